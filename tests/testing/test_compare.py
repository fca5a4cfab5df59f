"""memkernel.testing.assert_matches: what it accepts, and exactly what it reports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from memkernel import mlir_kernel
from memkernel.testing import assert_matches, default_tolerance, layout_copy

from .. import kernels
from ..kernels import conv_reference, conv_shape

F32 = np.float32


@pytest.fixture(scope="module")
def add():
    return mlir_kernel(kernels.ADD)(lambda a, b: None)


@pytest.fixture(scope="module")
def two():
    return mlir_kernel(kernels.TWO_RESULTS)(lambda x, n: None)


def mismatch(kernel, reference, *args, **kwargs) -> str:
    with pytest.raises(AssertionError) as caught:
        assert_matches(kernel, reference, *args, **kwargs)
    return str(caught.value)


def test_a_matching_kernel_passes_and_its_value_is_returned(add):
    a, b = np.arange(4, dtype=F32), np.ones(4, F32)
    out = assert_matches(add, lambda a, b: a + b, a, b)
    assert np.array_equal(out, a + b)


def test_a_mismatch_reports_kernel_arguments_first_index_values_errors_and_count(add):
    a, b = np.array([1, 2, 3, 4], F32), np.zeros(4, F32)
    message = mismatch(add, lambda a, b: a + F32([0, 0, 0.5, 1]), a, b)
    assert message == (
        "add(): the kernel does not match the reference\n"
        "  arguments: a float32[4], b float32[4]\n"
        "  output 'out' differs from the reference in 2 of 4 elements\n"
        "    first mismatch at index (2,): kernel 3.0, reference 3.5, allowed error 3.66e-05\n"
        "    max abs error 1, max rel error 0.2 (float32: rtol=1e-05, atol=1e-06 and the rounding of sums of up "
        "to 2 terms, against the reference in float64)"
    )


def test_views_are_marked_in_the_arguments(add):
    a = np.array([1, 2, 3, 4, 5, 6, 7, 8], F32)[::2]
    message = mismatch(add, np.zeros(4, F32), a, np.zeros(4, F32))
    assert "  arguments: a float32[4] (view), b float32[4]\n" in message
    assert "differs from the reference in 4 of 4 elements" in message


def test_a_2d_mismatch_gives_the_first_index_in_row_major_order():
    add = mlir_kernel(kernels.ADD_2D)(lambda a, b: None)
    a = np.zeros((2, 3), F32)
    expected = np.zeros((2, 3), F32)
    expected[1, 0] = -2
    expected[1, 2] = 4
    message = mismatch(add, expected, a, a)
    assert "differs from the reference in 2 of 6 elements\n" in message
    assert "first mismatch at index (1, 0): kernel 0.0, reference -2.0\n" in message
    assert "max abs error 4, max rel error 1 (float32" in message


def test_several_results_are_compared_one_by_one_and_the_one_that_differs_is_named(two):
    message = mismatch(two, lambda x, n: (x, n + 1), 2.5, 3)
    assert message == (
        "two(): the kernel does not match the reference\n"
        "  arguments: x = 2.5, n = 3\n"
        "  result 1 differs from the reference in 1 of 1 elements\n"
        "    first mismatch at index (): kernel 3, reference 4\n"
        "    max abs error 1, max rel error 0.25 (int32: exact)"
    )


def test_every_value_that_differs_is_reported(two):
    message = mismatch(two, (2.0, 4), 2.5, 3)
    assert "result 0 differs" in message and "result 1 differs" in message


def test_a_shape_mismatch_is_reported_as_such(add):
    a = np.ones(4, F32)
    message = mismatch(add, lambda a, b: (a + b)[:3], a, a)
    assert message.endswith("  output 'out': the kernel gave float32[4] but the reference float32[3]; "
                            "the shapes differ")


def test_a_dtype_mismatch_is_reported_as_such(add):
    a = np.ones(4, F32)
    message = mismatch(add, lambda a, b: (a + b).astype(np.float64), a, a)
    assert message.endswith("  output 'out': the kernel gave float32[4] but the reference float64[4]; "
                            "the dtypes differ")


def test_a_reference_with_the_wrong_number_of_values_is_reported(two):
    message = mismatch(two, lambda x, n: (x, n, n), 2.5, 3)
    assert message.endswith("the kernel gives 2 values (result 0, result 1) but the reference gave 3 values")


def test_python_numbers_take_the_kernels_dtype(two):
    assert_matches(two, (2.5, 3), 2.5, 3)


def test_integers_compare_exactly():
    sub = mlir_kernel(kernels.elementwise("arith.subi", "memref<?xi64>", "i64", 1, name="sub"))(lambda a, b: None)
    big = np.array([2**62, 5], np.int64)
    message = mismatch(sub, big - np.array([0, 1]) + np.array([1, 0]), big, np.zeros(2, np.int64))
    assert "first mismatch at index (0,): kernel 4611686018427387904, reference 4611686018427387905\n" in message
    assert "differs from the reference in 2 of 2 elements\n" in message
    assert "max abs error 1, max rel error 0.25 (int64: exact)" in message


def test_nans_in_the_same_places_are_equal_and_elsewhere_differ(add):
    a = np.array([1, np.nan, 3], F32)
    assert_matches(add, lambda a, b: a + b, a, np.zeros(3, F32))
    message = mismatch(add, F32([1, 2, 3]), a, np.zeros(3, F32))
    assert "first mismatch at index (1,): kernel nan, reference 2.0\n" in message
    assert "max abs error inf, max rel error inf" in message


def test_default_tolerance_follows_the_dtype(add):
    a = np.array([1, 2, 3, 4], F32)
    assert_matches(add, (a * (1 + 5e-6)).astype(F32), a, np.zeros(4, F32))
    message = mismatch(add, (a * (1 + 3e-5)).astype(F32), a, np.zeros(4, F32))
    assert "differs from the reference in 4 of 4 elements" in message
    assert "first mismatch at index (0,): kernel 1.0, reference 1.00003\n" in message


@pytest.mark.parametrize(("dtype", "rtol"), [
    (np.float64, 1e-12), (np.float32, 1e-5), (np.float16, 1e-2), (ml_dtypes.bfloat16, 2e-2),
    (ml_dtypes.float8_e4m3fn, 0.25), (ml_dtypes.float8_e5m2, 0.5), (np.complex64, 1e-5),
])
def test_default_rtol_by_dtype(dtype, rtol):
    assert default_tolerance(np.dtype(dtype))[0] == rtol


@pytest.mark.parametrize("dtype", [np.int8, np.uint64, np.bool_])
def test_integers_and_bools_are_exact_by_default(dtype):
    assert default_tolerance(np.dtype(dtype)) == (0.0, 0.0)


def test_rtol_and_atol_override_the_defaults(add):
    a = np.array([1, 2, 3, 4], F32)
    loose = (a * 1.001).astype(F32)
    assert_matches(add, loose, a, np.zeros(4, F32), rtol=1e-2)
    assert "(float32: rtol=0.0001, atol=1e-06)" in mismatch(add, loose, a, np.zeros(4, F32), rtol=1e-4)
    assert_matches(add, F32([1, 2, 3, 4.5]), a, np.zeros(4, F32), atol=0.5)


def test_ulps_compares_in_units_in_the_last_place(two):
    next_up = float(np.nextafter(np.nextafter(2.5, 3), 3))
    assert_matches(two, (next_up, 3), 2.5, 3, ulps=2)
    message = mismatch(two, (next_up, 3), 2.5, 3, ulps=1)
    assert f"first mismatch at index (): kernel 2.5, reference {next_up}\n" in message
    assert "(float64: ulps=1; max 2 ulps)" in message


def test_ulps_across_zero_count_both_sides(two):
    tiny = float(np.nextafter(0.0, 1.0))
    assert_matches(two, (-tiny, 3), tiny, 3, ulps=2)
    assert "max 2 ulps" in mismatch(two, (-tiny, 3), tiny, 3, ulps=1)


def test_an_in_place_kernel_is_judged_by_the_inputs_it_writes():
    @mlir_kernel(kernels.SCALE)
    def scale(x: "N", s, y: "N"):  # noqa: F821
        pass

    x = np.array([1, -2, 3], F32)

    def reference_in_place(x, s, y):
        y[...] = x * F32(s)

    assert_matches(scale, reference_in_place, x, 2.0, np.zeros(3, F32))
    assert_matches(scale, x * 2, x, 2.0, np.zeros(3, F32))
    message = mismatch(scale, x * 3, x, 2.0, np.zeros(3, F32))
    assert "  arguments: x float32[3], s = 2.0, y float32[3]\n" in message
    assert "  argument 'y' after the call differs from the reference in 3 of 3 elements\n" in message


def test_the_reference_gets_copies_that_keep_each_views_layout(add):
    a = np.arange(8, dtype=F32)[::-2]
    seen = []

    def reference(a, b):
        seen.append(a.strides)
        return a + b

    assert_matches(add, reference, a, np.ones(4, F32))
    assert seen == [a.strides]


def test_layout_copy_keeps_strides_values_and_is_independent():
    a = np.arange(24, dtype=F32).reshape(4, 6)[::-2, 1::2].T
    copy = layout_copy(a)
    assert copy.strides == a.strides and np.array_equal(copy, a)
    copy[0, 0] = 100
    assert a[0, 0] != 100


def test_layout_copy_of_a_subclass_whose_shape_lies_copies_the_array_it_is():
    base = np.arange(64, dtype=F32)
    liar = base[:4].view(type("Liar", (np.ndarray,), {"shape": property(lambda self: (64,))}))
    copy = layout_copy(liar)
    assert type(copy) is np.ndarray and np.array_equal(copy, base[:4])


def test_a_convolution_against_numpy():
    conv = mlir_kernel(kernels.CONV, name="conv")(conv_shape)
    rng = np.random.default_rng(0)
    i = rng.integers(-4, 5, (1, 5, 6, 2)).astype(F32)
    f = rng.integers(-4, 5, (3, 2, 2, 3)).astype(F32)
    assert_matches(conv, conv_reference, i, f)


def test_out_goes_to_the_kernel_only_and_the_out_array_is_compared(add):
    a = np.arange(4, dtype=F32)
    out = np.full(4, 7, F32)
    returned = assert_matches(add, lambda a, b: a + b, a, a, out=out)
    assert returned is out and np.array_equal(out, 2 * a)


# -- floats that sum many products ----------------------------------------------------------

U32 = 2.0**-24  # the unit roundoff of float32


def standard_normal(rng, shape):
    return rng.standard_normal(shape, dtype=F32)


def uniform(rng, shape):
    return rng.random(shape, dtype=F32)


def uniform_signed(rng, shape):
    return rng.uniform(-1, 1, shape).astype(F32)


def mixed_scales(rng, shape):
    """Signed values whose magnitudes span six orders."""
    return (rng.choice([-1, 1], shape) * 10.0 ** rng.uniform(-3, 3, shape)).astype(F32)


def tenths(rng, shape):
    """0.1 everywhere: a long float32 sum of equal terms drifts the same way at every step."""
    return np.full(shape, 0.1, F32)


INPUTS = [standard_normal, uniform, uniform_signed]


@pytest.fixture(scope="module", params=["default", "fast"])
def matmul(request):
    return mlir_kernel(kernels.MATMUL, name="matmul", pipeline=request.param)(lambda a, b: None)


@pytest.fixture(scope="module")
def given():
    return mlir_kernel(kernels.GIVEN)(lambda x, a, b: None)


def failures(kernel, reference, calls) -> list[str]:
    """The first line of what each failing call reports."""
    found = []
    for args in calls:
        try:
            assert_matches(kernel, reference, *args)
        except AssertionError as error:
            found.append(str(error).splitlines()[2])
    return found


@pytest.mark.parametrize("draw", INPUTS)
def test_a_correct_float32_matmul_matches_numpy_on_1000_random_shapes(matmul, draw):
    rng = np.random.default_rng(18)
    shapes = [rng.integers(1, 65, 3) for _ in range(1000)]
    calls = [(draw(rng, (m, k)), draw(rng, (k, n))) for m, k, n in shapes]
    assert failures(matmul, np.matmul, calls) == []


@pytest.mark.parametrize("draw", [*INPUTS, mixed_scales, tenths])
def test_a_correct_float32_matmul_matches_numpy_over_long_sums(matmul, draw):
    rng = np.random.default_rng(4096)
    shapes = [(rng.integers(1, 5), rng.integers(1024, 16385), rng.integers(1, 5)) for _ in range(20)]
    calls = [(draw(rng, (m, k)), draw(rng, (k, n))) for m, k, n in shapes]
    assert failures(matmul, np.matmul, calls) == []


@pytest.mark.slow
@pytest.mark.parametrize("draw", [*INPUTS, mixed_scales])
def test_a_correct_float32_matmul_matches_numpy_on_larger_random_shapes(matmul, draw):
    rng = np.random.default_rng(256)
    shapes = [rng.integers(1, 257, 3) for _ in range(1000)]
    calls = ((draw(rng, (m, k)), draw(rng, (k, n))) for m, k, n in shapes)
    assert failures(matmul, np.matmul, calls) == []


def test_a_correct_in_place_matvec_matches_numpy_on_random_shapes():
    matvec = mlir_kernel(kernels.MATVEC_IN_PLACE)(lambda a, x, y: None)

    def reference(a, x, y):
        y += a @ x

    rng = np.random.default_rng(7)
    shapes = [rng.integers(1, 300, 2) for _ in range(300)]
    calls = [(standard_normal(rng, (m, k)), standard_normal(rng, k), standard_normal(rng, m)) for m, k in shapes]
    assert failures(matvec, reference, calls) == []


def test_a_correct_convolution_matches_numpy_on_random_shapes():
    conv = mlir_kernel(kernels.CONV, name="conv")(conv_shape)
    rng = np.random.default_rng(3)
    calls = []
    for _ in range(100):
        kh, kw, c, f = rng.integers(1, 4, 4)
        h, w = kh + rng.integers(0, 6), kw + rng.integers(0, 6)
        calls.append((standard_normal(rng, (1, h, w, c * 8)), standard_normal(rng, (kh, kw, c * 8, f))))
    assert failures(conv, conv_reference, calls) == []


def test_openblas_haswell_kernels_do_not_fail_a_correct_matmul(tmp_path):
    script = tmp_path / "haswell.py"
    script.write_text(
        "import numpy as np\n"
        "from memkernel import mlir_kernel\n"
        "from memkernel.testing import assert_matches\n"
        "from tests import kernels\n"
        "matmul = mlir_kernel(kernels.MATMUL, name='matmul')(lambda a, b: None)\n"
        "rng = np.random.default_rng(0)\n"
        "failed = 0\n"
        "for _ in range(300):\n"
        "    m, k, n = rng.integers(1, 100, 3)\n"
        "    try:\n"
        "        assert_matches(matmul, np.matmul, rng.standard_normal((m, k), dtype=np.float32),\n"
        "                       rng.standard_normal((k, n), dtype=np.float32))\n"
        "    except AssertionError:\n"
        "        failed += 1\n"
        "print('failed', failed)\n")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OPENBLAS_CORETYPE": "Haswell", "PYTHONPATH": os.pathsep.join(
        [str(root), os.environ.get("PYTHONPATH", "")])}
    shown = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=root,
                           timeout=300, check=False)
    assert shown.stdout == "failed 0\n", shown.stderr


def worst_case(a, b):
    """Higham's bound on the error of any float32 evaluation of a @ b: γ(k)·(|a| @ |b|)."""
    k = a.shape[1]
    return k * U32 / (1 - k * U32) * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))


def exact(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


def test_an_error_up_to_the_worst_case_rounding_of_a_long_sum_passes(given):
    rng = np.random.default_rng(1)
    a, b = standard_normal(rng, (4, 1024)), standard_normal(rng, (1024, 4))
    x = (exact(a, b) + 0.9 * worst_case(a, b)).astype(F32)
    assert_matches(given, lambda x, a, b: a @ b, x, a, b)


def test_an_element_off_by_twice_the_worst_case_rounding_fails(given):
    rng = np.random.default_rng(2)
    a, b = standard_normal(rng, (4, 1024)), standard_normal(rng, (1024, 4))
    x = (a @ b).astype(F32)
    i, j = np.unravel_index(np.argmin(np.abs(exact(a, b))), x.shape)  # the most cancelling sum
    x[i, j] += F32(2 * worst_case(a, b)[i, j])
    message = mismatch(given, lambda x, a, b: a @ b, x, a, b)
    assert "differs from the reference in 1 of 16 elements\n" in message
    shown = f"first mismatch at index ({i}, {j}): kernel {x[i, j]!s}, reference {exact(a, b)[i, j]!s}, allowed error"
    assert shown in message
    assert "and the rounding of sums of up to 1024 terms, against the reference in float64)" in message


@pytest.mark.parametrize("sign", [-1, 1])
def test_an_element_that_drops_or_doubles_one_term_fails(given, sign):
    rng = np.random.default_rng(3)
    a, b = standard_normal(rng, (5, 64)), standard_normal(rng, (64, 6))
    x = (a @ b).astype(F32)
    terms = a[2, :] * b[:, 3]
    k = int(np.argmin(np.abs(np.abs(terms) - 0.25)))  # a term of a quarter: smaller than most
    x[2, 3] += sign * terms[k]
    message = mismatch(given, lambda x, a, b: a @ b, x, a, b)
    assert "differs from the reference in 1 of 30 elements\n" in message
    assert "first mismatch at index (2, 3)" in message


# Two terms of 3000 that cancel to 2**-12: a float32 kernel may be off by about 3·2**-24·6000 ≈ 1e-3.
CANCELLING = (np.array([[1, 1]], F32), np.array([[3000], [-2999.999755859375]], F32))


def cancelling_result(error):
    a, b = CANCELLING
    return (exact(a, b) + error).astype(F32), a, b


def test_an_error_within_the_rounding_of_cancelling_terms_passes(given):
    assert_matches(given, lambda x, a, b: a @ b, *cancelling_result(1e-4))


def test_given_rtol_and_atol_replace_the_elementwise_tolerance_and_keep_the_rounding_bound(given):
    assert_matches(given, lambda x, a, b: a @ b, *cancelling_result(1e-4), rtol=0, atol=0)
    message = mismatch(given, lambda x, a, b: a @ b, *cancelling_result(1e-2), rtol=0, atol=1e-3)
    assert "(float32: rtol=0, atol=0.001 and the rounding of sums of up to 2 terms, against the reference" in message


def test_expected_values_get_the_elementwise_tolerance_only(given):
    x, a, b = cancelling_result(1e-4)
    message = mismatch(given, a @ b, x, a, b)
    assert message.endswith("(float32: rtol=1e-05, atol=1e-06)")


def test_ulps_compare_with_the_references_own_values_only(given):
    message = mismatch(given, lambda x, a, b: a @ b, *cancelling_result(1e-4), ulps=4)
    assert "(float32: ulps=4; max " in message and "rounding" not in message


def test_a_reference_that_fails_on_float64_copies_gets_the_elementwise_tolerance_and_says_why(given):
    def float32_only(x, a, b):
        assert a.dtype == np.float32, f"got {a.dtype}"
        return a @ b

    message = mismatch(given, float32_only, *cancelling_result(1e-4))
    assert message.endswith("(float32: rtol=1e-05, atol=1e-06; no rounding bound: the reference raised "
                            "AssertionError on float64 copies of the arguments: got float64)")


def test_a_reference_that_gives_another_shape_on_float64_copies_gets_the_elementwise_tolerance(given):
    def shape_by_dtype(x, a, b):
        return a @ b if a.dtype == np.float32 else (a @ b).ravel()

    message = mismatch(given, shape_by_dtype, *cancelling_result(1e-4))
    assert message.endswith("no rounding bound: on float64 copies of the arguments the reference gave float64[1])")


def test_the_reference_is_called_once_when_the_values_are_within_the_elementwise_tolerance(add):
    calls = []

    def reference(a, b):
        calls.append(a.dtype)
        return a + b

    assert_matches(add, reference, np.arange(4, dtype=F32), np.ones(4, F32))
    assert calls == [np.float32]


@pytest.mark.parametrize("tolerance", [{}, {"rtol": 0, "atol": 0}], ids=["default tolerance", "rtol=atol=0"])
@pytest.mark.parametrize("scale", [1e3, 1e8])
def test_zeros_do_not_match_a_reference_that_scales_by_a_large_constant(given, scale, tolerance):
    rng = np.random.default_rng(6)
    a, b = standard_normal(rng, (3, 1)), standard_normal(rng, (1, 4))
    message = mismatch(given, lambda x, a, b: scale * (a @ b), np.zeros((3, 4), F32), a, b, **tolerance)
    assert "differs from the reference in 12 of 12 elements\n" in message


def test_a_value_three_percent_off_a_scaled_reference_fails(given):
    rng = np.random.default_rng(7)
    a, b = standard_normal(rng, (3, 1)), standard_normal(rng, (1, 4))
    x = (F32(1.03e6) * (a @ b)).astype(F32)
    message = mismatch(given, lambda x, a, b: 1e6 * (a @ b), x, a, b, rtol=0, atol=0)
    assert "differs from the reference in 12 of 12 elements\n" in message


def test_a_correct_scaled_long_sum_passes(given):
    rng = np.random.default_rng(8)
    a, b = standard_normal(rng, (2, 4096)), standard_normal(rng, (4096, 2))
    x = (F32(1e6) * (a @ b)).astype(F32)
    assert_matches(given, lambda x, a, b: F32(1e6) * (a @ b), x, a, b, rtol=0, atol=0)
