"""The fast path's constants table: process-specific addresses, named once with what fills them.

Compiled code must not hold addresses of this process (type objects, dtype
objects, C API functions), or it could not be cached on disk. The emitted
function loads them from the global table ``__memkernel_consts_<name>``
instead, by :class:`Slot`; :func:`fill` writes them after the code is loaded.
Slots past the named ones hold the dtype objects the kernel's arrays may have.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Sequence
from enum import IntEnum

import numpy as np

from .abi import NUMPY_ZEROS, c_function, has_c_function, numpy_api


class Answer:
    """What the fast path returns: :data:`DONE` or :data:`DECLINED` (plain objects, never immortal)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<fast path {self.name}>"


DONE = Answer("done")
"""Returned when the fast path ran the kernel."""
DECLINED = Answer("declined")
"""Returned, before anything ran, for a call the fast path does not handle."""


_NAMES = tuple(sys.intern(name) for name in ("requires_grad", "is_neg", "is_conj", "is_inference"))
"""The attribute and method names the fast path asks a torch tensor for, by address: held here for its life."""


class Slot(IntEnum):
    """The named slots of the table; :data:`FILL` says what each holds."""

    ARRAY_TYPE = 0
    FLOAT_TYPE = 1
    LONG_TYPE = 2
    BOOL_TYPE = 3
    TRUE = 4
    SAVE_THREAD = 5
    RESTORE_THREAD = 6
    AS_LONG_LONG = 7
    DONE = 8
    DECLINED = 9
    NONE = 10
    OUT_NAME = 11
    INCREF = 12
    VECTORCALL = 13
    CLEAR_ERROR = 14
    ZEROS = 15
    FAILED = 16
    FROM_VOID_PTR = 17
    TUPLE_NEW = 18
    TUPLE_SET_ITEM = 19
    CALL = 20
    DECREF = 21
    # torch.Tensor and its DLPack exchange API, which the fast path reads tensors through: 0 until adopted
    # (see memkernel.fastpath.torch_tensors), then the names of what it asks a tensor.
    TORCH_TENSOR = 22
    TORCH_DLPACK_API = 23
    GET_ATTR = 24
    CALL_METHOD = 25
    REQUIRES_GRAD = 26
    IS_NEG = 27
    IS_CONJ = 28
    IS_INFERENCE = 29
    FALSE = 30


FILL: dict[Slot, Callable[[], int]] = {
    Slot.ARRAY_TYPE: lambda: id(np.ndarray),  # compared with an argument's ob_type: exact ndarrays only
    Slot.FLOAT_TYPE: lambda: id(float),
    Slot.LONG_TYPE: lambda: id(int),
    Slot.BOOL_TYPE: lambda: id(bool),
    Slot.TRUE: lambda: id(True),
    Slot.SAVE_THREAD: lambda: c_function("PyEval_SaveThread"),  # releases the GIL around the kernel
    Slot.RESTORE_THREAD: lambda: c_function("PyEval_RestoreThread"),
    Slot.AS_LONG_LONG: lambda: c_function("PyLong_AsLongLongAndOverflow"),
    Slot.DONE: lambda: id(DONE),
    Slot.DECLINED: lambda: id(DECLINED),
    # The compiled entry (a kernel called as ``kernel(*inputs, out=...)``) also uses these:
    Slot.NONE: lambda: id(None),
    Slot.OUT_NAME: lambda: id(sys.intern("out")),  # the keyword a call names in its kwnames, compared by address
    Slot.INCREF: lambda: c_function("Py_IncRef"),  # safe on immortal objects (None, from Python 3.12)
    # Passes a declined call on, as it came; 0 where the interpreter has no such export (3.10: no entry).
    Slot.VECTORCALL: lambda: c_function("PyObject_Vectorcall") if has_c_function("PyObject_Vectorcall") else 0,
    Slot.CLEAR_ERROR: lambda: c_function("PyErr_Clear"),
    Slot.ZEROS: lambda: numpy_api(NUMPY_ZEROS),  # allocates an output, zero-filled
    # A kernel that unwound to its guard: the kernel's FAILED callable, called with the guard's frame, raises.
    Slot.FROM_VOID_PTR: lambda: c_function("PyLong_FromVoidPtr"),
    Slot.TUPLE_NEW: lambda: c_function("PyTuple_New"),
    Slot.TUPLE_SET_ITEM: lambda: c_function("PyTuple_SetItem"),
    Slot.CALL: lambda: c_function("PyObject_Call"),
    Slot.DECREF: lambda: c_function("Py_DecRef"),
    Slot.TORCH_TENSOR: lambda: 0,  # see memkernel.fastpath.torch_tensors.adopt
    Slot.TORCH_DLPACK_API: lambda: 0,
    Slot.GET_ATTR: lambda: c_function("PyObject_GetAttr"),
    # 0 where the interpreter has no such export: then torch.Tensor is not adopted.
    Slot.CALL_METHOD: lambda: c_function("PyObject_VectorcallMethod") if has_c_function("PyObject_VectorcallMethod")
    else 0,
    Slot.REQUIRES_GRAD: lambda: id(_NAMES[0]),
    Slot.IS_NEG: lambda: id(_NAMES[1]),
    Slot.IS_CONJ: lambda: id(_NAMES[2]),
    Slot.IS_INFERENCE: lambda: id(_NAMES[3]),
    Slot.FALSE: lambda: id(False),
}
"""What fills each slot but :attr:`Slot.FAILED`, which holds the kernel's own callable (see :func:`fill`)."""

FIRST_DTYPE = len(Slot)
"""The first slot after the named ones: the dtype objects, in the order the emitter asked for them."""


def fill(address: int, dtypes: Sequence[np.dtype], failed: Callable[[int], object]) -> None:
    """Write this process's addresses into the table at ``address``, and ``failed``: what the fast path
    calls, with the address of its guard's frame, when the kernel unwound to it (it raises the call's error).

    The caller keeps ``dtypes`` and ``failed`` alive as long as the code can run: the table holds their
    addresses.
    """
    table = (ctypes.c_int64 * (FIRST_DTYPE + len(dtypes))).from_address(address)
    for slot, value in FILL.items():
        table[slot] = value()
    table[Slot.FAILED] = id(failed)
    for i, dtype in enumerate(dtypes):
        table[FIRST_DTYPE + i] = id(dtype)
