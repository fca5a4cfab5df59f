"""The ``@mlir_kernel`` decorator and the callable :class:`Kernel` it returns.

Decoration parses the source and analyses it once into a frozen
:class:`~memkernel.spec.analysis.KernelSpec` (signature, parameters, write set,
each argument's contract); errors in the source or the signature surface
there. The first call (or :meth:`Kernel.compile`) gets the compiled code from
the cache, or compiles it, once and under a lock, and builds the
:class:`~memkernel.call.invoker.Invoker` that runs every call.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import forking
from . import isolate as isolation
from .call.allocation import allocator_for
from .call.binders import binder_for
from .call.callbacks import PendingErrors, bind_callbacks
from .call.invoker import Invoker, Run, with_output_capture
from .call.plan import CallPlan
from .compile import cache as kernel_cache
from .compile import libraries
from .compile.cache import Entry
from .compile import worker as compile_worker
from .compile.engine import CompiledFunction, compile_function, load_function, lowered_text
from .compile.objects import ObjectLoadError
from .compile.pipeline import STAGES, Pipeline, check_before_lowering, parse_pipeline
from .compile.translate import to_llvm_ir
from .errors import ArgumentError, OptionError
from .fastpath import abi
from .fastpath.builtin import FastFunction, called_through
from .fastpath.emitter import FastPath, fast_path
from .spec.analysis import KernelSpec, analyse, default_name
from .spec.signature import Signature
from .spec.source import MLIR_LOCK, parse_source


def checked_wanted(checked: bool | None, parallel: bool = False) -> bool:
    """``checked=`` as given, or, when None, whether ``$MEMKERNEL_CHECKED`` is set to something other than 0;
    the environment leaves ``parallel`` kernels unchecked, since checks cannot stop a kernel's worker threads."""
    if checked is not None:
        return bool(checked)
    return not parallel and os.environ.get("MEMKERNEL_CHECKED", "0").strip() not in ("", "0")


def _checked_llvm_options(options: Sequence[str]) -> tuple[str, ...]:
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


@dataclass(frozen=True)
class KernelOptions:
    """What :func:`mlir_kernel` was given, as given: enough to make the same kernel again elsewhere."""

    source: str
    name: str | None
    pipeline: str | None
    opt_level: int
    shared_libs: tuple[str | os.PathLike[str], ...]
    cache: bool
    callbacks: dict[str, Callable[..., Any]]
    capture_output: bool | None
    parallel: bool
    isolate: bool | None = None
    timeout: float | None = None
    llvm_options: tuple[str, ...] = ()
    checked: bool | None = None
    schedule: str | None = None

    def decorator(self) -> Callable[[Callable[..., Any]], Kernel]:
        """The :func:`mlir_kernel` decorator these options make."""
        return mlir_kernel(self.source, name=self.name, pipeline=self.pipeline, opt_level=self.opt_level,
                           shared_libs=self.shared_libs, cache=self.cache, callbacks=self.callbacks or None,
                           capture_output=self.capture_output, parallel=self.parallel,
                           isolate=self.isolate, timeout=self.timeout, llvm_options=self.llvm_options,
                           checked=self.checked, schedule=self.schedule)


class Kernel:
    """An MLIR function callable like a numpy function. Made by :func:`mlir_kernel`.

    Call it with the Python function's parameters (positionally or by keyword)
    and, when the MLIR function has trailing output memrefs, optionally
    ``out=`` (an array, or a tuple with one array or None per output). It
    returns the outputs, then the MLIR results: nothing gives None, one gives
    the value, several give a tuple.

    ``kernel.spec`` is what decoration read (see
    :class:`~memkernel.spec.analysis.KernelSpec`); ``kernel.invoker`` the
    compiled call (see :class:`~memkernel.call.invoker.Invoker`);
    ``kernel.options`` what :func:`mlir_kernel` was given.
    """

    def __init__(
        self,
        function: Callable[..., Any],
        source: str,
        *,
        name: str | None,
        pipeline: str | None,
        opt_level: int,
        shared_libs: Sequence[str | os.PathLike[str]],
        cache: bool,
        callbacks: Mapping[str, Callable[..., Any]] | None = None,
        capture_output: bool | None = None,
        parallel: bool = False,
        isolate: bool | None = None,
        timeout: float | None = None,
        llvm_options: Sequence[str] = (),
        checked: bool | None = None,
        schedule: str | None = None,
    ) -> None:
        functools.update_wrapper(self, function)
        self.__dict__.pop("__wrapped__", None)
        self._function = function
        self.decorated_at = ((function.__code__.co_filename, function.__code__.co_firstlineno)  # for reports
                             if hasattr(function, "__code__") else None)
        self._llvm_options = _checked_llvm_options(llvm_options)
        self.options = KernelOptions(source, name, pipeline, opt_level, tuple(shared_libs), cache,
                                     dict(callbacks or {}), capture_output, parallel, isolate, timeout,
                                     self._llvm_options, checked, schedule)
        self._pipeline: Pipeline = parse_pipeline(pipeline, parallel, schedule, checked_wanted(checked, parallel))
        if not isinstance(opt_level, int) or not 0 <= opt_level <= 3:
            raise OptionError(f"mlir_kernel(): opt_level must be 0, 1, 2 or 3, got {opt_level!r}")
        self._opt_level = opt_level
        self._cache = cache
        self._capture_output = capture_output
        self._shared_libs = libraries.resolve_libraries(os.fspath(lib) for lib in shared_libs)
        parsed = parse_source(source)
        self._source = source
        self.spec: KernelSpec = analyse(parsed, function, name or default_name(function, parsed))
        with MLIR_LOCK, parsed.context:
            check_before_lowering(parsed.module, self._pipeline)
            self._pending = PendingErrors(parallel=parallel)
            self._callbacks = bind_callbacks(parsed, callbacks or {}, self._pending, kernel=self.spec.name)
        self.__signature__ = self.spec.python_signature
        self._invoker: Invoker | None = None
        self._lock = forking.lock()  # held while the compile worker compiles: a forked child must not wait for it
        isolation.check_options(self.spec.name, isolate, timeout, callbacks)

    @property
    def _name(self) -> str:
        return self.spec.name

    @property
    def function(self) -> Callable[..., Any]:
        """The decorated Python function: its parameters name the inputs, its body may shape the outputs."""
        return self._function

    @property
    def mlir_signature(self) -> Signature:
        """The MLIR function's signature, as memkernel reads it."""
        return self.spec.signature

    # -- compilation ---------------------------------------------------------------

    def compile(self) -> Kernel:
        """JIT-compile now rather than at the first call; returns the kernel. Raises CompileError."""
        if self._invoker is None:
            with self._lock:
                if self._invoker is None:
                    started = time.perf_counter()
                    self._invoker = self._build_invoker()
                    self._compile_seconds = time.perf_counter() - started
        return self

    @property
    def invoker(self) -> Invoker:
        """The compiled call (compiling now if needed): its checked plan, its fast path, the path last taken."""
        invoker = self._invoker or self.compile()._invoker
        assert invoker is not None
        return invoker

    def _build_invoker(self) -> Invoker:
        if isolation.wanted(self.options.isolate, self.options.callbacks, self.options.timeout):
            return isolation.invoker(self)
        spec = self.spec
        results = spec.signature.results
        # A kernel whose assertions may fail runs through its guard, on the checked path.
        guarded = spec.asserts or self._pipeline.checked
        fast_spec = fast_path(spec, results) if abi.fast_path_enabled() and not guarded else None
        compiled = self._compiled_function(fast_spec)
        allocator = allocator_for(spec, self._function)
        plan = CallPlan(spec.name, [binder_for(c) for c in spec.contracts], spec.n_inputs, allocator, spec.shapes,
                        spec.overlap_pairs, results, compiled.address, compiled, compiled.guard_address, self._source)
        fast = None
        # A module whose failed assertions return to its guard (a custom pipeline's runtime verification, an
        # abort of its own) is called through that guard, whatever decoration saw.
        if compiled.fast_address and fast_spec is not None and not compiled.guard_address:
            entry = compiled.owner.symbol(fast_spec.entry) if fast_spec.entry else 0  # type: ignore[attr-defined]
            fast = FastFunction(compiled.fast_address, compiled.consts_address, fast_spec, results, entry)
        capture, may_print = self._capture_output, compiled.may_print
        pending = self._pending if self._callbacks else None

        def wrap(run: Run) -> Run:
            run = with_output_capture(run, capture, may_print)
            if pending is None:
                return run

            def run_raising_callback_errors(args: tuple[Any, ...], given: tuple[Any, ...]) -> Any:
                return pending.run(lambda: run(args, given))

            return run_raising_callback_errors

        invoker = Invoker(spec, plan, fast, allocator, wrap)
        if invoker.entry is not None:  # calls now reach the compiled entry with no Python frame
            self.__class__ = called_through(type(self), invoker.entry)
        return invoker

    def _compiled_function(self, fast_spec: FastPath | None) -> CompiledFunction:
        """The compiled kernel: from this process's cache, from the disk cache, or compiled now."""

        def compile_now(keep_object: bool) -> tuple[CompiledFunction, Entry | None]:
            compiled = compile_function(self._source, self._name, self._pipeline, self._opt_level,
                                        self._shared_libs, fast_spec, keep_object,
                                        {name: bound.address for name, bound in self._callbacks.items()},
                                        self._llvm_options)
            return compiled, compiled.entry

        def load_entry(entry: Entry) -> CompiledFunction | None:
            try:
                return load_function(entry, self._name, fast_spec)
            except ObjectLoadError:
                return None

        key = None
        # Compiled code with callbacks is bound to this kernel's Python functions: never shared.
        if self._cache and not self._callbacks:
            key = kernel_cache.CacheKey.of(
                source=hashlib.sha256(self._source.encode()).hexdigest(),
                function=self._name,
                pipeline=self._pipeline.describe(),
                opt_level=self._opt_level,
                shared_libs=list(self._shared_libs),
                fast_path=hashlib.sha256(fast_spec.text.encode()).hexdigest() if fast_spec else None,
                llvm_options=list(self._llvm_options),
            )
        return kernel_cache.get_or_compile(key, compile_now, load_entry)

    # -- inspection ------------------------------------------------------------------

    def ir(self, stage: str = "llvm") -> str:
        """The kernel's module at one stage of the pipeline, as MLIR text; computed when asked.

        Stages (see :data:`memkernel.compile.pipeline.STAGES`): ``"input"``, ``"bufferized"``,
        ``"vectorized"``, ``"loops"``, ``"llvm"``; a custom ``pipeline=`` has ``"input"`` and ``"llvm"``.
        The lowering runs in the compile worker (see :mod:`memkernel.compile.worker`).
        Raises ValueError for another stage, CompileError if lowering fails or aborts.
        """
        if stage not in STAGES:
            raise OptionError(f"stage must be one of {', '.join(map(repr, STAGES))}, not {stage!r}")
        return compile_worker.run(self._llvm_options, f"lowering @{self._name} to stage {stage!r}", lowered_text,
                                  self._source, self._name, self._pipeline, tuple(self._callbacks), stage)

    def llvm_ir(self) -> str:
        """The LLVM IR the kernel is compiled from (needs ``memkernel[runtime]`` for ``mlir-translate``)."""
        return to_llvm_ir(self.ir("llvm"))

    # -- calls ---------------------------------------------------------------------

    def __call__(self, /, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        # Once compiled with a compiled entry, the kernel's class calls that instead (see _build_invoker).
        return (self._invoker or self.invoker)(args, kwargs, out)

    def __get__(self, instance: object, owner: type | None = None) -> Kernel:
        """A kernel in a class body stays a plain function of its arguments, like a staticmethod.

        Being a descriptor also makes ``help(kernel)`` document it as a routine, with its signature.
        """
        return self

    def __repr__(self) -> str:
        return f"<memkernel.Kernel {self._name}{self.__signature__}>"

    def __reduce__(self) -> str | tuple[Any, ...]:
        """Pickle like a function: by reference when top-level, else by value (see :mod:`memkernel.pickling`)."""
        from . import pickling

        return pickling.reduce(self)

    # -- display (memkernel.display) ---------------------------------------------------

    _compile_seconds: float | None = None  # how long compile() took: set once, when it built the invoker

    @property
    def compile_seconds(self) -> float | None:
        """How long :meth:`compile` took (a disk cache load, or lowering and codegen); None before it ran."""
        return self._compile_seconds

    @property
    def compiled(self) -> bool:
        """Whether the kernel is compiled (by a call or :meth:`compile`)."""
        return self._invoker is not None

    def _repr_html_(self) -> str:
        """The kernel as an HTML table, for Jupyter (see :mod:`memkernel.display`)."""
        from .display import kernel_html

        return kernel_html(self)


def mlir_kernel(
    source: str,
    *,
    name: str | None = None,
    pipeline: str | None = None,
    opt_level: int = 3,
    shared_libs: Sequence[str | os.PathLike[str]] = (),
    cache: bool = True,
    callbacks: Mapping[str, Callable[..., Any]] | None = None,
    capture_output: bool | None = None,
    parallel: bool = False,
    isolate: bool | None = None,
    timeout: float | None = None,
    llvm_options: Sequence[str] = (),
    checked: bool | None = None,
    schedule: str | None = None,
) -> Callable[[Callable[..., Any]], Kernel]:
    """Turn a Python function into a call of the MLIR ``func.func`` it names.

    ``source`` is MLIR text holding the kernel (it may hold other functions and
    globals). The kernel is ``func.func @<name>``, ``name`` defaulting to the
    Python function's name. The Python parameters name the leading MLIR
    arguments; trailing memref arguments left out are outputs, allocated
    zero-filled or taken from ``out=``. The decorated function's body gives the
    shapes of outputs with ``?`` dims: a shape tuple for one output, a tuple
    of shapes for several; returning None lets memkernel take them from
    inputs of the same memref shape pattern.

    ``pipeline`` is a preset name (``"default"``, ``"fast"``; see
    :mod:`memkernel.compile.presets`) or a pass pipeline; ``parallel=True`` runs a
    preset's parallel loops (``scf.parallel``, ``scf.forall``, the parallel
    dims of linalg ops the preset does not vectorize) on the MLIR async
    runtime's thread pool;
    ``opt_level`` the LLVM optimization level (0-3); ``shared_libs`` paths or
    names (``"mlir_c_runner_utils"``) of libraries the kernel calls into.
    With ``cache`` (the default) a kernel compiles once per process and is
    kept on disk for later processes (see :mod:`memkernel.compile.cache`);
    ``cache=False`` always compiles afresh. ``callbacks`` binds private
    ``func.func`` declarations of the source to Python functions (see
    :mod:`memkernel.call.callbacks`); a kernel with callbacks is not cached.
    ``capture_output`` routes what the kernel prints on the C streams to
    ``sys.stdout``/``sys.stderr`` (see :mod:`memkernel.stdio`): None (the
    default) does so when the kernel may print and the Python streams are not
    the C ones (Jupyter, pytest); True always; False never.
    ``isolate=True`` runs every call in a worker process, so a kernel that
    crashes raises KernelCrashed instead of killing this process, and
    ``timeout`` (seconds) bounds an isolated call (KernelTimeout); None (the
    default) isolates when ``$MEMKERNEL_ISOLATE`` is set (see :mod:`memkernel.isolate`).
    ``llvm_options`` are LLVM command-line options for code generation, such
    as ``("-enable-matrix",)`` for ``llvm.intr.matrix.*``. Lowering and code
    generation run in a compile worker process, one per set of options (see
    :mod:`memkernel.compile.worker`), so an abort in MLIR or LLVM is a
    CompileError and never ends this process.
    ``checked=True`` adds MLIR's runtime verification: an out-of-bounds
    ``memref.load``/``store``/``subview`` or a linalg operand whose shape
    disagrees with the loops stops the kernel with a KernelAssertionError
    (None, the default, checks when ``$MEMKERNEL_CHECKED`` is set). A failed
    ``cf.assert`` of the source itself is a KernelAssertionError in every mode.
    ``schedule`` says where a transform schedule the module carries is applied:
    ``"before-bufferization"`` (None picks it), ``"after-bufferization"`` or
    ``"skip"`` (see :mod:`memkernel.compile.pipeline`).

    Raises MLIRSyntaxError, SignatureError or CompileError (a bad pipeline or
    library) at decoration; the returned :class:`Kernel` raises ArgumentError,
    ShapeError, ValueRangeError, KernelAssertionError and CompileError at call time.
    """

    def decorate(function: Callable[..., Any]) -> Kernel:
        return Kernel(function, source, name=name, pipeline=pipeline, opt_level=opt_level,
                      shared_libs=shared_libs, cache=cache, callbacks=callbacks,
                      capture_output=capture_output, parallel=parallel, isolate=isolate, timeout=timeout,
                      llvm_options=llvm_options, checked=checked, schedule=schedule)

    return decorate

