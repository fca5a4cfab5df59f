"""Shaping and allocating the output arguments a call does not pass.

A static dim comes from the memref type. A ``?`` dim comes, in order, from the
input dim the kernel ties it to (see :mod:`memkernel.analysis.shapes`), from the
shape the decorated Python function returns, or from the inputs that have the
same memref shape pattern when they all agree. Whatever gives the shape, the
call then checks the outputs against the same ties as the inputs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import AllocationError, ShapeError
from ..model.kernel_spec import KernelSpec
from ..model.shapes import Dim
from ..model.signature import MemRefSpec, UnrankedSpec
from .descriptors import is_array, plain_array

_NOT_CALLED = object()


def _is_shape(value: Any) -> bool:
    if not isinstance(value, (tuple, list)):
        return False
    try:
        for d in value:
            operator.index(d)
    except TypeError:
        return False
    return True


def _shape_of(value: Any) -> tuple[int, ...]:
    """``value``'s shape: an ndarray's (a subclass's too) as its C fields say, anything else as numpy reads it."""
    return plain_array(value).shape if is_array(value) else tuple(np.shape(value))


def allocation_error(what: str, shape: tuple[int, ...], dtype: np.dtype, fix: str) -> AllocationError:
    """The error for an array of ``shape`` and ``dtype`` that memory could not be had for: ``what`` names
    the kernel and the array ("k(): cannot allocate output 'out'"), ``fix`` says what to do instead."""
    size = float(np.prod([float(d) for d in shape])) * dtype.itemsize
    return AllocationError(f"{what} of shape {shape} and dtype {dtype.name} ({size / 2**30:.3g} GiB): "
                           f"not enough memory. {fix}")


def zeros(kernel: str, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero-filled output; AllocationError or ShapeError naming the kernel and output if numpy cannot make it."""
    try:
        return np.zeros(shape, dtype=dtype)
    except MemoryError:
        raise allocation_error(f"{kernel}(): cannot allocate output '{name}'", shape, dtype,
                               "Pass out= with an array you allocated.") from None
    except ValueError as exc:
        raise ShapeError(
            f"{kernel}(): cannot allocate output '{name}' of shape {shape} and dtype {dtype.name}: {exc}. "
            "Pass out= with an array of the shape the kernel needs."
        ) from None


class OutputAllocator:
    """Allocates zero-filled arrays for the outputs that ``out=`` leaves out."""

    def __init__(
        self,
        kernel: str,
        outputs: Sequence[tuple[str, MemRefSpec | UnrankedSpec]],
        inputs: Sequence[tuple[int, MemRefSpec]],
        shape_function: Callable[..., Any],
        sources: Sequence[tuple[Dim | int | None, ...] | None] = (),
    ) -> None:
        self.kernel = kernel
        self.outputs = tuple(outputs)
        self.shape_function = shape_function
        # Per output: its static shape (None if it has a `?` dim) and the inputs of its shape pattern.
        self._static: tuple[tuple[int, ...] | None, ...] = tuple(
            tuple(d for d in spec.shape if d is not None)
            if isinstance(spec, MemRefSpec) and None not in spec.shape else None
            for _, spec in self.outputs
        )
        self._dtypes = tuple(spec.element.dtype for _, spec in self.outputs)
        # Per output: where each dim's size comes from, when the ties give every dim of it.
        self._tied = tuple(
            s if s is not None and all(d is not None for d in s) else None
            for s in (tuple(sources) or (None,) * len(self.outputs))
        )
        self._like = tuple(
            tuple(j for j, input_spec in inputs if isinstance(spec, MemRefSpec) and input_spec.same_pattern(spec))
            for _, spec in self.outputs
        )
        self.shaped_in_python = any(static is None and tied is None for static, tied in zip(self._static, self._tied))
        """Whether an output's shape may have to come from the Python function (neither static nor tied)."""

    def shaped_only_by_function(self) -> tuple[str, ...]:
        """The outputs whose shape only the Python function can give: neither static nor tied, and no input
        has their shape pattern."""
        return tuple(name for (name, _), static, tied, like in zip(self.outputs, self._static, self._tied, self._like)
                     if static is None and tied is None and not like)

    def allocate_all(self, values: Sequence[Any]) -> tuple[Any, ...]:
        """New zeroed arrays for every output (the call gave no ``out=``); one output is the quick case."""
        if len(self.outputs) == 1:
            static = self._static[0]
            name = self.outputs[0][0]
            if static is not None:
                return (zeros(self.kernel, name, static, self._dtypes[0]),)
            tied = self._tied_shape(0, values)
            if tied is not None:
                return (zeros(self.kernel, name, tied, self._dtypes[0]),)
            returned = self.shape_function(*values)
            shape = self._like_shape(0, values) if returned is None else None
            if shape is not None:
                return (zeros(self.kernel, name, shape, self._dtypes[0]),)
            return self.allocate(values, (None,), self._normalized(returned))
        return self.allocate(values, (None,) * len(self.outputs))

    def allocate(self, values: Sequence[Any], given: Sequence[Any], returned: Any = _NOT_CALLED) -> tuple[Any, ...]:
        """The arrays for every output: ``given[i]`` where not None, else a new zeroed array.

        ``returned`` is what the decorated function returned, normalized, if it was already called.
        """
        arrays = list(given)
        for i, (name, spec) in enumerate(self.outputs):
            if arrays[i] is not None:
                continue
            static = self._static[i]
            if static is not None:
                arrays[i] = zeros(self.kernel, name, static, spec.element.dtype)
                continue
            tied = self._tied_shape(i, values)
            if tied is not None:
                arrays[i] = zeros(self.kernel, name, tied, spec.element.dtype)
                continue
            ranked = self._ranked(name, spec)
            if returned is _NOT_CALLED:
                returned = self._returned_shapes(values)
            shape = self._shape(i, name, ranked, returned[i], values, _shape_of)
            arrays[i] = zeros(self.kernel, name, shape, spec.element.dtype)
        return tuple(arrays)

    def shapes(self, values: Sequence[Any], shape_of: Callable[[Any], tuple[Any, ...]]) -> tuple[tuple[Any, ...], ...]:
        """Every output's shape, derived as :meth:`allocate` derives it, from ``values`` whose shapes
        ``shape_of`` reads: another library's arrays (torch's fake tensors, JAX's tracers), whose sizes may be
        symbolic (torch's ``SymInt``); the rules only copy and compare them. The shape function gets ``values``."""
        returned: Any = _NOT_CALLED
        shapes: list[tuple[Any, ...]] = []
        for i, (name, spec) in enumerate(self.outputs):
            static, sources = self._static[i], self._tied[i]
            if static is not None:
                shapes.append(static)
            elif sources is not None:
                shapes.append(tuple(shape_of(values[s.arg])[s.dim] if isinstance(s, Dim) else s for s in sources))
            else:
                ranked = self._ranked(name, spec)
                if returned is _NOT_CALLED:
                    returned = self._returned_shapes(values)
                shapes.append(self._shape(i, name, ranked, returned[i], values, shape_of))
        return tuple(shapes)

    def _ranked(self, name: str, spec: MemRefSpec | UnrankedSpec) -> MemRefSpec:
        if isinstance(spec, UnrankedSpec):
            raise ShapeError(
                f"{self.kernel}(): output '{name}' is {spec.mlir}, whose rank is unknown, so "
                f"memkernel cannot allocate it. Pass out= with an array of dtype {spec.element.dtype.name}."
            )
        return spec

    def _tied_shape(self, i: int, values: Sequence[Any]) -> tuple[int, ...] | None:
        """Output ``i``'s shape from the input dims tied to it; None unless every dim is tied and every
        input it reads is an exact ndarray (anything else, a subclass included, is converted, once, by the checked
        path first)."""
        sources = self._tied[i]
        if sources is None:
            return None
        shape = []
        for source in sources:
            if isinstance(source, Dim):
                value = values[source.arg]
                if type(value) is not np.ndarray or value.ndim <= source.dim:
                    return None
                shape.append(value.shape[source.dim])
            else:
                assert source is not None
                shape.append(source)
        return tuple(shape)

    def _returned_shapes(self, values: Sequence[Any]) -> tuple[Any, ...]:
        """What the decorated function returns, one entry (a shape or None) per output."""
        return self._normalized(self.shape_function(*values))

    def _normalized(self, returned: Any) -> tuple[Any, ...]:
        count = len(self.outputs)
        if returned is None:
            return (None,) * count
        if count == 1 and _is_shape(returned):
            return (tuple(returned),)
        if isinstance(returned, (tuple, list)) and len(returned) == count and all(
                r is None or _is_shape(r) for r in returned):
            return tuple(returned)
        expected = "a shape tuple" if count == 1 else f"a tuple of {count} shape tuples (or None)"
        raise ShapeError(
            f"{self.kernel}(): the decorated function returned {returned!r}; to give the output "
            f"shapes it must return {expected}, or None."
        )

    def _shape(self, i: int, name: str, spec: MemRefSpec, returned: Any, values: Sequence[Any],
               shape_of: Callable[[Any], tuple[Any, ...]]) -> tuple[int, ...]:
        if returned is not None:
            shape = tuple(operator.index(d) for d in returned)
            self._check(name, spec, shape)
            return shape
        agreed = self._like_shape(i, values, shape_of)
        if agreed is not None:
            return agreed
        like = {tuple(shape_of(values[j])) for j in self._like[i]}
        reason = (
            "the inputs of that shape pattern disagree: " + ", ".join(str(s) for s in sorted(like))
            if like else "no input has that shape pattern"
        )
        raise ShapeError(
            f"{self.kernel}(): cannot derive the shape of output '{name}' ({spec.mlir}): {reason}. "
            f"Return the output shapes from the decorated function (e.g. `return {self._example()}`), "
            f"or pass out=."
        )

    def _like_shape(self, i: int, values: Sequence[Any],
                    shape_of: Callable[[Any], tuple[Any, ...]] = _shape_of) -> tuple[int, ...] | None:
        """The shape shared by every input of output ``i``'s shape pattern; None if none or they disagree."""
        shape = None
        for j in self._like[i]:
            value = values[j]
            found = value.shape if type(value) is np.ndarray else tuple(shape_of(value))
            if shape is None:
                shape = found
            elif found != shape:
                return None
        return shape

    def _example(self) -> str:
        """A value for the decorated function to return that gives every output's shape."""
        shapes = []
        for _, spec in self.outputs:
            dims = ["n" if d is None else str(d) for d in getattr(spec, "shape", ("n",))]
            shapes.append(f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})")
        return shapes[0] if len(shapes) == 1 else f"({', '.join(shapes)})"

    def _check(self, name: str, spec: MemRefSpec, shape: tuple[int, ...]) -> None:
        wrong = len(shape) != spec.rank or any(d < 0 for d in shape) or any(
            want is not None and want != have for want, have in zip(spec.shape, shape))
        if wrong:
            raise ShapeError(
                f"{self.kernel}(): the decorated function gave shape {shape} for output '{name}', "
                f"which does not fit {spec.mlir}."
            )


def allocator_for(spec: KernelSpec, shape_function: Callable[..., Any]) -> OutputAllocator:
    """The allocator of ``spec``'s outputs, shaped by its ties, then ``shape_function``, then like inputs."""
    return OutputAllocator(
        spec.name,
        [(c.name, c.spec) for c in spec.contracts[spec.n_inputs:]],  # type: ignore[misc]
        [(i, a) for i, a in enumerate(spec.signature.args[:spec.n_inputs]) if isinstance(a, MemRefSpec)],
        shape_function,
        spec.output_sources(),
    )
