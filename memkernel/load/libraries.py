"""Finding the MLIR runtime libraries a kernel links against.

``shared_libs=`` takes paths, or names such as ``mlir_c_runner_utils`` that are
looked up in the installed MLIR packages (``memkernel[runtime]`` installs them).
Functions a lowered module calls but does not define (``memrefCopy``, the
``printMemref`` family, the APFloat routines of f8 arithmetic) are looked up in
those runtime libraries, which are then linked without being asked for.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
from collections.abc import Iterable, Sequence

from ..errors import CompileError


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


RUNTIME_LIBRARIES = ("mlir_c_runner_utils", "mlir_runner_utils", "mlir_float16_utils", "mlir_apfloat_wrappers",
                     "mlir_async_runtime")


@functools.lru_cache(maxsize=None)
def _open(path: str | None) -> ctypes.CDLL:
    return ctypes.CDLL(path)


def _defines(path: str | None, symbol: str) -> bool:
    try:
        return hasattr(_open(path), symbol)
    except OSError:
        return False


class _Info(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]


_RUNTIME_FILES = {f"lib{name}.so" for name in RUNTIME_LIBRARIES}


def _runtime_in_process(symbol: str) -> str | None:
    """The runtime library (of :data:`RUNTIME_LIBRARIES`) that this process already resolves ``symbol`` to,
    or None: LLVM loads the libraries a kernel links into the process's global scope, where the next
    kernel's symbols would otherwise resolve without the library being recorded."""
    try:
        address = ctypes.cast(getattr(_open(None), symbol), ctypes.c_void_p).value
    except AttributeError:
        return None
    info = _Info()
    if not address or not _libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.fname:
        return None
    path = os.fsdecode(info.fname)
    return path if os.path.basename(path) in _RUNTIME_FILES else None


_libc = ctypes.CDLL(None)


def libraries_for(symbols: Iterable[str], linked: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """Runtime libraries to add so that ``symbols`` resolve, and the symbols nothing defines.

    A symbol resolves if a library in ``linked`` or the process defines it;
    otherwise the first of :data:`RUNTIME_LIBRARIES` that defines it is added.
    A runtime library already in the process that defines it is added too, so
    that the object links where the process has not loaded it (a later process
    reading the disk cache), and the list tells which runtime it calls.
    """
    added: list[str] = []
    unresolved: list[str] = []
    runtime = [path for path in map(find_library, RUNTIME_LIBRARIES) if path is not None]
    for symbol in symbols:
        if any(_defines(path, symbol) for path in (*linked, *added)):
            continue
        if _defines(None, symbol):
            loaded = _runtime_in_process(symbol)
            if loaded is not None:
                added.append(loaded)
            continue
        provider = next((path for path in runtime if _defines(path, symbol)), None)
        if provider is None:
            unresolved.append(symbol)
        else:
            added.append(provider)
    return tuple(added), unresolved
