"""Differential checks of a lowering: two kernels of one signature must compute the same thing.

:func:`check_equivalent` runs hypothesis inside: it draws arguments with
:func:`~memkernel.testing.strategies.arguments`, calls both kernels on
independent copies, and compares what they return (and the inputs they write)
with :func:`~memkernel.testing.compare.assert_matches`'s elementwise
tolerances; there is no float64 reference to add a rounding bound to, and the
default draws (multiples of 1/8) keep sums exact in any order. Hypothesis
shrinks a failure to a small example, which the error shows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings

from ..errors import SignatureError
from ..kernel import Kernel
from .compare import Tolerance, assert_equal_values, describe_arguments, returned_labels, split_returned, written_inputs
from .copies import layout_copies
from .strategies import arguments

_SHOWN_ELEMENTS = 64
# Hypothesis's explain phase re-runs the shrunk example many times to say which parts matter; the
# report shows the whole example instead.
_PHASES = [phase for phase in Phase if phase is not Phase.explain]


def with_pipeline(kernel: Kernel, pipeline: str) -> Kernel:
    """The same kernel (source, function, options) compiled with another ``pipeline=``."""
    return Kernel(kernel.function, dataclasses.replace(kernel.options, pipeline=pipeline))


def _signature_text(kernel: Kernel) -> str:
    signature = kernel.spec.signature
    inputs = [a.mlir for a in signature.args[:kernel.spec.n_inputs]]
    outputs = [a.mlir for a in signature.args[kernel.spec.n_inputs:]]
    results = [r.mlir for r in signature.results]
    return f"({', '.join(inputs)}) outputs ({', '.join(outputs)}) -> ({', '.join(results)})"


def _check_same_signature(a: Kernel, b: Kernel) -> None:
    if _signature_text(a) != _signature_text(b):
        raise SignatureError(
            f"check_equivalent(): {a.spec.name} takes {_signature_text(a)} but {b.spec.name} takes "
            f"{_signature_text(b)}; compare kernels with the same argument, output and result types."
        )


def _observe(kernel: Kernel, args: tuple[Any, ...], written: list[int]) -> list[Any]:
    """Call ``kernel`` on ``args``; return what it returns (one value per output and result), then
    the inputs at the indices ``written``, after the call."""
    returned = kernel(*args)
    labels = returned_labels(kernel)
    values = split_returned(labels, returned) if labels else []
    return [*(values or []), *(args[i] for i in written)]


def _written(a: Kernel, b: Kernel) -> list[int]:
    """The inputs either kernel may write."""
    return sorted({c.index for c in written_inputs(a)} | {c.index for c in written_inputs(b)})


def _show(names: list[str], values: tuple[Any, ...]) -> str:
    with np.printoptions(threshold=_SHOWN_ELEMENTS, edgeitems=4):
        return "\n".join(f"    {n} = {v!r}" for n, v in zip(names, values))


def check_equivalent(a: Kernel, b: Kernel | str, *, name: str | None = None, examples: int = 200,
                     rtol: float | None = None, atol: float | None = None, ulps: int | None = None,
                     **strategy_options: Any) -> None:
    """Check on drawn arguments that kernel ``a`` computes the same outputs and results as ``b``, the reference.

    ``b`` is another kernel with the same signature, or a pipeline (a preset
    name or a pass pipeline): then it is ``a``'s source and function compiled
    with that ``pipeline=``. Arguments are drawn by :func:`arguments(a, **strategy_options)
    <memkernel.testing.arguments>`; each kernel is called on its own copies of
    them (views keep their layout), and what they return, and the inputs either
    may write, are compared with :func:`~memkernel.testing.assert_matches`'s
    elementwise tolerances (``rtol``, ``atol``, ``ulps``; no rounding bound, as
    the default draws sum exactly). Hypothesis runs ``examples`` examples
    (no example database, no deadline).

    Raises SignatureError (a TypeError) if the signatures differ, and
    AssertionError on a mismatch: its message names the check (``name``, by
    default the two kernels), shows hypothesis's shrunk counterexample with its
    values and says what differs there.
    """
    other = with_pipeline(a, b) if isinstance(b, str) else b
    _check_same_signature(a, other)
    label = name or _default_name(a, other)
    names = [p.name for p in a.spec.parameters]
    written = _written(a, other)
    labels = returned_labels(a) + [f"argument '{names[i]}' after the call" for i in written]
    tolerance = Tolerance(rtol, atol, ulps)
    failing: list[tuple[Any, ...]] = []

    @settings(max_examples=examples, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=_PHASES, report_multiple_bugs=False)
    @given(arguments(a, **strategy_options))
    def same_results(args: tuple[Any, ...]) -> None:
        got = _observe(a, layout_copies(args), written)
        want = _observe(other, layout_copies(args), written)
        header = (f"{a.spec.name} (the kernel) differs from {other.spec.name} (the reference)\n"
                  f"  arguments: {describe_arguments(names, args)}")
        try:
            assert_equal_values(header, labels, got, want, tolerance)
        except AssertionError:
            failing.append(args)
            raise

    try:
        same_results()
    except AssertionError as error:
        if not failing:
            raise
        raise AssertionError(
            f"check_equivalent({label}): the kernels differ on this example (shrunk by hypothesis):\n"
            f"{_show(names, failing[-1])}\n{error.args[0] if error.args else error}"
        ) from None


def _default_name(a: Kernel, b: Kernel) -> str:
    if a.spec.name != b.spec.name:
        return f"{a.spec.name}, {b.spec.name}"
    return f"{a.spec.name} with pipeline={a.options.pipeline!r}, with pipeline={b.options.pipeline!r}"
