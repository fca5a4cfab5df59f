"""The compiled fast path, bound to this process as a builtin Python function.

Binding fills the fast path's constants table with this process's addresses
(see :mod:`memkernel.fastpath.constants`) and wraps the compiled
``METH_FASTCALL`` function in a builtin function object, so a call costs what
calling ``len`` costs. The fast path releases the GIL around the kernel, once
it has read every Python object.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..call.results import ResultReader
from ..spec.signature import ArgSpec
from . import constants
from .constants import DONE
from .emitter import FastPath

_METH_FASTCALL = 0x0080


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p),
                ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


def _new_builtin(definition: _MethodDef) -> Any:
    """A builtin function for ``definition``; it holds the definition as its ``self``, keeping it alive."""
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p]
    return new(ctypes.addressof(definition), definition, None)


class FastFunction:
    """Calls the fast path; None from a call means "take the checked Python path"."""

    def __init__(self, function_address: int, consts_address: int, fast: FastPath,
                 results: Sequence[ArgSpec]) -> None:
        constants.fill(consts_address, fast.dtypes)
        self._dtypes = fast.dtypes  # the table holds their addresses: keep them alive
        self.raw = _new_builtin(_MethodDef(fast.function.encode(), function_address, _METH_FASTCALL, None))
        """``raw(args, outputs[, results])``: DONE if it ran the kernel, DECLINED if not."""
        self._reader = ResultReader(results) if results else None
        self._buffers: list[np.ndarray] = []

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
