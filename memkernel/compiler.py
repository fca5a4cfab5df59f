"""Lowering a parsed kernel module and JIT-compiling it into a callable address."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlir import ir
from mlir.execution_engine import ExecutionEngine

from . import libraries
from .diagnostics import capture_c_stderr
from .errors import CompileError
from .pipeline import APFLOAT_LIBRARY, Pipeline, lower
from .source import ParsedSource


@dataclass
class CompiledFunction:
    """A JIT-compiled kernel: the engine that owns the code and the packed entry point.

    ``address`` is ``_mlir__mlir_ciface_<name>(void** args)``: ``args[i]`` points at
    argument ``i`` (a memref argument is a pointer to its descriptor).
    """

    engine: ExecutionEngine
    address: int


def _with_stderr(message: str, stderr: str) -> str:
    stderr = stderr.strip()
    return f"{message}\nMLIR reported:\n{stderr}" if stderr else message


def compile_function(
    parsed: ParsedSource,
    name: str,
    pipeline: Pipeline,
    opt_level: int,
    shared_libs: Sequence[str],
) -> CompiledFunction:
    """Lower ``parsed`` in place with ``pipeline`` and JIT it; CompileError with MLIR's diagnostics on failure."""
    with parsed.context, ir.Location.unknown():
        parsed.function(name).attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        needs_apfloat = lower(parsed.module, pipeline, parsed.text)
        libs = tuple(shared_libs)
        if needs_apfloat:
            apfloat = libraries.find_library(APFLOAT_LIBRARY)
            if apfloat is None:
                raise CompileError(
                    "arithmetic on f8 types runs in software through libmlir_apfloat_wrappers, "
                    "which is not installed: pip install 'memkernel[runtime]'"
                )
            libs += (apfloat,)
        failure = None
        with capture_c_stderr() as stderr:
            try:
                engine = ExecutionEngine(parsed.module, opt_level=opt_level, shared_libs=list(libs))
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
        return CompiledFunction(engine, address)
