"""torch tensors in the fast path: ``torch.Tensor`` and its DLPack exchange API, adopted into a constants table.

The fast path reads an argument whose type is exactly the table's
:attr:`~memkernel.fastpath.constants.Slot.TORCH_TENSOR` through that type's
``__dlpack_c_exchange_api__`` (DLPack's ``DLPackExchangeAPI``): its
``dltensor_from_py_object_no_sync`` fills a ``DLTensor`` on the stack (data,
device, dtype, shape, strides) with no Python object made. Before reading any
argument it asks each tensor what DLPack cannot say, as the checked path does
(:mod:`memkernel.call.dlpack`): ``requires_grad``, ``is_neg()``, ``is_conj()``
and, for one the kernel writes, ``is_inference()``; any of them true, it
declines. Exact ``torch.Tensor`` only: a subclass, which may override any of
it, takes the checked path. The DLTensor borrows the tensor's memory and holds
no reference to its storage, so a kernel that runs Python during the call (one
with callbacks) leaves tensors to the checked path, which holds each storage
(see :class:`~memkernel.fastpath.builtin.FastFunction`).

The table starts with 0 there, which no type matches; :func:`adopt` fills it
once torch is imported (memkernel never imports it).
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

from .constants import Slot

_API_NAME = b"dlpack_exchange_api"
# DLPackExchangeAPI (dlpack.h): a 16-byte header (version, prev_api), then managed_tensor_allocator,
# managed_tensor_from_py_object_no_sync, managed_tensor_to_py_object_no_sync, dltensor_from_py_object_no_sync.
DLPACK_ALLOCATOR = 16
DLPACK_TO_OBJECT = 32
DLPACK_DLTENSOR_FROM_OBJECT = 40
# DLManagedTensorVersioned: version (8 bytes), manager_ctx, deleter, uint64 flags, then its DLTensor.
MANAGED_DELETER = 16
MANAGED_DLTENSOR = 32
DLPACK_CPU = 1
"""``kDLCPU``."""
# DLTensor (dlpack.h): void* data, DLDevice {int32 type, int32 id}, int32 ndim, DLDataType {uint8 code, uint8 bits,
# uint16 lanes}, int64* shape, int64* strides, uint64 byte_offset.
DLTENSOR_DEVICE = 8
DLTENSOR_NDIM = 16
DLTENSOR_DTYPE = 20
DLTENSOR_SHAPE = 24
DLTENSOR_STRIDES = 32
DLTENSOR_BYTE_OFFSET = 40
DLTENSOR_SIZE = 48

_DLPACK_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
"""DLPack's ``DLDataTypeCode`` of each numpy dtype kind (``kDLInt``, ``kDLUInt``, ``kDLFloat``, ``kDLComplex``,
``kDLBool``)."""


def dlpack_code(dtype: np.dtype) -> int | None:
    """``dtype``'s DLPack ``DLDataType`` as one little-endian int32 (code, bits, lanes 1), as numpy's DLPack reader
    maps it; ``kDLBfloat`` for ``ml_dtypes.bfloat16``; None for a dtype it has none for (the f8 types)."""
    if dtype.name == "bfloat16" and dtype.type.__module__ == "ml_dtypes":
        code = 4
    elif dtype.type.__module__ == "numpy" and dtype.kind in _DLPACK_CODES and dtype.isnative:
        code = _DLPACK_CODES[dtype.kind]
    else:
        return None
    return code | (8 * dtype.itemsize) << 8 | 1 << 16

_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.argtypes, _capsule_valid.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.argtypes, _capsule_pointer.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p


def exchange_api(kind: type) -> int:
    """The address of ``kind``'s DLPack exchange API if it is of DLPack 1.x and has the functions the fast path
    calls (allocate a tensor, make it a Python object, read an object as a DLTensor without copying); 0
    otherwise. The address stays valid for the life of the process (DLPack requires it)."""
    capsule = getattr(kind, "__dlpack_c_exchange_api__", None)
    if capsule is None or type(capsule).__name__ != "PyCapsule" or not _capsule_valid(capsule, _API_NAME):
        return 0
    api = _capsule_pointer(capsule, _API_NAME) or 0
    if not api or ctypes.c_uint32.from_address(api).value != 1:
        return 0
    functions = (DLPACK_ALLOCATOR, DLPACK_TO_OBJECT, DLPACK_DLTENSOR_FROM_OBJECT)
    return api if all(ctypes.c_void_p.from_address(api + offset).value for offset in functions) else 0


def torch_tensor_type() -> type | None:
    """``torch.Tensor`` if torch is imported, else None."""
    torch = sys.modules.get("torch")
    tensor = getattr(torch, "Tensor", None)
    return tensor if isinstance(tensor, type) else None


def adopt(consts_address: int) -> bool:
    """Fill the constants table at ``consts_address`` with ``torch.Tensor`` and its exchange API, if torch is
    imported, has one and the interpreter exports ``PyObject_VectorcallMethod``; whether it is filled.

    The API is written before the type: a thread whose compiled code sees the type sees its API. The table
    holds the type's address: ``torch.Tensor`` lives as long as torch, which is never unloaded.
    """
    table = (ctypes.c_int64 * (len(Slot))).from_address(consts_address)
    if table[Slot.TORCH_TENSOR]:
        return True
    kind = torch_tensor_type()
    if kind is None or not table[Slot.CALL_METHOD]:
        return False
    api = exchange_api(kind)
    if not api:
        return False
    table[Slot.TORCH_DLPACK_API] = api
    table[Slot.TORCH_TENSOR] = id(kind)
    return True
