"""The old name of `repro.trace`, importable for a while: `import repro_trace` is `repro.trace`."""

from repro._old_names import alias

alias(__name__)

if __name__ == "__main__":  # python3 python/repro_trace.py ...: the reader's command line
    import sys

    from repro.trace import main

    sys.exit(main())
