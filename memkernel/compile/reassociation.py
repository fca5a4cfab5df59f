"""The "fast" preset's rule for reductions on memrefs: their accumulating add or multiply may be reassociated.

A reduction into a memref (``linalg.reduce ins(%x : memref<?xf32>) outs(%out :
memref<f32>)``) lowers to a loop that loads the accumulator from ``%out``, adds one
element and stores it back. LLVM can keep the accumulator in registers and vectorize
such a loop, and it does so with a runtime check that ``%out`` and ``%x`` do not
overlap, falling back to the loop as written when they do; but it vectorizes a
floating-point sum only when the sum may be reassociated. Measured on 10^7 float32s:
the loop as written runs at 0.4 of ``x.sum()``, whether or not its arguments are marked
``llvm.noalias``; with the add marked ``fastmath<reassoc>``, about twice ``x.sum()``.

So the rule marks the combining op of each float reduction on memrefs (the ``arith.addf``
or ``arith.mulf`` that yields the new accumulator from the old one) ``reassoc``, which
lets the sum be taken in vector-wide partial sums, as the tensor reduction strategy and
numpy's pairwise summation take it. Nothing else in the body is marked.
"""

from __future__ import annotations

from mlir import ir

from ..analysis.ir_callbacks import walk

_COMBINERS = ("arith.addf", "arith.mulf")
_REASSOC = "#arith.fastmath<reassoc>"


def _is_reduction(op: ir.Operation) -> bool:
    if op.name == "linalg.reduce":
        return True
    if op.name != "linalg.generic":
        return False
    return "reduction" in str(op.attributes["iterator_types"])


def _on_memrefs(op: ir.Operation) -> bool:
    return any(isinstance(v.type, ir.MemRefType) for v in op.operands)


def _combiners(op: ir.Operation) -> list[ir.Operation]:
    """The ops of ``op``'s body that each yield an accumulator from its own previous value."""
    block = op.regions[0].blocks[0]
    arguments = list(block.arguments)
    yielded = list(block.operations)[-1].operands
    accumulators = arguments[len(arguments) - len(yielded):]
    found = []
    for value, accumulator in zip(yielded, accumulators):
        if isinstance(value.owner, ir.Block):
            continue
        combiner = value.owner.operation
        if combiner.name in _COMBINERS and any(operand == accumulator for operand in combiner.operands):
            found.append(combiner)
    return found


class Reassociation:
    """The rule as a preset step: memref reductions' combining ops marked ``fastmath<reassoc>``."""

    on_tensors = False
    text = f"reassociation: {' '.join(_COMBINERS)} combining a memref reduction's accumulator get {_REASSOC}"
    """What identifies the rule in a preset's fingerprint."""

    def applied(self, module: ir.Module, parallel: bool = False) -> ir.Module:
        """``module`` with its memref reductions' combining ops marked; changed in place (``parallel`` changes
        nothing)."""
        reductions: list[ir.Operation] = []

        def visit(op: ir.Operation) -> ir.WalkResult:
            if _is_reduction(op) and _on_memrefs(op):
                reductions.append(op)
            return ir.WalkResult.ADVANCE

        walk(module.operation, visit)
        with module.context:
            reassoc = ir.Attribute.parse(_REASSOC)
            for reduction in reductions:
                for combiner in _combiners(reduction):
                    combiner.attributes["fastmath"] = reassoc
        return module
