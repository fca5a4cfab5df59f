"""Finding the MLIR runtime libraries a kernel links against.

``shared_libs=`` takes paths, or names such as ``mlir_c_runner_utils`` that are
looked up in the installed MLIR packages (``memkernel[runtime]`` installs them).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable

from .errors import CompileError


def search_directories() -> list[str]:
    """The folders of the installed ``mlir`` package that hold shared libraries."""
    spec = importlib.util.find_spec("mlir")
    roots = list(spec.submodule_search_locations or []) if spec else []
    return [os.path.join(root, sub) for root in roots for sub in ("lib", "_mlir_libs")
            if os.path.isdir(os.path.join(root, sub))]


def find_library(name: str) -> str | None:
    """The path of library ``name`` (a path, or a bare name like ``mlir_c_runner_utils``), or None."""
    if os.sep in name or name.endswith(".so"):
        return os.path.abspath(name) if os.path.isfile(name) else None
    for directory in search_directories():
        for candidate in (f"lib{name}.so", f"{name}.so", name):
            path = os.path.join(directory, candidate)
            if os.path.isfile(path):
                return path
    return None


def resolve_libraries(names: Iterable[str]) -> tuple[str, ...]:
    """Paths of every library in ``names``; CompileError naming the missing ones."""
    paths = []
    for name in names:
        path = find_library(os.fspath(name))
        if path is None:
            raise CompileError(
                f"shared library {name!r} not found. Looked for a file of that path, and for "
                f"lib{name}.so in {', '.join(search_directories()) or 'no mlir package folder'}. "
                "The MLIR runtime libraries come with: pip install 'memkernel[runtime]'"
            )
        paths.append(path)
    return tuple(paths)
