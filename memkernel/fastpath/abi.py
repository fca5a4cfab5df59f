"""Where CPython and numpy keep the fields the compiled fast path reads.

The fast path (see :mod:`memkernel.thunk`) reads numpy arrays, tuples, floats and
ints directly in machine code. The offsets below are those of CPython 3.10-3.13
(standard, GIL builds) and numpy 2's ``PyArrayObject_fields``. They are checked
against live objects when memkernel imports; if any check fails the fast path
is switched off and every call takes the checked Python path, which gives the
same answers.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Layout:
    """Byte offsets and flag bits of the objects the fast path reads."""

    ob_type: int = 8
    tuple_items: int = 24
    float_value: int = 16
    array_data: int = 16
    array_nd: int = 24
    array_dims: int = 32
    array_strides: int = 40
    array_descr: int = 56
    array_flags: int = 64
    c_contiguous: int = 0x1
    aligned: int = 0x100
    writeable: int = 0x400


LAYOUT = Layout()


def _word(address: int) -> int:
    return ctypes.c_int64.from_address(address).value


def _layout_holds() -> bool:
    """Check every offset against live objects (reads only inside those objects)."""
    if sys.implementation.name != "cpython" or getattr(sys, "_is_gil_enabled", lambda: True)() is False:
        return False
    array = np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2]
    at = id(array)
    checks = [
        _word(at + LAYOUT.ob_type) == id(np.ndarray),
        _word(at + LAYOUT.array_data) == array.ctypes.data,
        ctypes.c_int32.from_address(at + LAYOUT.array_nd).value == 2,
        [_word(_word(at + LAYOUT.array_dims) + 8 * i) for i in range(2)] == list(array.shape),
        [_word(_word(at + LAYOUT.array_strides) + 8 * i) for i in range(2)] == list(array.strides),
        _word(at + LAYOUT.array_descr) == id(array.dtype),
    ]
    flags = ctypes.c_int32.from_address(at + LAYOUT.array_flags).value
    contiguous = np.zeros(3)
    contiguous_flags = ctypes.c_int32.from_address(id(contiguous) + LAYOUT.array_flags).value
    checks += [
        bool(not flags & LAYOUT.c_contiguous and flags & LAYOUT.aligned and flags & LAYOUT.writeable),
        bool(contiguous_flags & LAYOUT.c_contiguous),
    ]
    items = (array, contiguous)
    checks += [
        _word(id(items) + LAYOUT.tuple_items + 8) == id(contiguous),
        ctypes.c_double.from_address(id(2.5) + LAYOUT.float_value).value == 2.5,
    ]
    return all(checks)


@functools.lru_cache(maxsize=None)
def fast_path_supported() -> bool:
    """Whether the running interpreter and numpy have the layout the fast path assumes."""
    try:
        return _layout_holds()
    except (ValueError, OverflowError):
        return False


def c_function(name: str) -> int:
    """Address of a CPython C API function."""
    return ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value or 0
