"""One call, once the arguments are bound and the outputs known: fast path, else the checked path.

:func:`invoker` builds, at compile time, a closure specialised for the
kernel's shape of return value, so a call makes no decision it could have made
earlier. The fast path runs first; if it declines a value, the
:class:`~memkernel.plan.CallPlan` runs the call with every check and
conversion, or raises the error that explains the problem.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import stdio as output
from ..fastpath.builtin import DONE, FastFunction
from .plan import CallPlan

Invoker = Callable[[tuple[Any, ...], tuple[Any, ...]], Any]


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


def invoker(plan: CallPlan, fast: FastFunction | None, n_outputs: int, has_results: bool) -> Invoker:
    """The function that runs one call and returns what the kernel call returns."""
    assemble = _assemble(n_outputs, has_results)
    slow = plan.call
    if fast is None:
        return lambda args, outputs: assemble(outputs, slow(args + outputs))
    if not has_results:
        raw = fast.raw

        def invoke_without_results(args: tuple[Any, ...], outputs: tuple[Any, ...]) -> Any:
            if raw(args, outputs) is not DONE:
                slow(args + outputs)
            return assemble(outputs, ())

        return invoke_without_results

    def invoke(args: tuple[Any, ...], outputs: tuple[Any, ...]) -> Any:
        results = fast(args, outputs)
        return assemble(outputs, slow(args + outputs) if results is None else results)

    return invoke


def with_output_capture(invoke: Invoker, mode: bool | None, may_print: bool) -> Invoker:
    """``invoke``, routing what the kernel prints to the Python streams as ``mode`` says.

    None: when the kernel may print and ``sys.stdout``/``sys.stderr`` are not the
    C streams; True: always; False: never.
    """
    if mode is False or (mode is None and not may_print):
        return invoke
    if mode is True:
        return lambda args, outputs: output.captured(lambda: invoke(args, outputs))

    def invoke_capturing_when_needed(args: tuple[Any, ...], outputs: tuple[Any, ...]) -> Any:
        if output.python_streams_are_the_c_streams():
            return invoke(args, outputs)
        return output.captured(lambda: invoke(args, outputs))

    return invoke_capturing_when_needed
