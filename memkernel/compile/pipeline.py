"""The pass pipelines that lower a kernel module to the LLVM dialect.

The ``"default"`` preset lowers what upstream CPU code uses: linalg (to loops),
affine, scf, vector, arith, math (with libm), complex, memref (with
``expand-strided-metadata``), index, cf, ub and func. A module with tensors is
first bufferized (one-shot, across function boundaries, identity layouts at
the boundary) with ownership-based deallocation of its temporaries. Only where
the module has them (see :mod:`memkernel.analysis.lowerings`): sparse tensors are
sparsified and bufferized by ``sparsification-and-bufferization`` instead, the
``async`` dialect is lowered to the async runtime, and ``vector.mask`` ops are lowered. It runs in two halves;
between them memkernel rewrites ``i1`` memref accesses to byte accesses (the
LLVM 22 lowering of ``i1`` loads and stores aborts the process) and, when the
module does arithmetic on small float types (f8, f6, f4), adds
``convert-arith-to-apfloat``.

``"fast"`` first applies the transform strategies of :mod:`memkernel.compile.presets`.
``pipeline=`` may instead name a pass pipeline of the user's; it runs as given.

A module that carries its own transform-dialect schedule (a
``transform.named_sequence @__transform_main``, or a ``transform.sequence``,
at its top level or in a nested module) has it applied by the transform
interpreter where upstream's tests apply it: before bufferization (and before
a preset's strategies) by default, or after it (``schedule=``); the transform
ops are then erased, so only the code they transformed is lowered. With a
custom pipeline the schedule is applied before that pipeline runs, unless the
pipeline runs ``transform-interpreter`` itself: the transform ops are then
erased after it.

Before any pipeline, the ``func.func`` declarations nothing refers to are
dropped: a test file may declare runtime functions it never calls, with types
that would not lower or that no library at hand defines.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass

from mlir import ir, passmanager
from mlir.dialects.transform import interpreter

from . import allocations, atomics, i1_storage
from ..analysis.diagnostics import format_diagnostics
from ..model.dtypes import SMALL_FLOAT_NAMES, SUB_BYTE_FLOAT_BITS
from ..errors import CompileError, SignatureError
from ..options import SCHEDULES, KernelOptions, check_pipeline_choice
from .division_checks import add_division_checks
from .presets import PRESETS, fingerprint
from ..analysis.ir_callbacks import walk
from ..analysis.lowerings import Needs, needs
from ..analysis.types import llvm_function_types
from ..analysis.source import MLIR_LOCK, shared_context

DEFAULT = "default"

_SERIAL_LOOPS = "func.func(convert-linalg-to-loops),scf-forall-to-for,"
_PARALLEL_LOOPS = (
    "func.func(convert-linalg-to-parallel-loops),"
    "scf-forall-to-parallel,"
    "async-parallel-for{{async-dispatch=false num-workers={workers} min-task-size=1024}},"
)
_ASYNC_RUNTIME = (
    "async-func-to-async-runtime,"
    "async-to-async-runtime,"
    "async-runtime-ref-counting,"
    "async-runtime-ref-counting-opt,"
)
_MASKS = "func.func(lower-vector-mask),"
_PRE = (
    "builtin.module("
    "{loops}"
    "{asynchronous}"
    "func.func(lower-vector-multi-reduction),"
    "{masks}"
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


def pre_lowering(parallel: bool, wanted: Needs) -> str:
    """The first half of the preset lowering: to loops (parallel ones on a thread pool) and branches.

    The async runtime's lowering runs for ``parallel`` loops and for a module that needs it (``wanted``: one
    with ``async`` ops); ``vector.mask`` ops are lowered when it has some.
    """
    loops = _PARALLEL_LOOPS.format(workers=os.cpu_count() or 1) if parallel else _SERIAL_LOOPS
    on_runtime = parallel or wanted.asynchronous
    return _PRE.format(loops=loops, asynchronous=_ASYNC_RUNTIME if on_runtime else "",
                       masks=_MASKS if wanted.masks else "", runtime=",convert-async-to-llvm" if on_runtime else "")


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
_SPARSIFY = (
    "builtin.module("
    "func.func(linalg-generalize-named-ops),"
    "func.func(linalg-fuse-elementwise-ops),"
    "sparsification-and-bufferization,"
    "sparse-storage-specifier-to-llvm,"
    "func.func(canonicalize),"
    "func.func(expand-realloc))"
)
"""What upstream's ``sparsifier`` pipeline does before its lowering to LLVM: sparse code generation and
bufferization (with function boundaries and identity layouts, as :data:`_BUFFERIZE`), then the storage
specifiers' lowering; the module's sparse tensors live in buffers it allocates and frees itself."""
_APFLOAT = "convert-arith-to-apfloat,"
_POST = (
    "builtin.module("
    "{apfloat}"  # first: it unrolls vector ops into vector.to_elements/from_elements, which the next lowers
    "convert-vector-to-llvm,"
    "convert-math-to-llvm,"
    "convert-math-to-libm,"
    "convert-complex-to-llvm,"
    "convert-index-to-llvm,"
    "convert-arith-to-llvm,"
    "finalize-memref-to-llvm,"
    "convert-func-to-llvm,"
    "convert-cf-to-llvm,"
    "convert-ub-to-llvm,"
    "reconcile-unrealized-casts)"
)

@dataclass(frozen=True)
class Pipeline:
    """A preset name (see :mod:`memkernel.compile.presets`), or the user's own pass pipeline text.

    ``schedule`` is where the module's own transform schedule is applied (see :data:`~memkernel.options.SCHEDULES`).
    ``checked`` adds MLIR's runtime verification (``generate-runtime-verification``):
    out-of-bounds accesses and inconsistent linalg operand shapes become failing
    ``cf.assert`` ops, raised as :class:`~memkernel.errors.KernelAssertionError`.
    """

    name: str
    custom: str | None = None
    parallel: bool = False
    schedule: str | None = None
    checked: bool = False

    def describe(self) -> str:
        """What identifies the pipeline in a cache key."""
        schedule = f" schedule:{self.schedule}" if self.schedule is not None else ""
        schedule += " checked" if self.checked else ""
        if self.custom is not None:
            return self.custom + schedule
        return (f"preset {fingerprint(self.name)}" + (f" parallel:{os.cpu_count()}" if self.parallel else "")
                + schedule)


def _element(t: ir.Type) -> ir.Type:
    return t.element_type if isinstance(t, ir.ShapedType) else t


def _types_of(op: ir.Operation) -> list[ir.Type]:
    return [v.type for v in op.operands] + [r.type for r in op.results]


def uses_small_float_arithmetic(module: ir.Module) -> bool:
    """Whether an ``arith`` op (a conversion included) computes on an f8, f6 or f4 type (LLVM has none)."""
    found: list[str] = []

    def visit(op: ir.Operation) -> None:
        if op.name.startswith("arith.") and any(str(_element(t)) in SMALL_FLOAT_NAMES for t in _types_of(op)):
            found.append(op.name)

    walk(module.operation, visit)
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

    walk(module.operation, visit)
    return bool(found)


def _sub_byte_memref(t: ir.Type) -> str | None:
    """The element type of a memref of i1, f6 or f4 elements (one per byte, bit-packed in vectors), else None."""
    if not isinstance(t, (ir.MemRefType, ir.UnrankedMemRefType)):
        return None
    element = str(t.element_type)
    return element if element == "i1" or element in SUB_BYTE_FLOAT_BITS else None


def check_before_lowering(module: ir.Module, pipeline: Pipeline) -> None:
    """Refuse, with a SignatureError, IR that the lowering would miscompile or abort on."""
    vector_ops: list[tuple[str, str]] = []
    i1_ops: list[str] = []

    def visit(op: ir.Operation) -> None:
        elements = [e for e in map(_sub_byte_memref, _types_of(op)) if e is not None]
        if "i1" in elements:
            i1_ops.append(op.name)
        if elements and op.name.startswith("vector."):
            vector_ops.append((op.name, elements[0]))

    walk(module.operation, visit)
    if vector_ops:
        op, element = vector_ops[0]
        raise SignatureError(
            f"{op} on an {element} memref: vector accesses of {element} memrefs lower to bit-packed "
            f"loads and stores, while {element} memrefs hold one byte per element. Use memref.load/store "
            f"or linalg ops on {element} memrefs, or a memref of a byte-sized type."
        )
    if i1_ops and pipeline.custom is not None:
        raise SignatureError(
            f"{i1_ops[0]} uses an i1 memref, which only the preset pipelines support: with the "
            "LLVM 22 lowering, loading or storing an i1 element aborts the process, and the "
            "presets rewrite those accesses first. Drop pipeline= or use an i8 memref."
        )


_VERIFY = "builtin.module(generate-runtime-verification)"


def parse_pipeline(pipeline: str | None, parallel: bool = False, schedule: str | None = None,
                   checked: bool = False) -> Pipeline:
    """A :class:`Pipeline` for ``pipeline=``: None or a preset name, else pass pipeline text.

    ``parallel`` runs the parallel loops of a preset on the MLIR async runtime's
    thread pool; CompileError if that library is not installed or the pipeline is custom.
    ``schedule`` says where the module's own transform schedule is applied (see
    :data:`~memkernel.options.SCHEDULES`); CompileError for another value. ``checked`` adds runtime
    verification; CompileError with ``parallel``, whose worker threads a failed
    check could not stop.
    """
    check_pipeline_choice(pipeline, parallel, schedule, checked)
    if pipeline is None or pipeline in PRESETS:
        return Pipeline(pipeline or DEFAULT, parallel=parallel, schedule=schedule, checked=checked)
    text = pipeline.strip()
    if not text.startswith("builtin.module("):
        text = f"builtin.module({text})"
    try:
        with MLIR_LOCK, shared_context():
            passmanager.PassManager.parse(text)
    except ValueError as exc:
        presets = ", ".join(map(repr, PRESETS))
        raise CompileError(f"pipeline= does not parse as a pass pipeline or name a preset ({presets}): {exc}") from None
    return Pipeline("custom", text, schedule=schedule, checked=checked)


def pipeline_of(options: KernelOptions) -> Pipeline:
    """The :class:`Pipeline` a kernel made with ``options`` is lowered with (see :func:`parse_pipeline`)."""
    return parse_pipeline(options.pipeline, options.parallel, options.schedule, options.checked_wanted)


def _run(text: str, module: ir.Module, source: str) -> None:
    try:
        passmanager.PassManager.parse(text).run(module.operation)
    except ir.MLIRError as exc:
        raise CompileError(
            "lowering failed:\n" + format_diagnostics(exc.error_diagnostics, source)
        ) from None


_TRANSFORM_MAIN = "__transform_main"
_WITH_NAMED_SEQUENCE = "transform.with_named_sequence"


def _name_of(op: ir.Operation) -> str | None:
    return ir.StringAttr(op.attributes["sym_name"]).value if "sym_name" in op.attributes else None


def _is_transform(op: ir.Operation) -> bool:
    return op.name.startswith("transform.")


def _schedule_modules(module: ir.Module) -> list[ir.Operation]:
    """The module and its nested modules: where a schedule may be."""
    nested = [op.operation for op in module.body.operations if op.operation.name == "builtin.module"]
    return [module.operation, *nested]


@dataclass(frozen=True)
class Schedule:
    """A module's own transform schedule: its entry op and the module that holds it (and its helpers)."""

    entry: ir.Operation
    holder: ir.Operation


def find_schedule(module: ir.Module) -> Schedule | None:
    """The module's transform schedule: a ``transform.named_sequence @__transform_main`` or a
    ``transform.sequence``, at the top level or in a nested module; None if it has none."""
    for holder in _schedule_modules(module):
        for op in holder.regions[0].blocks[0].operations:
            op = op.operation
            if (op.name == "transform.named_sequence" and _name_of(op) == _TRANSFORM_MAIN) \
                    or op.name == "transform.sequence":
                return Schedule(op, holder)
    return None


def apply_schedule(module: ir.Module, schedule: Schedule, source: str) -> None:
    """Apply ``schedule`` to the whole module; CompileError with MLIR's diagnostics if it fails."""
    try:
        interpreter.apply_named_sequence(module.operation, schedule.entry, schedule.holder)
    except ir.MLIRError as exc:
        raise CompileError(
            "the module's transform schedule failed:\n" + format_diagnostics(exc.error_diagnostics, source)
        ) from None
    except ValueError as exc:  # how the interpreter reports a failed transform, its diagnostics in the text
        raise CompileError(f"the module's transform schedule failed: {exc}") from None


def strip_schedule(module: ir.Module) -> None:
    """Erase the module's transform ops, and the nested modules that held nothing else."""
    for holder in reversed(_schedule_modules(module)):
        ops = [op.operation for op in holder.regions[0].blocks[0].operations]
        if holder != module.operation and ops and all(_is_transform(op) for op in ops):
            holder.erase()
            continue
        for op in ops:
            if _is_transform(op):
                op.erase()
        if _WITH_NAMED_SEQUENCE in holder.attributes:
            del holder.attributes[_WITH_NAMED_SEQUENCE]


_INTERPRETER = re.compile(r"\btransform-(dialect-)?interpreter\b")


def runs_transform_interpreter(passes: str) -> bool:
    """Whether pass pipeline text (or ``mlir-opt`` options) runs the transform interpreter, which
    applies the module's schedule itself."""
    return _INTERPRETER.search(passes) is not None


def _scheduled(module: ir.Module, pipeline: Pipeline, source: str, point: str) -> None:
    """Apply (at its ``point``) and erase the module's own schedule, if it has one."""
    schedule = find_schedule(module)
    if schedule is None or (pipeline.schedule or SCHEDULES[0]) not in (point, "skip"):
        return
    if pipeline.schedule != "skip":
        apply_schedule(module, schedule, source)
    strip_schedule(module)


def add_llvm_c_interface(func: ir.Operation) -> None:
    """Give an ``llvm.func`` kernel the ``_mlir_ciface_<name>`` entry a ``func.func`` gets from
    ``llvm.emit_c_interface``: a function of the same scalar signature that calls it. A module lowered
    from a ``func.func`` with that attribute has the entry already, and keeps it."""
    name = ir.StringAttr(func.attributes["sym_name"]).value
    siblings = func.parent.regions[0].blocks[0].operations
    if any(op.operation.name == "llvm.func" and _name_of(op.operation) == f"_mlir_ciface_{name}" for op in siblings):
        return
    inputs, outputs = llvm_function_types(func)
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(inputs))
    args = ", ".join(f"%a{i}" for i in range(len(inputs)))
    types = ", ".join(map(str, inputs))
    if outputs:
        result = str(outputs[0])
        body = (f"%r = llvm.call @\"{name}\"({args}) : ({types}) -> {result}\n"
                f"llvm.return %r : {result}")
        returns = f" -> {result}"
    else:
        body, returns = f"llvm.call @\"{name}\"({args}) : ({types}) -> ()\nllvm.return", ""
    callee = f"llvm.func @\"{name}\"({types}){returns}\n"  # parsed beside the wrapper, which refers to it
    text = callee + f"llvm.func @\"_mlir_ciface_{name}\"({params}){returns} {{\n{body}\n}}"
    parsed = ir.Module.parse(text, func.context)
    wrapper = list(parsed.body.operations)[1]
    ir.InsertionPoint.after(func).insert(wrapper.detach_from_parent())


_SYMBOL_REFERENCE = re.compile(r'@("(?:[^"\\]|\\.)*"|[\w$.-]+)')


def _symbol_mentions(module: ir.Module) -> Counter[str]:
    """How often each symbol name appears after an ``@`` in the printed module, its definition included.

    Read from the text: the Python bindings abort the process on reading some attributes (a dense
    ``complex`` constant cannot be cast), so the ops' attributes are not looked at one by one."""
    return Counter(ir.StringAttr(ir.Attribute.parse(name, module.context)).value if name.startswith('"') else name
                   for name in _SYMBOL_REFERENCE.findall(str(module)))


def drop_unused_declarations(module: ir.Module) -> None:
    """Erase the ``func.func`` declarations nothing refers to: a library need not define them, and their
    types (``memref<?x?xvector<4x4xf32>>``) need not lower."""
    mentions = _symbol_mentions(module)
    for op in list(module.body.operations):
        op = op.operation
        if op.name != "func.func" or len(op.regions[0].blocks) != 0:
            continue
        name = _name_of(op)
        if name is None or mentions[name] <= 1:
            op.erase()


def _verify(module: ir.Module, source: str) -> None:
    """``checked=True``: upstream's runtime verification of memory accesses, and memkernel's of integer division."""
    _run(_VERIFY, module, source)
    add_division_checks(module)


def lower(module: ir.Module, pipeline: Pipeline, source: str, until: str = "llvm") -> ir.Module:
    """Lower ``module`` up to stage ``until``; the lowered module (the same one or, after a
    preset's strategies, a new one). CompileError with the diagnostics on failure.

    A custom pipeline has only the ``input`` and ``llvm`` stages.
    """
    if until == "input":
        return module
    drop_unused_declarations(module)
    if pipeline.custom is not None:
        if until != "llvm":
            raise ValueError(f"a custom pipeline has the stages 'input' and 'llvm', not {until!r}")
        interprets = runs_transform_interpreter(pipeline.custom)
        if not interprets:
            _scheduled(module, pipeline, source, pipeline.schedule or SCHEDULES[0])
        if pipeline.checked:
            _verify(module, source)
        allocations.check_sizes(module)
        _run(pipeline.custom, module, source)
        if interprets:
            strip_schedule(module)
        return module
    _scheduled(module, pipeline, source, "before-bufferization")
    strategies = PRESETS[pipeline.name]
    for strategy in strategies:
        if strategy.on_tensors:
            module = strategy.applied(module, pipeline.parallel)
    if needs(module.operation).sparse:
        _run(_SPARSIFY, module, source)
    elif uses_tensors(module):
        _run(_BUFFERIZE, module, source)
    _scheduled(module, pipeline, source, "after-bufferization")
    if pipeline.checked:
        _verify(module, source)
    if until == "bufferized":
        return module
    for strategy in strategies:
        if not strategy.on_tensors:
            module = strategy.applied(module, pipeline.parallel)
    if until == "vectorized":
        return module
    allocations.check_sizes(module)
    _run(pre_lowering(pipeline.parallel, needs(module.operation)), module, source)
    i1_storage.lower_i1_accesses(module)
    if until == "loops":
        return module
    atomics.freeze_yielded_values(module)
    apfloat = _APFLOAT if uses_small_float_arithmetic(module) else ""
    _run(_POST.format(apfloat=apfloat), module, source)
    return module
