"""What a kernel's first call asks of the compiler when no cache has its code: :func:`build` it, with its
fast path; and what :meth:`~memkernel.Kernel.ir` asks: the module :func:`lowered` to a stage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .fast_path import fast_path
from ..load.compiled import CompiledFunction
from ..model.kernel_spec import KernelSpec
from ..options import KernelOptions
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


def lowered(options: KernelOptions, name: str, callbacks: tuple[str, ...], stage: str) -> str:
    """Kernel ``name`` of ``options.source`` lowered to ``stage`` in the compile worker, as MLIR text."""
    return worker.run(options.llvm_options, f"lowering @{name} to stage {stage!r}", lowered_text, options.source,
                      name, pipeline_of(options), callbacks, stage)
