"""How far a correct float kernel may be from the exact value: the classical bound of sums of products.

A value that sums n products of the inputs (an element of a matmul or a
convolution, a sum, an elementwise expression), computed in a float type of
unit roundoff u in any order, with or without fused multiply-adds, is within
γ(n)·Σ|terms| of the exact value, where γ(n) = n·u / (1 - n·u) (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1 and §3.6 for
complex numbers). A reference function gives all three without anyone reading
it: called on float64 copies of the arguments it gives the exact value (up to
float64's own rounding), on their magnitudes Σ|terms|, and on ones the number
of terms times the constant the reference multiplies by (for a function made of
sums and products).

That constant must not count as terms (``lambda a: a * 1e8`` sums one term,
not 10^8), so n is also estimated from how the value varies, which a constant
factor does not change: called on random signs ±1 of the arguments, a sum of n
terms c·Π±1 has a mean square c²·n, while on ones it is c·n, so n is about
(value on ones)² / (mean square on signs). A term that squares an input is +1
whatever the signs; for those, random zeros and ones count instead (each term
survives with probability 2^-d for d factors, so (value on ones)² / (4·variance)
is at least n). The count taken is the smaller of the value on ones and
:data:`SAFETY` times the larger estimate: never more than before, and a
constant factor no longer widens the bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..kernel import Kernel
from ..model.contract import Contract
from ..model.dtypes import ML_DTYPES_TYPE_NAMES
from .copies import laid_out_as, layout_copy

Copies = Literal["float64 copies", "magnitudes", "ones", "random signs", "random zeros and ones"]
COPIES: tuple[Copies, ...] = ("float64 copies", "magnitudes", "ones")
"""The three sets of arguments the reference is called on, in the order :func:`rounding` takes its results."""

PROBES = 8
"""How many copies of random signs, and how many of random zeros and ones, the reference is also called on to
count the terms of each value (see the module's docstring)."""

SAFETY = 4.0
"""How many times the estimated number of terms the bound allows for: each estimate from :data:`PROBES` copies
is 4 times too small with a probability of about 10^-4, and both are, for a value the constant does not inflate,
with about 10^-8 (only then is the bound narrower than from the value on ones alone)."""


def _info(dtype: np.dtype) -> Any:
    if dtype.kind in "fc":
        return np.finfo(dtype)
    import ml_dtypes  # an optional dependency, loaded already when one of its types is in use

    return ml_dtypes.finfo(dtype)


def unit_roundoff(dtype: np.dtype) -> float:
    """The largest relative error of one rounding to ``dtype``: half its machine epsilon (a complex
    type's components')."""
    return float(_info(np.dtype(dtype)).eps) / 2


def gamma(n: np.ndarray, u: float) -> np.ndarray:
    """γ(n) = n·u / (1 - n·u), the relative error bound of n roundings; past n·u = 1/2, where the
    bound stops meaning anything, it goes on as 2·n·u."""
    nu = n * u
    return nu / np.maximum(1 - nu, 0.5)


# -- the arguments the reference is called on -------------------------------------------


def reference_arguments(kernel: Kernel, args: tuple[Any, ...], kwargs: dict[str, Any],
                        copies: Copies, random: np.random.Generator | None = None
                        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of a call (``out`` left out) for the reference: each float or complex one as
    the kernel reads it (a Python number rounded to its parameter's type), in float64 or complex128,
    as it is (``"float64 copies"``), as its magnitude (``"magnitudes"``), as ones (``"ones"``), or
    as ±1 or 0 and 1 drawn from ``random`` element by element (``"random signs"``, ``"random zeros
    and ones"``); the others as :func:`~memkernel.testing.layout_copy` copies them. Arrays keep their
    layout."""
    spec = kernel.spec
    contracts = {c.name: c for c in spec.contracts[:spec.n_inputs]}
    names = [p.name for p in spec.parameters]
    draw = random or np.random.default_rng(0)
    positional = tuple(_argument(value, contracts.get(name), copies, draw) for name, value in zip(names, args))
    keywords = {name: _argument(value, contracts.get(name), copies, draw) for name, value in kwargs.items()
                if name != "out"}
    return positional, keywords


def _argument(value: Any, contract: Contract | None, copies: Copies, random: np.random.Generator) -> Any:
    if contract is None or contract.element.kind not in ("float", "complex"):
        return layout_copy(value)
    wide = np.dtype(np.complex128 if contract.element.kind == "complex" else np.float64)
    read = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=contract.element.dtype)
    values = read.astype(wide)
    if copies == "magnitudes":
        values = np.abs(values).astype(wide)
    elif copies == "ones":
        values = np.ones_like(values)
    elif copies == "random signs":
        values = random.choice(np.array([-1.0, 1.0]), size=values.shape).astype(wide)
    elif copies == "random zeros and ones":
        values = random.integers(0, 2, size=values.shape).astype(wide)
    if not isinstance(value, np.ndarray):
        return values[()] if values.ndim == 0 else values
    result = laid_out_as(value, values)
    result.flags.writeable = value.flags.writeable
    return result


# -- the bound ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rounding:
    """What a float value is judged by where it is not within tolerance of the reference's own
    value: the reference in float64 (``exact``) and, elementwise, the rounding error a correct kernel
    may add to the tolerance (``allowed``), for sums of up to ``terms`` terms."""

    exact: np.ndarray
    allowed: np.ndarray
    terms: int


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind in "fc" or dtype.name in ML_DTYPES_TYPE_NAMES


def _values(got: np.ndarray, value: Any, copies: Copies) -> np.ndarray:
    """What the reference gave on ``copies`` as an array of ``got``'s shape: floats (or, for the
    magnitudes and ones, any numbers)."""
    array = np.asarray(value)
    numeric = _is_float(array.dtype) or (copies != "float64 copies" and array.dtype.kind in "biu")
    if array.shape != got.shape or not numeric:
        shape = ", ".join(str(d) for d in array.shape)
        raise ValueError(f"on {copies} of the arguments the reference gave {array.dtype.name}[{shape}]")
    return array


def _magnitude(values: np.ndarray) -> np.ndarray:
    return np.abs(values.astype(np.complex128 if values.dtype.kind == "c" else np.float64))


def estimated_terms(ones: np.ndarray, signs: list[np.ndarray], masks: list[np.ndarray]) -> np.ndarray:
    """Elementwise, about how many terms (at least, mostly) a value sums, whatever constant the reference
    multiplies them by, from its values on ones, on random signs and on random zeros and ones of the
    arguments (see the module's docstring). A value that does not vary sums 1; NaN where none is known."""
    on_ones = _magnitude(ones) ** 2
    with np.errstate(all="ignore"):
        square = np.mean([_magnitude(each) ** 2 for each in signs], axis=0)
        spread = np.var([_magnitude(each) for each in masks], axis=0, ddof=1)
        by_signs = np.where(square == 0, 1.0, on_ones / square)
        by_masks = np.where(spread == 0, 1.0, on_ones / (4 * spread))
    return np.fmax(by_signs, by_masks)


def rounding(got: np.ndarray, exact: Any, magnitudes: Any, ones: Any, *, signs: Sequence[Any],
             masks: Sequence[Any]) -> Rounding:
    """The bound for the kernel's value ``got`` from what the reference gave on float64 copies of the
    arguments, on their magnitudes and on ones (the three :data:`COPIES`), and on :data:`PROBES` copies
    each of random ``signs`` and random zeros and ones (``masks``): γ(n)·Σ|terms| for the kernel's type
    and again for the type the reference computed in, with n one more than the terms (a copy or a
    quotient rounds once), plus n subnormals for underflow. The terms are the value on ones, or
    :data:`SAFETY` times :func:`estimated_terms` where that is fewer (a reference that scales by a
    constant). Complex values get twice the bound of n + 2 roundings, which covers Higham's
    √2·γ(n + 2). An element whose magnitude or terms are not finite gets no allowance.

    Raises ValueError if one of them is not an array of floats of ``got``'s shape."""
    exact, magnitudes, ones = (_values(got, v, copies) for v, copies in zip((exact, magnitudes, ones), COPIES))
    signs = [_values(got, v, "random signs") for v in signs]
    masks = [_values(got, v, "random zeros and ones") for v in masks]
    complex_ = got.dtype.kind == "c"
    with np.errstate(all="ignore"):
        size = _magnitude(magnitudes)
        counted_on_ones = np.ceil(_magnitude(ones))
        estimate = np.ceil(SAFETY * estimated_terms(ones, signs, masks))
        terms = np.where(np.isfinite(counted_on_ones), np.fmin(counted_on_ones, estimate), np.nan)
        roundings = terms + (3 if complex_ else 1)
        relative = gamma(roundings, unit_roundoff(got.dtype)) + gamma(roundings, unit_roundoff(exact.dtype))
        underflow = roundings * float(_info(got.dtype).smallest_subnormal)
        allowed = (2.0 if complex_ else 1.0) * relative * size + underflow
        allowed = np.where(np.isfinite(allowed), allowed, 0.0)
    counted = terms[np.isfinite(terms)]
    wide = np.complex128 if complex_ else np.float64
    return Rounding(exact.astype(wide), allowed, int(counted.max()) if counted.size else 0)
