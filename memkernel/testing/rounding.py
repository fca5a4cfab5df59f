"""How far a correct float kernel may be from the exact value: the classical bound of sums of products.

A value that sums n products of the inputs (an element of a matmul or a
convolution, a sum, an elementwise expression), computed in a float type of
unit roundoff u in any order, with or without fused multiply-adds, is within
γ(n)·Σ|terms| of the exact value, where γ(n) = n·u / (1 - n·u) (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1 and §3.6 for
complex numbers). A reference function gives all three without anyone reading
it: called on float64 copies of the arguments it gives the exact value (up to
float64's own rounding), on their magnitudes Σ|terms|, and on ones the number
of terms (for a function made of sums and products).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..kernel import Kernel
from ..model.contract import Contract
from ..model.dtypes import ML_DTYPES_TYPE_NAMES
from .copies import laid_out_as, layout_copy

Copies = Literal["float64 copies", "magnitudes", "ones"]
COPIES: tuple[Copies, ...] = ("float64 copies", "magnitudes", "ones")
"""The three sets of arguments the reference is called on, in the order :func:`rounding` takes its results."""


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
                        copies: Copies) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of a call (``out`` left out) for the reference: each float or complex one as
    the kernel reads it (a Python number rounded to its parameter's type), in float64 or complex128,
    as it is (``"float64 copies"``), as its magnitude (``"magnitudes"``) or as ones (``"ones"``);
    the others as :func:`~memkernel.testing.layout_copy` copies them. Arrays keep their layout."""
    spec = kernel.spec
    contracts = {c.name: c for c in spec.contracts[:spec.n_inputs]}
    names = [p.name for p in spec.parameters]
    positional = tuple(_argument(value, contracts.get(name), copies) for name, value in zip(names, args))
    keywords = {name: _argument(value, contracts.get(name), copies) for name, value in kwargs.items()
                if name != "out"}
    return positional, keywords


def _argument(value: Any, contract: Contract | None, copies: Copies) -> Any:
    if contract is None or contract.element.kind not in ("float", "complex"):
        return layout_copy(value)
    wide = np.dtype(np.complex128 if contract.element.kind == "complex" else np.float64)
    read = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=contract.element.dtype)
    values = read.astype(wide)
    if copies == "magnitudes":
        values = np.abs(values).astype(wide)
    elif copies == "ones":
        values = np.ones_like(values)
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


def rounding(got: np.ndarray, exact: Any, magnitudes: Any, ones: Any) -> Rounding:
    """The bound for the kernel's value ``got`` from what the reference gave on float64 copies of the
    arguments, on their magnitudes and on ones (the three :data:`COPIES`): γ(n)·Σ|terms| for the
    kernel's type and again for the type the reference computed in, with n one more than the terms
    (a copy or a quotient rounds once), plus n subnormals for underflow.
    Complex values get twice the bound of n + 2 roundings, which covers Higham's √2·γ(n + 2). An
    element whose magnitude or terms are not finite gets no allowance.

    Raises ValueError if one of them is not an array of floats of ``got``'s shape."""
    exact, magnitudes, ones = (_values(got, v, copies) for v, copies in zip((exact, magnitudes, ones), COPIES))
    complex_ = got.dtype.kind == "c"
    with np.errstate(all="ignore"):
        size, terms = _magnitude(magnitudes), np.ceil(_magnitude(ones))
        roundings = terms + (3 if complex_ else 1)
        relative = gamma(roundings, unit_roundoff(got.dtype)) + gamma(roundings, unit_roundoff(exact.dtype))
        underflow = roundings * float(_info(got.dtype).smallest_subnormal)
        allowed = (2.0 if complex_ else 1.0) * relative * size + underflow
        allowed = np.where(np.isfinite(allowed), allowed, 0.0)
    counted = terms[np.isfinite(terms)]
    wide = np.complex128 if complex_ else np.float64
    return Rounding(exact.astype(wide), allowed, int(counted.max()) if counted.size else 0)
