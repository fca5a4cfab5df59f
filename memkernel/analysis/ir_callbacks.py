"""The Python functions MLIR's C++ code calls back: walks over the IR, and the bindings' attribute casters.

A Python exception that escapes such a callback does not come back as
itself. From a walk's callback it becomes a bare ``RuntimeError("Exception
raised in callback: ...")``; from an attribute caster, C++ ``terminate``:
the process aborts. So:

- :func:`walk` runs a visitor over the IR and raises what it raised as a
  :class:`~memkernel.errors.CompileError` naming the op (a
  :class:`~memkernel.errors.MemkernelError` or a ``KeyboardInterrupt`` as it is).
- :func:`install_attribute_casters` replaces the bindings' caster of dense
  integer and float constants, which raises ``TypeError: Can't cast unknown
  element type DenseIntOrFPElementsAttr`` for a complex constant
  (``dense<(1.0,5.0)> : tensor<3x3xcomplex<f32>>``): reading such an
  attribute (``op.attributes[i].attr``, ``op.value``) aborted the process.
  The replacement gives the bindings' classes for integers and floats, and a
  plain ``DenseElementsAttr`` for anything else; it never raises.
"""

from __future__ import annotations

import _thread
import functools
from collections.abc import Callable

from mlir import ir

from ..errors import CompileError, MemkernelError

Visitor = Callable[[ir.Operation], object]
"""Called on each op; returning ``ir.WalkResult.INTERRUPT`` ends the walk, anything else goes on."""


def walk(operation: ir.Operation, visit: Visitor, order: ir.WalkOrder = ir.WalkOrder.POST_ORDER) -> None:
    """Call ``visit`` on ``operation`` and every op nested in it, in ``order``.

    An exception ``visit`` raises ends the walk and is raised here: a
    MemkernelError or a BaseException that is not an Exception as it is, any
    other as a CompileError naming the op, its location and the exception.
    """
    raised: list[tuple[ir.Operation, BaseException]] = []

    def callback(op: ir.Operation) -> ir.WalkResult:
        try:
            result = visit(op)
        except BaseException as exc:  # noqa: BLE001 - raised below, once the walk has returned
            raised.append((op, exc))
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.INTERRUPT if result == ir.WalkResult.INTERRUPT else ir.WalkResult.ADVANCE

    operation.walk(callback, order)
    if not raised:
        return
    op, exc = raised[0]
    if isinstance(exc, MemkernelError) or not isinstance(exc, Exception):
        raise exc
    raise CompileError(
        f"memkernel failed reading the IR at {op.name} ({op.location}): {type(exc).__name__}: {exc}"
    ) from exc


def _dense_elements(attribute: ir.Attribute) -> ir.Attribute:
    """The Python class for a dense integer or float constant: never raises (see the module's docstring)."""
    try:
        for view in (ir.DenseFPElementsAttr, ir.DenseIntElementsAttr):
            try:
                return view(attribute)
            except ValueError:
                continue
        return ir.DenseElementsAttr(attribute)
    except KeyboardInterrupt:
        _thread.interrupt_main()  # delivered again once the bindings are back in Python
        return attribute
    except BaseException:  # noqa: BLE001 - an exception here would abort the process
        return attribute


@functools.lru_cache(maxsize=None)
def install_attribute_casters() -> None:
    """Replace the bindings' caster of dense integer and float constants, once per process.

    Needs a current context. The casters are the bindings' process-wide
    registry: the replacement applies to every context, the user's own too.
    """
    typeid = ir.Attribute.parse("dense<0.0> : tensor<1xf32>").typeid
    ir.register_type_caster(typeid, replace=True)(_dense_elements)
