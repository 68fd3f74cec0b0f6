"""The old name of `repro.torch`, importable for a while: `import repro_torch` is `repro.torch`."""

from repro._old_names import alias

alias(__name__)
