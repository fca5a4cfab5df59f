"""Making ``memref.generic_atomic_rmw`` lowerable when it yields a constant or an outside value.

``finalize-memref-to-llvm`` lowers a ``generic_atomic_rmw`` only when the
value its ``memref.atomic_yield`` yields is defined inside its region. But
the conversions hoist constants out of regions (canonicalization, and
``convert-arith-to-llvm``, which puts an ``llvm.mlir.constant`` at the top of
the function), so a kernel that stores a constant atomically
(``memref.atomic_yield %c99``) got "result not defined in region", reported
without failing the pass, which the MLIR bindings meet with an abort. So,
before the conversions, a yielded value that is a constant or comes from
outside the region is passed through an ``llvm.freeze`` made inside it (the
value itself, for anything but poison); a yielded value of a type ``llvm.freeze``
does not take (``index``, complex) is a CompileError naming the op.
"""

from __future__ import annotations

from mlir import ir

from ..analysis.ir_callbacks import walk
from ..errors import CompileError


def _needs_freeze(value: ir.Value, atomic: ir.Operation) -> bool:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return owner.owner != atomic
    return owner.parent != atomic or owner.name in ("arith.constant", "llvm.mlir.constant")


def _freezable(t: ir.Type) -> bool:
    return isinstance(t, (ir.IntegerType, ir.FloatType))


def freeze_yielded_values(module: ir.Module) -> None:
    """Yield each constant or outside value of a ``memref.generic_atomic_rmw`` through an ``llvm.freeze`` made
    in its region; CompileError for such a value of a type ``llvm.freeze`` does not take."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> None:
        if op.name == "memref.generic_atomic_rmw":
            found.append(op)

    walk(module.operation, visit)
    for atomic in found:
        terminator = atomic.regions[0].blocks[0].operations[-1]
        value = terminator.operands[0]
        if not _needs_freeze(value, atomic):
            continue
        if not _freezable(value.type):
            raise CompileError(
                f"memref.generic_atomic_rmw at {atomic.location} yields a {value.type} constant or value from "
                "outside its region, which MLIR cannot lower to LLVM (\"result not defined in region\"). "
                "Compute the new value inside the region from its block argument."
            )
        frozen = ir.Operation.create("llvm.freeze", results=[value.type], operands=[value],
                                     ip=ir.InsertionPoint(terminator))
        terminator.operands[0] = frozen.result
