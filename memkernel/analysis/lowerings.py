"""Which of the default pipeline's optional lowerings a module needs, read off its ops and types.

The default pipeline runs a lowering only for the modules that use what it lowers, so
the common kernel pays nothing for it:

- sparse tensors (a ``#sparse_tensor.encoding`` on a tensor type, or a ``sparse_tensor``
  op): bufferized by the sparsifier instead of plain one-shot bufferization;
- the ``async`` dialect (``async.execute``, ``async.func``, groups, values): lowered to
  calls of the async runtime (``libmlir_async_runtime``), whose worker threads run the
  async regions;
- ``vector.mask`` (which a transform schedule's masked vectorization leaves): lowered to
  masked vector ops before the vector lowering.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from .ir_callbacks import walk

_SPARSE_ENCODING = "#sparse_tensor.encoding"


def _is_sparse(t: ir.Type) -> bool:
    return isinstance(t, ir.RankedTensorType) and t.encoding is not None and _SPARSE_ENCODING in str(t.encoding)


def _types(op: ir.Operation) -> list[ir.Type]:
    """The types of ``op``'s operands and results, and of its signature if it is a function (a declaration too)."""
    types = [v.type for v in op.operands] + [r.type for r in op.results]
    if "function_type" in op.attributes:
        signature = ir.TypeAttr(op.attributes["function_type"]).value
        if isinstance(signature, ir.FunctionType):
            types += list(signature.inputs) + list(signature.results)
    return types


@dataclass(frozen=True)
class Needs:
    """The optional lowerings a module needs (see the module docstring)."""

    sparse: bool
    asynchronous: bool
    masks: bool


def needs(operation: ir.Operation) -> Needs:
    """What ``operation`` (a module) and the ops nested in it need lowered, in one walk."""
    found: set[str] = set()

    def visit(op: ir.Operation) -> None:
        name = op.name
        if name.startswith("async."):
            found.add("asynchronous")
        elif name == "vector.mask":
            found.add("masks")
        if "sparse" not in found and (name.startswith("sparse_tensor.") or any(map(_is_sparse, _types(op)))):
            found.add("sparse")

    walk(operation, visit)
    return Needs(sparse="sparse" in found, asynchronous="asynchronous" in found, masks="masks" in found)
