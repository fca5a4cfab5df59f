"""The compile worker's requests: the functions a caller has the worker run, named by pickle.

A function named in a request is pickled by its module and name, so the
caller imports the module that holds it. These import the compiler, and with
it the MLIR bindings (80-100 ms), only when they run, in the worker: a
process that decorates, compiles and calls kernels through the worker never
imports MLIR itself. A pass pipeline travels as the user's choice
(:class:`PipelineChoice`) and is parsed in the worker, and the worker's replies
are of types the caller unpickles without the compiler
(:class:`~memkernel.compile.compiled_object.ObjectCode`, text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..options import KernelOptions

if TYPE_CHECKING:
    from .compiled_object import ObjectCode
    from .fast_path import FastPath
    from .pipeline import Pipeline


@dataclass(frozen=True)
class PipelineChoice:
    """What chose a kernel's pass pipeline: ``pipeline=``, ``parallel=``, ``schedule=`` and whether it is
    checked, settled in the caller (``$MEMKERNEL_CHECKED`` is the caller's)."""

    pipeline: str | None
    parallel: bool
    schedule: str | None
    checked: bool

    @classmethod
    def of(cls, options: KernelOptions, *, parallel: bool | None = None) -> PipelineChoice:
        """The choice ``options`` make (with ``parallel`` in place of theirs, when given)."""
        return cls(options.pipeline, options.parallel if parallel is None else parallel, options.schedule,
                   options.checked_wanted)

    def parsed(self) -> Pipeline:
        """The pipeline this choice makes (see :func:`memkernel.compile.pipeline.parse_pipeline`): in the worker."""
        from .pipeline import parse_pipeline

        return parse_pipeline(self.pipeline, self.parallel, self.schedule, self.checked)


def kernel_ir_data(options: KernelOptions, requested: str | None, parameters: tuple[str, ...]) -> str:
    """The IR of kernel ``requested`` of ``options.source``, encoded (:mod:`memkernel.model.codec`); see
    :func:`memkernel.compile.decoration.read_kernel`."""
    from ..model import codec
    from .decoration import read_kernel

    kernel_ir, _ = read_kernel(options, requested, parameters)
    return codec.dumps(kernel_ir)


def object_code(source: str, name: str, choice: PipelineChoice, opt_level: int, shared_libs: tuple[str, ...],
                fast: FastPath | None, callbacks: tuple[str, ...], foreign: tuple[str, ...] = (),
                target_cpu: str | None = None) -> ObjectCode:
    """Kernel ``name`` of ``source`` compiled to object code; see :func:`memkernel.compile.engine.object_code`."""
    from . import engine

    return engine.object_code(source, name, choice.parsed(), opt_level, shared_libs, fast, callbacks, foreign,
                              target_cpu)


def lowered_text(source: str, name: str, choice: PipelineChoice, callbacks: Sequence[str], stage: str) -> str:
    """``source`` with kernel ``name`` lowered to ``stage``; see :func:`memkernel.compile.engine.lowered_text`."""
    from . import engine

    return engine.lowered_text(source, name, choice.parsed(), tuple(callbacks), stage)
