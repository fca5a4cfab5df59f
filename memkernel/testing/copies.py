"""Independent copies of arguments that keep each array's layout (strides, offset, order)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..call.descriptors import is_array, plain_array


def layout_copy(value: Any) -> Any:
    """A copy of ``value`` that no call can change through the original: an array keeps its shape,
    dtype, strides (negative ones too) and writability in a buffer of its own, as numpy's C fields hold
    them (an ndarray subclass becomes a plain ndarray, whatever its properties say); other values are
    deep-copied."""
    if not is_array(value):
        return copy.deepcopy(value)
    value = plain_array(value)
    if value.size == 0:
        return value.copy()
    low = sum((n - 1) * s for n, s in zip(value.shape, value.strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(value.shape, value.strides) if s > 0) + value.itemsize
    buffer = np.zeros(high - low, np.uint8)
    result: np.ndarray = np.ndarray(value.shape, value.dtype, buffer=buffer, offset=-low, strides=value.strides)
    result[...] = value
    result.flags.writeable = value.flags.writeable
    return result


def layout_copies(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """:func:`layout_copy` of each value."""
    return tuple(layout_copy(v) for v in values)
