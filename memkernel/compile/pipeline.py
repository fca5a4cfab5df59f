"""The pass pipelines that lower a kernel module to the LLVM dialect.

The ``"default"`` preset lowers what upstream CPU code uses: linalg (to loops),
affine, scf, vector, arith, math (with libm), complex, memref (with
``expand-strided-metadata``), index, cf, ub and func. A module with tensors is
first bufferized (one-shot, across function boundaries, identity layouts at
the boundary) with ownership-based deallocation of its temporaries. It runs in two halves;
between them memkernel rewrites ``i1`` memref accesses to byte accesses (the
LLVM 22 lowering of ``i1`` loads and stores aborts the process) and, when the
module does arithmetic on f8 types, adds ``convert-arith-to-apfloat``.

``"fast"`` first applies the transform strategies of :mod:`memkernel.presets`.
``pipeline=`` may instead name a pass pipeline of the user's; it runs as given.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from mlir import ir, passmanager

from . import i1_storage
from ..diagnostics import format_diagnostics
from ..spec.dtypes import F8_NAMES
from ..errors import CompileError, SignatureError
from .libraries import find_library
from .presets import PRESETS, fingerprint
from ..spec.source import MLIR_LOCK, shared_context

DEFAULT = "default"

_SERIAL_LOOPS = "func.func(convert-linalg-to-loops),scf-forall-to-for,"
_PARALLEL_LOOPS = (
    "func.func(convert-linalg-to-parallel-loops),"
    "scf-forall-to-parallel,"
    "async-parallel-for{{async-dispatch=false num-workers={workers} min-task-size=1024}},"
    "async-to-async-runtime,"
    "async-runtime-ref-counting,"
    "async-runtime-ref-counting-opt,"
)
_PRE = (
    "builtin.module("
    "{loops}"
    "func.func(lower-vector-multi-reduction),"
    "convert-vector-to-scf,"
    "arith-emulate-unsupported-floats{{source-types=bf16 target-type=f32}},"
    "arith-expand{{include-bf16=true}},"
    "expand-strided-metadata,"
    "lower-affine,"
    "convert-math-to-funcs,"
    "convert-complex-to-standard,"
    "convert-scf-to-cf"
    "{runtime})"
)
ASYNC_RUNTIME = "mlir_async_runtime"


def pre_lowering(parallel: bool) -> str:
    """The first half of the preset lowering: to loops (parallel ones on a thread pool) and branches."""
    if not parallel:
        return _PRE.format(loops=_SERIAL_LOOPS, runtime="")
    loops = _PARALLEL_LOOPS.format(workers=os.cpu_count() or 1)
    return _PRE.format(loops=loops, runtime=",convert-async-to-llvm")


_BUFFERIZE = (
    "builtin.module("
    "func.func(convert-elementwise-to-linalg),"
    "one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map},"
    "ownership-based-buffer-deallocation,"
    "canonicalize,"
    "buffer-deallocation-simplification,"
    "bufferization-lower-deallocations,"
    "convert-bufferization-to-memref,"
    "canonicalize)"
)
_APFLOAT = "convert-arith-to-apfloat,"
_POST = (
    "builtin.module("
    "convert-vector-to-llvm,"
    "convert-math-to-llvm,"
    "convert-math-to-libm,"
    "convert-complex-to-llvm,"
    "convert-index-to-llvm,"
    "{apfloat}"
    "convert-arith-to-llvm,"
    "finalize-memref-to-llvm,"
    "convert-func-to-llvm,"
    "convert-cf-to-llvm,"
    "convert-ub-to-llvm,"
    "reconcile-unrealized-casts)"
)

@dataclass(frozen=True)
class Pipeline:
    """A preset name (see :mod:`memkernel.presets`), or the user's own pass pipeline text."""

    name: str
    custom: str | None = None
    parallel: bool = False

    def describe(self) -> str:
        """What identifies the pipeline in a cache key."""
        if self.custom is not None:
            return self.custom
        return f"preset {fingerprint(self.name)}" + (f" parallel:{os.cpu_count()}" if self.parallel else "")


def _element(t: ir.Type) -> ir.Type:
    return t.element_type if isinstance(t, ir.ShapedType) else t


def _types_of(op: ir.Operation) -> list[ir.Type]:
    return [v.type for v in op.operands] + [r.type for r in op.results]


def _walk(module: ir.Module, visit: Callable[[ir.Operation], None]) -> None:
    def callback(op: ir.Operation) -> ir.WalkResult:
        visit(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(callback)


def uses_f8_arithmetic(module: ir.Module) -> bool:
    """Whether an ``arith`` op computes on an f8 type (LLVM has no f8 arithmetic)."""
    found: list[str] = []

    def visit(op: ir.Operation) -> None:
        if op.name.startswith("arith.") and any(str(_element(t)) in F8_NAMES for t in _types_of(op)):
            found.append(op.name)

    _walk(module, visit)
    return bool(found)


def _is_tensor(t: ir.Type) -> bool:
    return isinstance(t, (ir.RankedTensorType, ir.UnrankedTensorType))


def uses_tensors(module: ir.Module) -> bool:
    """Whether any op or function signature of the module has a tensor type."""
    found: list[str] = []

    def visit(op: ir.Operation) -> None:
        types = _types_of(op)
        if op.name == "func.func":
            function_type = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            types += list(function_type.inputs) + list(function_type.results)
        if any(_is_tensor(t) for t in types):
            found.append(op.name)

    _walk(module, visit)
    return bool(found)


def _is_i1_memref(t: ir.Type) -> bool:
    return isinstance(t, (ir.MemRefType, ir.UnrankedMemRefType)) and str(t.element_type) == "i1"


def check_before_lowering(module: ir.Module, pipeline: Pipeline) -> None:
    """Refuse, with a SignatureError, IR that the lowering would miscompile or abort on."""
    vector_ops: list[str] = []
    i1_ops: list[str] = []

    def visit(op: ir.Operation) -> None:
        if any(_is_i1_memref(t) for t in _types_of(op)):
            i1_ops.append(op.name)
            if op.name.startswith("vector."):
                vector_ops.append(op.name)

    _walk(module, visit)
    if vector_ops:
        raise SignatureError(
            f"{vector_ops[0]} on an i1 memref: vector accesses of i1 memrefs lower to bit-packed "
            "loads and stores, while i1 memrefs hold one byte per element. Use memref.load/store "
            "or linalg ops on i1 memrefs, or an i8 memref."
        )
    if i1_ops and pipeline.custom is not None:
        raise SignatureError(
            f"{i1_ops[0]} uses an i1 memref, which only the preset pipelines support: with the "
            "LLVM 22 lowering, loading or storing an i1 element aborts the process, and the "
            "presets rewrite those accesses first. Drop pipeline= or use an i8 memref."
        )


def parse_pipeline(pipeline: str | None, parallel: bool = False) -> Pipeline:
    """A :class:`Pipeline` for ``pipeline=``: None or a preset name, else pass pipeline text.

    ``parallel`` runs the parallel loops of a preset on the MLIR async runtime's
    thread pool; CompileError if that library is not installed or the pipeline is custom.
    """
    if pipeline is None or pipeline in PRESETS:
        if parallel and find_library(ASYNC_RUNTIME) is None:
            raise CompileError(
                "parallel=True runs parallel loops on the MLIR async runtime, libmlir_async_runtime, "
                "which is not installed: pip install 'memkernel[runtime]'"
            )
        return Pipeline(pipeline or DEFAULT, parallel=parallel)
    if parallel:
        raise CompileError("parallel=True applies to the preset pipelines; put the passes you want in pipeline=.")
    text = pipeline.strip()
    if not text.startswith("builtin.module("):
        text = f"builtin.module({text})"
    try:
        with MLIR_LOCK, shared_context():
            passmanager.PassManager.parse(text)
    except ValueError as exc:
        presets = ", ".join(map(repr, PRESETS))
        raise CompileError(f"pipeline= does not parse as a pass pipeline or name a preset ({presets}): {exc}") from None
    return Pipeline("custom", text)


def _run(text: str, module: ir.Module, source: str) -> None:
    try:
        passmanager.PassManager.parse(text).run(module.operation)
    except ir.MLIRError as exc:
        raise CompileError(
            "lowering failed:\n" + format_diagnostics(exc.error_diagnostics, source)
        ) from None


STAGES = ("input", "bufferized", "vectorized", "loops", "llvm")
"""The stages of the preset pipelines that :meth:`~memkernel.Kernel.ir` can show.

``input``: the parsed source, as memkernel prepared it (C interface added);
``bufferized``: tensors turned into memrefs (after the preset's tensor
strategies; the input itself for memref kernels); ``vectorized``: after the
preset's memref strategies (the same as ``bufferized`` for ``"default"``);
``loops``: linalg, affine, vector and scf lowered to loops and branches,
``i1`` accesses made byte accesses, just before the LLVM conversion; ``llvm``:
the LLVM dialect that is JIT-compiled.
"""


def lower(module: ir.Module, pipeline: Pipeline, source: str, until: str = "llvm") -> ir.Module:
    """Lower ``module`` up to stage ``until``; the lowered module (the same one or, after a
    preset's strategies, a new one). CompileError with the diagnostics on failure.

    A custom pipeline has only the ``input`` and ``llvm`` stages.
    """
    if until == "input":
        return module
    if pipeline.custom is not None:
        if until != "llvm":
            raise ValueError(f"a custom pipeline has the stages 'input' and 'llvm', not {until!r}")
        _run(pipeline.custom, module, source)
        return module
    strategies = PRESETS[pipeline.name]
    for strategy in strategies:
        if strategy.on_tensors:
            module = strategy.applied(module)
    if uses_tensors(module):
        _run(_BUFFERIZE, module, source)
    if until == "bufferized":
        return module
    for strategy in strategies:
        if not strategy.on_tensors:
            module = strategy.applied(module)
    if until == "vectorized":
        return module
    _run(pre_lowering(pipeline.parallel), module, source)
    i1_storage.lower_i1_accesses(module)
    if until == "loops":
        return module
    apfloat = _APFLOAT if uses_f8_arithmetic(module) else ""
    _run(_POST.format(apfloat=apfloat), module, source)
    return module
