"""Lowering a kernel and compiling it into object code, in the compile worker.

The caller's :func:`~memkernel.compile.build.compile_function` sends the work to
the worker (see :mod:`memkernel.compile.requests`), which runs
:func:`object_code` or :func:`lowered_text`; the caller links the object with
:func:`~memkernel.load.compiled.load_function`, as it links a disk cache entry.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from collections.abc import Collection, Sequence

from mlir import ir
from mlir.execution_engine import ExecutionEngine

from . import assertions, guard, initializers
from ..errors import CompileError
from ..load import libraries
from ..load.objects import LoadedObject, ObjectLoadError, host_cpu
from .llvm import engine_libraries
from .pipeline import Pipeline, add_llvm_c_interface, lower
from ..analysis.source import MLIR_LOCK, ParsedSource, parse_source
from .stderr import stderr_written
from .compiled_object import ObjectCode
from .fast_path import FastPath, lowered_function_type
from ..analysis.types import read_signature
from ..model.signature import Signature


def _object_code(engine: ExecutionEngine) -> bytes:
    with tempfile.TemporaryDirectory(prefix="memkernel-") as folder:
        path = os.path.join(folder, "kernel.o")
        engine.dump_to_object_file(path)
        with open(path, "rb") as dumped:
            return dumped.read()


def external_functions(module: ir.Module) -> list[str]:
    """Names of the functions the lowered module declares but does not define."""
    return [
        ir.StringAttr(op.attributes["sym_name"]).value
        for op in module.body.operations
        if op.operation.name == "llvm.func" and len(op.regions[0].blocks) == 0
    ]


def prepare_boundary(func: ir.Operation) -> None:
    """Give the kernel a C interface, and make its tensor arguments read-only for bufferization."""
    if func.name == "llvm.func":
        add_llvm_c_interface(func)
        return
    func.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
    inputs = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value).inputs
    if any(isinstance(t, (ir.RankedTensorType, ir.UnrankedTensorType)) for t in inputs):
        existing = list(ir.ArrayAttr(func.attributes["arg_attrs"])) if "arg_attrs" in func.attributes else []
        attrs = []
        for i, t in enumerate(inputs):
            entries = {a.name: a.attr for a in ir.DictAttr(existing[i])} if i < len(existing) else {}
            if isinstance(t, (ir.RankedTensorType, ir.UnrankedTensorType)):
                entries["bufferization.writable"] = ir.BoolAttr.get(False)
            attrs.append(ir.DictAttr.get(entries))
        func.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)


def _with_stderr(message: str, written: list[str]) -> str:
    stderr = "".join(written).strip()
    return f"{message}\nMLIR reported:\n{stderr}" if stderr else message


def lower_kernel(parsed: ParsedSource, name: str, pipeline: Pipeline, callbacks: Collection[str],
                 until: str = "llvm") -> None:
    """Prepare the kernel's boundary and its callbacks' declarations, then lower ``parsed.module``
    up to stage ``until``."""
    with MLIR_LOCK, parsed.context, ir.Location.unknown():
        assertions.annotate(parsed.module)
        prepare_boundary(parsed.function(name))
        for func in parsed.functions():
            if ir.StringAttr(func.attributes["sym_name"]).value in callbacks:
                func.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        parsed.module = lower(parsed.module, pipeline, parsed.text, until)


def check_lowered_signature(module: ir.Module, signature: Signature) -> None:
    """CompileError unless the lowered kernel takes and returns what memkernel passes and reads.

    Both call paths build descriptors of 64-bit words and read results the
    default lowering's way; a pipeline with ``index-bitwidth=32`` or the
    bare-pointer calling convention lowers to another signature, and calling
    it would read garbage.
    """
    lowered = lowered_function(module, signature.name)
    if lowered is None:
        return  # not lowered to the LLVM dialect at all: the JIT says why, with MLIR's diagnostics
    expected = lowered_function_type(signature.args, signature.results)
    actual = ir.TypeAttr(lowered.attributes["function_type"]).value
    if actual != ir.Type.parse(expected):
        raise CompileError(
            f"pipeline= lowered @{signature.name} to {actual}, but memkernel calls it as {ir.Type.parse(expected)}: "
            "64-bit index and the default memref calling convention (descriptors, not bare pointers). "
            "Drop index-bitwidth= and use-bare-ptr-memref-call-conv= from the pipeline."
        )


def _placeholder() -> ctypes.c_void_p:
    """An address for the symbols the worker cannot resolve: the object is linked in the caller, never run here."""
    return ctypes.c_void_p(ctypes.cast(ctypes.CDLL(None).abort, ctypes.c_void_p).value)


def object_code(source: str, name: str, pipeline: Pipeline, opt_level: int, shared_libs: tuple[str, ...],
                fast: FastPath | None, callbacks: tuple[str, ...], foreign: tuple[str, ...] = (),
                target_cpu: str | None = None) -> ObjectCode:
    """In the compile worker: parse, lower and compile ``source``'s kernel ``name`` into object code.

    ``fast``, when given, is compiled into the same module (if the lowered
    signature allows it). ``callbacks`` are declarations bound to Python
    functions, which the caller defines when it links the object, as it does
    the ``foreign`` symbols (see :mod:`memkernel.load.foreign`). ``target_cpu``
    (an LLVM CPU name such as ``x86-64-v3``) compiles for that CPU and its
    features instead of the host's. Raises
    CompileError with MLIR's diagnostics (and what LLVM wrote on stderr).
    """
    parsed = parse_source(source)
    with MLIR_LOCK, parsed.context, ir.Location.unknown():
        signature = read_signature(parsed.function(name))
        lower_kernel(parsed, name, pipeline, callbacks)
        check_lowered_signature(parsed.module, signature)
        has_initializers = initializers.gather(parsed.module)
        contained = guard.contain(parsed.module)
        if contained is not None:
            parsed.module = contained
        if fast is not None:
            attach(parsed.module, fast, guard.runner(fast.kernel, fast.operand_types, fast.result_type,
                                                     guarded=contained is not None))
        if target_cpu is not None:
            for_cpu(parsed.module, target_cpu)
        else:
            prefer_host_vector_width(parsed.module)
        defined_later = {f"_mlir_ciface_{callback}" for callback in callbacks} | set(foreign)
        externals = [f for f in external_functions(parsed.module) if f not in defined_later]
        module_text = _kernel_text(parsed.module)
        added, unresolved = libraries.libraries_for(externals, shared_libs)
        libs = (*shared_libs, *added)
        failure, address = None, 0
        with stderr_written() as stderr:
            try:
                engine = ExecutionEngine(parsed.module, opt_level=opt_level, shared_libs=engine_libraries(libs))
                for symbol in (*defined_later, *unresolved):
                    engine.raw_register_runtime(symbol, _placeholder())
                address = engine.raw_lookup("_mlir_ciface_" + name)
            except RuntimeError as exc:
                failure = str(exc)
    if failure is not None:
        raise CompileError(_with_stderr(f"JIT compilation of @{name} failed: {failure}", stderr))
    if not address:
        raise CompileError(_with_stderr(
            f"JIT compilation of @{name} failed: its code did not link. A function it calls "
            "may be missing: pass the library that defines it in shared_libs=.", stderr))
    code = _object_code(engine)
    _trial_link(name, code, libs, (*defined_later, *unresolved))
    return ObjectCode(code, fast is not None, tuple(externals), kernel_calls(module_text, externals),
                      contained is not None, has_initializers)


def _kernel_text(module: ir.Module) -> str:
    """The text of what the lowered ``module`` defines (functions, and globals, whose initializers may take a
    function's address) other than memkernel's own (``__memkernel_*``: the guard, the fast path, the checks)."""
    texts = []
    for op in module.body.operations:
        op = op.operation
        if op.name == "llvm.func" and len(op.regions[0].blocks) == 0:
            continue  # a declaration
        if "sym_name" in op.attributes and ir.StringAttr(op.attributes["sym_name"]).value.startswith("__memkernel_"):
            continue
        texts.append(str(op))
    return "\n".join(texts)


def kernel_calls(text: str, externals: Sequence[str]) -> tuple[str, ...]:
    """The ``externals`` that ``text`` (see :func:`_kernel_text`) names: calls and addresses taken. A name that
    merely starts like another counts too, which errs on the side of "may print"."""
    return tuple(name for name in externals if f"@{name}" in text or f'@"{name}' in text)


def for_cpu(module: ir.Module, cpu: str) -> None:
    """Have every function of the lowered ``module`` compiled for ``cpu``, with that CPU's features only: a
    function's own ``target-features`` replace the JIT's (the host's), which it would otherwise keep."""
    for op in module.body.operations:
        if op.operation.name == "llvm.func" and len(op.regions[0].blocks) > 0:
            op.attributes["target_cpu"] = ir.StringAttr.get(cpu)
            op.attributes["target_features"] = ir.Attribute.parse('#llvm.target_features<["+cx8"]>')


# Hosts with AVX-512 whose loops LLVM should vectorize 256 bits wide: Zen 4 runs a 512-bit op as two
# 256-bit halves, and its 512-bit stores stream to memory slower (measured: c = a + b on 10^7 f32 ran
# at 0.85 of numpy's 256-bit loop with zmm, 1.0 with ymm, 16- or 64-byte aligned alike). Vectors a
# strategy writes (the fast preset's 512-bit matmul tiles) keep their width: without
# "min-legal-vector-width" LLVM still treats 512-bit types as legal.
_PREFER_256_BIT = frozenset({"znver4"})


def prefer_host_vector_width(module: ir.Module) -> None:
    """On a host of :data:`_PREFER_256_BIT`, have LLVM's vectorizers pick 256-bit vectors in every function
    of the lowered ``module`` that does not say otherwise.

    The ExecutionEngine adds a packed wrapper ``_mlir_<f>`` of each function after this, without the
    attribute; the C interfaces are kept out of theirs (``no_inline``), or their loops, inlined there,
    would be vectorized 512 bits wide again."""
    if host_cpu().split(";", 1)[0] not in _PREFER_256_BIT:
        return
    for op in module.body.operations:
        if op.operation.name != "llvm.func" or len(op.regions[0].blocks) == 0:
            continue
        if "prefer_vector_width" not in op.attributes:
            op.attributes["prefer_vector_width"] = ir.StringAttr.get("256")
        if ir.StringAttr(op.attributes["sym_name"]).value.startswith("_mlir_ciface_"):
            op.attributes["no_inline"] = ir.UnitAttr.get()


def _trial_link(name: str, code: bytes, libs: Sequence[str], placeholders: Sequence[str]) -> None:
    """In the compile worker: link the object as the caller will (LLVM's JIT linker, which can assert on an
    object the ExecutionEngine took), so that an abort happens here, not in the caller's process."""
    address = ctypes.cast(_placeholder(), ctypes.c_void_p).value or 0
    try:
        LoadedObject(code, tuple(libs), {symbol: address for symbol in placeholders}).symbol(
            f"_mlir__mlir_ciface_{name}")
    except ObjectLoadError as exc:
        raise CompileError(f"JIT compilation of @{name} failed: its object code does not link: {exc}") from None


def lowered_text(source: str, name: str, pipeline: Pipeline, callbacks: tuple[str, ...], stage: str) -> str:
    """In the compile worker: ``source`` with its kernel ``name`` lowered up to ``stage``, as MLIR text."""
    parsed = parse_source(source)
    lower_kernel(parsed, name, pipeline, callbacks, stage)
    with MLIR_LOCK:
        return str(parsed.module)


def lowered_function(module: ir.Module, name: str) -> ir.Operation | None:
    """The ``llvm.func @name`` of a lowered module, or None."""
    for op in module.body.operations:
        if op.operation.name == "llvm.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op.operation
    return None


def attach(module: ir.Module, fast: FastPath, runner: str) -> None:
    """Add the fast path to a lowered module whose kernel has the default lowered signature, with ``runner``:
    the text of its ``__memkernel_run_<name>`` (see :func:`memkernel.compile.guard.runner`) and of the
    declarations it needs."""
    addition = ir.Module.parse(fast.text + runner, module.context)
    for op in list(addition.body.operations):
        op = op.operation
        defined = op.name == "llvm.func" and len(op.regions[0].blocks) > 0
        table = op.name == "llvm.mlir.global" and ir.StringAttr(op.attributes["sym_name"]).value == fast.symbols.consts
        if defined and not fast.optimized:
            op.attributes["passthrough"] = ir.ArrayAttr.get([ir.StringAttr.get("noinline"), ir.StringAttr.get("optnone")])
        if defined or table:  # the runner's declarations name what the guarded module defines
            module.body.append(op.detach_from_parent())
