"""Independent copies of arguments that keep each array's layout (strides, offset, order)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..call.descriptors import is_array, plain_array


def laid_out_as(array: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` (of ``array``'s shape, in any dtype) in a buffer of their own, laid out as ``array``
    is: the same strides counted in elements (negative ones too), the same order of dims in memory.
    In another item size, an array whose strides are not whole elements gets a C-contiguous copy."""
    if array.size == 0:
        return np.array(values, order="C")
    if values.itemsize == array.itemsize:
        strides = array.strides
    elif any(s % array.itemsize for s in array.strides):
        return np.array(values, order="C")
    else:
        strides = tuple(s // array.itemsize * values.itemsize for s in array.strides)
    low = sum((n - 1) * s for n, s in zip(array.shape, strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(array.shape, strides) if s > 0) + values.itemsize
    buffer = np.zeros(high - low, np.uint8)
    result: np.ndarray = np.ndarray(array.shape, values.dtype, buffer=buffer, offset=-low, strides=strides)
    result[...] = values
    return result


def layout_copy(value: Any) -> Any:
    """A copy of ``value`` that no call can change through the original: an array keeps its shape,
    dtype, strides (negative ones too) and writability in a buffer of its own, as numpy's C fields hold
    them (an ndarray subclass becomes a plain ndarray, whatever its properties say); other values are
    deep-copied."""
    if not is_array(value):
        return copy.deepcopy(value)
    value = plain_array(value)
    result = laid_out_as(value, value)
    result.flags.writeable = value.flags.writeable
    return result


def layout_copies(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """:func:`layout_copy` of each value."""
    return tuple(layout_copy(v) for v in values)
