"""The ``@mlir_kernel`` decorator and the callable :class:`Kernel` it returns.

Decoration parses the source, reads the signature and builds every argument's
binder; errors in the source or the signature surface here. The first call
(or :meth:`Kernel.compile`) lowers and JIT-compiles the function once, under a
lock, and builds the :class:`~memkernel.plan.CallPlan`. A call binds the
Python arguments, allocates the outputs, and runs the plan.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .compile import cache as kernel_cache
from .compile import libraries
from .fastpath import abi as pyabi
from .call.binders import Binder, CallState, MemRefBinder, ScalarBinder, UnrankedBinder
from .call.callbacks import PendingErrors, bind_callbacks
from .compile.cache import Entry
from .compile.engine import CompiledFunction, compile_function, load_function, lower_kernel
from .spec.writes import written_arguments
from .errors import ArgumentError, ShapeError, SignatureError
from .fastpath.builtin import FastFunction
from .call.invoker import Invoker, invoker, with_output_capture
from .compile.objects import ObjectLoadError
from .call.allocation import OutputAllocator
from .compile.pipeline import STAGES, Pipeline, check_before_lowering, parse_pipeline
from .call.plan import CallPlan
from .spec.signature import ArgSpec, MemRefSpec, ScalarSpec, Signature, UnrankedSpec, read_signature
from .spec.source import MLIR_LOCK, ParsedSource, parse_source
from .fastpath.emitter import FastArgument, FastPath, fast_path
from .compile.translate import to_llvm_ir

_PARAMETER = inspect.Parameter


class _TypeText(str):
    """An annotation that shows as the MLIR type text, unquoted, in signatures."""

    def __repr__(self) -> str:
        return str(self)


def _binder(kernel: str, name: str, spec: ArgSpec, *, may_write: bool, is_output: bool) -> Binder:
    if isinstance(spec, MemRefSpec):
        return MemRefBinder(kernel, name, spec, may_write=may_write, is_output=is_output)
    if isinstance(spec, UnrankedSpec):
        return UnrankedBinder(kernel, name, spec, may_write=may_write, is_output=is_output)
    return ScalarBinder(kernel, name, spec)


class Kernel:
    """An MLIR function callable like a numpy function. Made by :func:`mlir_kernel`.

    Call it with the Python function's parameters (positionally or by keyword)
    and, when the MLIR function has trailing output memrefs, optionally
    ``out=`` (an array, or a tuple with one array or None per output). It
    returns the outputs, then the MLIR results: nothing gives None, one gives
    the value, several give a tuple.
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
    ) -> None:
        functools.update_wrapper(self, function)
        self.__dict__.pop("__wrapped__", None)
        self._function = function
        self._pipeline: Pipeline = parse_pipeline(pipeline, parallel)
        if not isinstance(opt_level, int) or not 0 <= opt_level <= 3:
            raise ValueError(f"opt_level must be 0, 1, 2 or 3, got {opt_level!r}")
        self._opt_level = opt_level
        self._cache = cache
        self._capture_output = capture_output
        self._shared_libs = libraries.resolve_libraries(os.fspath(lib) for lib in shared_libs)
        self._parsed: ParsedSource = parse_source(source)
        self._name = name or self._default_name(function)
        with MLIR_LOCK, self._parsed.context:
            func = self._parsed.function(self._name)
            self.mlir_signature: Signature = read_signature(func)
            written = written_arguments(self._parsed.module, self._name)
            check_before_lowering(self._parsed.module, self._pipeline)
            self._pending = PendingErrors()
            self._callbacks = bind_callbacks(self._parsed, callbacks or {}, self._pending)
        self._params = self._python_parameters(function)
        self._binders = self._make_binders(written)
        self.__signature__ = self._python_signature()
        self._arity = len(self._params)
        self._n_outputs = len(self.mlir_signature.args) - self._arity
        self._invoke: Invoker | None = None
        self._lock = threading.Lock()

    # -- decoration-time analysis ------------------------------------------------

    def _default_name(self, function: Callable[..., Any]) -> str:
        """The Python function's name; for a lambda, the source's only function."""
        if function.__name__ != "<lambda>":
            return function.__name__
        with MLIR_LOCK, self._parsed.context:
            defined = self._parsed.defined_names()
        if len(defined) != 1:
            listed = ", ".join(f"@{n}" for n in defined) or "none"
            raise SignatureError(f"a lambda has no name to pick a function by (defined: {listed}); pass name=.")
        return defined[0]

    def _python_parameters(self, function: Callable[..., Any]) -> list[inspect.Parameter]:
        params = list(inspect.signature(function).parameters.values())
        mlir_args = self.mlir_signature.args
        for p in params:
            if p.kind in (_PARAMETER.VAR_POSITIONAL, _PARAMETER.VAR_KEYWORD):
                raise SignatureError(
                    f"{self._name}(): parameter {p} cannot name an MLIR argument; "
                    "name each argument with its own parameter."
                )
        if len(params) > len(mlir_args):
            raise SignatureError(
                f"{self._name}(): the Python function has {len(params)} parameters but "
                f"@{self._name} takes {len(mlir_args)} arguments "
                f"({', '.join(a.mlir for a in mlir_args) or 'none'})."
            )
        for i, spec in enumerate(mlir_args[len(params):], start=len(params)):
            if getattr(spec, "tensor", False):
                raise SignatureError(
                    f"{self._name}(): MLIR argument #{i} ({spec.mlir}) has no Python parameter. A tensor "
                    "argument is an input (a tensor function returns its results); add a parameter for it."
                )
            if isinstance(spec, ScalarSpec):
                raise SignatureError(
                    f"{self._name}(): MLIR argument #{i} ({spec.mlir}) has no Python parameter. "
                    "Arguments the Python signature leaves out are outputs, which must be memrefs; "
                    "add a parameter for it."
                )
        if len(params) < len(mlir_args) and any(p.name == "out" for p in params):
            raise SignatureError(
                f"{self._name}(): a parameter named 'out' clashes with the out= keyword of a kernel "
                "with outputs; rename it."
            )
        return params

    @property
    def _output_names(self) -> list[str]:
        count = len(self.mlir_signature.args) - len(self._params)
        return ["out"] if count == 1 else [f"out[{i}]" for i in range(count)]

    def _make_binders(self, written: frozenset[int]) -> list[Binder]:
        args = self.mlir_signature.args
        names = [p.name for p in self._params] + self._output_names
        return [
            _binder(self._name, names[i], spec, may_write=i in written, is_output=i >= len(self._params))
            for i, spec in enumerate(args)
        ]

    def _python_signature(self) -> inspect.Signature:
        args = self.mlir_signature.args
        params = [p.replace(annotation=_TypeText(args[i].mlir)) for i, p in enumerate(self._params)]
        outputs = args[len(self._params):]
        if outputs:
            params.append(_PARAMETER("out", _PARAMETER.KEYWORD_ONLY, default=None,
                                     annotation=_TypeText(" | ".join(["None", *(o.mlir for o in outputs)]))))
        returned = [o.mlir for o in outputs] + [r.mlir for r in self.mlir_signature.results]
        annotation: Any = inspect.Signature.empty
        if len(returned) == 1:
            annotation = _TypeText(returned[0])
        elif returned:
            annotation = _TypeText(f"tuple[{', '.join(returned)}]")
        return inspect.Signature(params, return_annotation=annotation)

    # -- compilation ---------------------------------------------------------------

    def _fast_path(self) -> FastPath | None:
        if not pyabi.fast_path_supported():
            return None
        n = len(self._params)
        arguments = [
            FastArgument(spec, i >= n, i - n if i >= n else i, binder.is_writable_target)
            for i, (spec, binder) in enumerate(zip(self.mlir_signature.args, self._binders))
        ]
        return fast_path(self._name, arguments, self.mlir_signature.results)

    def compile(self) -> Kernel:
        """JIT-compile now rather than at the first call; returns the kernel. Raises CompileError."""
        if self._invoke is None:
            with self._lock:
                if self._invoke is None:
                    self._invoke = self._compile()
        return self

    def _compile(self) -> Invoker:
        fast_spec = self._fast_path()
        compiled = self._compiled_function(fast_spec)
        results = self.mlir_signature.results
        plan = CallPlan(self._binders, results, compiled.address, compiled)
        fast = None
        if compiled.fast_address and fast_spec is not None:
            fast = FastFunction(compiled.fast_address, compiled.consts_address, fast_spec, results)
        invoke = invoker(plan, fast, self._n_outputs, bool(results))
        invoke = with_output_capture(invoke, self._capture_output, compiled.may_print)
        if not self._callbacks:
            return invoke
        pending = self._pending

        def invoke_then_raise_callback_errors(args: tuple[Any, ...], outputs: tuple[Any, ...]) -> Any:
            returned = invoke(args, outputs)
            pending.raise_first()
            return returned

        return invoke_then_raise_callback_errors

    def _compiled_function(self, fast_spec: FastPath | None) -> CompiledFunction:
        """The compiled kernel: from this process's cache, from the disk cache, or compiled now."""

        def compile_now(keep_object: bool) -> tuple[CompiledFunction, Entry | None]:
            # Lower a fresh parse: a failed attempt must not leave a half-lowered module behind.
            compiled = compile_function(parse_source(self._parsed.text), self._name, self._pipeline,
                                        self._opt_level, self._shared_libs, fast_spec, keep_object,
                                        {name: bound.address for name, bound in self._callbacks.items()})
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
                source=hashlib.sha256(self._parsed.text.encode()).hexdigest(),
                function=self._name,
                pipeline=self._pipeline.describe(),
                opt_level=self._opt_level,
                shared_libs=list(self._shared_libs),
                fast_path=hashlib.sha256(fast_spec.text.encode()).hexdigest() if fast_spec else None,
            )
        return kernel_cache.get_or_compile(key, compile_now, load_entry)

    # -- inspection ------------------------------------------------------------------

    def ir(self, stage: str = "llvm") -> str:
        """The kernel's module at one stage of the pipeline, as MLIR text; computed when asked.

        Stages (see :data:`memkernel.pipeline.STAGES`): ``"input"``, ``"bufferized"``, ``"vectorized"``,
        ``"loops"``, ``"llvm"``; a custom ``pipeline=`` has ``"input"`` and ``"llvm"``.
        Raises ValueError for another stage, CompileError if lowering fails.
        """
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(map(repr, STAGES))}, not {stage!r}")
        parsed = parse_source(self._parsed.text)
        lower_kernel(parsed, self._name, self._pipeline, self._callbacks, stage)
        with MLIR_LOCK:
            return str(parsed.module)

    def llvm_ir(self) -> str:
        """The LLVM IR the kernel is compiled from (needs ``memkernel[runtime]`` for ``mlir-translate``)."""
        return to_llvm_ir(self.ir("llvm"))

    def _allocate(self, values: tuple[Any, ...]) -> tuple[Any, ...]:
        return self._allocator.allocate_all(values)

    @functools.cached_property
    def _allocator(self) -> OutputAllocator:
        n = len(self._params)
        args = self.mlir_signature.args
        inputs = [(i, spec) for i, spec in enumerate(args[:n]) if isinstance(spec, MemRefSpec)]
        outputs = [(name, spec) for name, spec in zip(self._output_names, args[n:])]
        return OutputAllocator(self._name, outputs, inputs, self._function)  # type: ignore[arg-type]

    # -- calls ---------------------------------------------------------------------

    def _argument_error(self, message: str) -> ArgumentError:
        return ArgumentError(f"{self._name}{self.__signature__}: {message}")

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        params = self._params
        if len(args) > len(params):
            raise self._argument_error(f"takes {len(params)} positional arguments but {len(args)} were given")
        values = list(args)
        for p in params[len(args):]:
            if p.name in kwargs:
                values.append(kwargs.pop(p.name))
            elif p.default is not _PARAMETER.empty:
                values.append(p.default)
            else:
                raise self._argument_error(f"missing argument '{p.name}'")
        if kwargs:
            named = {p.name for p in params[:len(args)]}
            unknown = sorted(kwargs)
            twice = [k for k in unknown if k in named]
            if twice:
                raise self._argument_error(f"got multiple values for argument '{twice[0]}'")
            raise self._argument_error(f"got an unexpected keyword argument '{unknown[0]}'")
        return tuple(values)

    def _check_inputs(self, values: tuple[Any, ...]) -> None:
        """Raise the error of the first wrong input: it explains an output shape that cannot be derived."""
        state = CallState()
        for binder, value in zip(self._binders, values):
            binder.bind(value, state)

    def _outputs(self, values: tuple[Any, ...], out: Any) -> tuple[Any, ...]:
        """The output arrays: those of ``out=`` (not None), the others allocated."""
        count = self._n_outputs
        if count == 0:
            raise self._argument_error("takes no out=: the kernel has no output arguments")
        if type(out) is tuple:
            if len(out) != count:
                raise self._argument_error(f"out= must hold {count} entries, one per output; got {len(out)}")
            given = out
        elif count > 1:
            raise self._argument_error(f"has {count} outputs: pass out= as a tuple of {count} arrays (or None)")
        else:
            given = (out,)
        return self._allocator.allocate(values, given) if any(g is None for g in given) else given

    def __call__(self, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        if kwargs or len(args) != self._arity:
            args = self._bind(args, kwargs)
        try:
            if out is None:
                outputs = self._allocate(args) if self._n_outputs else ()
            elif type(out) is np.ndarray and self._n_outputs == 1:
                outputs = (out,)
            else:
                outputs = self._outputs(args, out)
        except ShapeError:
            self._check_inputs(args)
            raise
        invoke = self._invoke or self.compile()._invoke
        assert invoke is not None
        return invoke(args, outputs)

    def __get__(self, instance: object, owner: type | None = None) -> Kernel:
        """A kernel in a class body stays a plain function of its arguments, like a staticmethod.

        Being a descriptor also makes ``help(kernel)`` document it as a routine, with its signature.
        """
        return self

    def __repr__(self) -> str:
        return f"<memkernel.Kernel {self._name}{self.__signature__}>"


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
    :mod:`memkernel.presets`) or a pass pipeline; ``parallel=True`` runs a
    preset's parallel loops (``scf.parallel``, ``scf.forall``, the parallel
    dims of linalg ops the preset does not vectorize) on the MLIR async
    runtime's thread pool;
    ``opt_level`` the LLVM optimization level (0-3); ``shared_libs`` paths or
    names (``"mlir_c_runner_utils"``) of libraries the kernel calls into.
    With ``cache`` (the default) a kernel compiles once per process and is
    kept on disk for later processes (see :mod:`memkernel.cache`);
    ``cache=False`` always compiles afresh. ``callbacks`` binds private
    ``func.func`` declarations of the source to Python functions (see
    :mod:`memkernel.callbacks`); a kernel with callbacks is not cached.
    ``capture_output`` routes what the kernel prints on the C streams to
    ``sys.stdout``/``sys.stderr`` (see :mod:`memkernel.output`): None (the
    default) does so when the kernel may print and the Python streams are not
    the C ones (Jupyter, pytest); True always; False never.

    Raises MLIRSyntaxError, SignatureError or CompileError (a bad pipeline or
    library) at decoration; the returned :class:`Kernel` raises ArgumentError,
    ShapeError, ValueRangeError and CompileError at call time.
    """

    def decorate(function: Callable[..., Any]) -> Kernel:
        return Kernel(function, source, name=name, pipeline=pipeline, opt_level=opt_level,
                      shared_libs=shared_libs, cache=cache, callbacks=callbacks,
                      capture_output=capture_output, parallel=parallel)

    return decorate

