"""numpy arrays as memref descriptors.

A ranked descriptor is ``{allocated*, aligned*, int64 offset, int64 sizes[rank],
int64 strides[rank]}``; a 0-d one stops after the offset; an unranked one is
``{int64 rank, void* ranked_descriptor}``. Descriptor strides and offsets count
elements. numpy's count bytes, and numpy's data pointer already includes a
view's offset, so a view is described by its data pointer, offset 0 and its
byte strides divided by the item size.
"""

from __future__ import annotations

import ctypes
import functools
import struct

import numpy as np

POINTER_SIZE = ctypes.sizeof(ctypes.c_void_p)
if POINTER_SIZE != 8:
    raise ImportError("memkernel needs a 64-bit platform")

UNRANKED_FORMAT = "qQ"


@functools.lru_cache(maxsize=None)
def ranked_format(rank: int) -> str:
    """``struct`` format of a rank-``rank`` descriptor: pointers, offset, sizes, strides."""
    return "QQq" + "q" * (2 * rank)


@functools.lru_cache(maxsize=None)
def ranked_struct(rank: int) -> struct.Struct:
    return struct.Struct("<" + ranked_format(rank))


def is_array(value: object) -> bool:
    """Whether ``value`` is an ndarray by its C type: ``isinstance`` would also believe a ``__class__`` that lies."""
    return issubclass(type(value), np.ndarray)


def plain_array(array: np.ndarray) -> np.ndarray:
    """``array`` as numpy's C struct holds it: itself when it is an exact ndarray, else a plain ndarray view of
    its memory.

    The view's shape, strides, dtype, flags and data pointer are the subclass's C fields: properties a
    subclass overrides (a ``shape`` that lies) are never read, since ``np.ndarray.view`` is numpy's own
    method and a plain ndarray has no ``__array_finalize__`` to run. Writes through the view reach the
    subclass's memory.
    """
    return array if type(array) is np.ndarray else np.ndarray.view(array, np.ndarray)


def data_pointer(array: np.ndarray) -> int:
    """Address of the array's first element (a view's offset included)."""
    return array.ctypes.data


def align(offset: int, alignment: int) -> int:
    """``offset`` rounded up to a multiple of ``alignment``."""
    return -(-offset // alignment) * alignment


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides of a contiguous buffer of ``shape``."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    return tuple(strides)


def element_strides(array: np.ndarray) -> tuple[int, ...] | None:
    """The array's strides in elements, or None if a byte stride is not a multiple of the item size."""
    itemsize = array.itemsize
    strides = []
    for s in array.strides:
        if s % itemsize:
            return None
        strides.append(s // itemsize)
    return tuple(strides)


def is_direct_contiguous(array: np.ndarray) -> bool:
    """True if an identity-layout memref can use the array's memory as it is."""
    flags = array.flags
    return flags.c_contiguous and flags.aligned


def contiguous_copy(array: np.ndarray) -> np.ndarray:
    """A fresh, aligned, C-contiguous copy of ``array``."""
    return np.array(array, order="C", copy=True)


def reach(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """The bytes ``[low, high)`` a non-empty array's elements occupy, relative to its first element
    (``strides`` in bytes)."""
    low = high = 0
    for size, stride in zip(shape, strides):
        step = (size - 1) * stride
        if step < 0:
            low += step
        else:
            high += step
    return low, high + itemsize
