"""The top-level names the Python package had before its one import root (`repro_trace`,
`repro_writer`, `repro_torch`, `repro_study`), kept importable for a while: each is the module
of `repro` it became, the same object, its submodules too (`import repro_torch.trainer` is
`repro.torch.trainer`), so that classes and module state are never loaded twice."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

OLD_NAMES = {"repro_trace": "repro.trace", "repro_writer": "repro.writer", "repro_torch": "repro.torch", "repro_study": "repro.study"}


class _OldNameFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `OLD.SUB` as the module `NEW.SUB` itself, for each old name's package."""

    def __init__(self) -> None:
        self._specs: dict = {}

    @staticmethod
    def new_name(fullname: str):
        old, dot, rest = fullname.partition(".")
        if dot and old in OLD_NAMES:
            return OLD_NAMES[old] + "." + rest
        return None

    def find_spec(self, fullname, path=None, target=None):
        new = self.new_name(fullname)
        if new is None or importlib.util.find_spec(new) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(self.new_name(spec.name))
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The import system set the old name's spec on the module: give it back its own.
        module.__spec__ = self._specs.pop(module.__name__, module.__spec__)

    def get_code(self, fullname):
        """The module's code, for `python -m repro_study` (runpy runs a package's `__main__`)."""
        new = self.new_name(fullname)
        return importlib.util.find_spec(new).loader.get_code(new)


_FINDER = _OldNameFinder()


def alias(old: str) -> None:
    """Makes the module being imported as `old` the module of `repro` it became (nothing for a
    shim run as a script, `__main__`)."""
    if old not in OLD_NAMES:
        return
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    sys.modules[old] = importlib.import_module(OLD_NAMES[old])
