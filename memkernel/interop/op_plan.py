"""What a kernel is as an op of another array library (torch, JAX), read once from its spec.

:func:`op_plan` reads the :class:`~memkernel.model.kernel_spec.KernelSpec`
into an :class:`OpPlan`: which parameters are arrays and which scalars, which
arrays the kernel writes in place, and what the op returns (the outputs memkernel
allocates, then the kernel's results) with each one's dtype. The outputs' shapes
come from the same :class:`~memkernel.call.allocation.OutputAllocator` a numpy call
allocates with (static dims, tied dims, named dims, the shape function, inputs
of the same shape pattern), applied to the other library's arrays; so an op's
shapes and a call's never disagree. A kernel whose returns cannot be described
that way, or whose callbacks would be side effects the library does not see,
is a :class:`~memkernel.errors.SignatureError` naming the kernel and the reason.

:meth:`OpPlan.check` applies the argument contracts (dtype, rank, static dims)
and the shape rules to the other library's arrays while it traces, so a wrong
argument is memkernel's error at trace time, before anything runs.
"""

from __future__ import annotations

import dis
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..call.allocation import OutputAllocator, allocator_for
from ..errors import ArgumentError, ShapeError, SignatureError
from ..model.contract import BufferContract, ScalarContract
from ..model.dtypes import describe_dtype
from ..model.kernel_spec import KernelSpec
from ..model.signature import MemRefSpec, ScalarSpec

ShapeOf = Callable[[Any], tuple[Any, ...]]


@dataclass(frozen=True)
class Returned:
    """One value the op returns: an output memkernel allocates (``shape`` None: derived per call) or a
    result of the kernel (its shape fixed by its type; ``()`` for a scalar)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...] | None


@dataclass(frozen=True)
class OpPlan:
    """A kernel as another library's op: its parameters' contracts, what it writes, what it returns."""

    spec: KernelSpec
    allocator: OutputAllocator
    returned: tuple[Returned, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def inputs(self) -> tuple[BufferContract | ScalarContract, ...]:
        """The contracts of the Python parameters, in order."""
        return self.spec.contracts[:self.spec.n_inputs]

    @property
    def written(self) -> tuple[str, ...]:
        """The names of the parameters the kernel may write in place."""
        return tuple(c.name for c in self.inputs if isinstance(c, BufferContract) and c.may_write)

    def shapes(self, values: Sequence[Any], shape_of: ShapeOf) -> tuple[tuple[Any, ...], ...]:
        """The shape of every returned value, for the parameters ``values`` (arrays read by ``shape_of``)."""
        outputs = self.allocator.shapes(values, shape_of) if self.spec.n_outputs else ()
        return tuple(outputs) + tuple(r.shape for r in self.returned[len(outputs):] if r.shape is not None)

    def checked_shapes(self, values: Sequence[Any], dtype_of: Callable[[Any], np.dtype | None], shape_of: ShapeOf,
                       cast: Callable[[str, np.dtype], str]) -> tuple[tuple[Any, ...], ...]:
        """The shape of every returned value (see :meth:`shapes`), once ``values`` are checked: memkernel's
        ArgumentError or ShapeError if they break a contract or a shape rule, or if the outputs they shape
        would (a bound the decorated function's shape breaks), as the call would raise.

        ``dtype_of`` gives an array's element type as a numpy dtype (None: the library's dtype has no numpy
        counterpart), ``shape_of`` its shape (sizes may be symbolic, which the rules only compare), ``cast``
        the library's expression that converts argument ``name`` to a dtype (``x.to(torch.float32)``)."""
        shapes: list[tuple[Any, ...] | None] = []
        for contract, value in zip(self.inputs, values):
            if isinstance(contract, ScalarContract):
                shapes.append(None)
                continue
            shape, dtype = tuple(shape_of(value)), dtype_of(value)
            given = f"{describe_dtype(dtype) if dtype is not None else 'a dtype numpy lacks'}" \
                    f"[{', '.join(str(d) for d in shape)}]"
            where = f"{contract.where()} ({contract.expectation()}); got {given}"
            ranked = contract.rank is None or len(shape) == contract.rank
            if not ranked or dtype not in contract.dtypes:
                fix = contract.name if dtype in contract.dtypes else cast(contract.name, contract.element.dtype)
                raise ArgumentError(f"{where}. Pass {fix}{'' if ranked else f' with shape {contract.shape_text()}'}.")
            for k, size in contract.static_dims:  # as the call's binder says it: a ShapeError
                if shape[k] != size:
                    raise ShapeError(f"{where}: dim {k} is {shape[k]}, not {size}. Pass {contract.name} with shape "
                                     f"{contract.shape_text()}.")
            shapes.append(shape)
        names, allocated = self.spec.argument_names, range(self.spec.n_inputs, len(self.spec.contracts))
        self.spec.shapes.check(self.name, names, shapes + [None] * self.spec.n_outputs, allocated)
        returned = self.shapes(values, shape_of)
        self.spec.shapes.check(self.name, names, shapes + list(returned[:self.spec.n_outputs]), allocated)
        return returned


def returns_nothing(function: Callable[..., Any]) -> bool:
    """Whether ``function``'s body returns None whatever it is given (a docstring, ``pass``, ``return None``)."""
    code = getattr(function, "__code__", None)
    if code is None:
        return False
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in ("RESUME", "NOP", "CACHE")]
    return ops in ([("RETURN_CONST", None)], [("LOAD_CONST", None), ("RETURN_VALUE", None)])


def op_plan(spec: KernelSpec, function: Callable[..., Any], callbacks: bool, made_by: str) -> OpPlan:
    """The plan of ``spec``'s kernel as an op, its outputs shaped by ``function``'s body where the rules need
    it. Raises SignatureError, starting ``<kernel>.<made_by>: ``, for a kernel an op cannot describe."""
    where = f"{spec.name}.{made_by}"
    if callbacks:
        raise SignatureError(f"{where}: the kernel calls Python through callbacks=, side effects the op cannot "
                             "declare (it is taken as pure: traced once, reordered or dropped when unused). "
                             "Decorate it without callbacks.")
    allocator = allocator_for(spec, function)
    returned = []
    for contract in spec.contracts[spec.n_inputs:]:
        assert isinstance(contract, BufferContract)
        if not isinstance(contract.spec, MemRefSpec):
            raise SignatureError(f"{where}: output '{contract.name}' is {contract.spec.mlir}, whose rank is "
                                 "unknown, so no rule gives its shape. Give it a ranked memref type.")
        returned.append(Returned(contract.name, contract.element.dtype, None))
    unshaped = allocator.shaped_only_by_function()
    if unshaped and returns_nothing(function):
        raise SignatureError(
            f"{where}: output '{unshaped[0]}' has a ? dim that neither the kernel's ops nor the dim names tie to "
            "an input, no input has its shape pattern, and the decorated function returns no shape, so the op's "
            "output shape cannot be derived. Name its dims after the inputs' (-> \"n\"), or return its shape "
            "from the function.")
    for k, result in enumerate(spec.signature.results):
        if isinstance(result, ScalarSpec):
            returned.append(Returned(f"result {k}", result.element.dtype, ()))
        elif isinstance(result, MemRefSpec) and None not in result.shape:
            static = tuple(d for d in result.shape if d is not None)
            returned.append(Returned(f"result {k}", result.element.dtype, static))
        else:
            raise SignatureError(
                f"{where}: result {k} ({result.mlir}) has a dim no rule gives before the call, so the op's "
                "output shape cannot be derived. Write it into an output memref argument instead (destination "
                "passing), whose dims the ops tie to the inputs'.")
    return OpPlan(spec, allocator, tuple(returned))


def as_tuple(value: Any, count: int) -> tuple[Any, ...]:
    """A kernel call's return value as a tuple of ``count`` values (a call returns None, a value or a tuple)."""
    if count == 0:
        return ()
    return (value,) if count == 1 else tuple(value)
