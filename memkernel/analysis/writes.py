"""Which memref arguments a kernel may write, read off its IR.

memkernel sometimes has to pass a copy of an argument (a non-contiguous view
to an identity-layout memref). A copy the kernel may have written is copied back
into the caller's array; one the IR proves read-only is not. The analysis is
conservative: any use it does not know counts as a write. Calls to functions
defined in the same module are followed into the callee; a call to a declaration
writes every memref it is given, except the arguments the declaration marks
``{memkernel.read_only}`` (a promise about code memkernel cannot read).

A value may be written when some value it flows into (itself, a view of it, the
callee argument it is passed as) has a use that writes. That is reachability in
the flows-into graph, answered by a search that never takes a value still under
search for unwritten: a recursive call (even one that swaps its arguments)
cannot hide a write.

The uses are collected in one walk of the module rather than through
``Value.uses``, whose typed op objects would import every dialect's Python
module (linalg's alone takes ~45 ms).
"""

from __future__ import annotations

from collections import defaultdict

from mlir import ir

from ..errors import SignatureError
from ..model.foreign import READ_ONLY_ATTRIBUTE
from .ir_callbacks import walk

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


# Structured ops without an operandSegmentSizes attribute: how many of their operands are ``ins``.
_INPUTS_OF = {
    "linalg.reduce": lambda n: n // 2,  # as many inits as inputs
    "linalg.transpose": lambda n: 1,
    "linalg.broadcast": lambda n: 1,
    "linalg.map": lambda n: n - 1,  # one init
}


def _linalg_inputs(op: ir.Operation) -> int | None:
    """Number of ``ins`` operands of a linalg structured op, None if not one."""
    if op.name in _INPUTS_OF:
        return _INPUTS_OF[op.name](len(op.operands))
    if not op.name.startswith("linalg.") or "operandSegmentSizes" not in op.attributes:
        return None
    return ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"])[0]


class _Analysis:
    """May-write answers for the values of one module, memoized once final."""

    def __init__(self, module: ir.Operation) -> None:
        self.uses: dict[ir.Value, list[tuple[ir.Operation, int]]] = defaultdict(list)
        self.bodies: dict[str, ir.Block] = {}
        self.read_only: dict[str, frozenset[int]] = {}  # per declaration, the arguments marked read-only
        self.answers: dict[ir.Value, bool] = {}

        def visit(op: ir.Operation) -> ir.WalkResult:
            for position, operand in enumerate(op.operands):
                self.uses[operand].append((op, position))
            if op.name == "func.func":
                name = ir.StringAttr(op.attributes["sym_name"]).value
                if len(op.regions[0].blocks) > 0:
                    self.bodies[name] = op.regions[0].blocks[0]
                else:
                    self.read_only[name] = marked_read_only(op)
            return ir.WalkResult.ADVANCE

        walk(module, visit)

    def may_write(self, value: ir.Value) -> bool:
        """True when a write may reach ``value``: through one of its uses or a value it flows into."""
        if value in self.answers:
            return self.answers[value]
        seen = {value}
        todo = [value]
        while todo:
            current = todo.pop()
            if self.answers.get(current, False):
                self.answers[value] = True
                return True
            if current in self.answers:  # known unwritten, and so is all it flows into
                continue
            for op, position in self.uses.get(current, ()):
                flows_into = self._flows_into(op, position)
                if flows_into is None:
                    self.answers[value] = True
                    return True
                todo.extend(v for v in flows_into if v not in seen)
                seen.update(flows_into)
        # The search found no write from anything it reached: all of it is unwritten.
        self.answers.update(dict.fromkeys(seen, False))
        return False

    def _flows_into(self, op: ir.Operation, position: int) -> list[ir.Value] | None:
        """The values the operand at ``position`` of ``op`` flows into; None if this use may write."""
        name = op.name
        if name in _VIEWS and position == 0:
            return list(op.results)
        if name in _READS and position in _READS[name]:
            return []
        if name == "func.call":
            called = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            callee = self.bodies.get(called)
            if callee is None:
                return [] if position in self.read_only.get(called, ()) else None
            return [callee.arguments[position]]
        inputs = _linalg_inputs(op)
        return None if inputs is None or position >= inputs else []


def marked_read_only(declaration: ir.Operation) -> frozenset[int]:
    """The arguments of a ``func.func`` declaration marked ``{memkernel.read_only}`` (a unit attribute, or
    ``= true``). SignatureError, naming the declaration and the argument, for any other value (``= false``
    included): a mark memkernel cannot read must not turn a written memref into an unwritten one."""
    if "arg_attrs" not in declaration.attributes:
        return frozenset()
    marked = set()
    for i, attrs in enumerate(ir.ArrayAttr(declaration.attributes["arg_attrs"])):
        entries = ir.DictAttr(attrs)
        if READ_ONLY_ATTRIBUTE not in entries:
            continue
        value = entries[READ_ONLY_ATTRIBUTE]
        if not (isinstance(value, ir.UnitAttr) or (isinstance(value, ir.BoolAttr) and ir.BoolAttr(value).value)):
            name = ir.StringAttr(declaration.attributes["sym_name"]).value
            raise SignatureError(
                f"{name}(): argument #{i} of @{name} has {{{READ_ONLY_ATTRIBUTE} = {value}}}; only "
                f"{{{READ_ONLY_ATTRIBUTE}}} (or = true) marks a memref the function never writes. Drop the "
                "attribute for a memref it may write.")
        marked.add(i)
    return frozenset(marked)


def written_arguments(module: ir.Module, function: str) -> frozenset[int]:
    """Indices of the arguments of ``func.func @function`` that the kernel may write through."""
    analysis = _Analysis(module.operation)
    entry = analysis.bodies[function]
    return frozenset(
        i for i, arg in enumerate(entry.arguments)
        if isinstance(arg.type, (ir.MemRefType, ir.UnrankedMemRefType)) and analysis.may_write(arg)
    )


def freed_arguments(module: ir.Module, function: str) -> list[int]:
    """Arguments of ``func.func @function`` that it passes to ``memref.dealloc`` (directly or as a view):
    their memory is the caller's, and freeing it corrupts the caller's heap."""
    analysis = _Analysis(module.operation)
    entry = analysis.bodies[function]
    freed = []
    for i, arg in enumerate(entry.arguments):
        values, seen = [arg], set()
        while values:
            value = values.pop()
            for op, position in analysis.uses.get(value, ()):
                if op.name == "memref.dealloc":
                    freed.append(i)
                elif op.name in _VIEWS and position == 0 and op not in seen:
                    seen.add(op)
                    values.extend(op.results)
    return sorted(set(freed))
