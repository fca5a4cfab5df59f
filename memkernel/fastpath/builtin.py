"""The compiled fast path, bound to this process as a builtin Python function.

Binding fills the fast path's constants table with this process's addresses
(see :mod:`memkernel.fastpath.constants`) and wraps the compiled
``METH_FASTCALL`` function in a builtin function object, so a call costs what
calling ``len`` costs. The fast path releases the GIL around the kernel, once
it has read every Python object.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

import numpy as np

from . import constants, torch_tensors
from .constants import DONE
from .symbols import FastSymbols

_METH_FASTCALL = 0x0080
_METH_KEYWORDS = 0x0002


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p),
                ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


_NEW_BUILTIN = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p)(
    ("PyCFunction_NewEx", ctypes.pythonapi))


def _new_builtin(definition: _MethodDef, owner: Any = None) -> Any:
    """A builtin function for ``definition``, whose C function gets ``owner`` as its ``self``.

    ``owner`` must keep the definition alive; by default it is the definition itself.
    """
    return _NEW_BUILTIN(ctypes.addressof(definition), definition if owner is None else owner, None)


class ResultReading(Protocol):
    """Reads a kernel's results from the buffer the fast path wrote them into."""

    size: int

    def read(self, buffer: np.ndarray) -> tuple[Any, ...]: ...


class FastFunction:
    """Calls the fast path; None from a call means "take the checked Python path".

    ``reader`` reads the kernel's results (the call path's
    :class:`~memkernel.call.results.ResultReader`), None when it has none.
    ``failed`` raises the error of a call whose kernel unwound to its guard, given the guard's frame
    (see :func:`memkernel.load.guard.raiser`).
    ``tensors`` False keeps torch tensors off the compiled code, for the checked path: a kernel with callbacks
    runs Python during the call, which may free a tensor's storage, and the compiled code reads a tensor
    through a borrowed pointer that holds no reference to it (the checked path's DLPack export holds one).
    """

    def __init__(self, function_address: int, consts_address: int, fast: FastSymbols,
                 reader: ResultReading | None, failed: Callable[[int], NoReturn], entry_address: int = 0,
                 tensors: bool = True) -> None:
        constants.fill(consts_address, fast.dtypes, failed)
        self._consts_address = consts_address
        self._tensors = tensors
        self.reads_torch = tensors and torch_tensors.adopt(consts_address)
        """Whether the compiled code reads torch tensors (torch was imported and is adopted, see
        :mod:`memkernel.fastpath.torch_tensors`)."""
        self.entry_address = entry_address
        """Where the compiled entry (``fast.entry``) was loaded; 0 when the kernel has none."""
        self._dtypes, self._failed = fast.dtypes, failed  # the table holds their addresses: keep them alive
        self.raw = _new_builtin(_MethodDef(fast.function.encode(), function_address, _METH_FASTCALL, None))
        """``raw(args, outputs[, results])``: DONE if it ran the kernel, DECLINED if not; raises what ``failed``
        raises if the kernel unwound to its guard."""
        self._reader = reader
        self._buffers: list[np.ndarray] = []

    def adopt_torch(self) -> None:
        """Let the compiled code read torch tensors from now on (torch is imported: a call was given tensors)."""
        if self._tensors and not self.reads_torch:
            self.reads_torch = torch_tensors.adopt(self._consts_address)

    def __call__(self, args: tuple[Any, ...], outputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
        reader = self._reader
        if reader is None:
            return () if self.raw(args, outputs) is DONE else None
        try:
            buffer = self._buffers.pop()
        except IndexError:
            buffer = np.zeros(reader.size, np.uint8)
        try:
            if self.raw(args, outputs, buffer) is not DONE:
                return None
            return reader.read(buffer)
        finally:
            self._buffers.append(buffer)


def entry_builtin(name: str, address: int, fallback: Callable[..., Any], path_cell: np.ndarray) -> Any:
    """The compiled entry (see :func:`~memkernel.compile.fast_path.fast_path`) as a builtin function ``name``.

    Called as the kernel is, ``entry(*inputs, out=out)``, it runs the kernel
    and returns its output (None for an in-place kernel), writing
    :attr:`~memkernel.fastpath.symbols.CallPath.FAST` into ``path_cell[0]``; anything
    it declines it passes on, as it came, to ``fallback(*args, **kwargs)``.
    The address it was loaded at must stay mapped as long as the builtin lives.
    """
    if path_cell.dtype != np.int64 or path_cell.shape != (1,) or not path_cell.flags.writeable:
        raise ValueError(f"the path cell must be a writable int64 array of one element, not {path_cell!r}")
    definition = _MethodDef(name.encode(), address, _METH_FASTCALL | _METH_KEYWORDS, None)
    return _new_builtin(definition, (definition, fallback, path_cell))


def called_through(cls: type, entry: Any) -> type:
    """A subclass of ``cls``, named and documented as it is, whose instances, called, run ``entry``.

    A builtin function in a class dict is not bound as a method, so an instance
    called as ``kernel(a, b, out=c)`` runs ``entry(a, b, out=c)``.
    """
    return type(cls.__name__, (cls,), {"__call__": entry, "__slots__": (), "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
