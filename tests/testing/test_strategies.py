"""memkernel.testing.arguments: valid arguments drawn from a kernel's signature and shape rules."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from memkernel import mlir_kernel
from memkernel.testing import arguments, assert_matches
from memkernel.testing.strategies import laid_out

from .. import kernels
from ..kernels import conv_reference, conv_shape

FAST = settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def add():
    return mlir_kernel(kernels.ADD_2D)(lambda a, b: None)


@pytest.fixture(scope="module")
def matmul():
    return mlir_kernel(kernels.MATMUL)(lambda a, b: None)


@pytest.fixture(scope="module")
def conv():
    return mlir_kernel(kernels.CONV, name="conv")(conv_shape)


def _draws(strategy, count=60):
    found = []

    @settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(args):
        found.append(args)

    collect()
    return found


# -- what is drawn ----------------------------------------------------------------


def test_outputs_the_call_allocates_are_left_out(matmul):
    for args in _draws(arguments(matmul), 10):
        assert len(args) == 2


@FAST
@given(st.data())
def test_matmul_draws_agree_on_the_tied_dims_and_run(matmul, data):
    a, b = data.draw(arguments(matmul))
    assert a.dtype == b.dtype == np.float32
    assert a.shape[1] == b.shape[0]
    assert_matches(matmul, lambda a, b: a @ b, a, b)


@FAST
@given(st.data())
def test_elementwise_draws_have_one_shape_and_run(add, data):
    a, b = data.draw(arguments(add))
    assert a.shape == b.shape
    assert_matches(add, lambda a, b: a + b, a, b)


@FAST
@given(st.data())
def test_convolution_inputs_are_large_enough_for_their_windows(conv, data):
    i, f = data.draw(arguments(conv, max_side=3))
    assert i.shape[3] == f.shape[2]
    n, oh, ow, _ = conv_shape(i, f)
    if n and oh and ow and f.shape[0] and f.shape[1]:
        assert i.shape[1] >= oh + f.shape[0] - 1 and i.shape[2] >= ow + f.shape[1] - 1
    assert_matches(conv, conv_reference, i, f)


def test_static_dims_take_their_size():
    add = mlir_kernel(kernels.ADD_ROWS_OF_4)(lambda a, b: None)
    for a, b in _draws(arguments(add), 30):
        assert a.shape[1] == b.shape[1] == 4
        assert a.shape == b.shape


def test_named_dims_are_tied_and_an_in_place_kernel_runs_on_the_draws():
    @mlir_kernel(kernels.SCALE)
    def scale(x: "N", s, y: "N"):  # noqa: F821
        pass

    def reference(x, s, y):
        y[...] = x * np.float32(s)

    for x, s, y in _draws(arguments(scale), 40):
        assert x.shape == y.shape
        assert isinstance(s, float)
        assert_matches(scale, reference, x, s, y)


def test_tensor_arguments_are_drawn_as_inputs():
    tadd = mlir_kernel(kernels.TENSOR_ADD)(lambda a, b: None)
    for a, b in _draws(arguments(tadd), 30):
        assert a.shape == b.shape
        assert_matches(tadd, lambda a, b: a + b, a, b)


def test_unranked_memrefs_take_ranks_0_to_3():
    rank = mlir_kernel(kernels.UNRANKED_RANK)(lambda a: None)
    strategy = arguments(rank)
    for wanted in range(4):
        (a,) = find(strategy, lambda args, n=wanted: args[0].ndim == n)
        assert rank(a) == wanted
    for (a,) in _draws(strategy, 30):
        assert a.ndim <= 3


# -- scalars and element values -----------------------------------------------------


def test_scalars_stay_in_their_types_range_and_pass_through():
    scalars = mlir_kernel(kernels.SCALARS)(lambda a, flag, x, u, h: None)
    for a, flag, x, u, h in _draws(arguments(scalars), 80):
        assert -128 <= a <= 255 and isinstance(a, int)
        assert isinstance(flag, bool)
        assert 0 <= u <= 65535
        assert np.isfinite(x) and np.isfinite(h)
        got = scalars(a, flag, x, u, h)
        assert (int(got[0]), bool(got[1]), float(got[2]), int(got[3]), float(got[4])) == (
            int(np.uint8(a % 256).view(np.int8)), flag, x, u, h)


def test_a_signless_scalar_reaches_both_readings_of_its_bits():
    scalars = mlir_kernel(kernels.SCALARS)(lambda a, flag, x, u, h: None)
    strategy = arguments(scalars)
    assert find(strategy, lambda t: t[0] < 0)[0] == -1
    assert find(strategy, lambda t: t[0] > 127)[0] == 128


def test_default_floats_are_finite_eighths_within_8(add):
    for a, b in _draws(arguments(add), 40):
        for x in (a, b):
            assert np.all(np.abs(x) <= 8) and np.all(x * 8 == np.round(x * 8))


@pytest.mark.parametrize(("element", "dtype"), [
    ("bf16", ml_dtypes.bfloat16), ("f8E4M3FN", ml_dtypes.float8_e4m3fn), ("f8E5M2", ml_dtypes.float8_e5m2),
    ("f8E8M0FNU", ml_dtypes.float8_e8m0fnu), ("f16", np.float16), ("complex<f64>", np.complex128),
    ("i1", np.bool_), ("ui8", np.uint8), ("i64", np.int64),
])
def test_every_element_type_is_drawn_with_its_dtype_and_finite_values(element, dtype):
    copy = mlir_kernel(kernels.copy(element))(lambda a: None)
    for (a,) in _draws(arguments(copy), 15):
        assert a.dtype == np.dtype(dtype)
        if a.dtype.kind not in "biu":
            assert np.all(np.isfinite(a.astype(np.complex128)))
        assert_matches(copy, lambda a: a.copy(), a)


def test_eight_bit_floats_draw_from_all_their_values_up_to_8():
    copy = mlir_kernel(kernels.copy("f8E4M3FN"))(lambda a: None)
    seen = set()
    for (a,) in _draws(arguments(copy, min_side=8), 60):
        seen.update(a.astype(np.float64).tolist())
    assert max(abs(v) for v in seen) <= 8
    assert any(v != v * 8 // 1 / 8 for v in seen)  # values finer than eighths


def test_elements_can_be_given_by_argument_name_and_by_dtype(add):
    by_name = arguments(add, elements={"a": st.just(1.5)}, min_side=1)
    for a, b in _draws(by_name, 20):
        assert np.all(a == 1.5)
    by_dtype = arguments(add, elements={np.float32: st.just(-2.0)}, min_side=1)
    for a, b in _draws(by_dtype, 20):
        assert np.all(a == -2.0) and np.all(b == -2.0)
    by_dtype_name = arguments(add, elements={"float32": st.just(0.5)}, min_side=1)
    for a, b in _draws(by_dtype_name, 10):
        assert np.all(b == 0.5)


# -- views and sizes -------------------------------------------------------------------


def test_views_are_drawn_non_contiguous_offset_and_reversed(add):
    strategy = arguments(add)
    strided = find(strategy, lambda t: t[0].size > 1 and not t[0].flags.c_contiguous)[0]
    assert not strided.flags.c_contiguous
    reversed_ = find(strategy, lambda t: any(s < 0 for s in t[0].strides))[0]
    assert any(s < 0 for s in reversed_.strides)
    offset = find(strategy, lambda t: t[0].base is not None and t[0].size > 0
                  and t[0].__array_interface__["data"][0] != _base_of(t[0]).__array_interface__["data"][0])[0]
    assert offset.size > 0


def _base_of(array):
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def test_views_false_draws_only_contiguous_arrays(add):
    for a, b in _draws(arguments(add, views=False), 40):
        assert a.flags.c_contiguous and b.flags.c_contiguous


def test_zero_size_dims_are_drawn_and_run(add, matmul):
    a, b = find(arguments(matmul), lambda t: 0 in t[0].shape and t[1].size > 0)
    assert_matches(matmul, lambda a, b: a @ b, a, b)
    a, b = find(arguments(add), lambda t: t[0].shape[0] == 0)
    assert_matches(add, lambda a, b: a + b, a, b)


def test_sizes_shrink_to_min_side(add):
    a, b = find(arguments(add, min_side=2), lambda t: True)
    assert a.shape == (2, 2)


def test_sizes_stay_within_the_sides_given(add):
    for a, b in _draws(arguments(add, min_side=2, max_side=3), 30):
        assert all(2 <= n <= 3 for n in a.shape)


def test_a_strided_layout_with_a_static_stride_gets_arrays_laid_out_as_it_says():
    copy = mlir_kernel(kernels.COLUMN_MAJOR_COPY)(lambda a: None)
    for (a,) in _draws(arguments(copy), 30):
        if a.shape[0] > 1:
            assert a.strides[0] == a.itemsize
        assert_matches(copy, lambda a: np.ascontiguousarray(a), a)


def test_laid_out_keeps_the_values_and_places_dynamic_strides_past_static_ones():
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    array = laid_out(values, (None, 2))
    assert np.array_equal(array, values)
    assert array.strides == (20, 8)


def test_bad_sides_are_refused(add):
    with pytest.raises(ValueError, match="min_side <= max_side"):
        arguments(add, min_side=3, max_side=2)
