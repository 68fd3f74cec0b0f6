"""The old name of `repro.study`, importable for a while: `import repro_study` is `repro.study`."""

from repro._old_names import alias

alias(__name__)

if __name__ == "__main__":  # python -m repro_study ...
    import runpy

    runpy.run_module("repro.study", run_name="__main__", alter_sys=True)
