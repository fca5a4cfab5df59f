"""Scalars in and out of a kernel: range checks, and the bits that travel.

A scalar argument becomes the raw values that ``struct`` packs with
``ElementType.struct_format``: an unsigned integer for integers, ``f16``,
``bf16`` and f8 (their bits), a float for ``f32``/``f64``, two floats for complex.
"""

from __future__ import annotations

import numbers
import operator
from typing import Any, cast

import numpy as np

from ..model.dtypes import ML_DTYPES_TYPE_NAMES, ElementType

class ScalarValueError(Exception):
    """A value does not fit a scalar type; the message says why (without the argument name)."""

    def __init__(self, message: str, *, is_type_error: bool) -> None:
        super().__init__(message)
        self.is_type_error = is_type_error


def _as_int(value: Any, element: ElementType) -> int:
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (float, complex, np.inexact)):
        raise ScalarValueError(
            f"expects an integer for {element.mlir}, got {type(value).__name__} {value!r}; "
            "convert it with int() if truncation is intended",
            is_type_error=True,
        )
    try:
        return operator.index(value)
    except TypeError:
        raise ScalarValueError(
            f"expects an integer for {element.mlir}, got {type(value).__name__}", is_type_error=True
        ) from None


def _encode_int(value: Any, element: ElementType) -> tuple[int, ...]:
    number = _as_int(value, element)
    assert element.int_range is not None
    low, high = element.int_range
    if not low <= number <= high:
        raise ScalarValueError(
            f"value {number} is out of range for {element.mlir} ({low} .. {high})", is_type_error=False
        )
    if element.kind == "bool":
        return (number & 1,)  # i1's two readings: -1 and 1 are both the bit 1
    return (number & ((1 << (8 * element.itemsize)) - 1),)


def _is_number(value: Any, element: ElementType) -> bool:
    """Python and numpy numbers, ml_dtypes scalars included; complex only for complex types."""
    complex_ok = element.kind == "complex"
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, np.generic):
        if value.dtype.name in ML_DTYPES_TYPE_NAMES:
            return True
        return value.dtype.kind in ("biufc" if complex_ok else "biuf")
    return isinstance(value, numbers.Complex if complex_ok else numbers.Real)


def _encode_inexact(value: Any, element: ElementType) -> tuple[Any, ...]:
    if not _is_number(value, element):
        raise ScalarValueError(
            f"expects a {'complex' if element.kind == 'complex' else 'real'} number for "
            f"{element.mlir}, got {type(value).__name__}",
            is_type_error=True,
        )
    source = np.asarray(value)
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            converted = source.astype(element.dtype)
        pairs = [(source, converted)]
        if element.kind == "complex":
            pairs = [(source.real, converted.real), (source.imag, converted.imag)]
        # Finiteness of the value as given (a longdouble beyond f64 is finite, its float() is not).
        overflowed = any(bool(np.isfinite(want)) and not bool(np.isfinite(have)) for want, have in pairs)
    except (OverflowError, TypeError):
        overflowed = True
    if overflowed:
        raise ScalarValueError(f"value {value!r} overflows {element.mlir}", is_type_error=False)
    got: tuple[float, ...] = tuple(float(have) for _, have in pairs)
    if element.bits_are_packed:
        return (int(converted.view(element.bits_dtype)),)
    return got


def encode(value: Any, element: ElementType) -> tuple[Any, ...]:
    """The raw values to pack for ``value``; ScalarValueError if it does not fit."""
    if element.kind in ("int", "bool"):
        return _encode_int(value, element)
    return _encode_inexact(value, element)


def decode(raw: tuple[Any, ...], element: ElementType) -> np.generic:
    """The numpy scalar for the raw values unpacked with ``element.struct_format``."""
    if element.kind == "bool":
        return np.bool_(raw[0] & 1)
    if element.kind == "complex":
        return element.dtype.type(complex(raw[0], raw[1]))
    if element.kind == "float" and not element.bits_are_packed:
        return element.dtype.type(raw[0])
    bits = np.array(raw[0], dtype=element.bits_dtype)
    return cast(np.generic, bits.view(element.dtype)[()])
