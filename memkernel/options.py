"""What :func:`~memkernel.mlir_kernel` takes, declared once: :class:`KernelOptions`.

Every place that makes or carries a kernel takes this one frozen dataclass:
:func:`~memkernel.mlir_kernel` and :class:`~memkernel.kernel.Kernel`,
pickling, the CLI, the pytest plugin and the isolate worker. Its
``__post_init__`` checks every value that can be checked without reading the
source, so a wrong option is an :class:`~memkernel.errors.OptionError` (or, as
before, the error its README row names) at decoration, whatever path the kernel
then takes. Adding an option is one field here, with its check, plus its use.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from .errors import ArgumentError, CompileError, OptionError
from .load.libraries import find_library

PRESET_NAMES = ("default", "fast")
"""The preset pipelines :mod:`memkernel.compile.presets` defines, by name."""

SCHEDULES = ("before-bufferization", "after-bufferization", "skip")
"""Where a module's own transform schedule is applied: ``schedule=`` (None picks
``"before-bufferization"``, which for memref code is also after it); ``"skip"``
erases it unapplied."""

STAGES = ("input", "bufferized", "vectorized", "loops", "llvm")
"""The stages of the preset pipelines that :meth:`~memkernel.Kernel.ir` can show (a custom
``pipeline=`` has ``input`` and ``llvm``).

``input``: the parsed source, as memkernel prepared it (C interface added);
``bufferized``: tensors turned into memrefs (after the preset's tensor
strategies; the input itself for memref kernels); ``vectorized``: after the
preset's memref strategies (the same as ``bufferized`` for ``"default"``);
``loops``: linalg, affine, vector and scf lowered to loops and branches,
``i1`` accesses made byte accesses, just before the LLVM conversion; ``llvm``:
the LLVM dialect that is JIT-compiled.
"""

ASYNC_RUNTIME = "mlir_async_runtime"
"""The runtime library ``parallel=True`` kernels run their parallel loops on."""


def check_pipeline_choice(pipeline: str | None, parallel: bool, schedule: str | None, checked: bool) -> None:
    """Refuse a combination of ``pipeline=``, ``parallel=``, ``schedule=`` and ``checked=`` that cannot work:
    CompileError, as the README's error table says. Pass pipeline text is checked when it is parsed."""
    if schedule is not None and schedule not in SCHEDULES:
        raise CompileError(
            f"schedule= must be None (apply the module's transform schedule before bufferization) or one of "
            f"{', '.join(map(repr, SCHEDULES))}; got {schedule!r}."
        )
    if checked and parallel:
        raise CompileError(
            "checked=True stops a kernel at its first failed check, on the thread that called it; parallel=True "
            "runs loops on worker threads, where a failed check would abort the process. Drop one of them."
        )
    if pipeline is not None and not isinstance(pipeline, str):
        raise OptionError(f"pipeline= must be a preset name ({', '.join(map(repr, PRESET_NAMES))}), pass "
                          f"pipeline text or None; got {type(pipeline).__name__} {pipeline!r}")
    if not parallel:
        return
    if pipeline is not None and pipeline not in PRESET_NAMES:
        raise CompileError("parallel=True applies to the preset pipelines; put the passes you want in pipeline=.")
    if find_library(ASYNC_RUNTIME) is None:
        raise CompileError(
            "parallel=True runs parallel loops on the MLIR async runtime, libmlir_async_runtime, "
            "which is not installed: pip install 'memkernel[runtime]'"
        )


def _llvm_options(options: Sequence[str]) -> tuple[str, ...]:
    """``llvm_options=`` as a tuple; ArgumentError unless it is a sequence of options starting with '-'."""
    if isinstance(options, (str, bytes)) or not isinstance(options, Sequence):
        raise ArgumentError(
            "mlir_kernel(): llvm_options expects a sequence of LLVM options such as ('-enable-matrix',); "
            f"got {type(options).__name__} {options!r}. Pass a tuple of strings: llvm_options=({options!r},).")
    for option in options:
        if not isinstance(option, str) or not option.startswith("-"):
            raise ArgumentError(
                "mlir_kernel(): llvm_options expects LLVM options, each a str starting with '-' such as "
                f"'-enable-matrix'; got {option!r} in {tuple(options)!r}.")
    return tuple(options)


def checked_wanted(checked: bool | None, parallel: bool = False) -> bool:
    """``checked=`` as given, or, when None, whether ``$MEMKERNEL_CHECKED`` is set to something other than 0;
    the environment leaves ``parallel`` kernels unchecked, since checks cannot stop a kernel's worker threads."""
    if checked is not None:
        return bool(checked)
    return not parallel and os.environ.get("MEMKERNEL_CHECKED", "0").strip() not in ("", "0")


@dataclass(frozen=True)
class KernelOptions:
    """What :func:`~memkernel.mlir_kernel` was given: enough to make the same kernel again elsewhere.

    The fields are the keyword arguments of :func:`~memkernel.mlir_kernel`, whose
    docstring says what each one does. Made with wrong values, it raises
    OptionError (ArgumentError for ``llvm_options``, CompileError for a
    pipeline combination that cannot work).
    """

    source: str
    name: str | None = None
    pipeline: str | None = None
    opt_level: int = 3
    shared_libs: tuple[str | os.PathLike[str], ...] = ()
    cache: bool = True
    callbacks: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    capture_output: bool | None = None
    parallel: bool = False
    isolate: bool | None = None
    timeout: float | None = None
    llvm_options: tuple[str, ...] = ()
    checked: bool | None = None
    schedule: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.source, str):
            raise OptionError(f"mlir_kernel(): the MLIR source must be a str, got {type(self.source).__name__}")
        if self.name is not None and not isinstance(self.name, str):
            raise OptionError(f"mlir_kernel(): name must be a str or None, got {type(self.name).__name__}")
        if isinstance(self.opt_level, bool) or not isinstance(self.opt_level, int) or not 0 <= self.opt_level <= 3:
            raise OptionError(f"mlir_kernel(): opt_level must be 0, 1, 2 or 3, got {self.opt_level!r}")
        if isinstance(self.shared_libs, (str, bytes, os.PathLike)):
            raise OptionError(f"mlir_kernel(): shared_libs must be a sequence of paths or names, got "
                              f"{self.shared_libs!r}; pass shared_libs=({self.shared_libs!r},)")
        object.__setattr__(self, "shared_libs", tuple(self.shared_libs))
        object.__setattr__(self, "callbacks", dict(self.callbacks or {}))
        object.__setattr__(self, "llvm_options", _llvm_options(self.llvm_options))
        check_pipeline_choice(self.pipeline, self.parallel, self.schedule, self.checked_wanted)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each option's default, in order (``source`` has none)."""
        return {f.name: f.default_factory() if f.default_factory is not MISSING else f.default  # type: ignore[misc]
                for f in fields(cls) if f.name != "source"}

    @property
    def checked_wanted(self) -> bool:
        """Whether the kernel is compiled with runtime checks: ``checked``, else ``$MEMKERNEL_CHECKED``."""
        return checked_wanted(self.checked, self.parallel)


OPTION_NAMES = tuple(f.name for f in fields(KernelOptions) if f.name != "source")
"""The keyword arguments of :func:`~memkernel.mlir_kernel`, in order."""
