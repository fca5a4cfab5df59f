"""Dask arrays through a kernel: :func:`apply` builds a lazy ``dask.array`` computed chunk by chunk.

memkernel reads from the kernel's IR which dims of its arguments are
independent. Every linalg structured op (named ops generalized first, on a
copy of the module) maps its loop dims to its operands' dims through
indexing maps; dims given by the same loop dim are one *index* (``matmul`` is
``ij <- ik, kj``). An index that every op iterates in parallel splits into
chunks freely: each output block is the kernel run on the matching input
blocks (:func:`dask.array.blockwise`). A reduction index that an output does
not carry (``k`` of matmul) is either summed across chunks, when the kernel
is one linalg op that accumulates every output with ``arith.addf``/``addi``
(each block computes a partial product into a zero-filled output, dask sums
the partials), or kept whole: the inputs are rechunked to one chunk along it.
An index that a static dim (``memref<4x?xf32>``) carries is kept whole too.
A ``linalg.generic`` whose body reads its loop indices (``linalg.index``)
sees each block's indices counted from the block's start: each block runs
the kernel rewritten to add the block's offset along every index to them
(:mod:`memkernel.chunk_offsets`); a named op that reads them
(``linalg.fill_rng_2d``) is refused.

A kernel whose body is not only linalg ops on its arguments (``scf`` loops,
``memref.load``, calls) cannot be read this way; :func:`apply` raises
:class:`~memkernel.errors.ChunkingError` unless the caller says every dim is
parallel (``all_parallel=True``), which maps the kernel over matching blocks
of same-rank arrays, and promises that a block's output does not depend on
where the block is (a kernel that reads ``linalg.index`` is refused). The
kernel itself travels to the workers by reference when its module can be
imported there, else by value (see :mod:`memkernel.pickling`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from collections.abc import Sequence, Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
from mlir import ir, passmanager

from .chunk_offsets import index_dims, offset_source, reads_loop_indices
from .errors import ArgumentError, ChunkingError, ShapeError
from .kernel import Kernel, named_parameters
from .pickling import resolves_by_name
from .analysis.shapes import SHAPE_PRESERVING, argument_of
from .model.signature import MemRefSpec, ScalarSpec
from .analysis.source import MLIR_LOCK, parse_source

_IGNORED = frozenset({"func.return", "arith.constant"}) | SHAPE_PRESERVING
_ADD = frozenset({"arith.addf", "arith.addi"})


class _Unanalysable(Exception):
    """Why the IR does not say how to chunk the kernel."""


@dataclass(frozen=True)
class Chunking:
    """How a kernel's work splits into chunks, read from its IR.

    ``indices`` gives each MLIR argument's index letters (None for a scalar),
    ``reductions`` the letters some op reduces over, ``whole`` the letters that
    must stay one chunk (static dims), ``summable`` whether outputs of
    blocks that split a reduction may be summed, and ``indexed``, for each
    ``linalg.generic`` whose body reads its loop indices (``linalg.index``), by
    its position among the kernel's top-level ops, the letters of its loop dims:
    a block's indices along those letters (:attr:`offsets`) start at the block's offset.
    """

    indices: tuple[str | None, ...]
    reductions: frozenset[str]
    whole: frozenset[str]
    summable: bool
    indexed: tuple[tuple[int, str], ...] = ()

    @property
    def offsets(self) -> str:
        """The letters along which a block's loop indices start at its offset: one offset argument each."""
        return "".join(sorted({c for _, loops in self.indexed for c in loops}))


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}

    def find(self, x: Any) -> Any:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: Any, b: Any) -> None:
        self.parent[self.find(a)] = self.find(b)


@dataclass(frozen=True)
class _Op:
    """One linalg op: per operand its argument and loop dims (None for a scalar), its iterators, its outputs."""

    operands: tuple[tuple[int, tuple[int, ...]] | None, ...]
    reduction_dims: frozenset[int]
    n_outputs: int
    accumulates_by_add: bool
    position: int
    n_loops: int
    index_dims: frozenset[int]


def _accumulates_by_add(op: ir.Operation, n_outputs: int) -> bool:
    """Whether each output's yielded value is ``out + x`` with ``out`` used nowhere else in the body."""
    block = op.regions[0].blocks[0]
    yielded = list(block.operations)[-1].operands
    out_args = list(block.arguments)[-n_outputs:]
    for value, out in zip(yielded, out_args):
        owner = value.owner
        owner = owner.operation if isinstance(owner, ir.OpView) else owner
        if not isinstance(owner, ir.Operation) or owner.name not in _ADD:
            return False
        if out not in list(owner.operands) or len(list(out.uses)) != 1:
            return False
    return True


def _read_op(op: ir.Operation, entry: ir.Block, where: str, position: int) -> _Op:
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    operands: list[tuple[int, tuple[int, ...]] | None] = []
    for value, amap in zip(list(op.operands), maps):
        if not isinstance(value.type, ir.ShapedType):
            operands.append(None)
            continue
        arg = argument_of(value, entry)
        if arg is None:
            raise _Unanalysable(f"{where} has an operand that is not an argument of the kernel ({value.type})")
        dims = []
        for expr in amap.results:
            if not isinstance(expr, ir.AffineDimExpr):
                raise _Unanalysable(f"{where} indexes argument #{arg} with {expr}, not a plain loop dim")
            dims.append(expr.position)
        operands.append((arg, tuple(dims)))
    iterators = [str(t) for t in ir.ArrayAttr(op.attributes["iterator_types"])]
    n_outputs = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))[-1]
    return _Op(tuple(operands), frozenset(d for d, t in enumerate(iterators) if "reduction" in t), n_outputs,
               _accumulates_by_add(op, n_outputs), position, len(iterators), index_dims(op))


def _linalg_ops(kernel: Kernel) -> list[_Op]:
    """The kernel's linalg ops, generalized; _Unanalysable if its body holds anything else."""
    parsed = parse_source(kernel.options.source)
    name = kernel.spec.name
    with MLIR_LOCK, parsed.context:
        # Generalizing replaces each linalg op by one linalg.generic, and may hoist constants out of its body.
        given = [(position, op.operation.name) for position, op in
                 enumerate(parsed.function(name).regions[0].blocks[0].operations)
                 if op.operation.name not in _IGNORED]
        copy = parsed.module.operation.clone()
        passmanager.PassManager.parse("builtin.module(func.func(linalg-generalize-named-ops))",
                                      parsed.context).run(copy.operation)
        func = next(op.operation for op in copy.regions[0].blocks[0].operations
                    if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name)
        entry = func.regions[0].blocks[0]
        generalized = [op.operation for op in entry.operations if op.operation.name not in _IGNORED]
        if len(generalized) != len(given):
            raise _Unanalysable("generalizing its linalg ops changed the ops of its body")
        ops = []
        for op, (position, op_name) in zip(generalized, given):
            if not (op_name.startswith("linalg.") and "indexing_maps" in op.attributes):
                raise _Unanalysable(f"its body has a {op_name}, which is not a linalg structured op")
            read = _read_op(op, entry, f"its {op_name}", position)
            if read.index_dims and op_name != "linalg.generic":
                raise ChunkingError(
                    f"apply(@{name}): its {op_name} reads its loop indices, which memkernel offsets per block only "
                    "in a linalg.generic. Write it as one (mlir-opt --linalg-generalize-named-ops), or call the "
                    "kernel on numpy arrays.")
            ops.append(read)
    if not ops:
        raise _Unanalysable("its body has no linalg op")
    return ops


def analyse(kernel: Kernel) -> Chunking:
    """Read the kernel's IR into its :class:`Chunking`; ChunkingError if it cannot be read."""
    try:
        return _analyse(kernel, _linalg_ops(kernel))
    except _Unanalysable as why:
        raise ChunkingError(
            f"apply(@{kernel.spec.name}): memkernel cannot tell from the IR which dims of the arguments are "
            f"independent: {why}. Pass all_parallel=True if every dim of every argument is parallel (each output "
            "block depends only on the same block of each input), or write the kernel as linalg ops on its "
            "arguments."
        ) from None


def _analyse(kernel: Kernel, ops: list[_Op]) -> Chunking:
    args = kernel.spec.signature.args
    sets = _UnionFind()
    for n, op in enumerate(ops):
        for operand in op.operands:
            if operand is not None:
                for k, d in enumerate(operand[1]):
                    sets.union(("arg", operand[0], k), ("loop", n, d))
    letters: dict[Any, str] = {}
    indices: list[str | None] = []
    whole: set[str] = set()
    for i, spec in enumerate(args):
        if isinstance(spec, ScalarSpec):
            indices.append(None)
            continue
        if not isinstance(spec, MemRefSpec):
            raise _Unanalysable(f"argument #{i} is {spec.mlir}, which has no fixed rank")
        index = ""
        for k, size in enumerate(spec.shape):
            if ("arg", i, k) not in sets.parent:
                raise _Unanalysable(f"no linalg op reads or writes argument #{i} ({spec.mlir})")
            root = sets.find(("arg", i, k))
            letter = letters.setdefault(root, string.ascii_letters[len(letters)])
            if letter in index:
                raise _Unanalysable(f"dims of argument #{i} ({spec.mlir}) are indexed by one loop dim")
            if size is not None:
                whole.add(letter)
            index += letter
        indices.append(index)
    reductions = frozenset(letters[sets.find(("loop", n, d))] for n, op in enumerate(ops) for d in op.reduction_dims)
    summable = len(ops) == 1 and ops[0].accumulates_by_add and all(
        isinstance(spec, MemRefSpec) and spec.element.dtype != np.bool_ for spec in kernel.spec.outputs)
    indexed = []
    for n, op in enumerate(ops):
        if op.index_dims:
            roots = [sets.find(("loop", n, d)) for d in range(op.n_loops)]
            if any(root not in letters for root in roots):
                raise _Unanalysable("a linalg.generic reads the index of a loop dim that no argument's dim gives")
            indexed.append((op.position, "".join(letters[root] for root in roots)))
    return Chunking(tuple(indices), reductions, frozenset(whole), summable, tuple(indexed))


# -- building the graph -----------------------------------------------------------------


def _carried(kernel: Kernel) -> Any:
    """What the graph holds for ``kernel``: itself when its module can be imported elsewhere, else its value."""
    if resolves_by_name(kernel) and kernel.__module__ != "__main__":
        return kernel
    return _ByValue(kernel)


class _ByValue:
    """A kernel that pickles by value (options and shape function), whatever its module."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel

    def __reduce__(self) -> tuple[Any, ...]:
        return self.kernel.reduce_by_value()


def _kernel_of(carried: Any) -> Kernel:
    return carried.kernel if isinstance(carried, _ByValue) else carried


def _run_block(carried: Any, sources: tuple[tuple[tuple[int, int], ...], ...], dtypes: tuple[np.dtype, ...],
               which: int, extra_axes: int, n_offsets: int, *blocks: Any) -> np.ndarray:
    """Output ``which`` of the kernel run on one set of blocks, into zero-filled outputs of the blocks' sizes.
    The first ``n_offsets`` blocks are blocks of ``arange`` s: the first index of the block along each
    offset letter, which the kernel's leading offset arguments take."""
    offsets = [int(b[0]) if b.size else 0 for b in blocks[:n_offsets]]
    blocks = blocks[n_offsets:]
    outs = tuple(np.zeros(tuple(blocks[p].shape[k] for p, k in dims), dtype) for dims, dtype in zip(sources, dtypes))
    _kernel_of(carried)(*offsets, *blocks, out=outs[0] if len(outs) == 1 else outs)
    return outs[which].reshape(outs[which].shape + (1,) * extra_axes)


def _as_dask(kernel: Kernel, name: str, spec: MemRefSpec, value: Any) -> da.Array:
    array = value if isinstance(value, da.Array) else da.asarray(value)
    if any(math.isnan(size) for size in array.shape):
        raise ShapeError(
            f"apply(@{kernel.spec.name}): argument '{name}' has unknown chunk sizes (shape {array.shape}); "
            f"call {name}.compute_chunk_sizes() first."
        )
    dtype = spec.element.dtype
    if array.dtype != dtype or array.ndim != spec.rank:
        raise ArgumentError(
            f"apply(@{kernel.spec.name}): argument '{name}' expects {spec.mlir} ({dtype}, {spec.rank}-d); got a "
            f"{array.dtype} array of {array.ndim} dims. Pass {name}.astype(np.{dtype}) with {spec.rank} dims."
        )
    return array


def _check_count(kernel: Kernel, args: Sequence[Any]) -> None:
    spec = kernel.spec
    if len(args) != spec.n_inputs:
        raise ArgumentError(f"apply(@{spec.name}): the kernel takes {spec.n_inputs} arguments "
                            f"{kernel.__signature__}; got {len(args)}.")
    written = sorted(i for i in spec.written if i < spec.n_inputs)
    if written:
        raise ChunkingError(
            f"apply(@{spec.name}): the kernel may write its input '{spec.argument_names[written[0]]}'; dask "
            "arrays are immutable, so apply takes only kernels that write their outputs alone."
        )


def _bind(kernel: Kernel, args: Sequence[Any]) -> list[Any]:
    """The arguments checked: the right count, memrefs as dask arrays of their dtype and rank."""
    _check_count(kernel, args)
    spec = kernel.spec
    bound = []
    for i, value in enumerate(args):
        arg = spec.signature.args[i]
        bound.append(_as_dask(kernel, spec.argument_names[i], arg, value) if isinstance(arg, MemRefSpec) else value)
    return bound


def apply(kernel: Kernel, *args: Any, all_parallel: bool = False) -> Any:
    """The kernel's outputs for dask array inputs, as lazy dask arrays computed chunk by chunk.

    ``args`` are the kernel's inputs, in the order of its Python parameters:
    dask arrays, or numpy arrays (taken as one chunk) for memrefs, and scalars,
    which pass through. Each output starts zero-filled, as a kernel call's
    does. Returns one dask array for a kernel with one output, else a tuple.
    Kernels with MLIR results cannot be split and are refused.

    The chunking is read from the IR (see the module docs). With
    ``all_parallel=True``, which says every dim is independent, a kernel the IR
    does not describe (``scf`` loops) is mapped over matching blocks of its
    array arguments, which must all have the rank of its outputs.

    Raises ChunkingError when the kernel cannot be split, ArgumentError for an
    argument of the wrong dtype or rank or count, ShapeError when the arrays'
    shapes break the kernel's ties.
    """
    spec = kernel.spec
    if spec.signature.results and not all_parallel:
        returned = ", ".join(r.mlir for r in spec.signature.results)
        raise ChunkingError(
            f"apply(@{spec.name}): the kernel returns MLIR results ({returned}), "
            "which memkernel cannot combine across blocks. Pass all_parallel=True if every dim is parallel and "
            "every result is an array shaped like the inputs, or write the kernel with output memrefs."
        )
    if all_parallel:
        _refuse_loop_indices(kernel)
        return _map_blocks(kernel, _bind(kernel, args))
    if spec.n_outputs == 0:
        raise ChunkingError(
            f"apply(@{spec.name}): the kernel has no output memrefs (its Python parameters name every MLIR "
            "argument); apply needs a kernel that writes outputs it is not given, as dask arrays are immutable."
        )
    bound = _bind(kernel, args)
    chunking = analyse(kernel)
    _check_shapes(kernel, chunking, bound)
    carried = _carried(_offset_kernel(kernel, chunking) if chunking.offsets else kernel)
    outputs = tuple(_output(kernel, carried, chunking, bound, j) for j in range(spec.n_outputs))
    return outputs[0] if len(outputs) == 1 else outputs


def apply_gufunc(gufunc: np.ufunc, *args: Any, **kwargs: Any) -> Any:
    """``gufunc(*args)`` for dask arrays, lazily, for any generalized ufunc with one loop, such as one
    :meth:`~memkernel.Kernel.gufunc` made: also one whose core signature has numbers (static core dims,
    ``(4)->(1)``), which ``gufunc(dask_array)`` cannot take, since dask reads each number as a dim's name and
    infers the output dtypes by calling the gufunc on arrays of size 1.

    This passes :func:`dask.array.apply_gufunc` the output dtypes of the gufunc's loop and the sizes of its
    numbered dims. ``kwargs`` are those of :func:`dask.array.apply_gufunc` (``axes``, ``keepdims``, ...).
    Each core dim must be one chunk, as dask requires. Raises ArgumentError for a ufunc that is not a
    generalized ufunc with one loop.
    """
    signature: str | None = getattr(gufunc, "signature", None)
    loops: list[str] = list(getattr(gufunc, "types", ()))
    if not isinstance(gufunc, np.ufunc) or signature is None or len(loops) != 1:
        raise ArgumentError(f"apply_gufunc(): expected a generalized numpy ufunc with one loop, such as "
                            f"kernel.gufunc() makes; got {gufunc!r}")
    dtypes = [np.dtype(code) for code in loops[0].split("->")[1]]
    sizes = {number: int(number) for number in re.findall(r"\b\d+\b", signature)}
    return da.apply_gufunc(gufunc, signature, *args, output_dtypes=dtypes[0] if len(dtypes) == 1 else dtypes,
                           output_sizes=sizes, **kwargs)


def _sizes(chunking: Chunking, bound: Sequence[Any]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for index, value in zip(chunking.indices, bound):
        if index is not None:
            sizes.update(zip(index, value.shape))
    return sizes


def _check_shapes(kernel: Kernel, chunking: Chunking, bound: Sequence[Any]) -> None:
    """The kernel's own shape checks, on the whole arrays and the outputs they imply."""
    spec = kernel.spec
    sizes = _sizes(chunking, bound)
    shapes: list[tuple[int, ...] | None] = [getattr(v, "shape", None) if i is not None else None
                                             for i, v in zip(chunking.indices, bound)]
    for index in chunking.indices[spec.n_inputs:]:
        assert index is not None
        missing = [c for c in index if c not in sizes]
        if missing:
            raise ChunkingError(f"apply(@{spec.name}): an output has a dim no input gives the size of; "
                                "pass that size through an input, or call the kernel on numpy arrays.")
        shapes.append(tuple(sizes[c] for c in index))
    spec.shapes.check(spec.name, spec.argument_names, shapes)


def _located(inputs: Sequence[str | None], letter: str) -> tuple[int, int]:
    """The first input that carries ``letter``, and its dim there: where a block's size along it is read."""
    return next((p, index.index(letter)) for p, index in enumerate(inputs) if index and letter in index)


def _rechunked(chunking: Chunking, bound: Sequence[Any], n_inputs: int, whole: AbstractSet[str]) -> list[Any]:
    """The blockwise ``(array, index)`` pairs of the inputs, each rechunked to one chunk along ``whole``'s letters."""
    pairs: list[Any] = []
    for index, value in zip(chunking.indices[:n_inputs], bound):
        if index is None:
            pairs += [value, None]
            continue
        rechunk = {k: -1 for k, c in enumerate(index) if c in whole}
        pairs += [value.rechunk(rechunk) if rechunk else value, index]
    return pairs


def _offset_kernel(kernel: Kernel, chunking: Chunking) -> Kernel:
    """What runs on each block of a kernel that reads its loop indices: the kernel with one leading ``index``
    argument per offset letter (see :mod:`memkernel.chunk_offsets`), the block's first index along it."""
    spec = kernel.spec
    letters = chunking.offsets
    dims = {position: {d: letters.index(c) for d, c in enumerate(loops)} for position, loops in chunking.indexed}
    source = offset_source(kernel.options.source, spec.name, dims, len(letters))
    inputs = [p.name for p in spec.parameters]
    offsets = []
    for letter in letters:
        name = f"offset_{letter}"
        while name in inputs:
            name += "_"
        offsets.append(name)
    options = dataclasses.replace(kernel.options, source=source, name=spec.name)
    return Kernel(named_parameters(spec.name, [*offsets, *inputs]), options)


def _offset_pairs(chunking: Chunking, pairs: Sequence[Any]) -> list[Any]:
    """The blockwise ``(array, index)`` pairs of the offsets: per offset letter, an ``arange`` along it chunked
    as the first of the input ``pairs`` that carries it."""
    found: list[Any] = []
    for letter in chunking.offsets:
        array, index = next((a, i) for a, i in zip(pairs[::2], pairs[1::2]) if i is not None and letter in i)
        chunks = array.chunks[index.index(letter)]
        found += [da.arange(sum(chunks), chunks=(chunks,), dtype=np.int64), letter]
    return found


def _output(kernel: Kernel, carried: Any, chunking: Chunking, bound: Sequence[Any], which: int) -> da.Array:
    """Output ``which`` as a dask array: one call of ``carried`` (the kernel, or its offset kernel) per block,
    partial outputs summed along ``summed``."""
    spec = kernel.spec
    inputs = chunking.indices[:spec.n_inputs]
    index = chunking.indices[spec.n_inputs + which]
    assert index is not None
    contracted = sorted(set("".join(i for i in inputs if i is not None)) - set(index))
    summed = [c for c in contracted if chunking.summable and c in chunking.reductions and c not in chunking.whole]
    pairs = _rechunked(chunking, bound, spec.n_inputs, chunking.whole | (set(contracted) - set(summed)))
    sources = tuple(tuple(_located(inputs, c) for c in i or "") for i in chunking.indices[spec.n_inputs:])
    dtypes = tuple(o.element.dtype for o in spec.outputs if isinstance(o, MemRefSpec))
    dtype = dtypes[which]
    out_index = index + "".join(summed)
    offsets = _offset_pairs(chunking, pairs)
    blocks = da.blockwise(_run_block, out_index, carried, None, sources, None, dtypes, None, which, None,
                          len(summed), None, len(chunking.offsets), None, *offsets, *pairs, dtype=dtype,
                          concatenate=True,
                          adjust_chunks={c: 1 for c in summed}, meta=np.empty((0,) * len(out_index), dtype))
    if not summed:
        return blocks
    return blocks.sum(axis=tuple(range(len(index), len(out_index))), dtype=dtype)


# -- all_parallel ----------------------------------------------------------------------


def _run_mapped(carried: Any, which: int, count: int, *blocks: Any) -> np.ndarray:
    """Returned value ``which`` of the kernel on one set of blocks, checked to have the blocks' shape."""
    kernel = _kernel_of(carried)
    returned = kernel(*blocks)
    value = returned if count == 1 else returned[which]
    expected = next(b.shape for b in blocks if isinstance(b, np.ndarray))
    if np.shape(value) != expected:
        raise ChunkingError(
            f"apply(@{kernel.spec.name}, all_parallel=True): a block of shape {expected} gave an output of shape "
            f"{np.shape(value)}; all_parallel needs outputs shaped like the inputs. Drop all_parallel=True."
        )
    return np.asarray(value)


def _refuse_loop_indices(kernel: Kernel) -> None:
    """ChunkingError if the kernel reads loop indices (``linalg.index``), which mapped blocks would see as their own."""
    parsed = parse_source(kernel.options.source)
    with MLIR_LOCK, parsed.context:
        reads = reads_loop_indices(parsed.function(kernel.spec.name))
    if reads:
        raise ChunkingError(
            f"apply(@{kernel.spec.name}, all_parallel=True): the kernel reads its loop indices (linalg.index), "
            "so each block would compute with indices counted from its own start. Drop all_parallel=True: "
            "memkernel then reads the kernel's linalg ops and offsets each block's indices.")


def _map_blocks(kernel: Kernel, bound: list[Any]) -> Any:
    """The kernel mapped over matching blocks of same-rank arrays: ``all_parallel=True``."""
    spec = kernel.spec
    returned = [*spec.outputs, *spec.signature.results]
    arrays = [r for r in returned if isinstance(r, MemRefSpec)]
    if not returned or len(arrays) != len(returned):
        raise ChunkingError(f"apply(@{spec.name}, all_parallel=True): the kernel must return arrays only; "
                            f"it returns {', '.join(r.mlir for r in returned) or 'nothing'}.")
    ranks = {r.rank for r in arrays} | {v.ndim for v in bound if isinstance(v, da.Array)}
    if len(ranks) != 1:
        raise ChunkingError(f"apply(@{spec.name}, all_parallel=True): every array argument and output must have "
                            f"one rank to be mapped block by block; they have ranks {sorted(ranks)}.")
    index = string.ascii_letters[:ranks.pop()]
    pairs: list[Any] = []
    for value in bound:
        pairs += [value, index if isinstance(value, da.Array) else None]
    outputs = tuple(
        da.blockwise(_run_mapped, index, _carried(kernel), None, j, None, len(arrays), None, *pairs,
                     dtype=r.element.dtype, meta=np.empty((0,) * len(index), r.element.dtype))
        for j, r in enumerate(arrays))
    return outputs[0] if len(outputs) == 1 else outputs
