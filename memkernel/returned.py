"""Memrefs a kernel returns, as numpy arrays that own their memory.

A returned descriptor says where its buffer came from through its allocated
pointer:

- the allocated pointer of an argument of the call: the result aliases that
  argument, and becomes a view of the caller's array, never freed here (a
  tensor result, being a value, is copied instead);
- ``0xdeadbeef``, which ``memref.get_global`` stores there: module memory,
  copied into a new array, never freed;
- anything else: a heap buffer from the kernel's ``memref.alloc`` (``malloc``).
  The array adopts it zero-copy and ``free``\\ s it when the last numpy reference
  goes. Several results with one allocated pointer share one owner and free it once.

An unranked result's ranked descriptor was copied to the heap by the kernel's
return; it is read and freed at once.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .descriptors import UNRANKED_FORMAT, ranked_format, ranked_struct
from .signature import MemRefSpec, UnrankedSpec

GLOBAL_MEMORY = 0xDEADBEEF

_libc = ctypes.CDLL(None)
_free = _libc.free
_free.argtypes = [ctypes.c_void_p]
_free.restype = None


class HeapBuffer:
    """Owns one ``malloc`` allocation of the kernel's and frees it when collected."""

    def __init__(self, allocated: int) -> None:
        self.allocated = allocated

    def __del__(self) -> None:
        _free(self.allocated)


class ExposedMemory:
    """Exposes memory to numpy through ``__array_interface__`` while holding its owner."""

    def __init__(self, owner: object, data: int, shape: tuple[int, ...], strides: tuple[int, ...],
                 itemsize: int) -> None:
        self.owner = owner
        self.__array_interface__ = {
            "version": 3,
            "typestr": f"|V{itemsize}",
            "data": (data, False),
            "shape": shape,
            "strides": strides,
        }


def read_descriptor(address: int, rank: int) -> tuple[int, ...]:
    """The fields of the rank-``rank`` descriptor stored at ``address``."""
    layout = ranked_struct(rank)
    return layout.unpack(ctypes.string_at(address, layout.size))


def descriptor_array(fields: tuple[int, ...], dtype: np.dtype, owner: object) -> np.ndarray:
    """A numpy view of the memory a ranked descriptor's ``fields`` describe, keeping ``owner`` alive."""
    rank = (len(fields) - 3) // 2
    shape = tuple(fields[3:3 + rank])
    strides = tuple(s * dtype.itemsize for s in fields[3 + rank:])
    data = fields[1] + fields[2] * dtype.itemsize
    return np.asarray(ExposedMemory(owner, data, shape, strides, dtype.itemsize)).view(dtype)


class ResultAdopter:
    """Turns one call's returned descriptors into arrays; shares owners between results of the call."""

    def __init__(self, call_buffers: dict[int, np.ndarray]) -> None:
        self.call_buffers = call_buffers
        self.owners: dict[int, object] = {}

    def array(self, spec: MemRefSpec | UnrankedSpec, fields: tuple[int, ...]) -> np.ndarray:
        """The array for a ranked descriptor's ``fields`` (allocated, aligned, offset, sizes..., strides...)."""
        dtype = spec.element.dtype
        allocated = fields[0]
        if allocated == GLOBAL_MEMORY:
            return np.array(descriptor_array(fields, dtype, None))
        owner: object | None = self.call_buffers.get(allocated)
        if owner is not None and spec.tensor:
            # A tensor result is a value: never a view of an input.
            return np.array(descriptor_array(fields, dtype, owner))
        if owner is None:
            owner = self.owners.get(allocated)
            if owner is None:
                owner = self.owners[allocated] = HeapBuffer(allocated)
        return descriptor_array(fields, dtype, owner)

    def unranked(self, spec: UnrankedSpec, rank: int, descriptor: int) -> np.ndarray:
        """The array for an unranked result; frees the heap copy of its ranked descriptor."""
        fields = read_descriptor(descriptor, rank)
        _free(descriptor)
        return self.array(spec, fields)


def descriptor_format(spec: MemRefSpec | UnrankedSpec) -> str:
    """``struct`` format of a returned descriptor: ``{rank, pointer}`` or a ranked descriptor."""
    return UNRANKED_FORMAT if isinstance(spec, UnrankedSpec) else ranked_format(spec.rank)
