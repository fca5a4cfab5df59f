"""Pipeline presets: what each does to a kernel's IR before the default lowering.

``"default"`` lowers linalg to plain loops and leaves vectorization to LLVM.

``"fast"`` first applies transform-dialect strategies (``memkernel/compile/transforms``)
to the ops they know, sized for the host's vector width:

- ``linalg.matmul`` on f32/f64 memrefs (tensor kernels after bufferization):
  blocked for the caches, with each panel of B packed into an aligned contiguous
  buffer, then tiled for registers and peeled so every tile is static,
  vectorized to broadcast-and-FMA outer products with the C tile held in
  registers; with ``parallel=True`` the blocks of rows are tasks on the async
  runtime's workers. Fewer rows than a register tile (a static M, or a dynamic one
  at run time) read B in place instead, vectorized over N (see
  ``transforms/matmul.mlir``);
- ``linalg.conv_2d_nhwc_hwcf``, ``linalg.conv_1d_nwc_wcf`` and
  ``linalg.depthwise_conv_2d_nhwc_hwc`` on f32/f64 memrefs: tiled so that each tile is a
  small matmul (an elementwise multiply-add for the depthwise one) of output columns by
  input and output channels, vectorized like the matmul with the output block in
  registers (see ``transforms/convolution.mlir``);
- 1-d reductions to a scalar on f32/f64 tensors (``linalg.reduce``, and
  ``linalg.generic`` with one reduction iterator): split into vector-wide
  partial results carried across the loop, vectorized with masks for the tail
  (see ``transforms/reduction.mlir``);
- reductions on memrefs: their accumulating ``arith.addf``/``arith.mulf`` marked
  ``fastmath<reassoc>``, which lets LLVM vectorize them (see :mod:`.reassociation`).

Every other op, and any op a strategy fails on, takes the default lowering:
a strategy is applied to a copy of the module, which is kept only if the whole
strategy succeeded, so a preset is never less correct than ``"default"``.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Protocol

from mlir import ir
from mlir.dialects import arith, memref
from mlir.dialects.transform import interpreter

from ..load import objects as jit
from ..analysis.ir_callbacks import walk
from .reassociation import Reassociation

_FLOATS = ("f32", "f64")


@functools.lru_cache(maxsize=None)
def host_vector_bits() -> int:
    """The widest vector register of the host: 512 with AVX-512, 256 with AVX2, else 128."""
    features = jit.host_cpu().split(";", 1)[1].split(",")
    if "+avx512f" in features:
        return 512
    if "+avx2" in features:
        return 256
    return 128


def _ops(module: ir.Module, name: str) -> list[ir.Operation]:
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    walk(module.operation, visit)
    return found


def _element(value: ir.Value) -> str:
    return str(value.type.element_type)


# The matmul strategy's blocks: C's rows are cut into one block per worker (one when serial;
# more blocks pack B's panels more often, which measured slower), each into register tiles of
# 8 rows by two host vectors, 16 of AVX-512's 32 registers. A static M below the register
# rows takes tiles of all M rows by four host vectors instead, reading B in place; a dynamic
# one below them, tiles of one row. One row at a time (a static M of 1, a dynamic one below
# the register rows), K is cut into steps of 8 first: 1×512×512 f32 ran at 0.74 of OpenBLAS's
# sgemv without them, 1.05 with (4: 0.98, 16: 1.02); a static M of 2 to 7 ran slower with them
# (7×512×512: 2.97 of OpenBLAS without, 1.86 with), its C tile stored at every step.
_MATMUL_REGISTER_ROWS = 8
_MATMUL_ROW_VECTORS = 4
_MATMUL_ROW_DEPTH = 8


def _any_static_zero(ops: list[ir.Operation]) -> bool:
    """Whether an operand of ``ops`` has a static dim of size 0: nothing to compute, and tiling it made an upstream
    utility assert (``computeAllSliceParameters``: "expected as many ivs as non-zero sizes")."""
    return any(0 in v.type.shape for op in ops for v in op.operands if isinstance(v.type, ir.ShapedType))


def _matmul_parameters(module: ir.Module, parallel: bool) -> dict[str, str] | None:
    matmuls = _ops(module, "linalg.matmul")
    types = {_element(v) for op in matmuls for v in op.operands}
    if not matmuls or not types <= set(_FLOATS) or len(types) != 1 or _any_static_zero(matmuls):
        return None
    lanes = host_vector_bits() // (64 if types == {"f64"} else 32)
    workers = os.cpu_count() or 1
    # The last, narrower panel is cut into single columns when its width is dynamic (the only
    # static shape it surely has); with static shapes its width is static, and a tile as wide
    # as the widest panel leaves it whole.
    static = all(v.type.has_static_shape for op in matmuls for v in op.operands)
    rows = [op.operands[0].type for op in matmuls]
    if all(not t.is_dynamic_dim(0) and t.shape[0] == 1 for t in rows):
        tiling = "tile_one_row"
    elif all(not t.is_dynamic_dim(0) and 0 < t.shape[0] < _MATMUL_REGISTER_ROWS for t in rows):
        tiling = "tile_rows"
    elif len(rows) == 1 and rows[0].is_dynamic_dim(0):
        tiling = "split_rows"  # at the point _mark_row_split computes
    else:
        tiling = "pack_panels"
    return {"tiling": tiling,
            "distribution": "run_blocks_on_workers" if parallel else "run_blocks_in_order",
            "workers": str(workers), "blocks": str(workers if parallel else 1),
            "register_rows": str(_MATMUL_REGISTER_ROWS),
            "register_columns": str(2 * lanes), "leftover_columns": str(_MATMUL_ROW_VECTORS * lanes if static else 1),
            "row_columns": str(_MATMUL_ROW_VECTORS * lanes), "row_depth": str(_MATMUL_ROW_DEPTH)}


def _mark_row_split(module: ir.Module, parameters: dict[str, str]) -> None:
    """For ``split_rows``, before the matmul: the row where the script splits it, M if M is below
    the register rows, else 0 (marked ``memkernel.few_rows``); and the rows of its blocks after the
    split, ``blocks`` blocks of them but at least one row (marked ``memkernel.block_rows``)."""
    if parameters["tiling"] != "split_rows":
        return
    matmul = _ops(module, "linalg.matmul")[0]
    with ir.InsertionPoint(matmul), matmul.location:
        index = ir.IndexType.get()

        def constant(value: int) -> ir.Value:
            return arith.ConstantOp(index, value).result

        rows = memref.DimOp(matmul.operands[0], constant(0)).result
        few = arith.CmpIOp(arith.CmpIPredicate.ult, rows, constant(_MATMUL_REGISTER_ROWS)).result
        point = arith.SelectOp(few, rows, constant(0))
        point.operation.attributes["memkernel.few_rows"] = ir.UnitAttr.get()
        rest = arith.SubIOp(rows, point.result).result
        block = arith.MaxUIOp(arith.CeilDivUIOp(rest, constant(int(parameters["blocks"]))).result, constant(1))
        block.operation.attributes["memkernel.block_rows"] = ir.UnitAttr.get()


_WINDOW = ("kh", "kw", "c")


@dataclass(frozen=True)
class _Convolution:
    """A convolution op's loops, for ``transforms/convolution.mlir``.

    ``dims`` names its loops in linalg's order: batch ``n``, output rows ``oh`` and columns
    ``ow``, output channels ``f``, filter rows ``kh`` and columns ``kw``, input channels
    ``c``. The strategy tiles the others first (the "outer" loops), then the window ones
    (``kh``, ``kw``, ``c``); ``column_loop`` and ``feature_loop`` index the outer loops of
    ``ow`` and ``f``, ``channel_loop`` the window loop of ``c``, the three it peels.
    """

    dims: tuple[str, ...]
    column_loop: int
    feature_loop: int
    channel_loop: int

    def parameters(self, op: str, sizes: dict[str, int]) -> dict[str, str]:
        """The script's parameters for tile ``sizes`` by loop name (the loops not named: 1)."""
        outer = [d for d in self.dims if d not in _WINDOW]
        window = [d for d in self.dims if d in _WINDOW]

        def tiles(chosen: list[str]) -> str:
            return ", ".join(str(sizes.get(d, 1)) if d in chosen else "0" for d in self.dims)

        return {
            "op": op,
            "outer_tiles": tiles(outer),
            "window_tiles": tiles(window),
            "outer_count": str(len(outer)),
            "window_count": str(len(window)),
            "outer_types": ", !transform.any_op" * len(outer),
            "window_types": ", !transform.any_op" * len(window),
            "column_loop": str(self.column_loop),
            "feature_loop": str(self.feature_loop),
            "channel_loop": str(self.channel_loop),
        }


CONVOLUTIONS = {
    "linalg.conv_2d_nhwc_hwcf": _Convolution(("n", "oh", "ow", "f", "kh", "kw", "c"), 2, 3, 2),
    "linalg.conv_1d_nwc_wcf": _Convolution(("n", "ow", "f", "kw", "c"), 1, 2, 1),
    # No input-channel loop: a depthwise convolution's channels are its "f". Its window
    # loop kw, of step 1, stands in for the channel loop and has nothing to peel.
    "linalg.depthwise_conv_2d_nhwc_hwc": _Convolution(("n", "oh", "ow", "f", "kh", "kw"), 2, 3, 1),
}
"""The convolutions the fast preset's convolution strategy knows, by op name."""

# The register block of the convolution strategy: 6 output columns by 4 host vectors of
# output channels (24 of AVX-512's 32 registers hold it), 4 input channels per step.
_CONV_COLUMNS = 6
_CONV_FEATURE_VECTORS = 4
_CONV_CHANNELS = 4


def _convolution_parameters(op: str) -> Callable[[ir.Module, bool], dict[str, str] | None]:
    """The parameters of the convolution strategy for the ``op`` convolutions of a module (serial or not)."""

    def parameters(module: ir.Module, parallel: bool) -> dict[str, str] | None:
        convolutions = _ops(module, op)
        types = {_element(v) for conv in convolutions for v in conv.operands}
        if not convolutions or not types <= set(_FLOATS) or len(types) != 1 or _any_static_zero(convolutions):
            return None
        lanes = host_vector_bits() // (64 if types == {"f64"} else 32)
        sizes = {"ow": _CONV_COLUMNS, "f": _CONV_FEATURE_VECTORS * lanes, "c": _CONV_CHANNELS}
        return CONVOLUTIONS[op].parameters(op, sizes)

    return parameters


_REDUCTION_ONLY = "[#linalg.iterator_type<reduction>]"


def _reduction_parameters(module: ir.Module, parallel: bool) -> dict[str, str] | None:
    reductions = _ops(module, "linalg.reduce") + [
        op for op in _ops(module, "linalg.generic") if str(op.attributes["iterator_types"]) == _REDUCTION_ONLY
    ]
    if not reductions:
        return None
    for op in reductions:
        inputs = op.operands[0].type
        if (not isinstance(inputs, ir.RankedTensorType) or inputs.rank != 1 or len(op.results) != 1
                or len(op.operands) != 2 or _element(op.operands[0]) not in _FLOATS):
            return None
    bits = 64 if all(_element(op.operands[0]) == "f64" for op in reductions) else 32
    lanes = 4 * host_vector_bits() // bits
    return {"reduction_tiles": str(lanes), "vector_sizes": str(lanes)}


@dataclass(frozen=True)
class Strategy:
    """A transform script for the ops it knows; ``parameters`` says whether (and how) it applies."""

    script: str
    on_tensors: bool
    parameters: Callable[[ir.Module, bool], dict[str, str] | None]
    prepare: Callable[[ir.Module, dict[str, str]], None] | None = None

    @functools.cached_property
    def text(self) -> str:
        return resources.files("memkernel.compile").joinpath("transforms", self.script).read_text()

    def applied(self, module: ir.Module, parallel: bool = False) -> ir.Module:
        """``module`` transformed, as a new module; the original one if the strategy does not apply or fails.

        ``parallel``: the kernel runs its parallel loops on the async runtime's workers. ``prepare``,
        if any, first adds to the copy what the script needs and cannot create (a payload value).
        """
        parameters = self.parameters(module, parallel)
        if parameters is None:
            return module
        text = self.text
        for key, value in parameters.items():
            text = text.replace("{" + key + "}", value)
        copy = ir.Module.parse(str(module), module.context)
        try:
            if self.prepare is not None:
                self.prepare(copy, parameters)
            script = ir.Module.parse(text, module.context)
            interpreter.apply_named_sequence(copy.operation, script.body.operations[0], script.operation)
            copy.operation.verify()
        except (ValueError, ir.MLIRError):
            return module
        return copy


class Step(Protocol):
    """One step of a preset: a transform :class:`Strategy`, or a rewrite such as :class:`Reassociation`."""

    @property
    def on_tensors(self) -> bool:
        """Whether it applies before bufferization (else after)."""

    @property
    def text(self) -> str:
        """What identifies its behaviour in a preset's fingerprint."""

    def applied(self, module: ir.Module, parallel: bool = False) -> ir.Module:
        """``module`` with the step applied (the module itself where it does not apply); ``parallel``: the
        kernel runs its parallel loops on the async runtime's workers."""


PRESETS: dict[str, tuple[Step, ...]] = {
    "default": (),
    "fast": (
        Strategy("reduction.mlir", True, _reduction_parameters),
        Reassociation(),
        Strategy("matmul.mlir", False, _matmul_parameters, _mark_row_split),
        *(Strategy("convolution.mlir", False, _convolution_parameters(op)) for op in CONVOLUTIONS),
    ),
}


# The strategies' tile sizes not written in their scripts: part of what a preset does.
_TUNING = (_MATMUL_REGISTER_ROWS, _MATMUL_ROW_VECTORS, _MATMUL_ROW_DEPTH, _CONV_COLUMNS, _CONV_FEATURE_VECTORS,
           _CONV_CHANNELS)


def fingerprint(preset: str) -> str:
    """What identifies a preset's behaviour in a cache key: its name, scripts, tile sizes and the vector width."""
    texts = "".join(strategy.text for strategy in PRESETS[preset]) + repr(_TUNING)
    return f"{preset}:{host_vector_bits()}:{hashlib.sha256(texts.encode()).hexdigest()[:16]}"
