"""Reshapes of a kernel's arguments, as the shape rules see them: views whose dims are sizes of the arguments'.

A linalg op on ``memref.collapse_shape %x [[0, 1]]`` loops over as many
elements as ``x``'s two dims multiply to; on an ``expand_shape`` of ``x`` into
``?x4``, over a quarter of ``x``'s length in its first dim. Such a view gets dims
of its own, numbered past the arguments' (:class:`~memkernel.model.dims.Dim`
``(n + i, k)`` is dim ``k`` of view ``i`` of a kernel of ``n`` arguments), and
the rules the op puts on them are checked once the call knows their sizes:
each is a :class:`Size`, a product of dims of the arguments (or of views
before it) and constants.

A view also asks things of its own:

- an ``expand_shape`` asks that each source dim be what the dims it is split
  into multiply to (a :class:`Split`);
- a ``reinterpret_cast`` or ``memref.view`` asks that every element it makes lie
  in the memory of the argument it reinterprets (a :class:`Reach`).

:mod:`memkernel.analysis.reshapes` reads views off the IR.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ShapeError
from .dims import Dim

Shapes = Sequence[tuple[int, ...] | None]
"""The shapes of the arguments, then of the views (None where unknown)."""


@dataclass(frozen=True)
class Size:
    """``constant * prod(the size of each of factors) // divisor``."""

    factors: tuple[Dim, ...] = ()
    constant: int = 1
    divisor: int = 1

    def value(self, shapes: Shapes) -> int | None:
        """The size, given the shapes of the arguments and the views before; None if one is unknown."""
        total = self.constant
        for factor in self.factors:
            shape = shapes[factor.arg]
            if shape is None:
                return None
            total *= shape[factor.dim]
        return total // self.divisor


@dataclass(frozen=True)
class Split:
    """The view dims ``dims`` are ``source`` split up (a group of an expand_shape's reassociation): their sizes
    must multiply to its size. ``multiple``, when not 0: one of them is what the others' static sizes, whose
    product it is, leave of ``source``, which must then be a multiple of it."""

    source: Dim
    dims: tuple[int, ...]
    multiple: int = 0


@dataclass(frozen=True)
class Reach:
    """Element ``(i_0, i_1, ...)`` of the view lies ``offset + sum(i_k * strides[k])`` elements into the memory
    of argument ``base`` and spans ``width`` of its elements; every element of the view must lie in it."""

    base: int
    offset: Size
    strides: tuple[Size, ...]
    width: int = 1


@dataclass(frozen=True)
class View:
    """A reshape of argument (or view) ``source`` by ``reason`` (``@k's memref.collapse_shape``), each of its
    dims a :class:`Size`. Its splits and reach hold whenever every dim of ``guards`` (the loops around it) is
    non-empty."""

    reason: str
    source: int
    dims: tuple[Size, ...]
    splits: tuple[Split, ...] = ()
    reach: Reach | None = None
    guards: tuple[Dim, ...] = ()

    def name(self, names: Sequence[str]) -> str:
        """How messages call the view: ``@k's memref.collapse_shape of x``."""
        return f"{self.reason} of {names[self.source]}"

    def shape(self, kernel: str, names: Sequence[str], shapes: Shapes) -> tuple[int, ...] | None:
        """The view's shape for a call of argument and earlier view ``shapes`` (named ``names``); a ShapeError
        if a split or the reach does not hold. None if a size it needs is unknown."""
        sizes = [size.value(shapes) for size in self.dims]
        if any(s is None for s in sizes):
            return None
        shape = tuple(s for s in sizes if s is not None)
        guards = [shapes[g.arg] for g in self.guards]
        if any(g is None or g[d.dim] == 0 for g, d in zip(guards, self.guards)):
            return shape
        for split in self.splits:
            self._check_split(kernel, names, shapes, shape, split)
        if self.reach is not None and 0 not in shape:
            self._check_reach(kernel, names, [*shapes, shape], shape, self.reach)
        return shape

    def _check_split(self, kernel: str, names: Sequence[str], shapes: Shapes, shape: tuple[int, ...],
                     split: Split) -> None:
        source = shapes[split.source.arg]
        if source is None:
            return
        have = source[split.source.dim]
        parts = [shape[j] for j in split.dims]
        if math.prod(parts) == have:
            return
        name = names[split.source.arg]
        remedy = (f"pass {name} with dim {split.source.dim} a multiple of {split.multiple}" if split.multiple
                  else f"the parts must multiply to {name}'s dim {split.source.dim}")
        raise ShapeError(
            f"{kernel}(): {name} has {have} elements on dim {split.source.dim} but {self.reason} splits it into "
            f"{' x '.join(map(str, parts))} = {math.prod(parts)}; {remedy}."
        )

    def _check_reach(self, kernel: str, names: Sequence[str], shapes: Shapes, shape: tuple[int, ...],
                     reach: Reach) -> None:
        memory = shapes[reach.base]
        values = [s.value(shapes) for s in (reach.offset, *reach.strides)]
        if memory is None or None in values:
            return
        offset, *strides = [v for v in values if v is not None]
        low = high = offset
        for size, stride in zip(shape, strides):
            step = (size - 1) * stride
            low, high = (low + step, high) if step < 0 else (low, high + step)
        high += reach.width - 1
        have = math.prod(memory)
        if 0 <= low and high < have:
            return
        base = names[reach.base]
        where = (f"element {low}, before the start of {base}" if low < 0
                 else f"up to element {high} of {base}, which has {have}")
        remedy = "the kernel indexes out of bounds." if low < 0 else f"pass {base} with at least {high + 1} elements."
        raise ShapeError(f"{kernel}(): {self.name(names)}, of shape {shape}, reaches {where}; {remedy}")
