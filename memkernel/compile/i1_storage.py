"""Byte-level lowering of ``i1`` memref accesses.

In this LLVM build ``finalize-memref-to-llvm`` aborts (assertion
``integralElementType.getWidth() >= 8``) on a ``memref.load``/``memref.store``
whose element type is ``i1``.  An ``i1`` memref element already occupies one
byte at runtime (LLVM's alloc size of ``i1`` is 1 byte, and numpy stores
``bool`` as one 0/1 byte), so such accesses can equivalently be done as ``i8``
accesses on the same memref seen as an ``i8`` memref.
"""

from mlir import ir
from mlir.dialects import arith, builtin, memref

from ..analysis.ir_callbacks import walk


def lower_i1_accesses(module: ir.Module) -> None:
    """Rewrite every ``memref.load``/``memref.store`` of an ``i1`` element into a byte access.

    Meant to run between the pre-LLVM pipeline (func/cf/arith/memref level)
    and the LLVM conversion pipeline, which must end with
    ``reconcile-unrealized-casts``.  Accepts any ranked ``i1`` memref (any rank
    including 0-d, identity or strided layout, static or dynamic, function
    argument or produced in the kernel).  The accessed memref is reinterpreted
    as the same-shaped, same-layout ``i8`` memref through a
    ``builtin.unrealized_conversion_cast``; both types lower to the identical
    LLVM descriptor, so the casts fold away and the usual memref addressing is
    kept.  A load becomes an ``i8`` load plus ``arith.cmpi ne, 0`` (any nonzero
    byte reads as true, as in numpy), a store ``arith.extui`` to ``i8`` plus an
    ``i8`` store.  Accesses to other element types are untouched.  Vector and
    atomic ops on ``i1`` memrefs are not handled.  Modifies ``module`` in place.
    """
    with module.context:
        i1 = ir.IntegerType.get_signless(1)
        i8 = ir.IntegerType.get_signless(8)
        accesses: list[memref.LoadOp | memref.StoreOp] = []

        def collect(op: ir.Operation) -> ir.WalkResult:
            view = op.opview
            if isinstance(view, (memref.LoadOp, memref.StoreOp)) and (
                ir.MemRefType(view.memref.type).element_type == i1
            ):
                accesses.append(view)
            return ir.WalkResult.ADVANCE

        # Collect first: erasing ops during the walk would invalidate it.
        walk(module.operation, collect, ir.WalkOrder.PRE_ORDER)

        for access in accesses:
            with ir.InsertionPoint(access), access.location:
                ref_type = ir.MemRefType(access.memref.type)
                byte_type = ir.MemRefType.get(
                    ref_type.shape, i8, ref_type.layout, ref_type.memory_space
                )
                bytes_ref = builtin.unrealized_conversion_cast([byte_type], [access.memref])
                # `nontemporal` is dropped on purpose: a 1-byte nontemporal load
                # folded into an x86 instruction hits llvm_unreachable
                # ("Unsupported store size", X86ISelDAGToDAG.cpp).
                if isinstance(access, memref.LoadOp):
                    byte = memref.load(bytes_ref, access.indices, alignment=access.alignment)
                    zero = arith.constant(i8, 0)
                    access.result.replace_all_uses_with(
                        arith.cmpi(arith.CmpIPredicate.ne, byte, zero)
                    )
                else:
                    byte = arith.extui(i8, access.value)
                    memref.store(byte, bytes_ref, access.indices, alignment=access.alignment)
            access.operation.erase()
