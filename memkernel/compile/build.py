"""What a kernel's first call asks of the compiler when no cache has its code: :func:`build` it, with its
fast path; and what :meth:`~memkernel.Kernel.ir` asks: the module :func:`lowered` to a stage."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from .fast_path import FastPath, fast_path
from .gufunc_loop import consts_name, loop_name, loop_text, operand_types
from ..fastpath.symbols import FastSymbols
from ..load.compiled import CompiledFunction
from ..model.kernel_spec import KernelSpec
from ..options import KernelOptions
from ..ufunc.layout import GufuncLayout
from . import worker
from .engine import compile_function, lowered_text
from .pipeline import pipeline_of


def build(options: KernelOptions, spec: KernelSpec, shared_libs: Sequence[str], fast_wanted: bool,
          keep_object: bool, callbacks: Mapping[str, int],
          foreign: Mapping[str, int] | None = None) -> CompiledFunction:
    """Compile ``spec``'s kernel of ``options.source`` (with its fast path if ``fast_wanted`` and the
    kernel's argument kinds allow one) in the compile worker, and link it here. ``callbacks`` maps
    declarations to the addresses of the functions that define them, ``foreign`` the foreign symbols the
    kernel calls to theirs. Raises CompileError."""
    fast = fast_path(spec, spec.signature.results) if fast_wanted else None
    return compile_function(options.source, spec.name, pipeline_of(options), options.opt_level, shared_libs, fast,
                            keep_object, callbacks, options.llvm_options, foreign)


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
    serial = dataclasses.replace(options, parallel=False)
    return compile_function(options.source, name, pipeline_of(serial), options.opt_level, shared_libs, loop,
                            False, {}, options.llvm_options, foreign)


def lowered(options: KernelOptions, name: str, callbacks: tuple[str, ...], stage: str) -> str:
    """Kernel ``name`` of ``options.source`` lowered to ``stage`` in the compile worker, as MLIR text."""
    return worker.run(options.llvm_options, f"lowering @{name} to stage {stage!r}", lowered_text, options.source,
                      name, pipeline_of(options), callbacks, stage)
