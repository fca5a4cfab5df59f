"""``kernel.as_torch_op(name)``: the kernel as a torch custom op, its fake implementation derived.

:func:`make_torch_op` registers the kernel with ``torch.library.custom_op``.
The op's schema comes from the kernel's parameters: a memref (or tensor)
parameter is a ``Tensor``, a scalar a ``float``, ``int`` or ``bool``; the
parameters the write analysis says the kernel may write are ``mutates_args``;
the op returns the outputs memkernel allocates, then the kernel's results,
as new tensors. The fake (meta) implementation checks the arguments'
contracts and the shape rules, then makes empty tensors of the shapes the
:class:`~memkernel.interop.op_plan.OpPlan` derives, with the allocator's own
rules; under ``torch.compile(dynamic=True)`` those sizes are ``SymInt``
expressions of the inputs' sizes. The real implementation hands the CPU
tensors to the kernel as numpy arrays sharing their memory (``Tensor.numpy()``)
and returns the arrays it allocates as tensors sharing theirs
(``torch.from_numpy``). Autograd is left to the user
(``torch.library.register_autograd``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..call.dlpack import TORCH, read_only_reason
from ..errors import ArgumentError, SignatureError
from ..model.contract import BufferContract, ScalarContract
from ..model.dtypes import dtype_expression
from .op_plan import OpPlan, as_tuple

_ML_DTYPES = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
              "float8_e4m3fnuz": torch.float8_e4m3fnuz, "float8_e5m2fnuz": torch.float8_e5m2fnuz}
"""The ml_dtypes element types torch has, by name: their tensors travel as unsigned integers of their size."""

_BITS = {1: torch.uint8, 2: torch.uint16}
_REGISTERED: dict[str, str] = {}
"""The ops memkernel registered in this process: their name, and the name of the kernel each calls."""
_SCALARS: dict[str, type] = {"bool": bool, "int": int, "float": float}


def torch_dtype(dtype: np.dtype) -> torch.dtype | None:
    """The torch dtype of numpy ``dtype``; None if torch has none."""
    if dtype.name in _ML_DTYPES:
        return _ML_DTYPES[dtype.name]
    try:
        return torch.from_numpy(np.empty(0, dtype)).dtype
    except TypeError:
        return None


_NUMPY_DTYPES = {t: d for d in map(np.dtype, ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                               "uint64", "float16", "float32", "float64", "complex64", "complex128"])
                 if (t := torch_dtype(d)) is not None}
"""The numpy dtype of each torch dtype that has one (ml_dtypes' aside), read outside any fake mode."""


def _to_numpy(tensor: torch.Tensor, dtype: np.dtype) -> np.ndarray:
    """A numpy array sharing ``tensor``'s memory (a detached CPU tensor without conjugate or negative bits)."""
    if dtype.name in _ML_DTYPES:
        return tensor.view(_BITS[dtype.itemsize]).numpy().view(dtype)
    return tensor.numpy()


def _to_tensor(value: Any, dtype: np.dtype, inputs: list[Any]) -> torch.Tensor:
    """A tensor sharing the memory of the array the kernel returned (a copy if it may share an input's)."""
    array = np.asarray(value, dtype)
    if not array.flags.writeable or any(isinstance(x, np.ndarray) and np.may_share_memory(array, x) for x in inputs):
        array = array.copy()
    if dtype.name in _ML_DTYPES:
        return torch.from_numpy(array.view(f"u{dtype.itemsize}")).view(_ML_DTYPES[dtype.name])
    return torch.from_numpy(array)


def _torch_cast(name: str, dtype: np.dtype) -> str:
    """The fix for a tensor of the wrong dtype: ``x.to(torch.float32)``."""
    expected = torch_dtype(dtype)
    return f"{name}.to({expected})" if expected is not None else f"{name}.astype({dtype_expression(dtype)})"


class _Arguments:
    """Turns the op's arguments into the kernel's: CPU tensors of an accepted dtype into numpy arrays."""

    def __init__(self, plan: OpPlan, made_by: str) -> None:
        self.plan = plan
        self.written = [k for k, c in enumerate(plan.inputs) if isinstance(c, BufferContract) and c.may_write]
        self.accepted: list[dict[torch.dtype, np.dtype] | None] = []
        for contract in plan.inputs:
            if isinstance(contract, ScalarContract):
                self.accepted.append(None)
                continue
            accepted = {t: d for d in contract.dtypes if (t := torch_dtype(d)) is not None}
            if not accepted:
                raise SignatureError(f"{plan.name}.{made_by}: argument '{contract.name}' is {contract.spec.mlir}, "
                                     f"whose element type {contract.element.dtype.name} torch has no dtype for.")
            self.accepted.append(accepted)

    def numpy_dtype(self, tensor: torch.Tensor) -> np.dtype | None:
        """``tensor``'s dtype as numpy's: the kernel's own first (ml_dtypes' among them), then numpy's builtin."""
        for accepted in self.accepted:
            if accepted is not None and tensor.dtype in accepted:
                return accepted[tensor.dtype]
        return _NUMPY_DTYPES.get(tensor.dtype)

    def convert(self, args: tuple[Any, ...]) -> list[Any]:
        values = []
        for k, (contract, accepted, value) in enumerate(zip(self.plan.inputs, self.accepted, args)):
            if accepted is None:
                values.append(value)
                continue
            assert isinstance(contract, BufferContract)
            dtype = accepted.get(value.dtype)
            if dtype is None:
                raise ArgumentError(f"{contract.where()} ({contract.expectation()}); got a {value.dtype} tensor of "
                                    f"shape {tuple(value.shape)}. Pass {_torch_cast(contract.name, contract.element.dtype)}.")
            if value.layout != torch.strided:
                raise ArgumentError(f"{contract.where()}; got a {value.layout} tensor. A kernel reads dense memory: "
                                    f"pass {contract.name}.to_dense().")
            if value.device.type != "cpu":
                raise ArgumentError(f"{contract.where()}; got a tensor on {value.device}. memkernel kernels run on "
                                    f"the CPU: pass {contract.name}.cpu() (and copy the result back).")
            if k in self.written and value.is_inference() and not torch.is_inference_mode_enabled():
                raise ArgumentError(f"{contract.where()}; got a read-only torch.Tensor for an argument the kernel "
                                    f"may write: {read_only_reason(value, TORCH, contract.name)}.")
            tensor = value.detach()
            if tensor.is_conj():
                tensor = tensor.resolve_conj()
            if tensor.is_neg():
                tensor = tensor.resolve_neg()
            values.append(_to_numpy(tensor, dtype))
        for k in self.written:  # an input the kernel writes is read by the others as it was before the call
            for j, value in enumerate(values):
                if j != k and j not in self.written and isinstance(value, np.ndarray) and np.may_share_memory(
                        value, values[k]):
                    values[j] = value.copy()
        return values


def _signature(plan: OpPlan, made_by: str) -> inspect.Signature:
    """The op's Python signature, which torch reads its schema from."""
    params = []
    for contract, parameter in zip(plan.inputs, plan.spec.parameters):
        if isinstance(contract, BufferContract):
            params.append(inspect.Parameter(parameter.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            annotation=torch.Tensor))
            continue
        kind = _SCALARS.get(contract.element.kind)
        if kind is None:
            raise SignatureError(f"{plan.name}.{made_by}: argument '{contract.name}' is a {contract.spec.mlir} "
                                 "scalar, which a torch op schema cannot take (only float, int and bool).")
        default = parameter.default if isinstance(parameter.default, (bool, int, float)) else inspect.Parameter.empty
        params.append(inspect.Parameter(parameter.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind,
                                        default=default))
    count = len(plan.returned)
    returns: Any = None if count == 0 else torch.Tensor if count == 1 else tuple[(torch.Tensor,) * count]  # type: ignore[misc]
    return inspect.Signature(params, return_annotation=returns)


def make_torch_op(kernel: Callable[..., Any], plan: OpPlan, qualname: str) -> Any:
    """Register ``kernel`` (whose plan is ``plan``) as the torch custom op ``qualname`` (``"namespace::name"``);
    returns torch's ``CustomOpDef``, callable like ``torch.ops.namespace.name``. Raises SignatureError for a
    kernel no op schema describes, or a name torch refuses."""
    made_by = f"as_torch_op({qualname!r})"
    arguments = _Arguments(plan, made_by)
    dtypes = [r.dtype for r in plan.returned]
    torch_dtypes = []
    for r in plan.returned:
        t = torch_dtype(r.dtype)
        if t is None:
            raise SignatureError(f"{plan.name}.{made_by}: it returns {r.name} of element type {r.dtype.name}, "
                                 "which torch has no dtype for.")
        torch_dtypes.append(t)
    count = len(dtypes)

    def finish(tensors: tuple[torch.Tensor, ...]) -> Any:
        return None if count == 0 else tensors[0] if count == 1 else tensors

    signature = _signature(plan, made_by)
    n_inputs = len(plan.inputs)

    def full(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """Every parameter's value: torch leaves out trailing arguments that equal their defaults."""
        if len(args) == n_inputs and not kwargs:
            return args
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return tuple(bound.arguments.values())

    def run(*args: Any, **kwargs: Any) -> Any:
        values = arguments.convert(full(args, kwargs))
        returned = as_tuple(kernel(*values), count)
        return finish(tuple(_to_tensor(v, d, values) for v, d in zip(returned, dtypes)))

    def shape_of(value: Any) -> tuple[Any, ...]:
        return tuple(value.shape)

    def cast(name: str, dtype: np.dtype) -> str:
        return _torch_cast(name, dtype)

    def fake(*args: Any, **kwargs: Any) -> Any:
        args = full(args, kwargs)
        shapes = plan.checked_shapes(args, arguments.numpy_dtype, shape_of, cast)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        return finish(tuple(torch.empty(s, dtype=t, device=device) for s, t in zip(shapes, torch_dtypes)))

    _claim(qualname, plan.name, made_by)
    run.__name__ = run.__qualname__ = plan.name
    run.__signature__ = signature  # type: ignore[attr-defined]
    try:
        op = torch.library.custom_op(qualname, run, mutates_args=plan.written)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise SignatureError(f"{plan.name}.{made_by}: torch refuses the op: {exc}") from exc
    op.register_fake(fake)
    _REGISTERED[qualname] = plan.name
    return op


def _exists(qualname: str) -> bool:
    namespace, _, name = qualname.partition("::")
    try:
        return hasattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return False


def _claim(qualname: str, kernel: str, made_by: str) -> None:
    """Refuse ``qualname`` if an op of that name exists that is not an earlier registration of a kernel of the
    same name (a notebook cell run again), which torch would silently replace."""
    owner = _REGISTERED.get(qualname)
    if owner is not None and owner != kernel:
        raise SignatureError(f"{kernel}.{made_by}: the op {qualname} already calls the kernel @{owner}; "
                             "give this one another name.")
    if owner is None and _exists(qualname):
        raise SignatureError(f"{kernel}.{made_by}: torch already has an op {qualname}; give this one another name.")

