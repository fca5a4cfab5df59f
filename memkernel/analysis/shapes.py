"""Which dims of a kernel's arguments must agree: read off its IR, and from the dims the user names.

A kernel compiled for ``memref<?xf32>`` reads and writes as many elements as
its loops say, whatever the arrays hold: nothing in the compiled code checks
that ``a``, ``b`` and ``out`` of an elementwise add have the same length. The
IR says it, though. Every linalg structured op (named ops are generalized
first) maps its loop dims to its operands' dims through indexing maps; two
operand dims given by the same loop dim must be equal, and an operand dim
given by a sum (a convolution's ``oh + kh``) must be large enough for every
index the loops reach. ``memref.copy`` and elementwise ``arith``/``math`` ops
on tensors tie every dim of their operands. Only operands that are function
arguments count, directly or through shape-preserving casts and transposes, or
reshapes of them (:mod:`memkernel.model.views`), or slices of them, whose sizes (a
constant, or a dim read with ``memref.dim``) are what the op's other operands are
tied to. A cast of an argument to a static size ties its dim to that size. The ops
of the functions the kernel calls count too (:mod:`memkernel.analysis.inlining`,
and a ``func.call_indirect`` of a ``func.constant``), and only ops that run on every
call (:func:`unconditional`).

The result is a :class:`~memkernel.model.shapes.ShapeRules` (where the dims the
user names join them): ties (pairs of dims that must be equal,
or a dim and a constant), bounds (a dim at least as large as an affine sum of
others, or a constant), and for each output dim where its size can be taken from.
Both call paths check the ties and the bounds before every call; the checked path
alone checks affine bounds (maps with negative coefficients, floordiv or mod).

Loads, stores and slices add bounds too, where their positions are constants or
the variables of ``scf.for`` loops over argument dims, plus or minus a constant
(see :class:`_LoopNest`): at their highest index, and at their lowest, which must
not lie below 0 (a kernel that reaches below 0 on every call is refused).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlir import ir

from ..errors import SignatureError
from .ir_callbacks import walk
from .control_flow import EveryRun
from ..model.dims import Dim
from ..model.shapes import AffineBound, Bound, Expr, ShapeRules, Tie
from .inlining import Inlined, Origin, defined_function, structured_names  # noqa: F401  (the CLI reads structured_names)
from .reshapes import KEEP_BASE, RESHAPES, offsets_sizes_strides, reshape_view
from ..model.signature import ArgSpec, MemRefSpec, UnrankedSpec
from .types import read_signature
from ..model.views import Size, View

_DYNAMIC = -(1 << 63)
"""How a slice's static offsets, sizes and strides mark a dynamic one (``ShapedType::kDynamic``)."""

SHAPE_PRESERVING = frozenset({"memref.cast", "tensor.cast", "bufferization.to_tensor", "bufferization.to_buffer",
                              "sparse_tensor.convert"})
"""Ops whose result has the shape (and, but for a sparse convert, the memory) of their first operand."""
_CONDITIONAL = frozenset({"scf.if", "scf.index_switch"})

_SLICE_VIEWS = frozenset({"memref.subview", "tensor.extract_slice"})
"""Ops whose result is a slice of their first operand, of the sizes they are given."""

Extent = Dim | tuple[int, str] | None
"""How long a value is on one dim: the size of an argument's (or view's) dim; a constant, with what has it (for
messages: ``@k's memref.subview of x``); or unknown."""


# -- the IR's ties ----------------------------------------------------------------


def argument_of(value: ir.Value, entry: ir.Block) -> int | None:
    """The kernel argument ``value`` is, directly or through shape-preserving casts, element and slice
    inserts (their result is their destination), and ``scf.for`` loops that carry it."""
    view = argument_view(value, entry)
    return view[0] if view is not None and view[1] is None else None


def argument_view(value: ir.Value, entry: ir.Block) -> tuple[int, tuple[int, ...] | None] | None:
    """The kernel argument ``value`` is a view of, as :func:`argument_of` finds it or through
    ``memref.transpose``; and which of the argument's dims each of the view's dims is (None: the same)."""
    origin, dims = trace(value, entry)
    return (origin, dims) if isinstance(origin, int) else None


def trace(value: ir.Value, entry: ir.Block) -> tuple[int | ir.Operation | None, tuple[int, ...] | None]:
    """What ``value`` is, looking through what :func:`argument_view` looks through: the number of the kernel
    argument, or the op that made it (None: a block argument of something else); and which of that one's
    dims each of ``value``'s dims is (None: the same)."""
    dims: tuple[int, ...] | None = None
    while True:
        if isinstance(value, ir.BlockArgument):
            if value.owner == entry:
                return value.arg_number, dims
            loop = value.owner.owner
            if loop.name != "scf.for" or value.arg_number == 0:
                return None, dims
            carried = _carried(loop, value.arg_number - 1)
            if carried is None:
                return None, dims
            value = carried
            continue
        owner = _defining_op(value)
        if owner is None:
            return None, dims
        source = _same_buffer_source(owner)
        if source is not None:
            value = source
        elif owner.name == "scf.for":
            carried = _carried(owner, ir.OpResult(value).result_number)
            if carried is None:
                return owner, dims
            value = carried
        elif owner.name == "memref.transpose":
            source_dims = [r.position for r in ir.AffineMapAttr(owner.attributes["permutation"]).value.results]
            dims = tuple(source_dims[d] for d in (dims if dims is not None else range(len(source_dims))))
            value = owner.operands[0]
        else:
            return owner, dims


_INSERTS = frozenset({"tensor.insert", "tensor.insert_slice"})


def _same_buffer_source(op: ir.Operation) -> ir.Value | None:
    """The operand whose memory and shape ``op``'s result has: a cast's source, an insert's destination."""
    if op.name in SHAPE_PRESERVING:
        return op.operands[0]
    if op.name in _INSERTS:
        return op.operands[1]
    return None


def _carried(loop: ir.Operation, j: int) -> ir.Value | None:
    """The initial value of ``loop``'s ``j``-th carried value, if every iteration yields it back (itself, or
    what casts and inserts made of it): then the carried value, and the loop's result, are that value."""
    body = loop.regions[0].blocks[0]
    carried = body.arguments[1 + j]
    value = list(body.operations)[-1].operands[j]
    while value != carried:
        owner = _defining_op(value)
        source = None if owner is None else _same_buffer_source(owner)
        if source is None:
            return None
        value = source
    return loop.operands[3 + j]


def unconditional(op: ir.Operation, function: ir.Operation, blocks: EveryRun | None = None) -> bool:
    """Whether ``op`` runs on every call: inside no ``scf.if``, and in a block every path through its region
    passes (the entry block, or one that post-dominates it: see :mod:`memkernel.analysis.control_flow`).
    ``blocks`` keeps the blocks' answers across calls for the same function."""
    blocks = EveryRun() if blocks is None else blocks
    current = op
    while True:
        parent = current.parent
        if parent is None or not blocks.passes_through(current.block):
            return False
        if parent == function:
            return True
        if parent.name in _CONDITIONAL or parent.name == "func.func":
            return False
        current = parent


def _defining_op(value: ir.Value) -> ir.Operation | None:
    """The op whose result ``value`` is; None for a block argument."""
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def _constant(value: ir.Value) -> int | None:
    """The value of an ``arith.constant`` integer or index, else None."""
    owner = _defining_op(value)
    if owner is not None and owner.name == "arith.constant":
        attribute = owner.attributes["value"]
        if isinstance(attribute, ir.IntegerAttr):
            return int(attribute.value)
    return None


def _linear(expr: Expr | None) -> tuple[dict[int, int], int] | None:
    """``expr`` as ``{loop dim: coefficient}`` and a constant; None if it is not a non-negative linear sum."""
    if expr is None:
        return None
    kind = expr[0]
    if kind == "d":
        return {expr[1]: 1}, 0
    if kind == "c":
        return ({}, expr[1]) if expr[1] >= 0 else None
    if kind == "+":
        left, right = _linear(expr[1]), _linear(expr[2])
        if left is None or right is None:
            return None
        terms = dict(left[0])
        for d, c in right[0].items():
            terms[d] = terms.get(d, 0) + c
        return terms, left[1] + right[1]
    if kind == "*" and expr[2] >= 0:
        inner = _linear(expr[1])
        return None if inner is None else ({d: c * expr[2] for d, c in inner[0].items()}, inner[1] * expr[2])
    return None


def _expression(expr: ir.AffineExpr) -> Expr | None:
    """``expr`` as an :data:`Expr`; None for what it cannot say (symbols, products of dims)."""
    if isinstance(expr, ir.AffineDimExpr):
        return ("d", expr.position)
    if isinstance(expr, ir.AffineConstantExpr):
        return ("c", expr.value)
    if isinstance(expr, ir.AffineAddExpr):
        left, right = _expression(expr.lhs), _expression(expr.rhs)
        return None if left is None or right is None else ("+", left, right)
    kinds = ((ir.AffineMulExpr, "*"), (ir.AffineFloorDivExpr, "//"), (ir.AffineCeilDivExpr, "cd"),
             (ir.AffineModExpr, "%"))
    for kind, name in kinds:
        if isinstance(expr, kind) and isinstance(expr.rhs, ir.AffineConstantExpr):
            inner = _expression(expr.lhs)
            factor = expr.rhs.value
            if inner is not None and (name == "*" or factor > 0):
                return (name, inner, factor)
    if isinstance(expr, ir.AffineMulExpr) and isinstance(expr.lhs, ir.AffineConstantExpr):
        inner = _expression(expr.rhs)
        return None if inner is None else ("*", inner, expr.lhs.value)
    return None


def _dims_of(expr: Expr) -> set[int]:
    if expr[0] == "d":
        return {expr[1]}
    if expr[0] == "c":
        return set()
    found = _dims_of(expr[1])
    return found | _dims_of(expr[2]) if expr[0] == "+" else found


class _Collector:
    """The rules one function's ops put on the dims of its arguments and of the views it makes of them."""

    def __init__(self, kernel: str, function: ir.Operation, specs: Sequence[ArgSpec], names: Sequence[str],
                 origin: Callable[[ir.Operation], str]) -> None:
        self.kernel = kernel
        self.function = function
        self.entry = function.regions[0].blocks[0]
        self.ranks = [s.rank if isinstance(s, MemRefSpec) else None for s in specs]
        self.static = {Dim(i, k) for i, s in enumerate(specs) if isinstance(s, MemRefSpec)
                       for k, size in enumerate(s.shape) if size is not None}
        self.n = len(specs)
        self.names = list(names)
        self.origin = origin
        self.views: list[View] = []
        # The arguments whose memory is one run of their elements, which a reinterpret_cast may reshape.
        self._bases = {i: i for i, s in enumerate(specs)
                       if isinstance(s, UnrankedSpec) or isinstance(s, MemRefSpec) and s.layout is None}
        self._reshaped: dict[ir.Operation, tuple[int, tuple[Dim, ...]] | None] = {}
        self.ties: list[Tie] = []
        self.bounds: list[Bound] = []
        self.affine_bounds: list[AffineBound] = []
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        """The calls the rules cannot follow (see :meth:`unfollowed`)."""

    def tie(self, a: Dim, b: Dim, reason: str) -> None:
        if a != b:
            self.ties.append(Tie(a, b, reason))

    def tie_extents(self, a: Extent, b: Extent, reason: str) -> None:
        """Tie two extents: two dims, or a dim to a constant (two constants the verifier has compared)."""
        if isinstance(a, Dim) and isinstance(b, Dim):
            self.tie(a, b, reason)
        elif isinstance(a, Dim) and isinstance(b, tuple):
            self.fix(a, b[0], reason, f"{b[1]} has {b[0]} there")
        elif isinstance(b, Dim) and isinstance(a, tuple):
            self.fix(b, a[0], reason, f"{a[1]} has {a[0]} there")

    def fix(self, dim: Dim, size: int, reason: str, has: str) -> None:
        """``dim`` must be ``size`` (unless its type says so already): ``has`` says what has that size."""
        if dim not in self.static:
            tie = Tie(dim, None, reason, size=size, has=has)
            if tie not in self.ties:
                self.ties.append(tie)

    def extents(self, value: ir.Value) -> tuple[Extent, ...] | None:
        """How long ``value`` is on each dim: as :meth:`dims_of` finds it, or for a slice (see
        :meth:`slice_sizes`); None for anything else."""
        found = self.dims_of(value)
        if found is not None:
            return found[1]
        origin, order = trace(value, self.entry)
        if not isinstance(origin, ir.Operation) or origin.name not in _SLICE_VIEWS:
            return None
        sizes = self.slice_sizes(origin, ir.ShapedType(origin.results[0].type).rank)
        if sizes is None or order is None:
            return sizes
        return tuple(sizes[k] for k in order)

    def slice_sizes(self, op: ir.Operation, rank: int | None = None) -> tuple[Extent, ...] | None:
        """The sizes of a slice (a ``memref.subview``/``tensor.extract_slice`` result, or what a
        ``tensor.insert_slice`` inserts, of ``rank`` dims, without the unit dims it drops; all of them if
        ``rank`` is None): constants, dims read with ``memref.dim``/``tensor.dim``, or unknown; None when it
        drops unit dims ambiguously."""
        parts = offsets_sizes_strides(op, self.size)
        count = len(parts) // 3
        origin, _ = trace(op.operands[_SLICES[op.name]], self.entry)
        what = f"{self.origin(op)} of {self.names[origin] if isinstance(origin, int) else 'a value'}"
        sizes: list[Extent] = []
        for _, size in parts[count:2 * count]:
            if size is None or size.divisor != 1 or len(size.factors) > 1 or size.factors and size.constant != 1:
                sizes.append(None)
            else:
                sizes.append(size.factors[0] if size.factors else (size.constant, what))
        dropped = 0 if rank is None else len(sizes) - rank
        if dropped:
            ones = [k for k, size in enumerate(sizes) if isinstance(size, tuple) and size[0] == 1]
            if len(ones) != dropped:
                return None
            sizes = [size for k, size in enumerate(sizes) if k not in ones]
        return tuple(sizes)

    def cast(self, op: ir.Operation, reason: str) -> None:
        """A cast to a type with static dims: the dims it casts must have those sizes."""
        result = op.results[0].type
        found = self.extents(op.operands[0])
        if found is None or not isinstance(result, ir.ShapedType) or not result.has_rank:
            return
        for here, size in zip(found, result.shape):
            if isinstance(here, Dim) and size != _DYNAMIC:
                self.fix(here, size, reason, f"it casts {self.names[here.arg]} to {result}")

    def dims_of(self, value: ir.Value) -> tuple[int, tuple[Dim, ...]] | None:
        """The argument or view that ``value`` is (as :func:`trace` finds it), and the dim each of ``value``'s
        dims is; None for anything else (a scalar, an unranked memref, memory the kernel allocated)."""
        origin, order = trace(value, self.entry)
        if isinstance(origin, int):
            rank = self.ranks[origin]
            if rank is None:
                return None
            found: tuple[int, tuple[Dim, ...]] | None = (origin, tuple(Dim(origin, k) for k in range(rank)))
        elif origin is not None and origin.name in RESHAPES:
            found = self._reshape(origin)
        else:
            return None
        if found is None or order is None:
            return found
        return found[0], tuple(found[1][k] for k in order)

    def _reshape(self, op: ir.Operation) -> tuple[int, tuple[Dim, ...]] | None:
        """The view ``op`` makes of an argument, made once (see :mod:`memkernel.analysis.reshapes`); a
        SignatureError if its sizes cannot be read."""
        if op in self._reshaped:
            return self._reshaped[op]
        self._reshaped[op] = None
        source = self.dims_of(op.operands[0])
        unranked, _ = trace(op.operands[0], self.entry)
        if source is None and isinstance(unranked, int) and unranked in self._bases:
            source = unranked, ()  # an unranked argument: its dims are unknown, its memory is not
        if source is None:
            return None
        origin, dims = source
        index = self.n + len(self.views)
        nest = _LoopNest.around(op, self.function, self)
        guards = () if nest is None else tuple(d for _, d in nest.guards)
        base = self._bases.get(origin)
        reason = self.origin(op)
        view = reshape_view(op, origin, dims, self.names, index, self.size, base, guards, reason)
        if isinstance(view, str):
            raise SignatureError(f"{self.kernel}(): {reason} of {self.names[origin]} {view}")
        self.views.append(view)
        self.names.append(view.name(self.names))
        if op.name in KEEP_BASE and base is not None:
            self._bases[index] = base
        # A view dim that is one dim of its source is that dim: its rules stay rules on the arguments.
        found = index, tuple(size.factors[0] if len(size.factors) == 1 and size == Size(size.factors) else Dim(index, k)
                             for k, size in enumerate(view.dims))
        self._reshaped[op] = found
        return found

    def size(self, value: ir.Value) -> Size | None:
        """What an index value is as a product of dims and constants: a constant, a ``memref.dim`` of an
        argument or view, their products and index casts; None for anything else."""
        constant = _constant(value)
        if constant is not None:
            return Size((), constant)
        owner = _defining_op(value)
        if owner is not None and owner.name in ("arith.index_cast", "arith.index_castui"):
            return self.size(owner.operands[0])
        if owner is not None and owner.name in ("arith.muli", "index.mul"):
            left, right = self.size(owner.operands[0]), self.size(owner.operands[1])
            if left is None or right is None or left.divisor != 1 or right.divisor != 1:
                return None
            return Size(left.factors + right.factors, left.constant * right.constant)
        dim = self.dim(value)
        return None if dim is None else Size((dim,))

    def structured(self, op: ir.Operation, reason: str) -> None:
        maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
        operands = [self.extents(v) for v in list(op.operands)[:len(maps)]]
        placed = [(found, amap) for found, amap in zip(operands, maps) if found is not None]
        # Each loop dim is tied to the first argument dim it indexes (a view's dim only if no argument's), or to
        # the first constant size a slice gives it.
        loop_dims: dict[int, Dim] = {}
        loop_sizes: dict[int, tuple[int, str]] = {}
        for dims, amap in placed:
            for here, expr in zip(dims, amap.results):
                if isinstance(expr, ir.AffineDimExpr) and isinstance(here, tuple):
                    loop_sizes.setdefault(expr.position, here)
                elif isinstance(expr, ir.AffineDimExpr) and isinstance(here, Dim):
                    first = loop_dims.setdefault(expr.position, here)
                    if first.arg >= self.n and here.arg < self.n:
                        loop_dims[expr.position] = here
        affine: list[tuple[Dim, dict[int, int], int]] = []
        general: list[tuple[Dim, Expr]] = []
        for dims, amap in placed:
            for here, expr in zip(dims, amap.results):
                if not isinstance(here, Dim):
                    continue
                if isinstance(expr, ir.AffineDimExpr):
                    known = loop_sizes.get(expr.position)
                    if known is not None:
                        self.tie_extents(here, known, reason)
                    else:
                        self.tie(loop_dims[expr.position], here, reason)
                    continue
                serialized = _expression(expr)
                linear = _linear(serialized)
                if linear is not None and linear[0]:
                    affine.append((here, linear[0], linear[1]))
                elif serialized is not None:
                    general.append((here, serialized))
        for target, terms, constant in affine:
            fixed = {d: loop_sizes[d][0] for d in terms if d in loop_sizes}
            if all(d in loop_dims or d in fixed for d in terms) and all(fixed.values()):
                constant += sum(terms[d] * (size - 1) for d, size in fixed.items())
                self.bounds.append(Bound(target, tuple((c, loop_dims[d]) for d, c in sorted(terms.items())
                                                       if d not in fixed), constant, reason))
        for target, serialized in general:
            used = sorted(_dims_of(serialized))
            if all(j in loop_dims for j in used):
                self.affine_bounds.append(AffineBound(target, serialized, tuple((j, loop_dims[j]) for j in used),
                                                      reason))

    def bound(self, bound: Bound) -> None:
        """Add ``bound``, unless it is there already or always holds (a dim that reaches its own end)."""
        own = [c for c, d in bound.terms if d == bound.target]
        others = [c for c, d in bound.terms if d != bound.target]
        if own == [1] and bound.constant <= 0 and not any(others) and bound.lowest >= 0:
            return
        if bound not in self.bounds:
            self.bounds.append(bound)

    def slice(self, op: ir.Operation, source: ir.Value, nest: _LoopNest, reason: str) -> None:
        """A ``memref.subview``/``tensor.extract_slice``/``tensor.insert_slice`` of ``source``: each dim whose
        offset and stride are constants, and whose size is a constant or a dim read with ``memref.dim``, must
        reach the slice's last index, and its first must not lie below 0."""
        found = self.dims_of(source)
        if found is None:
            return
        parts = [ir.DenseI64ArrayAttr(op.attributes[f"static_{kind}"]) for kind in ("offsets", "sizes", "strides")]
        sizes = self.slice_sizes(op) if len(found[1]) == len(parts[1]) else None
        if op.name == "tensor.insert_slice":  # what it inserts has the slice's sizes
            inserted = self.extents(op.operands[0])
            dims = self.slice_sizes(op, ir.ShapedType(op.operands[0].type).rank)
            if inserted is not None and dims is not None and len(inserted) == len(dims):
                for a, b in zip(inserted, dims):
                    self.tie_extents(a, b, reason)
        for k, (dim, offset, size, stride) in enumerate(zip(found[1], *parts)):
            read = sizes[k] if sizes is not None else None
            if offset == _DYNAMIC or stride == _DYNAMIC:
                continue
            if size != _DYNAMIC and size > 0:
                last = offset + (size - 1) * stride
                self.bound(Bound(dim, nest.guards, max(offset, last), reason, "reaches", min(offset, last)))
            elif isinstance(read, Dim) and stride > 0:
                terms = ((stride, read),) + tuple(g for g in nest.guards if g[1] != read)
                self.bound(Bound(dim, terms, offset, reason, "reaches", offset))

    def element(self, memory: ir.Value, indices: Sequence[ir.Value], nest: _LoopNest, reason: str,
                shape: Sequence[int] = ()) -> None:
        """A load or store of ``memory`` at ``indices`` (of a vector of ``shape`` over its last dims): each
        index that is a constant, or a loop's induction variable plus or minus a constant, must lie inside its
        dim (from 0)."""
        found = self.dims_of(memory)
        if found is None:
            return
        extents = [1] * (len(indices) - len(shape)) + list(shape)
        for dim, index, extent in zip(found[1], indices, extents):
            reach = nest.reach(index)
            if reach is not None and extent > 0:
                terms, highest, lowest = reach
                self.bound(Bound(dim, terms, highest + extent - 1, reason, "reaches", lowest))

    def dim(self, value: ir.Value) -> Dim | None:
        """The argument or view dim ``value`` is the size of (a ``memref.dim``/``tensor.dim`` at a constant
        index)."""
        owner = _defining_op(value)
        if owner is None or owner.name not in ("memref.dim", "tensor.dim"):
            return None
        found = self.dims_of(owner.operands[0])
        k = _constant(owner.operands[1])
        return None if found is None or k is None or not 0 <= k < len(found[1]) else found[1][k]

    def all_dims(self, op: ir.Operation, reason: str) -> None:
        operands = [found for found in map(self.extents, op.operands) if found is not None]
        for other in operands[1:]:
            if len(other) == len(operands[0]):
                for a, b in zip(operands[0], other):
                    self.tie_extents(a, b, reason)

    def called(self, values: Sequence[ir.Value], callee: ShapeRules,
               guards: tuple[tuple[int, Dim], ...] | None) -> None:
        """The rules of the function a ``func.call`` or ``func.call_indirect`` calls (the argument rules of
        ``callee``), on the extents of what the call passes (``values``). ``guards``: the loops around the call,
        as :class:`_LoopNest` gives them (None if something else encloses it: then the callee's bounds are left
        out, as an access's would be)."""
        passed = [self.extents(v) if isinstance(v.type, ir.ShapedType) else None for v in values]

        def mapped(dim: Dim) -> Extent:
            found = passed[dim.arg] if dim.arg < len(passed) else None
            return found[dim.dim] if found is not None and dim.dim < len(found) else None

        for tie in callee.ties:
            a = mapped(tie.a)
            if tie.b is None and isinstance(a, Dim):
                self.fix(a, tie.size, tie.reason, tie.has or f"{tie.reason} is {tie.size}")
            elif tie.b is not None:
                self.tie_extents(a, mapped(tie.b), tie.reason)
        for reason, args in callee.unfollowed:
            self.unfollowed(reason, [values[a] for a in args if a < len(values)])
        if guards is None:
            return
        for bound in callee.bounds:
            target, terms = mapped(bound.target), [(c, mapped(d)) for c, d in bound.terms]
            if not isinstance(target, Dim) or any(d is None for _, d in terms):
                continue
            fixed = [size for _, d in terms if isinstance(d, tuple) for size in d[:1]]
            if all(fixed):  # a slice of 0 elements: nothing is reached
                constant = bound.constant + sum(c * (d[0] - 1) for c, d in terms if isinstance(d, tuple))
                self.bound(Bound(target, tuple((c, d) for c, d in terms if isinstance(d, Dim)) + guards, constant,
                                 bound.reason, bound.verb, bound.lowest))
        for affine in callee.affine_bounds if not guards else ():
            target, loops = mapped(affine.target), [(j, mapped(d)) for j, d in affine.loops]
            if isinstance(target, Dim) and all(isinstance(d, Dim) for _, d in loops):
                self.affine_bounds.append(AffineBound(target, affine.expr, tuple((j, d) for j, d in loops
                                                                                 if isinstance(d, Dim)),
                                                      affine.reason))

    def unfollowed(self, reason: str, values: Sequence[ir.Value]) -> None:
        """A call the rules cannot follow, passed ``values``: the arguments among them (or whose dims size
        them) must have named dims."""
        args: set[int] = set()
        for value in values:
            found = self.extents(value) if isinstance(value.type, ir.ShapedType) else None
            origin, _ = trace(value, self.entry)
            args.update(d.arg for d in found or () if isinstance(d, Dim) and d.arg < self.n)
            if isinstance(origin, int) and self.ranks[origin] is not None:
                args.add(origin)
        if args:
            self.calls.append((reason, tuple(sorted(args))))

    def rules(self) -> ShapeRules:
        """The rules collected: those on views' dims apart, and the views only if something checks them."""
        def on_arguments(*dims: Dim | None) -> bool:
            return all(d is None or d.arg < self.n for d in dims)

        ties = [t for t in self.ties if on_arguments(t.a, t.b)]
        bounds = [b for b in self.bounds if on_arguments(b.target, *(d for _, d in b.terms))]
        affine = [b for b in self.affine_bounds if on_arguments(b.target, *(d for _, d in b.loops))]
        through = ShapeRules(tuple(t for t in self.ties if t not in ties),
                             tuple(b for b in self.bounds if b not in bounds), {}, (),
                             tuple(b for b in self.affine_bounds if b not in affine))
        checked = any(v.splits or v.reach for v in self.views) or through.ties or through.bounds \
            or through.affine_bounds
        views = tuple(self.views) if checked else ()
        return ShapeRules(tuple(ties), tuple(bounds), {}, (), tuple(affine), views, through if views else None,
                          tuple(self.calls))


def _is_elementwise_on_tensors(op: ir.Operation) -> bool:
    return (op.name.startswith(("arith.", "math.")) and len(op.operands) > 1
            and all(isinstance(v.type, ir.RankedTensorType) for v in op.operands))


def ir_rules(module: ir.Module, function: str, specs: Sequence[ArgSpec], names: Sequence[str] = (),
             visiting: frozenset[str] = frozenset()) -> ShapeRules:
    """The ties and bounds that ``func.func @function``'s ops, and those of the functions it calls, put on its
    arguments (named ``names`` in messages), and on the views it makes of them; no dim names yet.

    Works on a copy of the module with the calls inlined and linalg's named ops
    generalized (see :mod:`memkernel.analysis.inlining`); a call the inliner leaves is
    read through its callee's own rules, unless the callee is one of ``visiting``
    (the functions whose rules are being read). Raises SignatureError for a reshape
    of an argument whose sizes cannot be read (see :mod:`memkernel.analysis.reshapes`).
    """
    names = names or [f"argument #{i}" for i in range(len(specs))]
    casts: list[Tie] = []

    def read_casts(before: ir.Operation, origin: Origin) -> None:
        """The sizes casts to static dims fix, read before generalizing folds the casts into linalg ops."""
        early = _Collector(function, before, specs, names, origin)
        blocks = EveryRun()
        for op in _operations(before):
            if op.name in SHAPE_PRESERVING and unconditional(op, before, blocks):
                early.cast(op, origin(op))
        casts.extend(t for t in early.ties if t.a.arg < len(specs))

    inlined = Inlined(module, function, read_casts)
    func = inlined.function
    collector = _Collector(function, func, specs, names, inlined.origin)
    collector.ties.extend(casts)
    blocks = EveryRun()

    for op in _operations(func):
        if not unconditional(op, func, blocks):
            continue
        reason = inlined.origin(op)
        if op.name.startswith("linalg.") and "indexing_maps" in op.attributes:
            collector.structured(op, reason)
        elif op.name in ("memref.copy",) or _is_elementwise_on_tensors(op):
            collector.all_dims(op, reason)
        elif op.name in RESHAPES:
            collector.dims_of(op.results[0])
        elif op.name in ("func.call", "func.call_indirect"):
            _call(module, collector, op, func, reason, visiting | {function})
        else:
            _accesses(collector, op, func, reason)
    if not visiting:
        _refuse_negative(function, collector)
    return collector.rules()


def _call(module: ir.Module, collector: _Collector, op: ir.Operation, function: ir.Operation, reason: str,
          visiting: frozenset[str]) -> None:
    """Carry the rules of the function a call the inliner left calls over to what it passes. A
    ``func.call_indirect`` is followed when its callee is a ``func.constant``; one whose callee the rules cannot
    name is recorded with the arguments it is passed, whose dims must then be named (see
    :meth:`ShapeRules.unnamed`)."""
    values = list(op.operands)
    if op.name == "func.call":
        name = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
    else:
        values = values[1:]
        constant = _defining_op(op.operands[0])
        if constant is None or constant.name != "func.constant":
            collector.unfollowed(reason, values)
            return
        name = ir.FlatSymbolRefAttr(constant.attributes["value"]).value
    callee = _callee_rules(module, name, visiting)
    if callee is not None:
        nest = _LoopNest.around(op, function, collector)
        collector.called(values, callee, None if nest is None else nest.guards)


def _refuse_negative(kernel: str, collector: _Collector) -> None:
    """Refuse a kernel that reaches an index below 0 on every call (no loop around the access can run no
    times): that access is outside its array whatever the array's size."""
    for bound in collector.bounds:
        if bound.lowest < 0 and not bound.terms:
            name = collector.names[bound.target.arg]
            raise SignatureError(
                f"{kernel}(): {bound.reason} {bound.verb} index {bound.lowest} of {name} on dim "
                f"{bound.target.dim}, on every call: an index below 0 is outside {name} whatever its size. "
                "Index from 0."
            )


def _callee_rules(module: ir.Module, callee: str, visiting: frozenset[str]) -> ShapeRules | None:
    """The rules of a function a call the inliner left calls, read on its own; None for a function only
    declared, one of ``visiting``, or one whose arguments or reshapes the rules cannot read."""
    function = defined_function(module.operation, callee)
    if function is None or callee in visiting:
        return None
    try:
        return ir_rules(module, callee, read_signature(function).args, visiting=visiting)
    except SignatureError:
        return None


def _operations(function: ir.Operation) -> list[ir.Operation]:
    """The ops inside ``function``, in the order ``walk`` visits them; listed first, so that reading them
    raises its errors outside MLIR's callback (which would wrap them in a RuntimeError)."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op != function:
            found.append(op)
        return ir.WalkResult.ADVANCE

    walk(function, visit)
    return found


class _LoopNest:
    """The ``scf.for`` loops around an op, each from 0 by 1 to a constant or to a dim of an argument.

    ``guards`` are the loops' dims as bound terms of coefficient 0: a bound holds only when
    every loop around the access runs at least once.
    """

    def __init__(self, loops: dict[ir.Value, tuple[int, Dim | None]]) -> None:
        self._loops = loops
        self.guards = tuple((0, dim) for dim in dict.fromkeys(d for _, d in loops.values() if d is not None))

    @staticmethod
    def around(op: ir.Operation, function: ir.Operation, collector: _Collector) -> _LoopNest | None:
        """The loops around ``op`` up to ``function``'s body; None if anything else encloses it, or a loop
        runs from elsewhere than 0, by another step than 1, to an end that is not a constant or a dim, or not
        at all."""
        loops: list[tuple[ir.Value, tuple[int, Dim | None]]] = []  # innermost first
        parent = op.parent
        while parent != function:
            if parent.name != "scf.for":
                return None
            lower, upper, step = (parent.operands[i] for i in range(3))
            if _constant(lower) != 0 or _constant(step) != 1:
                return None
            end = _constant(upper)
            dim = collector.dim(upper) if end is None else None
            if end is not None and end <= 0 or end is None and dim is None:
                return None
            loops.append((parent.regions[0].blocks[0].arguments[0], (end or 0, dim)))
            parent = parent.parent
        return _LoopNest(dict(reversed(loops)))

    def reach(self, index: ir.Value) -> tuple[tuple[tuple[int, Dim], ...], int, int] | None:
        """The largest value ``index`` takes, as bound terms and a constant, and its least, a constant: for a
        constant, a loop's induction variable, or one plus or minus a constant; None for anything else."""
        offset = 0
        owner = _defining_op(index)
        if owner is not None and owner.name in ("arith.addi", "arith.subi"):
            first, second = owner.operands[0], owner.operands[1]
            sign = 1 if owner.name == "arith.addi" else -1
            for variable, other in ((first, second), (second, first))[:2 if sign == 1 else 1]:
                added = _constant(other)
                if added is not None and variable in self._loops:
                    index, offset = variable, sign * added
                    break
        constant = _constant(index)
        if constant is not None:
            return self.guards, constant, constant
        if index not in self._loops:
            return None
        end, dim = self._loops[index]
        if dim is None:
            return self.guards, end - 1 + offset, offset
        return tuple((1 if d == dim else 0, d) for _, d in self.guards), offset, offset


_ELEMENT_ACCESSES = {"memref.load": 0, "tensor.extract": 0, "memref.store": 1, "tensor.insert": 1,
                     "vector.load": 0, "vector.store": 1}
"""Ops that read or write at indices, by the position of the memory operand (the indices follow it)."""

_SLICES = {"memref.subview": 0, "tensor.extract_slice": 0, "tensor.insert_slice": 1}
"""Ops that take a slice at static or dynamic positions, by the position of the sliced operand."""


def _accesses(collector: _Collector, op: ir.Operation, function: ir.Operation, reason: str) -> None:
    """What a slice at constant positions, or a load or store at constant positions or loop indices, asks of
    its operand's dims."""
    if op.name not in _ELEMENT_ACCESSES and op.name not in _SLICES:
        return
    nest = _LoopNest.around(op, function, collector)
    if nest is None:
        return
    if op.name in _SLICES:
        collector.slice(op, op.operands[_SLICES[op.name]], nest, reason)
    else:
        position = _ELEMENT_ACCESSES[op.name]
        memory = op.operands[position]
        indices = list(op.operands)[position + 1:]
        vector_type = op.results[0].type if op.name == "vector.load" else op.operands[0].type
        shape = list(vector_type.shape) if op.name.startswith("vector.") else []
        collector.element(memory, indices, nest, reason, shape)
