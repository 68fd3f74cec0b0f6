"""The program's line that a record names as its `source`: the call of a module (its output) or
of an op (its output), found on the call stack, its file named as from the program's project
root whatever directory the program was started from (docs/pytorch.md)."""

from __future__ import annotations

import os
import sys
from typing import Optional

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PACKAGE_DIR = os.path.dirname(__file__) + os.sep


def call_site(frame) -> Optional[str]:
    """Where the program's code made the call that `frame` runs in, `FILE:LINE` (the file as
    `program_file` names it): the innermost frame from `frame` outward outside torch and this
    package, so a container's children (an `nn.Sequential`'s) name the line that called the
    container. None if every frame is torch's or this package's."""
    while frame is not None:
        relative = _file_of(frame)
        if relative is not None:
            return f"{relative}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def op_call_site(frame) -> tuple[bool, Optional[str]]:
    """For an op called from `frame` outward: whether this package called it (one of its frames
    comes before any of the program's: the recorder's own work, such as copying a tensor to
    record it), and otherwise where the program's code called it (`call_site`)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            return True, None
        relative = _file_of(frame)
        if relative is not None:
            return False, f"{relative}:{frame.f_lineno}"
        frame = frame.f_back
    return False, None


def _file_of(frame) -> Optional[str]:
    """`program_file` of the file `frame` runs in, looked up once a file."""
    file = frame.f_code.co_filename
    relative = _PROGRAM_FILES.get(file, "")
    if relative == "":
        relative = _PROGRAM_FILES[file] = program_file(file)
    return relative


def program_file(file: str) -> Optional[str]:
    """`file` as a record's `source` names it, whatever directory the program was started from
    (identical runs write identical records, docs/trace-format.md section 9): relative to the
    nearest directory above it that is a project's root (`PROJECT_MARKERS`), as the project's
    repository names it; an installed package's file (in a site-packages or dist-packages
    directory, a project's virtual environment included), or one in no project, relative to the
    deepest entry of `sys.path` that holds it, as Python imports it (a script outside any project
    relative to its own directory); else as it is. None for torch's files and this package's."""
    if file.startswith(_PACKAGE_DIR) or file.startswith(_TORCH_DIR):
        return None
    if file.startswith("<"):  # `<stdin>`, `<string>`: no file
        return file
    path = os.path.abspath(file)
    installed = any(part in _INSTALLED_DIRS for part in path.split(os.sep))
    root = None if installed else _project_root(os.path.dirname(path))
    if root is None:
        # (An empty entry, the working directory, would name the file by it: left out.)
        entries = [os.path.abspath(entry) for entry in sys.path if isinstance(entry, str) and entry]
        holding = [entry for entry in entries if path.startswith(os.path.join(entry, ""))]
        root = max(holding, key=len, default=None)
    return os.path.relpath(path, root) if root is not None else path


# What marks a directory as a project's root (`program_file`): a repository's, or a Python
# project's.
PROJECT_MARKERS = (".git", ".hg", "pyproject.toml", "setup.py", "setup.cfg")

# The directories installed packages live in.
_INSTALLED_DIRS = ("site-packages", "dist-packages")


def _project_root(directory: str) -> Optional[str]:
    """The nearest of `directory` and the directories above it that holds one of
    `PROJECT_MARKERS`; None where none does."""
    while True:
        if any(os.path.exists(os.path.join(directory, marker)) for marker in PROJECT_MARKERS):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


# Each file seen in a call stack, as `program_file` says (finding its root costs more than the
# rest of a hook): one dictionary lookup a frame.
_PROGRAM_FILES: dict[str, Optional[str]] = {}
