"""memkernel.testing.assert_matches: what it accepts, and exactly what it reports."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from memkernel import mlir_kernel
from memkernel.testing import assert_matches, default_tolerance, layout_copy

from . import kernels
from .test_strategies import conv_reference, conv_shape

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
        "    first mismatch at index (2,): kernel 3.0, reference 3.5\n"
        "    max abs error 1, max rel error 0.2 (float32: rtol=1e-05, atol=1e-06)"
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
