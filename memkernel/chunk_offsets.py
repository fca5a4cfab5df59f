"""A kernel's source rewritten so that its ``linalg.index`` values count from given offsets.

A chunk of a chunked kernel (:mod:`memkernel.dask`) runs on blocks of its
arguments, whose indices start at 0; a ``linalg.generic`` body that reads its
loop indices (``linalg.index 0``) would see the block's own. The rewritten
function takes one leading ``index`` argument per offset and adds it to every
``linalg.index`` of the loop dims it belongs to, so a block computes what the
whole call computes there.
"""

from __future__ import annotations

from collections.abc import Iterator

from mlir import ir
from mlir.dialects import arith

from .analysis.source import MLIR_LOCK, parse_source

INDEX_OP = "linalg.index"


def _nested(op: ir.Operation, into_linalg: bool = False) -> Iterator[ir.Operation]:
    """The ops in ``op``'s regions, at any depth; inside a nested linalg structured op only ``into_linalg``."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                if into_linalg or "indexing_maps" not in inner.operation.attributes:
                    yield from _nested(inner.operation, into_linalg)


def index_dims(op: ir.Operation) -> frozenset[int]:
    """The loop dims whose index the body of the linalg op ``op`` reads with ``linalg.index``."""
    return frozenset(ir.IntegerAttr(inner.attributes["dim"]).value for inner in _nested(op)
                     if inner.name == INDEX_OP)


def reads_loop_indices(op: ir.Operation) -> bool:
    """Whether a ``linalg.index`` is anywhere inside ``op``."""
    return any(inner.name == INDEX_OP for inner in _nested(op, into_linalg=True))


def _with_leading_arguments(func: ir.Operation, count: int) -> list[ir.BlockArgument]:
    """Give ``func`` ``count`` new leading ``index`` arguments (their attributes empty); returns them."""
    block = func.regions[0].blocks[0]
    old = list(block.arguments)
    index = ir.IndexType.get()
    added = [block.add_argument(index, func.location) for _ in range(count)]
    for argument in old:
        argument.replace_all_uses_with(block.add_argument(argument.type, argument.location))
    for _ in old:
        block.erase_argument(0)
    function_type = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    func.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get([index] * count + list(function_type.inputs), list(function_type.results)))
    if "arg_attrs" in func.attributes:
        attrs = list(ir.ArrayAttr(func.attributes["arg_attrs"]))
        func.attributes["arg_attrs"] = ir.ArrayAttr.get([ir.DictAttr.get({})] * count + attrs)
    return added


def offset_source(source: str, name: str, offsets: dict[int, dict[int, int]], count: int) -> str:
    """``source`` with ``@name`` taking ``count`` leading ``index`` arguments, the offsets.

    ``offsets`` says, for the ``linalg.generic`` ops at these positions among
    ``@name``'s top-level ops, which offset (0 to ``count - 1``) each loop dim
    adds: every ``linalg.index d`` of such an op then yields its index plus offset
    ``offsets[position][d]``.
    """
    parsed = parse_source(source)
    with MLIR_LOCK, parsed.context:
        func = parsed.function(name)
        added = _with_leading_arguments(func, count)
        top = list(func.regions[0].blocks[0].operations)
        for position, dims in offsets.items():
            for inner in [op for op in _nested(top[position].operation) if op.name == INDEX_OP]:
                index = inner.results[0]
                offset = added[dims[ir.IntegerAttr(inner.attributes["dim"]).value]]
                with ir.InsertionPoint.after(inner), inner.location:
                    shifted = arith.AddIOp(index, offset)
                index.replace_all_uses_except(shifted.result, shifted.operation)
        return str(parsed.module)
