"""Foreign code in this process: the addresses of the symbols :func:`memkernel.extern` kernels call.

A library is a shared object, opened with ``dlopen`` (``ctypes.CDLL``), or a
relocatable object file (``.o``), linked into an LLJIT of its own by the loader
of :mod:`memkernel.load.objects` against the process. Either stays loaded for
the life of the process, so the code of every kernel linked to it stays valid.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Iterable

from ..errors import CompileError
from ..model.foreign import ForeignSymbol
from .objects import LoadedObject, ObjectLoadError

_ELF_MAGIC = b"\x7fELF"
_RELOCATABLE, _SHARED = 1, 3  # ELF e_type values: ET_REL, ET_DYN


class _Library:
    """One library, loaded once: ``address(symbol)`` is the symbol's address, 0 if it does not define it."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as opened:
            head = opened.read(18)
            kind = int.from_bytes(head[16:18], "little") if head.startswith(_ELF_MAGIC) else None
            code = opened.read() if kind == _RELOCATABLE else b""
        if kind == _RELOCATABLE:
            self._object: LoadedObject | None = LoadedObject(head + code, ())
            self._shared = None
        elif kind == _SHARED:
            self._object = None
            self._shared = ctypes.CDLL(path)
        else:
            raise OSError(f"{path} is neither a shared object nor a relocatable object file (ELF)")

    def address(self, symbol: str) -> int:
        if self._shared is not None:
            try:
                return ctypes.cast(getattr(self._shared, symbol), ctypes.c_void_p).value or 0
            except AttributeError:
                return 0
        assert self._object is not None
        try:
            return self._object.symbol(symbol)
        except ObjectLoadError:
            return 0


@functools.lru_cache(maxsize=None)
def _opened(path: str, stamp: tuple[int, int]) -> _Library:
    return _Library(path)


def library(path: str | os.PathLike[str], kernel: str) -> str:
    """``path`` made absolute, once it is known to load; CompileError naming ``kernel`` if it does not."""
    absolute = os.path.abspath(os.fspath(path))
    _load(absolute, kernel)
    return absolute


def _load(path: str, kernel: str) -> _Library:
    try:
        status = os.stat(path)
        return _opened(path, (status.st_mtime_ns, status.st_size))
    except (OSError, ObjectLoadError) as exc:
        raise CompileError(f"{kernel}(): the library {path} cannot be loaded: {exc}") from None


def defines(path: str, symbol: str, kernel: str) -> bool:
    """Whether the library at ``path`` defines ``symbol``."""
    return _load(path, kernel).address(symbol) != 0


def addresses(symbols: Iterable[ForeignSymbol], kernel: str) -> dict[str, int]:
    """The address of each foreign symbol, by the name the kernel's object calls it; CompileError naming
    ``kernel`` for a library that does not load or a symbol it does not define."""
    found = {}
    for foreign in symbols:
        address = _load(foreign.library, kernel).address(foreign.symbol)
        if not address:
            raise CompileError(f"{kernel}(): the library {foreign.library} does not define {foreign.symbol}.")
        found[foreign.linked] = address
    return found
