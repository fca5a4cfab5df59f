"""memkernel.testing.rounding: the arguments the reference is called on, and the rounding bound it gives."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from memkernel import mlir_kernel
from memkernel.testing.rounding import PROBES, SAFETY, estimated_terms, reference_arguments, rounding, unit_roundoff

from .. import kernels

F32 = np.float32


@pytest.fixture(scope="module")
def scale():
    @mlir_kernel(kernels.SCALE)
    def scale(x: "N", s, y: "N"):  # noqa: F821
        pass

    return scale


@pytest.mark.parametrize(("dtype", "u"), [
    (np.float64, 2.0**-53), (np.float32, 2.0**-24), (np.float16, 2.0**-11), (ml_dtypes.bfloat16, 2.0**-8),
    (ml_dtypes.float8_e4m3fn, 2.0**-4), (np.complex64, 2.0**-24),
])
def test_unit_roundoff_is_half_the_gap_above_one(dtype, u):
    assert unit_roundoff(np.dtype(dtype)) == u


def test_float_arguments_become_float64_copies_with_the_same_element_strides(scale):
    x = np.arange(12, dtype=F32)[::-3]
    y = np.zeros(8, F32)[::2]
    (x64, _, y64), keywords = reference_arguments(scale, (x, 2.0, y), {}, "float64 copies")
    assert keywords == {}
    assert x64.dtype == y64.dtype == np.float64
    assert [st // 8 for st in x64.strides] == [st // 4 for st in x.strides]
    assert [st // 8 for st in y64.strides] == [st // 4 for st in y.strides]
    assert np.array_equal(x64, x) and not np.shares_memory(x64, x)


def test_a_python_float_is_given_as_the_kernel_reads_it(scale):
    x = np.ones(3, F32)
    (_, s, _), _ = reference_arguments(scale, (x, 0.1, x.copy()), {}, "float64 copies")
    assert s == float(np.float32(0.1)) and s != 0.1


def test_magnitudes_and_ones(scale):
    x = np.array([-1.5, 2, -3], F32)
    (mx, ms, _), _ = reference_arguments(scale, (x, -0.5, np.zeros(3, F32)), {}, "magnitudes")
    assert np.array_equal(mx, np.abs(x)) and ms == 0.5
    (ox, os_, oy), _ = reference_arguments(scale, (x, -0.5, np.zeros(3, F32)), {}, "ones")
    assert np.array_equal(ox, np.ones(3)) and os_ == 1 and np.array_equal(oy, np.ones(3))


def test_keyword_arguments_are_converted_and_out_is_left_out():
    add = mlir_kernel(kernels.ADD)(lambda a, b: None)
    a = np.array([-1, 2], F32)
    positional, keywords = reference_arguments(add, (a,), {"b": a, "out": np.zeros(2, F32)}, "magnitudes")
    assert np.array_equal(positional[0], [1, 2]) and list(keywords) == ["b"]
    assert keywords["b"].dtype == np.float64 and np.array_equal(keywords["b"], [1, 2])


def test_integer_arguments_are_left_as_they_are():
    two = mlir_kernel(kernels.TWO_RESULTS)(lambda x, n: None)
    (x, n), _ = reference_arguments(two, (-2.5, -3), {}, "ones")
    assert (x, n) == (1.0, -3)


def probes(reference, *shapes, seed=0):
    """The reference on random signs and on random zeros and ones of arguments of these shapes."""
    rng = np.random.default_rng(seed)
    signs = [reference(*(rng.choice([-1.0, 1.0], size=s) for s in shapes)) for _ in range(PROBES)]
    masks = [reference(*(rng.integers(0, 2, size=s).astype(np.float64) for s in shapes)) for _ in range(PROBES)]
    return {"signs": signs, "masks": masks}


def matmul(a, b):
    return a @ b


def matmul_bound(a, b):
    wide = np.complex128 if a.dtype.kind == "c" else np.float64
    a64, b64 = a.astype(wide), b.astype(wide)
    return rounding((a @ b), a64 @ b64, np.abs(a64) @ np.abs(b64), np.ones_like(a64) @ np.ones_like(b64),
                    **probes(matmul, a.shape, b.shape))


def test_the_bound_of_a_matmul_covers_highams_worst_case_and_not_much_more():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 500), dtype=F32), rng.standard_normal((500, 2), dtype=F32)
    bound = matmul_bound(a, b)
    u = 2.0**-24
    worst = 500 * u / (1 - 500 * u) * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    assert bound.terms == 500
    assert np.all(bound.allowed >= worst) and np.all(bound.allowed <= 1.01 * worst)
    assert np.array_equal(bound.exact, a.astype(np.float64) @ b.astype(np.float64))


def test_a_complex_matmul_gets_highams_complex_bound():
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((2, 40)) + 1j * rng.standard_normal((2, 40))).astype(np.complex64)
    b = (rng.standard_normal((40, 3)) + 1j * rng.standard_normal((40, 3))).astype(np.complex64)
    bound = matmul_bound(a, b)
    u = 2.0**-24
    complex_worst = np.sqrt(2) * 42 * u / (1 - 42 * u) * (np.abs(a) @ np.abs(b))
    assert bound.exact.dtype == np.complex128
    assert np.all(bound.allowed >= complex_worst)


def test_a_reference_that_computes_in_float32_adds_its_own_rounding():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 100), dtype=F32), rng.standard_normal((100, 2), dtype=F32)
    size = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    terms = probes(matmul, a.shape, b.shape)
    in_float32 = rounding(a @ b, a @ b, size, np.full((2, 2), 100.0), **terms)
    in_float64 = rounding(a @ b, a.astype(np.float64) @ b, size, np.full((2, 2), 100.0), **terms)
    assert np.allclose(in_float32.allowed, 2 * in_float64.allowed, rtol=1e-6)


def test_elements_whose_magnitude_or_terms_are_not_finite_get_no_allowance():
    got = np.ones(3, F32)
    bound = rounding(got, np.ones(3), np.array([np.inf, 1, 1]), np.array([1, np.nan, 1]),
                     **probes(lambda x: x, (3,)))
    assert bound.allowed[0] == bound.allowed[1] == 0 and bound.allowed[2] > 0
    assert bound.terms == 1


@pytest.mark.parametrize(("exact", "magnitudes", "ones", "said"), [
    (np.ones(2), np.ones(3), np.ones(3), "on float64 copies of the arguments the reference gave float64[2]"),
    (np.ones(3, np.int64), np.ones(3), np.ones(3), "on float64 copies of the arguments the reference gave int64[3]"),
    (np.ones(3), np.ones(3), np.array(["a"] * 3), "on ones of the arguments the reference gave str32[3]"),
])
def test_a_reference_value_that_does_not_fit_is_refused_with_what_it_gave(exact, magnitudes, ones, said):
    with pytest.raises(ValueError) as caught:
        rounding(np.ones(3, F32), exact, magnitudes, ones, **probes(lambda x: x, (3,)))
    assert str(caught.value) == said


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e8])
@pytest.mark.parametrize("k", [1, 7, 300])
def test_the_terms_of_a_scaled_matmul_are_counted_whatever_the_scale(scale, k):
    terms = estimated_terms(scale * np.full((3, 2), float(k)), **probes(lambda a, b: scale * (a @ b), (3, k), (k, 2)))
    assert np.all(terms >= k / 2) and np.all(SAFETY * terms >= k)
    assert np.all(terms <= 10 * k)  # not the constant: on ones the value is scale * k


def test_a_sum_of_squares_counts_its_terms():
    terms = estimated_terms(np.array([500.0]), **probes(lambda x: np.array([np.sum(x * x)]), (500,)))
    assert 250 <= terms[0] <= 1500


def test_a_reference_that_scales_by_a_constant_sums_one_term_not_the_constant():
    a = np.random.default_rng(5).standard_normal(100).astype(F32)
    bound = rounding(np.zeros(100, F32), 1e8 * a.astype(np.float64), 1e8 * np.abs(a.astype(np.float64)),
                     np.full(100, 1e8), **probes(lambda x: 1e8 * x, (100,)))
    assert bound.terms <= 4 * SAFETY  # the estimate from zeros and ones of one term is at most 4
    assert np.all(bound.allowed <= 1e-5 * 1e8 * np.abs(a))  # a few units in the last place, not 10^8 of them
