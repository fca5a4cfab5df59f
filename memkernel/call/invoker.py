"""One compiled kernel's call: bind the Python arguments, run the fast path, else the checked path.

An :class:`Invoker` is built once, when the kernel compiles, and holds
everything a call needs: the kernel's parameters, the output allocator, the
checked :class:`~memkernel.call.plan.CallPlan` and the compiled
:class:`~memkernel.fastpath.builtin.FastFunction`. The fast path runs first; if
it declines a value, the plan runs the call with every check and conversion,
or raises the error that explains the problem. Printed-output capture and
callback errors are wrapped around the call only for kernels that need them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from .. import stdio
from ..errors import ArgumentError
from ..fastpath.builtin import FastFunction, entry_builtin
from ..fastpath.symbols import CallPath
from ..model.contract import BufferContract
from ..model.kernel_spec import KernelSpec
from .allocation import OutputAllocator
from .dlpack import callers_library, returned_as
from .plan import CallPlan

Run = Callable[[tuple[Any, ...], tuple[Any, ...]], Any]
"""Runs one call on the bound inputs and the given outputs (None for each to allocate)."""

_EMPTY = inspect.Parameter.empty


def _assemble(n_outputs: int, has_results: bool) -> Callable[[tuple[Any, ...], tuple[Any, ...]], Any]:
    """What a call returns: the outputs, then the results; None for nothing, a value for one."""
    if not has_results:
        if n_outputs == 0:
            return lambda outputs, results: None
        if n_outputs == 1:
            return lambda outputs, results: outputs[0]
        return lambda outputs, results: outputs

    def returned(outputs: tuple[Any, ...], results: tuple[Any, ...]) -> Any:
        values = outputs + results
        return values[0] if len(values) == 1 else values

    return returned


def with_output_capture(run: Run, mode: bool | None, may_print: bool) -> Run:
    """``run``, routing what the kernel prints to the Python streams as ``mode`` says.

    None: when the kernel may print and ``sys.stdout``/``sys.stderr`` are not the
    C streams; True: always; False: never.
    """
    if mode is False or (mode is None and not may_print):
        return run
    if mode is True:
        return lambda args, given: stdio.captured(lambda: run(args, given))

    def run_capturing_when_needed(args: tuple[Any, ...], given: tuple[Any, ...]) -> Any:
        if stdio.python_streams_are_the_c_streams():
            return run(args, given)
        return stdio.captured(lambda: run(args, given))

    return run_capturing_when_needed


_PATHS: dict[int, Literal["fast", "checked"]] = {CallPath.FAST: "fast", CallPath.CHECKED: "checked"}
"""What :attr:`Invoker.last_path` reads from its path cell (0 before any call)."""


class Invoker:
    """Runs calls of one compiled kernel.

    ``plan`` is the checked path, ``fast`` the compiled fast path (None when the
    kernel has none: an argument kind it does not handle, a custom calling
    convention, ``MEMKERNEL_FAST_PATH=0``). ``entry`` is the compiled entry, a
    builtin function called as the kernel is (``entry(*inputs, out=out)``),
    which runs the common call with no Python frame and passes anything else to
    :meth:`fallback`; None when the kernel has none (results, several outputs,
    printed-output capture, callbacks, isolation, no fast path).
    """

    def __init__(self, spec: KernelSpec, plan: CallPlan | None, fast: FastFunction | None, allocator: OutputAllocator,
                 wrap: Callable[[Run], Run], may_print: bool = True) -> None:
        self.spec = spec
        self.may_print = may_print
        """Whether the compiled kernel calls functions that may write to the C streams."""
        self.plan = plan
        self.fast = fast
        self._path = np.zeros(1, np.int64)  # the compiled entry writes here too: see last_path
        self._allocator = allocator
        self._parameters = spec.parameters
        self._arity = len(spec.parameters)
        self._n_outputs = spec.n_outputs
        self._no_outputs: tuple[None, ...] = (None,) * spec.n_outputs
        # An in-place kernel may name a parameter 'out': then out= is that parameter.
        self._out_is_a_parameter = spec.n_outputs == 0 and any(p.name == "out" for p in spec.parameters)
        self._assemble = _assemble(spec.n_outputs, bool(spec.signature.results))
        self._array_inputs = tuple(c.index for c in spec.contracts[:spec.n_inputs] if isinstance(c, BufferContract))
        """The inputs that are memrefs: what decides the type of the arrays a call returns (see _checked)."""
        self._run = wrap(self._fast_then_checked if fast is not None else self._checked)
        self.entry = None
        if fast is not None and fast.entry_address and self._run == self._fast_then_checked:
            self.entry = entry_builtin(spec.name, fast.entry_address, self.fallback, self._path)

    @classmethod
    def running(cls, spec: KernelSpec, allocator: OutputAllocator, run: Run) -> Invoker:
        """An invoker whose calls, bound and with their outputs given, go to ``run`` (an isolated call): it has
        neither a checked plan nor a fast path of its own."""
        invoker = cls(spec, None, None, allocator, lambda _: run)
        invoker._run = lambda args, given: invoker._as_callers(run(args, given), args, given)
        return invoker

    @property
    def last_path(self) -> Literal["fast", "checked"] | None:
        """``"fast"`` or ``"checked"``: the path the latest call took, in whichever thread; None before any.

        A call through the compiled entry records "fast" as the Python paths do.
        """
        return _PATHS.get(int(self._path[0]))

    def fallback(self, /, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        """Run ``kernel(*args, out=out, **kwargs)`` in Python: what the compiled entry declined.

        A call the entry could bind and allocate for, it declined for a value, after the checks the fast
        path makes: that call goes straight to the checked path, which explains or converts. One it declined
        for its form (keywords, an output the Python function shapes) takes the whole way, fast path first.
        """
        if (kwargs or len(args) != self._arity or self._out_is_a_parameter
                or (out is None and self._allocator.shaped_in_python)):
            return self(args, kwargs, out)
        return self._checked(args, self._no_outputs if out is None else self._given(out))

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        """Call the kernel with ``kernel(*args, out=out, **kwargs)``."""
        if out is not None and self._out_is_a_parameter:
            kwargs = {**kwargs, "out": out}
            out = None
        if kwargs or len(args) != self._arity:
            args = self._bind(args, kwargs)
        given: tuple[Any, ...]
        if out is None:
            given = self._no_outputs
        elif type(out) is np.ndarray and self._n_outputs == 1:
            given = (out,)
        else:
            given = self._given(out)
        return self._run(args, given)

    def _fast_then_checked(self, args: tuple[Any, ...], given: tuple[Any, ...]) -> Any:
        outputs = self._allocated(args, given)
        if outputs is not None:
            assert self.fast is not None
            results = self.fast(args, outputs)
            if results is not None:
                self._path[0] = CallPath.FAST
                return self._as_callers(self._assemble(outputs, results), args, given)
        return self._checked(args, given)

    def _checked(self, args: tuple[Any, ...], given: tuple[Any, ...]) -> Any:
        self._path[0] = CallPath.CHECKED
        assert self.plan is not None
        outputs, results = self.plan.call(args, given)
        return self._as_callers(self._assemble(outputs, results), args, given)

    def _as_callers(self, returned: Any, args: tuple[Any, ...], given: tuple[Any, ...]) -> Any:
        """What a call returns, its new arrays made the caller's type when every array argument is a torch tensor
        or every one a JAX array (see :mod:`memkernel.call.dlpack`)."""
        ndarray = np.ndarray
        for i in self._array_inputs:  # the common case, every array a numpy array, first and cheaply
            if type(args[i]) is not ndarray:
                break
        else:
            for g in given:
                if g is not None and type(g) is not ndarray:
                    break
            else:
                return returned
        arrays = [args[i] for i in self._array_inputs] + [g for g in given if g is not None]
        library = callers_library(arrays)
        if library is None:
            return returned
        if library == "torch" and self.fast is not None:
            self.fast.adopt_torch()  # torch is imported: the compiled code reads tensors from the next call on
        return returned_as(library, returned)

    def _allocated(self, args: tuple[Any, ...], given: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The outputs for the fast path to try; None when they cannot be allocated from ``args`` as given.

        The checked path then checks the inputs first, and allocates from them
        or explains why it cannot.
        """
        try:
            if given is self._no_outputs:
                return self._allocator.allocate_all(args)
            if all(g is not None for g in given):
                return given
            return self._allocator.allocate(args, given)
        except Exception:
            return None

    def _error(self, message: str) -> ArgumentError:
        return ArgumentError(f"{self.spec.name}{self.spec.python_signature}: {message}")

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The inputs in parameter order, from positional and keyword arguments and defaults."""
        params = self._parameters
        if len(args) > len(params):
            raise self._error(f"takes {len(params)} positional arguments but {len(args)} were given")
        values = list(args)
        for p in params[len(args):]:
            if p.name in kwargs:
                values.append(kwargs.pop(p.name))
            elif p.default is not _EMPTY:
                values.append(p.default)
            else:
                raise self._error(f"missing argument '{p.name}'")
        if kwargs:
            named = {p.name for p in params[:len(args)]}
            unknown = sorted(kwargs)
            twice = [k for k in unknown if k in named]
            if twice:
                raise self._error(f"got multiple values for argument '{twice[0]}'")
            raise self._error(f"got an unexpected keyword argument '{unknown[0]}'")
        return tuple(values)

    def _given(self, out: Any) -> tuple[Any, ...]:
        """The outputs ``out=`` gives: one entry per output, None for each to allocate."""
        count = self._n_outputs
        if count == 0:
            raise self._error("takes no out=: the kernel has no output arguments")
        if type(out) is tuple:
            if len(out) != count:
                raise self._error(f"out= must hold {count} entries, one per output; got {len(out)}")
            return out
        if count > 1:
            raise self._error(f"has {count} outputs: pass out= as a tuple of {count} arrays (or None)")
        return (out,)
