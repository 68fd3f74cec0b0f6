"""The old name of `repro.writer`, importable for a while: `import repro_writer` is `repro.writer`."""

from repro._old_names import alias

alias(__name__)
