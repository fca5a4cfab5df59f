"""``kernel.as_jax()``: the kernel as a JAX function, usable inside ``jax.jit``, through ``jax.ffi.ffi_call``.

:func:`make_jax_function` registers the kernel's XLA FFI handler
(:mod:`memkernel.interop.xla_handler`, no C++) and returns a function of the
kernel's parameters. Traced (under ``jax.jit``, ``jax.vmap``), it checks the
arguments' contracts and the shape rules on the abstract arrays (memkernel's
ArgumentError and ShapeError, at trace time), derives the result shapes and
dtypes from the :class:`~memkernel.interop.op_plan.OpPlan` (the allocator's
own rules), and stages an ``ffi_call``: XLA allocates the results and the
handler runs the kernel on its buffers in place. Called on concrete arrays
outside a trace, it runs the kernel directly. JAX arrays are immutable: the new
values of parameters the kernel writes in place are returned after its outputs
and results, and the kernel writes a copy. ``vmap_method="sequential"``:
under ``jax.vmap`` the kernel runs once per batch element.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..call.binders import CallState, binder_for
from ..errors import ArgumentError
from ..model.contract import BufferContract
from ..model.dtypes import dtype_expression
from .op_plan import OpPlan, as_tuple
from .xla_handler import Constants, Handler

_TARGETS = itertools.count()
_HANDLERS: list[Handler] = []
"""Every handler registered with XLA in this process: XLA keeps their addresses for good."""

VMAP_METHOD = "sequential"
"""How ``jax.vmap`` runs the FFI call: one kernel call per batch element (the kernel knows no batch dim)."""


def _shape_of(value: Any) -> tuple[Any, ...]:
    return tuple(value.shape)


def _dtype_of(value: Any) -> np.dtype:
    return np.dtype(value.dtype)


def _cast(name: str, dtype: np.dtype) -> str:
    return f"{name}.astype({dtype_expression(dtype).replace('np.', 'jnp.')})"


def _needs_x64(dtype: np.dtype) -> bool:
    return dtype.itemsize == 8 and dtype.kind in "iuf" or dtype.itemsize == 16 and dtype.kind == "c"


def make_jax_function(kernel: Callable[..., Any], plan: OpPlan) -> Callable[..., Any]:
    """A JAX function of ``kernel``'s parameters (``plan`` is its plan) returning its outputs, then its
    results, then the new values of the parameters it writes: None for none, the value for one, else a tuple."""
    spec = plan.spec
    signature = inspect.Signature(list(spec.parameters))
    written = [i for i, c in enumerate(plan.inputs) if isinstance(c, BufferContract) and c.may_write]
    count = len(plan.returned) + len(written)
    x64_dtypes = sorted({c.element.dtype.name for c in plan.inputs
                         if isinstance(c, BufferContract) and all(_needs_x64(d) for d in c.dtypes)}
                        | {r.dtype.name for r in plan.returned if _needs_x64(r.dtype)})

    binders = [binder_for(c) for c in plan.inputs]
    constants = Constants()
    handler = Handler(kernel, plan, constants)
    target = f"memkernel_{spec.name}_{next(_TARGETS)}"
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler.function), platform="cpu")
    _HANDLERS.append(handler)

    def run(values: list[Any]) -> tuple[np.ndarray, ...]:
        """The kernel on the host: ``values`` are numpy arrays and Python or numpy scalars."""
        for i in written:
            values[i] = np.array(values[i], copy=True)
        returned = as_tuple(kernel(*values), len(plan.returned))
        return tuple(np.asarray(v, r.dtype) for v, r in zip(returned, plan.returned)) + tuple(values[i]
                                                                                               for i in written)

    def finish(results: tuple[Any, ...]) -> Any:
        return None if count == 0 else results[0] if count == 1 else tuple(results)

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise ArgumentError(f"{spec.name}(): {exc}") from None
        bound.apply_defaults()
        values = list(bound.arguments.values())
        for k, (contract, value) in enumerate(zip(plan.inputs, values)):
            if isinstance(contract, BufferContract) and not (hasattr(value, "dtype") and hasattr(value, "shape")):
                values[k] = binders[k].check(value, CallState())  # Python numbers: converted as a call would
            elif not isinstance(contract, BufferContract) and isinstance(value, jax.core.Tracer) and value.shape:
                raise ArgumentError(f"{contract.where()}; got an array {_dtype_of(value).name}"
                                    f"[{', '.join(map(str, value.shape))}]. Pass one number (a 0-d array).")
        if x64_dtypes and not jax.config.read("jax_enable_x64"):
            raise ArgumentError(f"{spec.name}(): the kernel takes or returns {', '.join(x64_dtypes)}, which JAX "
                                "holds only with 64-bit types enabled: jax.config.update('jax_enable_x64', True).")
        shapes = plan.checked_shapes(values, _dtype_of, _shape_of, _cast)
        operands = [k for k, (c, v) in enumerate(zip(plan.inputs, values))
                    if isinstance(c, BufferContract) or isinstance(v, jax.core.Tracer)]
        if not any(isinstance(values[k], jax.core.Tracer) for k in operands):  # concrete arrays: a plain call
            host = [np.asarray(v) if k in operands else v for k, v in enumerate(values)]
            return finish(tuple(jnp.asarray(x) for x in run(host)))
        results = [jax.ShapeDtypeStruct(s, r.dtype) for s, r in zip(shapes, plan.returned)]
        results += [jax.ShapeDtypeStruct(values[i].shape, values[i].dtype) for i in written]
        number = np.int32(constants.number(values, [(k, _dtype_of(values[k])) for k in operands]))
        returned = jax.ffi.ffi_call(target, results, vmap_method=VMAP_METHOD)(number, *(values[k] for k in operands))
        return finish(tuple(returned))

    call.__name__ = call.__qualname__ = spec.name
    call.__doc__ = f"The memkernel kernel @{spec.name} as a JAX function (see Kernel.as_jax)."
    call.__signature__ = signature  # type: ignore[attr-defined]
    return call

