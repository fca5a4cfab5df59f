"""``checked=True``'s checks of integer division: a ``cf.assert`` before each division that would trap.

On x86 an integer division by zero, or of the smallest signed integer by -1, raises
SIGFPE, which ends the process; ``generate-runtime-verification`` checks memory
accesses only. So, when a kernel is checked, each ``arith`` and ``index`` integer
division and remainder gets its divisor checked first (for vectors, every lane), and each signed
one its operands too; a failed check is a KernelAssertionError like any other
(see :mod:`memkernel.compile.assertions`), pointing at the division's line.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, cf, vector

from ..analysis.ir_callbacks import walk
from .assertions import located

_UNSIGNED = ("arith.divui", "arith.remui", "arith.ceildivui", "index.divu", "index.remu", "index.ceildivu")
_SIGNED = ("arith.divsi", "arith.remsi", "arith.ceildivsi", "arith.floordivsi", "index.divs", "index.rems",
           "index.ceildivs", "index.floordivs")
_INDEX_BITS = 64


def _bits(element: ir.Type) -> int | None:
    if isinstance(element, ir.IndexType):
        return _INDEX_BITS
    if isinstance(element, ir.IntegerType):
        return int(element.width)
    return None


def _splat(type_: ir.Type, value: int) -> ir.Value:
    """The constant ``value`` of ``type_``: a scalar, or every lane of a vector."""
    if isinstance(type_, ir.VectorType):
        lane = ir.IntegerAttr.get(type_.element_type, value)
        return arith.ConstantOp(type_, ir.DenseElementsAttr.get_splat(type_, lane)).result
    return arith.ConstantOp(type_, ir.IntegerAttr.get(type_, value)).result


def _all(condition: ir.Value) -> ir.Value:
    """``condition`` as one i1: itself, or the and of its lanes."""
    if isinstance(condition.type, ir.VectorType):
        return vector.ReductionOp(ir.IntegerType.get_signless(1), vector.CombiningKind.AND, condition).result
    return condition


def _check(op: ir.Operation) -> None:
    lhs, rhs = op.operands[0], op.operands[1]
    type_ = rhs.type
    element = type_.element_type if isinstance(type_, ir.VectorType) else type_
    bits = _bits(element)
    if bits is None:
        return
    name = op.name.removeprefix("arith.").removeprefix("index.")
    nonzero = arith.CmpIOp(arith.CmpIPredicate.ne, rhs, _splat(type_, 0)).result
    cf.AssertOp(_all(nonzero), located(f"integer division by zero ({name})", op.location))
    if op.name in _SIGNED:
        smallest = -(1 << (bits - 1))
        is_smallest = arith.CmpIOp(arith.CmpIPredicate.eq, lhs, _splat(type_, smallest)).result
        by_minus_one = arith.CmpIOp(arith.CmpIPredicate.eq, rhs, _splat(type_, -1)).result
        overflows = arith.AndIOp(is_smallest, by_minus_one).result
        fine = arith.XOrIOp(overflows, _splat(overflows.type, 1)).result
        message = f"integer overflow: {smallest} divided by -1 ({name}) does not fit {element}"
        cf.AssertOp(_all(fine), located(message, op.location))


def add_division_checks(module: ir.Module) -> None:
    """Insert the checks before every integer division and remainder of ``module``, in place."""
    divisions: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name in _UNSIGNED or op.name in _SIGNED:
            divisions.append(op)
        return ir.WalkResult.ADVANCE

    walk(module.operation, visit)
    with module.context:
        for op in divisions:
            with ir.InsertionPoint(op), op.location:
                _check(op)
