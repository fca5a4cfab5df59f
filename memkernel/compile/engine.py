"""Lowering a parsed kernel module and JIT-compiling it into a callable address."""

from __future__ import annotations

import ctypes
import os
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from mlir import ir
from mlir.execution_engine import ExecutionEngine

from . import libraries
from ..errors import CompileError
from .cache import Entry
from .objects import LoadedObject, engine_libraries, engine_symbol
from ..stdio import capture_c_stderr, may_print
from .pipeline import Pipeline, add_llvm_c_interface, lower
from ..spec.source import MLIR_LOCK, ParsedSource
from ..fastpath.emitter import FastPath, attach, lowered_function, lowered_function_type
from ..spec.signature import Signature, read_signature


@dataclass
class CompiledFunction:
    """A compiled kernel: what owns the code, and its entry points.

    ``owner`` is the ExecutionEngine (or, for a cached kernel, the
    :class:`~memkernel.jit.LoadedObject`) that keeps the code mapped.
    ``address`` is ``_mlir__mlir_ciface_<name>(void** args)``: ``args[i]`` points at
    argument ``i`` (a memref argument is a pointer to its descriptor).
    ``fast_address`` and ``consts_address`` are the fast path's function and
    constants table (see :mod:`memkernel.thunk`), 0 when it has none.
    ``entry`` is what the disk cache stores: the object code and its libraries.
    ``may_print`` tells whether it calls functions that may write to the C streams.
    """

    owner: object
    address: int
    fast_address: int
    consts_address: int
    entry: Entry | None
    may_print: bool


def load_function(entry: Entry, name: str, fast: FastPath | None) -> CompiledFunction:
    """A kernel from a disk cache entry, linked without running MLIR or LLVM codegen.

    Raises ObjectLoadError if LLVM cannot load or link it.
    """
    loaded = LoadedObject(entry.code, entry.libraries)
    address = loaded.symbol(f"_mlir__mlir_ciface_{name}")
    if fast is None or not entry.fast:
        return CompiledFunction(loaded, address, 0, 0, entry, entry.may_print)
    return CompiledFunction(loaded, address, loaded.symbol(fast.function), loaded.symbol(fast.consts), entry,
                            entry.may_print)


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


def _with_stderr(message: str, stderr: str) -> str:
    stderr = stderr.strip()
    return f"{message}\nMLIR reported:\n{stderr}" if stderr else message


def lower_kernel(parsed: ParsedSource, name: str, pipeline: Pipeline, callbacks: Collection[str],
                 until: str = "llvm") -> None:
    """Prepare the kernel's boundary and its callbacks' declarations, then lower ``parsed.module``
    up to stage ``until``."""
    with MLIR_LOCK, parsed.context, ir.Location.unknown():
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


def compile_function(
    parsed: ParsedSource,
    name: str,
    pipeline: Pipeline,
    opt_level: int,
    shared_libs: Sequence[str],
    fast: FastPath | None = None,
    keep_object: bool = False,
    callbacks: Mapping[str, int] | None = None,
) -> CompiledFunction:
    """Lower ``parsed`` in place with ``pipeline`` and JIT it; CompileError with MLIR's diagnostics on failure.

    ``fast``, when given, is compiled into the same module (if the lowered
    signature allows it). With ``keep_object`` the result carries the object
    code for the disk cache. ``callbacks`` maps declarations to the addresses
    of the functions that define them (see :mod:`memkernel.callbacks`).
    """
    callbacks = callbacks or {}
    with MLIR_LOCK, parsed.context, ir.Location.unknown():
        signature = read_signature(parsed.function(name))
        lower_kernel(parsed, name, pipeline, callbacks)
        check_lowered_signature(parsed.module, signature)
        with_fast = fast is not None
        if fast is not None:
            attach(parsed.module, fast)
        defined_here = {f"_mlir_ciface_{callback}" for callback in callbacks}
        externals = [f for f in external_functions(parsed.module) if f not in defined_here]
        added, unresolved = libraries.libraries_for(externals, shared_libs)
        printing = may_print(externals)
        if unresolved:
            raise CompileError(
                f"@{name} calls {', '.join(unresolved)}, which no linked library defines. Bind a "
                "declaration to Python with callbacks={name: function}; pass the library that defines "
                "it in shared_libs=; the MLIR runtime libraries (memrefCopy, printMemref*, the APFloat "
                "routines of f8 arithmetic) come with: pip install 'memkernel[runtime]'."
            )
        libs = (*shared_libs, *added)
        failure = None
        with capture_c_stderr() as stderr:
            try:
                engine = ExecutionEngine(parsed.module, opt_level=opt_level, shared_libs=engine_libraries(libs))
                for callback, callback_address in callbacks.items():
                    engine.raw_register_runtime(f"_mlir_ciface_{callback}", ctypes.c_void_p(callback_address))
                address = engine.raw_lookup("_mlir_ciface_" + name)
            except RuntimeError as exc:
                failure = str(exc)
        if failure is not None:
            raise CompileError(_with_stderr(f"JIT compilation of @{name} failed: {failure}", stderr[0]))
        if not address:
            raise CompileError(_with_stderr(
                f"JIT compilation of @{name} failed: its code did not link. A function it calls "
                "may be missing: pass the library that defines it in shared_libs=.", stderr[0]))
        engine.initialize()
        entry = Entry(_object_code(engine), libs, with_fast, printing) if keep_object else None
        if not with_fast:
            return CompiledFunction(engine, address, 0, 0, entry, printing)
        assert fast is not None
        return CompiledFunction(engine, address, engine_symbol(engine, fast.function),
                                engine_symbol(engine, fast.consts), entry, printing)
