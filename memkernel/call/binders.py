"""Per-argument binders: check one Python value against its MLIR type and turn it into descriptor fields.

A binder is built once per kernel argument. At call time it checks the value,
chooses zero-copy or a contiguous copy, and returns the raw values that the
call frame packs. Copies and copy-backs go through the :class:`CallState` so
that the same array passed twice stays one buffer.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import descriptors
from . import scalars
from .descriptors import contiguous_strides, data_pointer, element_strides
from ..spec.dtypes import ElementType, describe_dtype, dtype_expression
from ..errors import ArgumentError, ShapeError, ValueRangeError
from ..spec.signature import ArgSpec, MemRefSpec, ScalarSpec, UnrankedSpec

_ADDRESS_MASK = (1 << 64) - 1


@dataclass
class CallState:
    """What one call keeps alive and must copy back once the kernel returns.

    ``buffers`` maps each memref argument's allocated pointer to the array passed,
    so that a returned memref aliasing an argument is recognised.
    """

    keep: list[Any] = field(default_factory=list)
    buffers: dict[int, np.ndarray] = field(default_factory=dict)
    copies: dict[tuple[Any, ...], np.ndarray] = field(default_factory=dict)
    copy_back: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def copy_of(self, array: np.ndarray, make_copy: Any, write_back: bool) -> np.ndarray:
        """One temporary per distinct view of memory, copied back after the call if it may be written."""
        key = (data_pointer(array), array.shape, array.strides, array.dtype.str)
        temp = self.copies.get(key)
        if temp is None:
            temp = make_copy(array)
            self.copies[key] = temp
        if write_back and array.flags.writeable:
            self.copy_back[key] = (array, temp)
        return temp

    def finish(self) -> None:
        for original, temp in self.copy_back.values():
            np.copyto(original, temp, casting="no")


def describe_value(value: Any) -> str:
    """What was given, as in ``float64[3, 5]``."""
    if isinstance(value, np.ndarray):
        return f"{describe_dtype(value.dtype)}[{', '.join(str(d) for d in value.shape)}]"
    if isinstance(value, np.generic):
        return f"{value.dtype.name} scalar {value!r}"
    if isinstance(value, (bool, int, float, complex)):
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__


def _dtype_names(element: ElementType) -> str:
    return " or ".join(d.name for d in element.accepted)


def _shape_hint(shape: tuple[int | None, ...]) -> str:
    inner = ", ".join("*" if d is None else str(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def _expectation(spec: MemRefSpec) -> str:
    parts = [_dtype_names(spec.element), f"{spec.rank}-d"]
    parts += [f"dim {i} == {d}" for i, d in enumerate(spec.shape) if d is not None]
    return ", ".join(parts)


def _convertible(source: np.dtype, element: ElementType) -> bool:
    """Whether a value of a Python sequence or scalar converts without changing meaning."""
    kinds = {"bool": "b", "int": "biu", "float": "biuf", "complex": "biufc"}[element.kind]
    return source.kind in kinds


class Binder:
    """Checks and converts one argument. ``name`` is how messages call it."""

    is_writable_target = False

    def __init__(self, kernel: str, name: str, spec: ArgSpec) -> None:
        self.kernel = kernel
        self.name = name
        self.spec = spec

    @property
    def struct_format(self) -> str:
        """``struct`` format of the values :meth:`bind` returns."""
        raise NotImplementedError

    def bind(self, value: Any, state: CallState) -> tuple[Any, ...]:
        """Check ``value`` and return the raw values to pack; raise the error that explains it if wrong."""
        raise NotImplementedError

    def _where(self) -> str:
        return f"{self.kernel}(): argument '{self.name}' expects {self.spec.mlir}"


class ScalarBinder(Binder):
    spec: ScalarSpec

    @property
    def struct_format(self) -> str:
        return self.spec.element.struct_format

    def bind(self, value: Any, state: CallState) -> tuple[Any, ...]:
        try:
            return scalars.encode(value, self.spec.element)
        except scalars.ScalarValueError as exc:
            error = ArgumentError if exc.is_type_error else ValueRangeError
            raise error(f"{self._where()}: {exc}") from None


class _BufferBinder(Binder):
    """Shared by ranked and unranked memrefs: array checks, coercion of inputs, copies."""

    def __init__(self, kernel: str, name: str, spec: MemRefSpec | UnrankedSpec, *,
                 may_write: bool, is_output: bool) -> None:
        super().__init__(kernel, name, spec)
        self.element = spec.element
        self.may_write = may_write
        self.is_output = is_output
        self.is_writable_target = may_write or is_output

    def _array(self, value: Any, state: CallState) -> np.ndarray:
        if isinstance(value, np.ndarray) and not isinstance(value, np.ma.MaskedArray):
            array = value
        elif self.is_writable_target or isinstance(value, np.ma.MaskedArray):
            why = "an output" if self.is_output else "an argument the kernel may write"
            raise ArgumentError(
                f"{self._where()}; got {describe_value(value)}. It is {why}, so pass a writable "
                f"numpy array of dtype {self.element.dtype.name}."
            )
        else:
            array = self._coerce(value)
            state.keep.append(array)
        if not array.dtype.isnative:
            raise ArgumentError(
                f"{self._where()}; got {describe_value(array)}. Pass "
                f"{self.name}.astype({dtype_expression(self.element.dtype)}) to get native byte order."
            )
        if not self.element.accepts(array.dtype):
            raise ArgumentError(
                f"{self._where()} ({self._expectation()}); got {describe_value(array)}. "
                f"Pass {self.name}.astype({dtype_expression(self.element.dtype)}){self._shape_fix(array)}."
            )
        if not array.flags.writeable and self.is_writable_target:
            where = "as out=" if self.is_output else "for an argument the kernel may write"
            raise ArgumentError(
                f"{self._where()}; got a read-only array {describe_value(array)} {where}. "
                f"Pass a writable array, e.g. {self.name}.copy()."
            )
        return array

    def _expectation(self) -> str:
        return f"{_dtype_names(self.element)}, any rank"

    def _shape_fix(self, array: np.ndarray) -> str:
        return ""

    def _coerce(self, value: Any) -> np.ndarray:
        try:
            natural = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise ArgumentError(f"{self._where()}; got {describe_value(value)} ({exc}).") from None
        if natural.dtype == object or not _convertible(natural.dtype, self.element):
            raise ArgumentError(
                f"{self._where()}; got {describe_value(value)}, which does not convert to "
                f"{self.element.dtype.name} without changing its values. Pass a numpy array of "
                f"dtype {self.element.dtype.name}."
            )
        if self.element.kind in ("float", "complex"):
            with np.errstate(over="ignore", invalid="ignore"):
                converted = natural.astype(self.element.dtype)
            if np.any(np.isfinite(natural) & ~np.isfinite(converted)):
                raise ValueRangeError(
                    f"{self._where()}; got {describe_value(value)} with values that overflow "
                    f"{self.element.mlir}."
                )
            return converted
        if natural.dtype.kind not in "iu" or self.element.kind != "int":
            return natural.astype(self.element.dtype)
        # Integers: the first accepted dtype that holds every value (a signless type takes either sign).
        for dtype in self.element.accepted:
            converted = natural.astype(dtype)
            if np.array_equal(converted, natural):
                return converted
        raise ValueRangeError(
            f"{self._where()}; got {describe_value(value)} with values out of range for "
            f"{self.element.mlir}."
        )

    def _contiguous(self, array: np.ndarray, state: CallState) -> np.ndarray:
        if descriptors.is_direct_contiguous(array):
            return array
        return state.copy_of(array, descriptors.contiguous_copy, self.is_writable_target)


class MemRefBinder(_BufferBinder):
    spec: MemRefSpec

    @property
    def struct_format(self) -> str:
        return descriptors.ranked_format(self.spec.rank)

    def _expectation(self) -> str:
        return _expectation(self.spec)

    def _shape_fix(self, array: np.ndarray) -> str:
        fits = array.ndim == self.spec.rank and all(
            want is None or want == have for want, have in zip(self.spec.shape, array.shape))
        return "" if fits else f" with shape {_shape_hint(self.spec.shape)}"

    def _check_shape(self, array: np.ndarray) -> None:
        spec = self.spec
        if array.ndim != spec.rank:
            raise ArgumentError(
                f"{self._where()} ({_expectation(spec)}); got {describe_value(array)}. "
                f"Pass an array of shape {_shape_hint(spec.shape)}."
            )
        for i, (want, have) in enumerate(zip(spec.shape, array.shape)):
            if want is not None and want != have:
                raise ShapeError(
                    f"{self._where()} ({_expectation(spec)}); got {describe_value(array)}: "
                    f"dim {i} is {have}, not {want}. Pass an array of shape {_shape_hint(spec.shape)}."
                )

    def bind(self, value: Any, state: CallState) -> tuple[Any, ...]:
        array = self._array(value, state)
        self._check_shape(array)
        layout = self.spec.layout
        if layout is None:
            array = self._contiguous(array, state)
            pointer = data_pointer(array)
            state.buffers[pointer] = array
            return (pointer, pointer, 0, *array.shape, *contiguous_strides(array.shape))
        strides = self._layout_strides(array)
        if strides is None:
            array = state.copy_of(array, self._realizing_copy, self.is_writable_target)
            strides = self._layout_strides(array)
            assert strides is not None
        pointer = data_pointer(array)
        offset = layout.offset or 0
        aligned = (pointer - offset * array.itemsize) & _ADDRESS_MASK
        state.buffers[aligned] = array
        return (aligned, aligned, offset, *array.shape, *strides)

    def _layout_strides(self, array: np.ndarray) -> tuple[int, ...] | None:
        """The descriptor strides if the array's memory fits the layout as it is, else None."""
        if not array.flags.aligned:
            return None
        actual = element_strides(array)
        if actual is None:
            return None
        assert self.spec.layout is not None
        strides = []
        for want, have, size in zip(self.spec.layout.strides, actual, array.shape):
            if want is None:
                strides.append(have)
            elif want == have or size <= 1:
                strides.append(want)
            else:
                return None
        return tuple(strides)

    def _realizing_copy(self, array: np.ndarray) -> np.ndarray:
        for order in ("C", "F"):
            copy = np.array(array, order=order, copy=True)
            if self._layout_strides(copy) is not None:
                return copy
        raise ArgumentError(
            f"{self._where()}; got {describe_value(array)}, and no C- or Fortran-ordered copy of "
            f"that shape has the layout's static strides. Pass an array whose strides match."
        )


class UnrankedBinder(_BufferBinder):
    spec: UnrankedSpec

    @property
    def struct_format(self) -> str:
        return descriptors.UNRANKED_FORMAT

    def bind(self, value: Any, state: CallState) -> tuple[Any, ...]:
        array = self._contiguous(self._array(value, state), state)
        pointer = data_pointer(array)
        state.buffers[pointer] = array
        fields = (pointer, pointer, 0, *array.shape, *contiguous_strides(array.shape))
        ranked = descriptors.ranked_struct(array.ndim)
        buffer = ctypes.create_string_buffer(ranked.size)
        ranked.pack_into(buffer, 0, *fields)
        state.keep.append(buffer)
        return (array.ndim, ctypes.addressof(buffer))
