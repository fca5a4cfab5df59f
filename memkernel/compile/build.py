"""What a kernel's first call asks of the compiler when no cache has its code: :func:`build` it, with its
fast path, in the compile worker and link it here (:func:`compile_function`); and what
:meth:`~memkernel.Kernel.ir` asks: the module :func:`lowered` to a stage. This process imports no MLIR for
them (see :mod:`memkernel.compile.requests`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ..errors import CompileError
from ..fastpath.symbols import FastSymbols
from ..load import libraries
from ..load.compiled import CompiledFunction, load_function
from ..load.entry import Entry
from ..load.objects import ObjectLoadError
from ..model.kernel_spec import KernelSpec
from ..options import KernelOptions
from ..stdio import may_print
from ..ufunc.layout import GufuncLayout
from . import requests, worker
from .fast_path import FastPath, fast_path
from .gufunc_loop import consts_name, loop_name, loop_text, operand_types
from .requests import PipelineChoice


def build(options: KernelOptions, spec: KernelSpec, shared_libs: Sequence[str], fast_wanted: bool,
          keep_object: bool, callbacks: Mapping[str, int],
          foreign: Mapping[str, int] | None = None) -> CompiledFunction:
    """Compile ``spec``'s kernel of ``options.source`` (with its fast path if ``fast_wanted`` and the
    kernel's argument kinds allow one) in the compile worker, and link it here. ``callbacks`` maps
    declarations to the addresses of the functions that define them, ``foreign`` the foreign symbols the
    kernel calls to theirs. Raises CompileError."""
    fast = fast_path(spec, spec.signature.results) if fast_wanted else None
    return compile_function(options.source, spec.name, PipelineChoice.of(options), options.opt_level, shared_libs,
                            fast, keep_object, callbacks, options.llvm_options, foreign)


def build_gufunc(options: KernelOptions, layout: GufuncLayout, shared_libs: Sequence[str],
                 foreign: Mapping[str, int] | None = None) -> CompiledFunction:
    """Compile the kernel of ``options.source`` with the gufunc loop of ``layout`` (see
    :mod:`memkernel.compile.gufunc_loop`) in the compile worker, and link it here: its ``fast_address`` is the
    loop, its ``consts_address`` the loop's table. The kernel itself is compiled without the async runtime
    (with ``parallel=True`` the loop spreads the batch over threads of its own). ``foreign`` maps the foreign
    symbols the kernel calls (an extern kernel's) to their addresses. Raises CompileError."""
    name = layout.kernel
    loop = FastPath(loop_text(layout, options.parallel), FastSymbols(loop_name(name), consts_name(name), ()), name,
                    operand_types(layout), None, optimized=True)
    return compile_function(options.source, name, PipelineChoice.of(options, parallel=False), options.opt_level,
                            shared_libs, loop, False, {}, options.llvm_options, foreign)


def lowered(options: KernelOptions, name: str, callbacks: tuple[str, ...], stage: str) -> str:
    """Kernel ``name`` of ``options.source`` lowered to ``stage`` in the compile worker, as MLIR text."""
    return worker.run(options.llvm_options, f"lowering @{name} to stage {stage!r}", requests.lowered_text,
                      options.source, name, PipelineChoice.of(options), callbacks, stage)


def _unresolved_error(name: str, unresolved: Sequence[str]) -> CompileError:
    return CompileError(
        f"@{name} calls {', '.join(unresolved)}, which no linked library defines. Bind a "
        "declaration to Python with callbacks={name: function}; pass the library that defines "
        "it in shared_libs=; the MLIR runtime libraries (memrefCopy, printMemref*, the APFloat "
        "routines of f8 arithmetic) come with: pip install 'memkernel[runtime]'."
    )


def compile_function(
    source: str,
    name: str,
    choice: PipelineChoice,
    opt_level: int,
    shared_libs: Sequence[str],
    fast: FastPath | None = None,
    keep_object: bool = False,
    callbacks: Mapping[str, int] | None = None,
    llvm_options: Sequence[str] = (),
    foreign: Mapping[str, int] | None = None,
) -> CompiledFunction:
    """Compile ``source``'s kernel ``name`` in the compile worker and link it here.

    ``fast``, when given, is compiled into the same module (if the lowered
    signature allows it). With ``keep_object`` the result carries the object
    code for the disk cache. ``callbacks`` maps declarations to the addresses
    of the functions that define them (see :mod:`memkernel.call.callbacks`).
    ``llvm_options`` picks the worker (see :mod:`memkernel.compile.worker`).
    ``foreign`` maps the foreign symbols the object calls to their addresses (see :mod:`memkernel.load.foreign`).
    CompileError with MLIR's diagnostics on failure, or if the worker crashed.
    """
    callbacks, foreign = callbacks or {}, foreign or {}
    made = worker.run(llvm_options, f"compiling @{name}", requests.object_code, source, name, choice, opt_level,
                      tuple(shared_libs), fast, tuple(callbacks), tuple(foreign))
    added, unresolved = libraries.libraries_for([e for e in made.externals if e not in foreign], shared_libs)
    if unresolved:
        raise _unresolved_error(name, unresolved)
    entry = Entry(made.code, (*shared_libs, *added), fast.symbols if fast is not None and made.fast else None,
                  may_print(made.kernel_calls), made.guarded,
                  made.initializers)
    try:
        compiled = load_function(entry, name, {**{f"_mlir_ciface_{c}": a for c, a in callbacks.items()}, **foreign})
    except ObjectLoadError as exc:
        raise CompileError(f"JIT compilation of @{name} failed: its code did not link: {exc}. A function it "
                           "calls may be missing: pass the library that defines it in shared_libs=.") from None
    return compiled if keep_object else dataclasses.replace(compiled, entry=None)
