"""Hypothesis strategies of valid arguments for a kernel, read off its signature and shape rules.

:func:`arguments` draws one tuple per example: an array per memref or tensor
input (its dtype, rank and static dims from the type), a number per scalar
input (within its type's range), and nothing for the outputs the call
allocates. The ``?`` dims are drawn per class of tied dims (union-find over
the kernel's :class:`~memkernel.model.shapes.Tie` s, from the IR and from named
dims), so that every tied dim gets one size; a dim that a
:class:`~memkernel.model.shapes.Bound` constrains (a convolution's input) is
then raised to the bound. Sizes shrink towards ``min_side`` and views towards
plain contiguous arrays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Union

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..kernel import Kernel
from ..model.contract import BufferContract, ScalarContract
from ..model.shapes import Bound, Dim, ShapeRules
from ..model.signature import ArgSpec, MemRefSpec

Elements = Union[st.SearchStrategy[Any], Mapping[Any, st.SearchStrategy[Any]], None]

# Default float values: multiples of 1/8 in [-8, 8]. Sums and products of a few thousand of them
# are exact in f32 and f64, so a reassociated reduction compares equal to the reference.
_EIGHTHS = st.integers(-64, 64).map(lambda k: k / 8)
# The largest magnitude drawn for 8-bit floats (every value of theirs is taken, up to it).
_SMALL_FLOAT_LIMIT = 8.0
_MAX_STEP = 3
_MAX_OFFSET = 3


class _Classes:
    """Union-find over the dims of a kernel's ranked arguments: which dims must have one size."""

    def __init__(self, specs: tuple[ArgSpec, ...], rules: ShapeRules) -> None:
        self.parent: dict[Dim, Dim] = {}
        self.fixed: dict[Dim, int] = {}
        for i, spec in enumerate(specs):
            if isinstance(spec, MemRefSpec):
                for k, size in enumerate(spec.shape):
                    self.parent[Dim(i, k)] = Dim(i, k)
                    if size is not None:
                        self.fixed[Dim(i, k)] = size
        for tie in rules.ties:
            if tie.a not in self.parent:
                continue
            if tie.b is None:
                self._fix(tie.a, tie.size)
            elif tie.b in self.parent:
                self._union(tie.a, tie.b)

    def root(self, dim: Dim) -> Dim:
        while self.parent[dim] != dim:
            self.parent[dim] = self.parent[self.parent[dim]]
            dim = self.parent[dim]
        return dim

    def _fix(self, dim: Dim, size: int) -> None:
        root = self.root(dim)
        if self.fixed.get(root, size) != size:
            raise ValueError(f"dim {dim.dim} of argument #{dim.arg} is tied to both {self.fixed[root]} and {size}")
        self.fixed[root] = size

    def _union(self, a: Dim, b: Dim) -> None:
        ra, rb = self.root(a), self.root(b)
        if ra == rb:
            return
        self.parent[rb] = ra
        if rb in self.fixed:
            self._fix(ra, self.fixed.pop(rb))

    def roots(self) -> list[Dim]:
        """One dim per class, in argument order (the order sizes are drawn in)."""
        return sorted({self.root(d) for d in self.parent}, key=lambda d: (d.arg, d.dim))

    def fixed_size(self, root: Dim) -> int | None:
        return self.fixed.get(root)


def _satisfy_bounds(sizes: dict[Dim, int], classes: _Classes, bounds: tuple[Bound, ...]) -> bool:
    """Raise bounded classes to their bounds, in place; False if a fixed size cannot meet one, or one reaches
    below index 0 (only sizes that leave its loops empty meet it)."""
    for _ in range(len(bounds) + 1):
        changed = False
        for bound in bounds:
            lengths = [sizes[classes.root(d)] for _, d in bound.terms]
            if any(n == 0 for n in lengths):
                continue
            if bound.lowest < 0:  # an index below 0: only sizes that leave the loops empty meet it
                return False
            needed = sum(c * (n - 1) for (c, _), n in zip(bound.terms, lengths)) + bound.constant + 1
            target = classes.root(bound.target)
            if sizes[target] >= needed:
                continue
            if classes.fixed_size(target) is not None:
                return False
            sizes[target] = needed
            changed = True
        if not changed:
            return True
    return False


# -- element values ---------------------------------------------------------------


def _small_float_values(dtype: np.dtype) -> list[float]:
    """Every finite value of an 8-bit float type up to the limit, smallest magnitude first."""
    values = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)
    kept = {float(v) for v in values if np.isfinite(v) and abs(v) <= _SMALL_FLOAT_LIMIT}
    return sorted(kept, key=lambda v: (abs(v), v < 0))


def default_elements(dtype: np.dtype) -> st.SearchStrategy[Any]:
    """The values drawn by default for ``dtype``: any bool or integer of its range; for floats,
    multiples of 1/8 in [-8, 8] (every finite value up to 8 for 8-bit floats); complex from two such."""
    if dtype.kind == "b":
        return st.booleans()
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return st.integers(int(info.min), int(info.max))
    if dtype.kind == "c":
        return st.builds(complex, _EIGHTHS, _EIGHTHS)
    if dtype.itemsize == 1:
        return st.sampled_from(_small_float_values(dtype))
    return _EIGHTHS


def _override(elements: Elements, name: str, dtype: np.dtype) -> st.SearchStrategy[Any] | None:
    """The strategy ``elements`` gives argument ``name`` of ``dtype``: by name first, then by dtype
    (a dtype, a type, or a dtype's full name such as ``"float32"``); None if it gives none."""
    if elements is None or isinstance(elements, st.SearchStrategy):
        return elements
    if name in elements:
        return elements[name]
    for key, strategy in elements.items():
        if key == dtype.name or not isinstance(key, str) and np.dtype(key) == dtype:
            return strategy
    return None


def _scalar(contract: ScalarContract, elements: Elements) -> st.SearchStrategy[Any]:
    element = contract.element
    chosen = _override(elements, contract.name, element.dtype)
    if chosen is not None:
        return chosen
    if element.kind == "bool":
        return st.booleans()
    if element.kind == "int":
        assert element.int_range is not None
        return st.integers(*element.int_range)
    return default_elements(element.dtype)


# -- arrays and views -------------------------------------------------------------


def _values(shape: tuple[int, ...], dtype: np.dtype, elements: st.SearchStrategy[Any]) -> st.SearchStrategy[np.ndarray]:
    """A contiguous array of ``shape``; types hypothesis cannot fill (bf16, f8) are drawn as float64."""
    if dtype.kind in "biufc" and dtype.type.__module__ == "numpy":
        return hnp.arrays(dtype, shape, elements=elements)
    return hnp.arrays(np.dtype(np.float64), shape, elements=elements.map(float)).map(lambda a: a.astype(dtype))


def _as_view(draw: st.DrawFn, values: np.ndarray) -> np.ndarray:
    """``values`` as a view: dims permuted, stepped, reversed, and the whole offset in its buffer.
    Shrinks to a plain contiguous copy."""
    if values.ndim == 0 or not draw(st.booleans()):
        return values
    rank = values.ndim
    order = draw(st.permutations(range(rank)))
    steps = [draw(st.integers(1, _MAX_STEP)) for _ in range(rank)]
    flips = [draw(st.booleans()) for _ in range(rank)]
    offset = draw(st.integers(0, _MAX_OFFSET))
    inner = [values.shape[j] * s for j, s in zip(order, steps)]
    buffer = np.zeros(offset + math.prod(inner), values.dtype)
    view = buffer[offset:].reshape(inner)[tuple(slice(None, None, s) for s in steps)]
    view = view[tuple(slice(None, None, -1) if f else slice(None) for f in flips)]
    view = view.transpose(np.argsort(order))
    view[...] = values
    return view


def laid_out(values: np.ndarray, strides: tuple[int | None, ...]) -> np.ndarray:
    """``values`` in an array with the given element strides (``None``: any), as a strided layout
    with static strides wants it. The ``?`` strides are placed past the static dims' footprint."""
    shape = values.shape
    element = [abs(s) if s is not None else 0 for s in strides]
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, element) if n > 0)
    for k in reversed(range(len(shape))):
        if strides[k] is None:
            element[k] = extent
            extent += (shape[k] - 1) * extent if shape[k] > 0 else 0
    signed = [e if s is None or s >= 0 else -e for e, s in zip(element, strides)]
    start = sum((n - 1) * -s for n, s in zip(shape, signed) if s < 0 and n > 0)
    buffer = np.zeros(extent, values.dtype)
    itemsize = values.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(buffer[start:], shape, tuple(s * itemsize for s in signed), writeable=True)
    view[...] = values
    return view


class _Drawer:
    """Draws one argument tuple; everything that does not depend on the drawn sizes is built once."""

    def __init__(self, kernel: Kernel, min_side: int, max_side: int, elements: Elements, views: bool) -> None:
        spec = kernel.spec
        self.contracts = spec.contracts[:spec.n_inputs]
        self.classes = _Classes(spec.signature.args, spec.shapes)
        self.bounds = spec.shapes.bounds
        self.side = st.integers(min_side, max_side)
        self.views = views
        self.scalars = {c.index: _scalar(c, elements) for c in self.contracts if isinstance(c, ScalarContract)}
        self.elements: dict[int, st.SearchStrategy[Any]] = {}
        for c in self.contracts:
            if isinstance(c, BufferContract):
                chosen = _override(elements, c.name, c.dtypes[0])
                self.elements[c.index] = default_elements(c.dtypes[0]) if chosen is None else chosen
        self.arrays: dict[tuple[int, tuple[int, ...]], st.SearchStrategy[np.ndarray]] = {}

    def sizes(self, draw: st.DrawFn) -> dict[Dim, int]:
        sizes = {}
        for root in self.classes.roots():
            fixed = self.classes.fixed_size(root)
            sizes[root] = fixed if fixed is not None else draw(self.side)
        assume(_satisfy_bounds(sizes, self.classes, self.bounds))
        return sizes

    def array(self, draw: st.DrawFn, contract: BufferContract, shape: tuple[int, ...]) -> np.ndarray:
        key = (contract.index, shape)
        if key not in self.arrays:
            self.arrays[key] = _values(shape, contract.dtypes[0], self.elements[contract.index])
        values = draw(self.arrays[key])
        layout = contract.layout_strides
        if layout is not None and any(s is not None for s in layout):
            return laid_out(values, layout)
        return _as_view(draw, values) if self.views else values

    def draw(self, draw: st.DrawFn) -> tuple[Any, ...]:
        sizes = self.sizes(draw)
        drawn = []
        for contract in self.contracts:
            if isinstance(contract, ScalarContract):
                drawn.append(draw(self.scalars[contract.index]))
            elif isinstance(contract.spec, MemRefSpec):
                root = self.classes.root
                shape = tuple(sizes[root(Dim(contract.index, k))] for k in range(contract.spec.rank))
                drawn.append(self.array(draw, contract, shape))
            else:
                rank = draw(st.integers(0, 3))
                drawn.append(self.array(draw, contract, tuple(draw(self.side) for _ in range(rank))))
        return tuple(drawn)


# -- the strategy -----------------------------------------------------------------


def arguments(kernel: Kernel, *, max_side: int = 8, min_side: int = 0, elements: Elements = None,
              views: bool = True) -> st.SearchStrategy[tuple[Any, ...]]:
    """A hypothesis strategy of valid argument tuples for ``kernel``'s inputs (its Python parameters).

    Each memref or tensor input is a numpy array of the dtype its element type
    maps to, of its rank, with its static dims; every ``?`` dim is drawn from
    ``min_side`` to ``max_side`` once per class of dims the kernel ties (its
    IR's ops and its named dims), dims tied to a constant take it, and dims a
    bound constrains (a convolution's input) are raised to it. Unranked inputs
    get rank 0 to 3. Scalars are drawn within their type's range (``i1`` as
    bool). The outputs the call allocates are left out.

    ``elements`` sets the values: a strategy for every argument, or a dict from
    an argument's name or a dtype (``np.float32``, ``"float32"``) to a strategy.
    By default integers take their dtype's whole range and floats multiples of
    1/8 in [-8, 8] (finite, and exact under reassociation); see
    :func:`default_elements`.

    With ``views`` (the default), arrays are also drawn as non-contiguous,
    offset, reversed (negative-stride), transposed and zero-size views; memkernel
    copies them where the layout needs it, and copies back what the kernel
    writes. Arrays for strided layouts with static strides are laid out as the
    layout says. Draws shrink to small shapes and plain contiguous arrays.
    """
    if not 0 <= min_side <= max_side:
        raise ValueError(f"arguments(): need 0 <= min_side <= max_side, got min_side={min_side}, max_side={max_side}")
    drawer = _Drawer(kernel, min_side, max_side, elements, views)

    @st.composite
    def kernel_arguments(draw: st.DrawFn) -> tuple[Any, ...]:
        return drawer.draw(draw)

    return kernel_arguments()
