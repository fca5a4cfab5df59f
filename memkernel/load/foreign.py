"""Foreign code in this process: the addresses of the symbols :func:`memkernel.extern` kernels call.

A library is a shared object, opened with ``dlopen`` (``ctypes.CDLL``), or a
relocatable object file (``.o``), linked into an LLJIT of its own by the loader
of :mod:`memkernel.load.objects` against the process. Either stays loaded for
the life of the process, so the code of every kernel linked to it stays valid.
An object file's global constructors run once it is linked, as ``dlopen`` runs
a shared object's, and its destructors at the interpreter's exit (see
:mod:`memkernel.load.elf`). A library is read without ever blocking: a FIFO or a
device is refused (see :mod:`memkernel.load.files`).
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Iterable

from ..errors import CompileError
from ..model.foreign import ForeignSymbol
from .elf import SHARED, RELOCATABLE, ElfError, Relocatable, elf_type, read_object
from .files import read_regular
from .initializers import call_void
from .objects import LoadedObject, ObjectLoadError


_JIT_DEFINED = frozenset({"_GLOBAL_OFFSET_TABLE_", "__dso_handle"})
"""What an object may refer to that the JIT defines: the GOT, and the handle C++ registers its static objects'
destructors with (``__cxa_atexit``)."""


class _Library:
    """One library, loaded once: ``address(symbol)`` is the symbol's address, 0 if it does not define it.
    Raises OSError if it cannot be read, ObjectLoadError if it cannot be loaded or linked."""

    def __init__(self, path: str) -> None:
        code = read_regular(path)
        kind = elf_type(code)
        self._object: LoadedObject | None = None
        self._shared: ctypes.CDLL | None = None
        if kind == RELOCATABLE:
            try:
                self._relocatable: Relocatable | None = read_object(code)
            except ElfError as exc:
                raise ObjectLoadError(str(exc)) from None
            self._object = LoadedObject(self._relocatable.with_entry_symbols(), ())
            self._construct()
        elif kind == SHARED:
            self._relocatable = None
            self._shared = ctypes.CDLL(path)
        else:
            raise ObjectLoadError("it is neither a shared object nor a relocatable object file (ELF)")

    def _construct(self) -> None:
        """Run the object's constructors, in order, and have its destructors run at exit (or its release)."""
        assert self._object is not None and self._relocatable is not None
        constructors = [self._linked(name) for name in self._relocatable.constructor_symbols]
        destructors = [self._linked(name) for name in self._relocatable.destructor_symbols]
        self._object.at_release(functools.partial(_call_all, destructors))
        _call_all(constructors)

    def _linked(self, symbol: str) -> int:
        """The address of ``symbol``, which the object defines; ObjectLoadError naming what it refers to and
        nothing defines, if it does not link."""
        assert self._object is not None and self._relocatable is not None
        try:
            return self._object.symbol(symbol)
        except ObjectLoadError as exc:
            process = ctypes.CDLL(None)
            provided = self._relocatable.defined | _JIT_DEFINED
            missing = sorted(n for n in self._relocatable.undefined - provided if not hasattr(process, n))
            if missing:
                raise ObjectLoadError(f"it does not link: it refers to {', '.join(missing)}, which neither it nor "
                                      f"this process defines (LLVM: {exc})") from None
            raise ObjectLoadError(f"it does not link: {exc}") from None

    def address(self, symbol: str) -> int:
        if self._shared is not None:
            try:
                return ctypes.cast(getattr(self._shared, symbol), ctypes.c_void_p).value or 0
            except AttributeError:
                return 0
        assert self._relocatable is not None
        return self._linked(symbol) if symbol in self._relocatable.defined else 0


def _call_all(addresses: list[int]) -> None:
    for address in addresses:
        call_void(address)


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
    """Whether the library at ``path`` defines ``symbol``; CompileError naming ``kernel`` if it does but
    does not link."""
    return _address(path, symbol, kernel) != 0


def _address(path: str, symbol: str, kernel: str) -> int:
    try:
        return _load(path, kernel).address(symbol)
    except ObjectLoadError as exc:
        raise CompileError(f"{kernel}(): the library {path} defines {symbol}, but {exc}") from None


def addresses(symbols: Iterable[ForeignSymbol], kernel: str) -> dict[str, int]:
    """The address of each foreign symbol, by the name the kernel's object calls it; CompileError naming
    ``kernel`` for a library that does not load or a symbol it does not define."""
    found = {}
    for foreign in symbols:
        address = _address(foreign.library, foreign.symbol, kernel)
        if not address:
            raise CompileError(f"{kernel}(): the library {foreign.library} does not define {foreign.symbol}.")
        found[foreign.linked] = address
    return found
