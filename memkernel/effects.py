"""Which memref arguments a kernel may write, read off its IR.

memkernel sometimes has to pass a copy of an argument (a non-contiguous view
to an identity-layout memref). A copy the kernel may have written is copied back
into the caller's array; one the IR proves read-only is not. The analysis is
conservative: any use it does not know counts as a write.
"""

from __future__ import annotations

from mlir import ir

# Ops that read the memref at the given operand positions and write nothing through it.
_READS = {
    "memref.load": (0,),
    "affine.load": (0,),
    "affine.vector_load": (0,),
    "vector.load": (0,),
    "vector.maskedload": (0,),
    "vector.transfer_read": (0,),
    "vector.gather": (0,),
    "vector.expandload": (0,),
    "memref.dim": (0,),
    "memref.prefetch": (0,),
    "memref.copy": (0,),
}

# Ops whose results are views of the operand at position 0: their uses count as the operand's.
_VIEWS = frozenset({
    "memref.subview",
    "memref.cast",
    "memref.reinterpret_cast",
    "memref.collapse_shape",
    "memref.expand_shape",
    "memref.transpose",
    "memref.view",
    "memref.reshape",
    "memref.memory_space_cast",
    "memref.assume_alignment",
    "memref.extract_strided_metadata",
})


def _linalg_inputs(op: ir.Operation) -> int | None:
    """Number of ``ins`` operands of a linalg structured op, None if not one."""
    if not op.name.startswith("linalg.") or "operandSegmentSizes" not in op.attributes:
        return None
    return ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"])[0]


def _may_write(value: ir.Value) -> bool:
    for use in value.uses:
        op = use.owner
        name = op.name
        position = use.operand_number
        if name in _VIEWS and position == 0:
            if any(_may_write(result) for result in op.results):
                return True
            continue
        if name in _READS and position in _READS[name]:
            continue
        inputs = _linalg_inputs(op)
        if inputs is not None and position < inputs:
            continue
        return True
    return False


def written_arguments(func: ir.Operation) -> frozenset[int]:
    """Indices of the ``func.func`` arguments that the kernel may write through."""
    entry = func.regions[0].blocks[0]
    return frozenset(
        i for i, arg in enumerate(entry.arguments)
        if isinstance(arg.type, (ir.MemRefType, ir.UnrankedMemRefType)) and _may_write(arg)
    )
