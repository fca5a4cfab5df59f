"""The views that reshaping ops make of the arguments, read off the IR (see :mod:`memkernel.model.views`).

- ``collapse_shape`` (memref and tensor): each view dim is the product of the
  source dims of its reassociation group.
- ``expand_shape`` (memref and tensor): a source dim is split into the dims of
  its group. Their sizes are static, read off ``output_shape`` (a constant, a
  ``memref.dim`` of an argument, a product of those), or, for one dim of a group
  whose others are static, what those leave of the source dim.
- ``memref.reinterpret_cast``: sizes, strides and offset as given, read the same
  way; every element must lie in the buffer of the identity-layout argument
  whose memory it reinterprets.
- ``memref.view``: a contiguous view at a byte shift of an ``i8`` buffer,
  which must hold all of it.

Where a size, stride or offset cannot be read, nothing can be checked about
what the view reaches, and the kernel is refused with a message that says which
value; no dim name can stand for it, since it is not a dim of an argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from mlir import ir

from ..model.dims import Dim
from ..model.views import Reach, Size, Split, View

RESHAPES = frozenset({"memref.collapse_shape", "tensor.collapse_shape", "memref.expand_shape",
                      "tensor.expand_shape", "memref.reinterpret_cast", "memref.view"})
"""The ops whose result is a view, of another shape, of their first operand."""

KEEP_BASE = frozenset(RESHAPES - {"memref.view"})
"""The reshapes whose result has its source's base pointer (a ``memref.view``'s is shifted)."""

_DYNAMIC = -(1 << 63)

_READABLE = "a constant, a memref.dim of an argument or a product of those"

Resolve = Callable[[ir.Value], Size | None]
"""What an index value is as a :class:`Size` of the arguments' dims, or None."""


def reshape_view(op: ir.Operation, origin: int, source: tuple[Dim, ...], names: Sequence[str], index: int,
                 size: Resolve, base: int | None, guards: tuple[Dim, ...], reason: str) -> View | str:
    """The view ``op`` makes of argument or view ``origin`` (named in ``names``), whose dims as ``op`` sees
    them are ``source``, to be view number ``index`` (its dims ``Dim(index, k)``); or, when its sizes cannot
    be read, why, to follow the view's name in a message. ``base``: the identity-layout argument whose buffer
    ``origin`` is (None if it is not one)."""
    if op.name.endswith("collapse_shape"):
        groups = _groups(op)
        return View(reason, origin, tuple(Size(tuple(source[k] for k in group)) for group in groups), guards=guards)
    if op.name.endswith("expand_shape"):
        return _expanded(op, source, origin, size, guards, reason)
    if base is None:
        return (f"reinterprets memory that is not one identity-layout argument's buffer ({names[origin]} has a "
                "strided layout, or was shifted by a memref.view): memkernel cannot check what the view reaches, "
                "so it refuses the kernel. Reinterpret an identity-layout argument, or take a memref.subview, whose "
                "bounds memkernel checks.")
    if op.name == "memref.reinterpret_cast":
        parts = offsets_sizes_strides(op, size)
        unread = next((what for what, value in parts if value is None), None)
        if unread is not None:
            return _unreadable(unread, names[base])
        values = [value for _, value in parts if value is not None]
        rank = (len(values) - 1) // 2
        return View(reason, origin, tuple(values[1:1 + rank]), reach=Reach(base, values[0], tuple(values[1 + rank:])),
                    guards=guards)
    return _viewed(op, origin, names, index, size, base, guards, reason)


def _unreadable(what: str, base: str) -> str:
    return (f"takes its {what} from a value that is not {_READABLE}: memkernel cannot check that the view stays "
            f"inside {base}, so it refuses the kernel. Compute the {what} that way, or take a memref.subview, whose "
            "bounds memkernel checks.")


def _groups(op: ir.Operation) -> list[list[int]]:
    return [[ir.IntegerAttr(k).value for k in ir.ArrayAttr(group)]
            for group in ir.ArrayAttr(op.attributes["reassociation"])]


def _expanded(op: ir.Operation, source: tuple[Dim, ...], origin: int, size: Resolve, guards: tuple[Dim, ...],
              reason: str) -> View | str:
    """An expand_shape's view: its static and readable sizes, and per group at most one that the others leave."""
    dynamic = iter(list(op.operands)[1:])
    dims: list[Size | None] = [Size((), s) if s != _DYNAMIC else size(next(dynamic))
                               for s in ir.DenseI64ArrayAttr(op.attributes["static_output_shape"])]
    splits = []
    for k, group in enumerate(_groups(op)):
        unread = [j for j in group if dims[j] is None]
        multiple = 0
        if unread:
            known = [dims[j] for j in group if dims[j] is not None]
            multiple = math.prod(d.constant for d in known if d is not None)
            if len(unread) > 1 or any(d is not None and d.factors for d in known) or multiple == 0:
                shown = " x ".join(str(d.constant) if d is not None and not d.factors else "?"
                                   for d in (dims[j] for j in group))
                return (f"splits its dim {k} into {shown}, with sizes not {_READABLE}: memkernel "
                        "cannot tell the view's dims, so it refuses the kernel. Leave at most one such size in each "
                        "group, with static sizes beside it, or read the sizes with memref.dim.")
            dims[unread[0]] = Size((source[k],), 1, multiple)
        splits.append(Split(source[k], tuple(group), multiple))
    return View(reason, origin, tuple(d for d in dims if d is not None), tuple(splits), guards=guards)


def offsets_sizes_strides(op: ir.Operation, size: Resolve) -> list[tuple[str, Size | None]]:
    """The offsets, sizes and strides of a reinterpret_cast (one offset) or a slice (one per dim), in that order,
    each named for messages, as sizes where readable."""
    segments = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
    operands = list(op.operands)
    start = sum(segments[:-3])  # the source (and an insert's destination)
    parts: list[tuple[str, Size | None]] = []
    for kind, count in zip(("offset", "size", "stride"), segments[-3:]):
        dynamic = iter(operands[start:start + count])
        start += count
        static = list(ir.DenseI64ArrayAttr(op.attributes[f"static_{kind}s"]))
        for k, value in enumerate(static):
            what = kind if kind == "offset" else f"{kind} of dim {k}"
            parts.append((what, Size((), value) if value != _DYNAMIC else size(next(dynamic))))
    return parts


def _viewed(op: ir.Operation, origin: int, names: Sequence[str], index: int, size: Resolve, base: int,
            guards: tuple[Dim, ...], reason: str) -> View | str:
    """A memref.view: contiguous, row-major, ``byte_shift`` bytes into its ``i8`` source."""
    operands = list(op.operands)
    shift = size(operands[1])
    if shift is None:
        return _unreadable("byte shift", names[base])
    result = ir.MemRefType(op.results[0].type)
    dynamic = iter(operands[2:])
    dims = []
    for k, static in enumerate(result.shape):
        value = Size((), static) if static != _DYNAMIC else size(next(dynamic))
        if value is None:
            return _unreadable(f"size of dim {k}", names[base])
        dims.append(value)
    width = _bytes(result.element_type)
    if width is None:
        return (f"makes elements of {result.element_type}, whose size in bytes memkernel does not know, so it "
                "refuses the kernel.")
    strides = tuple(Size(tuple(Dim(index, j) for j in range(k + 1, result.rank)), width) for k in range(result.rank))
    return View(reason, origin, tuple(dims), reach=Reach(base, shift, strides, width), guards=guards)


def _bytes(element: ir.Type) -> int | None:
    """The bytes an element of type ``element`` takes in memory; None for a type memkernel does not size."""
    if isinstance(element, ir.IndexType):
        return 8
    if isinstance(element, (ir.IntegerType, ir.FloatType)):
        return -(-element.width // 8)
    return None
