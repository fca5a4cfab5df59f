"""Comparing what a kernel computes with a reference: tolerances by dtype, and a report that says
where and by how much they differ.

Integers and bools compare exactly. Floats (and complex numbers) compare with
``|kernel - reference| <= atol + rtol * |reference|`` and default tolerances
that follow the dtype (:func:`default_tolerance`), or in units in the last
place with ``ulps=``. NaNs in the same places are equal. Where a reference
function's float value is not within ``rtol``/``atol``, :func:`assert_matches`
judges it again against the reference run in float64, allowing on top the
rounding error of sums of products (:mod:`memkernel.testing.rounding`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernel import Kernel
from ..model.contract import BufferContract
from .copies import layout_copies, layout_copy
from .rounding import COPIES, PROBES, Copies, Rounding, reference_arguments, rounding, unit_roundoff

# (rtol, atol) by float dtype; 8-bit floats get two units of their precision (see default_tolerance).
_FLOAT_TOLERANCES = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}
_COMPONENT: dict[str, np.dtype] = {"complex64": np.dtype(np.float32), "complex128": np.dtype(np.float64)}


def _exact(dtype: np.dtype) -> bool:
    return dtype.kind in "biu"


def default_tolerance(dtype: np.dtype) -> tuple[float, float]:
    """The default ``(rtol, atol)`` for values of ``dtype``: exact (0, 0) for integers and bools;
    1e-12 for float64, (1e-5, 1e-6) for float32, (1e-2, 1e-3) for float16, (2e-2, 1e-2) for bfloat16,
    twice the precision (the gap above 1) for the 8-bit floats; complex numbers take their components'
    tolerance. :func:`assert_matches` may allow the rounding of sums of products on top."""
    dtype = np.dtype(dtype)
    if _exact(dtype):
        return 0.0, 0.0
    dtype = _COMPONENT.get(dtype.name, dtype)
    if dtype.name in _FLOAT_TOLERANCES:
        return _FLOAT_TOLERANCES[dtype.name]
    eps = 4 * unit_roundoff(dtype)
    return eps, eps


@dataclass(frozen=True)
class Tolerance:
    """What the caller asked for; None takes the dtype's default."""

    rtol: float | None = None
    atol: float | None = None
    ulps: int | None = None

    def of(self, dtype: np.dtype) -> tuple[float, float]:
        rtol, atol = default_tolerance(dtype)
        return (rtol if self.rtol is None else self.rtol), (atol if self.atol is None else self.atol)

    def describe(self, dtype: np.dtype) -> str:
        if _exact(dtype):
            return f"{dtype.name}: exact"
        if self.ulps is not None:
            return f"{dtype.name}: ulps={self.ulps}"
        rtol, atol = self.of(dtype)
        return f"{dtype.name}: rtol={rtol:g}, atol={atol:g}"


# -- units in the last place ----------------------------------------------------------


def _ordinals(a: np.ndarray) -> np.ndarray:
    """Integers that step by one between adjacent values of ``a``'s float type."""
    bits = a.view(np.dtype(f"uint{8 * a.itemsize}")).astype(np.uint64)
    if not float(np.array(-1.0).astype(a.dtype)) < 0:  # an unsigned type (f8E8M0FNU)
        return bits.astype(np.int64)
    sign = np.uint64(1 << (8 * a.itemsize - 1))
    magnitude = (bits & (sign - np.uint64(1))).astype(np.int64)
    return np.where((bits & sign) != 0, -magnitude, magnitude)


def _ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    if got.dtype.kind == "c":
        return np.maximum(_ulp_distance(np.array(got.real, order="C"), np.array(want.real, order="C")),
                          _ulp_distance(np.array(got.imag, order="C"), np.array(want.imag, order="C")))
    g, w = _ordinals(got), _ordinals(want)
    same_sign = (g >= 0) == (w >= 0)
    with np.errstate(over="ignore"):
        near = np.abs(g - w).astype(np.float64)
    far = np.abs(g.astype(np.float64)) + np.abs(w.astype(np.float64))
    return np.where(same_sign, near, far)


# -- one value --------------------------------------------------------------------


def _text(value: Any) -> str:
    if isinstance(value, np.ndarray):
        dims = ", ".join(str(d) for d in value.shape)
        return f"{value.dtype.name}[{dims}]" if value.ndim else f"{value.dtype.name} scalar"
    return "None" if value is None else type(value).__name__


def _as_array(want: Any, got: np.ndarray) -> np.ndarray:
    """The reference value as an array: Python numbers and lists take the kernel's dtype when they
    convert without changing kind (ints to floats yes, floats to ints no)."""
    if isinstance(want, (np.ndarray, np.generic)):
        return np.asarray(want)
    array = np.asarray(want)
    return array.astype(got.dtype) if np.can_cast(array.dtype, got.dtype, "same_kind") else array


def _errors(got: np.ndarray, want: np.ndarray, bad: np.ndarray) -> tuple[str, str]:
    """The maximum absolute and relative errors, as text."""
    if _exact(got.dtype):
        pairs = [(int(x), int(y)) for x, y in zip(got[bad].tolist(), want[bad].tolist())]
        absolute = max(abs(x - y) for x, y in pairs)
        relative = max(abs(x - y) / abs(y) if y else float("inf") for x, y in pairs)
        return str(absolute), f"{relative:.3g}"
    wide = np.complex128 if got.dtype.kind == "c" else np.float64
    g, w = got.astype(wide), want.astype(wide)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        diff = np.where(same, 0.0, np.abs(g - w))
        diff = np.where(np.isnan(diff), np.inf, diff)
        rel = np.where(diff == 0, 0.0, diff / np.abs(w))
        rel = np.where(np.isnan(rel), np.inf, rel)
    return f"{diff.max():.3g}", f"{rel.max():.3g}"


def _within(got: np.ndarray, want: np.ndarray, rtol: float, atol: float, extra: Any = 0.0) -> np.ndarray:
    """Where ``got`` equals ``want`` (NaNs in the same places too) or is within
    ``atol + rtol * |want| + extra`` of it."""
    wide = np.complex128 if got.dtype.kind == "c" else np.float64
    g, w = got.astype(wide), want.astype(wide)
    with np.errstate(invalid="ignore", over="ignore"):
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        close = np.isfinite(g) & np.isfinite(w) & (np.abs(g - w) <= atol + rtol * np.abs(w) + extra)
    return np.asarray(same | close)


def _mismatches(got: np.ndarray, want: np.ndarray, tolerance: Tolerance) -> tuple[np.ndarray, str]:
    """Where ``got`` and ``want`` (same dtype and shape) differ, and a note on the comparison."""
    if _exact(got.dtype):
        return np.asarray(got != want), tolerance.describe(got.dtype)
    if tolerance.ulps is None:
        return ~_within(got, want, *tolerance.of(got.dtype)), tolerance.describe(got.dtype)
    wide = np.complex128 if got.dtype.kind == "c" else np.float64
    g, w = got.astype(wide), want.astype(wide)
    with np.errstate(invalid="ignore", over="ignore"):
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        finite = np.isfinite(g) & np.isfinite(w)
    distance = _ulp_distance(np.array(got, order="C"), np.array(want, order="C"))
    bad = ~(same | (finite & (distance <= tolerance.ulps)))
    worst = distance[bad & finite].max() if (bad & finite).any() else 0
    return bad, f"{tolerance.describe(got.dtype)}; max {worst:.3g} ulps"


def _described(label: str, got: np.ndarray, want: np.ndarray, bad: np.ndarray, note: str,
               allowed: np.ndarray | None = None) -> str:
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    absolute, relative = _errors(got, want, bad)
    limit = "" if allowed is None else f", allowed error {allowed[index]:.3g}"
    return (f"  {label} differs from the reference in {int(bad.sum())} of {bad.size} elements\n"
            f"    first mismatch at index {index}: kernel {got[index]!s}, reference {want[index]!s}{limit}\n"
            f"    max abs error {absolute}, max rel error {relative} ({note})")


def difference(label: str, got: Any, want: Any, tolerance: Tolerance,
               bound: Rounding | str | None = None) -> str | None:
    """How ``got`` (the kernel's value) differs from ``want`` (the reference's), in words; None if
    they match. With a :class:`~memkernel.testing.rounding.Rounding` ``bound``, an element that is
    not within tolerance of ``want`` may still be within tolerance plus the rounding bound of the
    reference in float64 (and is then reported against that); a string ``bound`` says why there is none."""
    if got is None or want is None:
        return None if got is None and want is None else (
            f"  {label}: the kernel gave {_text(got)} but the reference {_text(want)}")
    g = np.asarray(got)
    w = _as_array(want, g)
    if g.dtype != w.dtype or g.shape != w.shape:
        what = "dtypes" if g.dtype != w.dtype else "shapes"
        return f"  {label}: the kernel gave {_text(g)} but the reference {_text(w)}; the {what} differ"
    bad, note = _mismatches(g, w, tolerance)
    if not bad.any():
        return None
    if isinstance(bound, str):
        return _described(label, g, w, bad, f"{note}; no rounding bound: {bound}")
    if bound is None:
        return _described(label, g, w, bad, note)
    rtol, atol = tolerance.of(g.dtype)
    bad &= ~_within(g, bound.exact, rtol, atol, bound.allowed)
    if not bad.any():
        return None
    note += f" and the rounding of sums of up to {bound.terms} terms, against the reference in float64"
    return _described(label, g, bound.exact, bad, note, atol + rtol * np.abs(bound.exact) + bound.allowed)


def describe_arguments(names: Sequence[str], values: Sequence[Any]) -> str:
    """The arguments of a call, as ``a float32[3, 4], s = 2.0``; views are marked."""
    parts = []
    for name, value in zip(names, values):
        if isinstance(value, np.ndarray):
            view = "" if value.flags.c_contiguous else " (view)"
            parts.append(f"{name} {_text(value)}{view}")
        else:
            parts.append(f"{name} = {value!r}")
    return ", ".join(parts)


# -- what a call gives --------------------------------------------------------------


def returned_labels(kernel: Kernel) -> list[str]:
    """How the values a call returns are called: its outputs, then its results."""
    spec = kernel.spec
    outputs = [f"output '{c.name}'" for c in spec.contracts[spec.n_inputs:]]
    return outputs + [f"result {i}" for i in range(len(spec.signature.results))]


def split_returned(labels: Sequence[str], returned: Any) -> list[Any] | None:
    """The values of a return as one per label (a lone value for one label); None if they do not fit."""
    if len(labels) == 1:
        return [returned]
    if not isinstance(returned, (tuple, list)) or len(returned) != len(labels):
        return None
    return list(returned)


def written_inputs(kernel: Kernel) -> list[BufferContract]:
    """The inputs the kernel may write (in-place style)."""
    spec = kernel.spec
    return [c for c in spec.contracts[:spec.n_inputs]
            if isinstance(c, BufferContract) and c.index in spec.written and not getattr(c.spec, "tensor", False)]


def bind(kernel: Kernel, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name (``out`` left out)."""
    bound = inspect.signature(kernel).bind(*args, **kwargs)
    return {k: v for k, v in bound.arguments.items() if k != "out"}


def assert_equal_values(header: str, labels: Sequence[str], got: Sequence[Any], want: Sequence[Any],
                        tolerance: Tolerance) -> None:
    """Raise an AssertionError with ``header`` and every value of ``got`` that differs from ``want``."""
    _report(header, [difference(label, g, w, tolerance) for label, g, w in zip(labels, got, want)])


def _report(header: str, differences: Sequence[str | None]) -> None:
    found = [d for d in differences if d]
    if found:
        raise AssertionError(header + "\n" + "\n".join(found))


def assert_matches(kernel: Kernel, reference: Callable[..., Any] | Any, *args: Any, rtol: float | None = None,
                   atol: float | None = None, ulps: int | None = None, **kwargs: Any) -> Any:
    """Call ``kernel(*args, **kwargs)`` and check that it computes what ``reference`` does; return
    what the kernel returned.

    ``reference`` is a function called with copies of the same arguments
    (without ``out=``), returning what the kernel returns (its outputs, then
    its results: one value, or a tuple), or those expected values themselves.
    For a kernel that returns nothing and writes its inputs in place, the
    values compared are the inputs it may write, after the call: the reference
    returns their expected values, or updates its copies in place and returns None.

    Integers and bools must be equal; floats within ``rtol``/``atol`` (defaults
    by dtype: :func:`default_tolerance`), or within ``ulps`` units in the last
    place when given; NaNs in the same places are equal. Where a float value
    is not within ``rtol``/``atol`` of a reference function's value, the
    function is called 19 more times, on float64 (or complex128) copies of the
    float arguments, on their magnitudes, on ones and on 8 random copies of
    signs and 8 of zeros and ones, and an element also passes within
    ``rtol``/``atol`` plus ``γ(n)·Σ|terms|`` of the float64 value: the rounding
    error of a sum of ``n`` products (counted from the function on ones and on
    the random copies, so a constant the reference multiplies by is no term)
    of total magnitude ``Σ|terms|`` (the function on the magnitudes), in the
    kernel's type and in any order (see :mod:`memkernel.testing.rounding`). So
    a correct float32 matmul of standard-normal inputs passes however its sums
    are ordered, and one that drops or doubles a term of typical size does not.

    Raises AssertionError naming the kernel, the arguments' shapes and dtypes
    and, for each value that differs (``output 'out'``, ``result 0``...), the
    first mismatching index, the two values there (and the error allowed there,
    against the reference in float64), the maximum absolute and relative error
    and how many elements differ; or that the shapes, dtypes or number of
    values differ.
    """
    copies = layout_copies(args)
    kw_copies = {k: layout_copy(v) for k, v in kwargs.items() if k != "out"}
    # What the arguments were before the call, for the reference's further calls (the kernel and the
    # reference may both write theirs).
    originals = None
    if callable(reference):
        originals = layout_copies(args), {k: layout_copy(v) for k, v in kw_copies.items()}
    returned = kernel(*args, **kwargs)
    bound = bind(kernel, args, kwargs)
    header = f"{kernel.spec.name}(): the kernel does not match the reference\n  arguments: " + describe_arguments(
        list(bound), list(bound.values()))
    labels, got = compared_values(kernel, returned, bound)
    if callable(reference):
        want, expected = _expected(kernel, reference, labels, copies, kw_copies)
    else:
        want, expected = reference, split_returned(labels, reference) if labels else []
    if expected is None or got is None:
        raise AssertionError(f"{header}\n  the kernel gives {len(labels)} values ({', '.join(labels)}) but the "
                             f"reference gave {_count(want)}")
    tolerance = Tolerance(rtol, atol, ulps)
    found = [difference(label, g, w, tolerance) for label, g, w in zip(labels, got, expected)]
    if originals is not None and tolerance.ulps is None and any(d and _is_float(g) for d, g in zip(found, got)):
        bounds = _rounding_bounds(kernel, reference, labels, got, *originals)
        found = [d and difference(label, g, w, tolerance, b)
                 for d, label, g, w, b in zip(found, labels, got, expected, bounds)]
    _report(header, found)
    return returned


def _is_float(value: Any) -> bool:
    return value is not None and not _exact(np.asarray(value).dtype)


def _expected(kernel: Kernel, reference: Callable[..., Any], labels: list[str], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> tuple[Any, list[Any] | None]:
    """What ``reference`` returns on ``args``, and it as one value per label (for a kernel that returns
    nothing and a reference that returns None: the arguments it updated in place); None if it does not fit."""
    want = reference(*args, **kwargs)
    if want is None and not returned_labels(kernel):
        return want, compared_values(kernel, None, bind(kernel, args, kwargs))[1]
    return want, split_returned(labels, want) if labels else []


def _rounding_bounds(kernel: Kernel, reference: Callable[..., Any], labels: list[str], got: list[Any],
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Rounding | str | None]:
    """Per value, the rounding bound from the reference on float64 copies of ``args``, their magnitudes
    and ones; or why there is none; None for an integer value."""
    evaluations = []
    random = np.random.default_rng(0)
    signs: Copies = "random signs"
    masks: Copies = "random zeros and ones"
    calls: list[Copies] = [*COPIES, *[signs] * PROBES, *[masks] * PROBES]
    for copies in calls:
        try:
            positional, keywords = reference_arguments(kernel, args, kwargs, copies, random)
            with np.errstate(all="ignore"):
                want, values = _expected(kernel, reference, labels, positional, keywords)
        except Exception as error:  # noqa: BLE001 (any failure of the reference leaves the plain tolerance)
            said = str(error).splitlines()[0] if str(error) else "no message"
            return [f"the reference raised {type(error).__name__} on {copies} of the arguments: {said}"] * len(got)
        if values is None:
            return [f"on {copies} of the arguments the reference gave {_count(want)}"] * len(got)
        evaluations.append(values)
    bounds: list[Rounding | str | None] = []
    for g, results in zip(got, zip(*evaluations)):
        if not _is_float(g):
            bounds.append(None)
            continue
        exact, magnitudes, ones = results[:len(COPIES)]
        probes = results[len(COPIES):]
        try:
            bounds.append(rounding(np.asarray(g), exact, magnitudes, ones, signs=probes[:PROBES],
                                   masks=probes[PROBES:]))
        except ValueError as error:
            bounds.append(str(error))
    return bounds


def compared_values(kernel: Kernel, returned: Any, bound: dict[str, Any]) -> tuple[list[str], list[Any] | None]:
    """What a call is judged by, with labels: what it returns or, for a kernel that returns nothing,
    the inputs it may write, after the call."""
    labels = returned_labels(kernel)
    if labels:
        return labels, split_returned(labels, returned)
    written = written_inputs(kernel)
    return [f"argument '{c.name}' after the call" for c in written], [bound[c.name] for c in written]


def _count(value: Any) -> str:
    return f"{len(value)} values" if isinstance(value, (tuple, list)) else f"one value ({_text(value)})"
