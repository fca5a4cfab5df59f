"""Output arguments: allocation, out=, return conventions, and the decorated function's role.

Every expected value is computed with numpy from the inputs; inputs hold small
integers so that float results are exact and compared with ``==``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from memkernel import mlir_kernel

from .. import kernels
from ..kernels import loop_map, loop_total

FLOATS = [pytest.param("f32", np.float32, id="f32"), pytest.param("f64", np.float64, id="f64")]
NUMERIC = [*FLOATS, pytest.param("i32", np.int32, id="i32")]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240611)


def ints(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Small integers in ``dtype``: every sum and product below is exact."""
    return rng.integers(-8, 9, size=shape).astype(dtype)


class Recorder:
    """A decorated-function body that records each call and returns a fixed value."""

    def __init__(self, returns=None):
        self.calls: list[tuple] = []
        self.returns = returns

    def body(self, *args):
        self.calls.append(args)
        return self.returns(*args) if callable(self.returns) else self.returns


# --------------------------------------------------------------------------------------
# Kernels. The sources take the element type T; factories are cached so that each
# (kernel, dtype) compiles once per test session where the test does not need its own.

STATIC_MATMUL = """
func.func @static_matmul(%a: memref<2x3x{T}>, %b: memref<3x4x{T}>, %c: memref<2x4x{T}>) {{
  linalg.matmul ins(%a, %b : memref<2x3x{T}>, memref<3x4x{T}>) outs(%c : memref<2x4x{T}>)
  return
}}
"""

DYNAMIC_MATMUL = """
func.func @dynamic_matmul(%a: memref<?x?x{T}>, %b: memref<?x?x{T}>, %c: memref<?x?x{T}>) {{
  linalg.matmul ins(%a, %b : memref<?x?x{T}>, memref<?x?x{T}>) outs(%c : memref<?x?x{T}>)
  return
}}
"""

ADD_2D = """
func.func @add2d(%a: memref<?x?x{T}>, %b: memref<?x?x{T}>, %c: memref<?x?x{T}>) {{
  linalg.add ins(%a, %b : memref<?x?x{T}>, memref<?x?x{T}>) outs(%c : memref<?x?x{T}>)
  return
}}
"""

ADD_4XN = """
func.func @add4xn(%a: memref<4x?xf32>, %b: memref<4x?xf32>, %c: memref<4x?xf32>) {
  linalg.add ins(%a, %b : memref<4x?xf32>, memref<4x?xf32>) outs(%c : memref<4x?xf32>)
  return
}
"""

# c[i, j] = a[j] + b[i]: the output's ? dim is no input's, so the body must give it.
BROADCAST_4XN = """
func.func @broadcast(%a: memref<?xf32>, %b: memref<4xf32>, %c: memref<4x?xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (j)>, affine_map<(i, j) -> (i)>,
                                   affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%a, %b : memref<?xf32>, memref<4xf32>) outs(%c : memref<4x?xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  }
  return
}
"""

# Two outputs: the transpose (3x?) and the column sums (static 3, accumulated).
TRANSPOSE_COLSUM = """
func.func @transpose_colsum(%a: memref<?x3xf32>, %t: memref<3x?xf32>, %s: memref<3xf32>) {
  linalg.transpose ins(%a : memref<?x3xf32>) outs(%t : memref<3x?xf32>) permutation = [1, 0]
  linalg.reduce ins(%a : memref<?x3xf32>) outs(%s : memref<3xf32>) dimensions = [0]
    (%x: f32, %acc: f32) {
      %y = arith.addf %x, %acc : f32
      linalg.yield %y : f32
    }
  return
}
"""

# c[i, j] = i * cols + j over c's own dims: nothing ties c to a or b, so only the body can shape it.
IOTA_2D = """
func.func @iota2d(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %c: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = memref.dim %c, %c0 : memref<?x?xf32>
  %n = memref.dim %c, %c1 : memref<?x?xf32>
  scf.for %i = %c0 to %m step %c1 {
    scf.for %j = %c0 to %n step %c1 {
      %k = arith.muli %i, %n : index
      %l = arith.addi %k, %j : index
      %x = arith.index_cast %l : index to i64
      %f = arith.sitofp %x : i64 to f32
      memref.store %f, %c[%i, %j] : memref<?x?xf32>
    }
  }
  return
}
"""

UNTIED_TWO_OUTPUTS = """
func.func @untied_two(%a: memref<?xf32>, %b: memref<?xf32>, %s: memref<?xf32>, %d: memref<?xf32>) {
  return
}
"""

# Two outputs of the inputs' shape pattern: a + b and a - b.
ADD_SUB = """
func.func @add_sub(%a: memref<?x{T}>, %b: memref<?x{T}>, %s: memref<?x{T}>, %d: memref<?x{T}>) {{
  linalg.add ins(%a, %b : memref<?x{T}>, memref<?x{T}>) outs(%s : memref<?x{T}>)
  linalg.sub ins(%a, %b : memref<?x{T}>, memref<?x{T}>) outs(%d : memref<?x{T}>)
  return
}}
"""

# c = 2 * a, and returns (sum(a), len(a)).
DOUBLE_WITH_RESULTS = """
func.func @double_sum(%a: memref<?xf32>, %c: memref<?xf32>) -> (f32, index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %n = memref.dim %a, %c0 : memref<?xf32>
  %sum = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> (f32) {
    %x = memref.load %a[%i] : memref<?xf32>
    %y = arith.addf %x, %x : f32
    memref.store %y, %c[%i] : memref<?xf32>
    %next = arith.addf %acc, %x : f32
    scf.yield %next : f32
  }
  return %sum, %n : f32, index
}
"""

SUM_COUNT = """
func.func @sum_count(%a: memref<?xf32>) -> (f32, index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %n = memref.dim %a, %c0 : memref<?xf32>
  %sum = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> (f32) {
    %x = memref.load %a[%i] : memref<?xf32>
    %next = arith.addf %acc, %x : f32
    scf.yield %next : f32
  }
  return %sum, %n : f32, index
}
"""

# In place, in ascending order: b[i] = a[i - 1] + b[i]. With a and b one buffer each step
# reads the value the previous step wrote (a running sum); with two buffers it does not.
SHIFTED_ACCUMULATE = """
func.func @shifted_accumulate(%a: memref<?xf32>, %b: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %a, %c0 : memref<?xf32>
  scf.for %i = %c1 to %n step %c1 {
    %p = arith.subi %i, %c1 : index
    %x = memref.load %a[%p] : memref<?xf32>
    %y = memref.load %b[%i] : memref<?xf32>
    %z = arith.addf %x, %y : f32
    memref.store %z, %b[%i] : memref<?xf32>
  }
  return
}
"""


def scale_in_place(T: str) -> str:
    """a[i] = a[i] * s, in place."""
    return loop_map("scale", T, f"%r = arith.mulf %v, %s : {T}", scalar=f"%s: {T}", in_place=True)


def kernel(source: str, name: str, body, T: str | None = None):
    text = source.format(T=T) if T is not None else source
    return mlir_kernel(text, name=name)(body)


@functools.cache
def static_matmul(T):
    return kernel(STATIC_MATMUL, "static_matmul", lambda a, b: None, T)


@functools.cache
def add2d(T):
    return kernel(ADD_2D, "add2d", lambda a, b: None, T)


@functools.cache
def add_sub(T):
    return kernel(ADD_SUB, "add_sub", lambda a, b: None, T)


@functools.cache
def scale(T):
    return kernel(scale_in_place(T), "scale", lambda a, s: None)


@functools.cache
def accumulate():
    return kernel(kernels.accumulate("f32"), "accumulate", lambda a, b: None)


# --------------------------------------------------------------------------------------
# Allocated outputs: static shapes


@pytest.mark.parametrize("T, dtype", NUMERIC)
def test_static_output_has_the_type_shape_and_dtype(T, dtype, rng):
    c = static_matmul(T)(ints(rng, (2, 3), dtype), ints(rng, (3, 4), dtype))
    assert isinstance(c, np.ndarray)
    assert c.shape == (2, 4)
    assert c.dtype == np.dtype(dtype)


@pytest.mark.parametrize("T, dtype", NUMERIC)
def test_static_output_is_zero_filled_before_an_accumulating_kernel(T, dtype, rng):
    a, b = ints(rng, (2, 3), dtype), ints(rng, (3, 4), dtype)
    static_matmul(T).compile()
    # Free a block of the output's size full of junk, so that memory which is not
    # cleared before the kernel runs would show in the result.
    junk = np.full((2, 4), 77, dtype)
    del junk
    np.testing.assert_array_equal(static_matmul(T)(a, b), a @ b)


def test_each_call_allocates_a_fresh_zeroed_output(rng):
    a, b = ints(rng, (2, 3), np.float32), ints(rng, (3, 4), np.float32)
    first = static_matmul("f32")(a, b)
    second = static_matmul("f32")(a, b)
    assert first is not second
    np.testing.assert_array_equal(first, a @ b)
    np.testing.assert_array_equal(second, a @ b)


# --------------------------------------------------------------------------------------
# Allocated outputs: ? dims


@pytest.mark.parametrize("T, dtype", FLOATS)
def test_dynamic_output_shape_comes_from_the_body_return_value(T, dtype, rng):
    # a, b and c share the ?x? pattern but a and b disagree: only the body can give c's shape.
    matmul = kernel(DYNAMIC_MATMUL, "dynamic_matmul", lambda a, b: (a.shape[0], b.shape[1]), T)
    a, b = ints(rng, (5, 3), dtype), ints(rng, (3, 2), dtype)
    c = matmul(a, b)
    assert c.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(c, a @ b)


def test_body_may_return_the_shape_as_a_list(rng):
    matmul = kernel(DYNAMIC_MATMUL, "dynamic_matmul", lambda a, b: [a.shape[0], b.shape[1]], "f32")
    a, b = ints(rng, (5, 3), np.float32), ints(rng, (3, 2), np.float32)
    np.testing.assert_array_equal(matmul(a, b), a @ b)


@pytest.mark.parametrize("T, dtype", FLOATS)
def test_dynamic_output_shape_comes_from_inputs_of_the_same_pattern(T, dtype, rng):
    a, b = ints(rng, (3, 5), dtype), ints(rng, (3, 5), dtype)
    c = add2d(T)(a, b)
    assert c.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(c, a + b)


def test_mixed_static_and_dynamic_output_from_inputs(rng):
    add = kernel(ADD_4XN, "add4xn", lambda a, b: None)
    a, b = ints(rng, (4, 6), np.float32), ints(rng, (4, 6), np.float32)
    np.testing.assert_array_equal(add(a, b), a + b)


def test_mixed_static_and_dynamic_output_from_the_body(rng):
    broadcast = kernel(BROADCAST_4XN, "broadcast", lambda a, b: (4, a.shape[0]))
    a, b = ints(rng, (7,), np.float32), ints(rng, (4,), np.float32)
    np.testing.assert_array_equal(broadcast(a, b), b[:, None] + a[None, :])


def test_several_outputs_shaped_by_a_tuple_with_none_for_the_static_one(rng):
    k = kernel(TRANSPOSE_COLSUM, "transpose_colsum", lambda a: ((3, a.shape[0]), None))
    a = ints(rng, (5, 3), np.float32)
    t, s = k(a)
    np.testing.assert_array_equal(t, a.T)
    np.testing.assert_array_equal(s, a.sum(axis=0))


@pytest.mark.parametrize("T, dtype", FLOATS)
def test_several_outputs_body_returning_none_shapes_each_from_the_inputs(T, dtype, rng):
    a, b = ints(rng, (6,), dtype), ints(rng, (6,), dtype)
    s, d = add_sub(T)(a, b)
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(d, a - b)


# --------------------------------------------------------------------------------------
# out=


@pytest.mark.parametrize("T, dtype", FLOATS)
def test_out_array_is_returned_itself(T, dtype, rng):
    a, b = ints(rng, (3, 4), dtype), ints(rng, (3, 4), dtype)
    out = np.zeros((3, 4), dtype)
    assert add2d(T)(a, b, out=out) is out


@pytest.mark.parametrize("T, dtype", FLOATS)
def test_out_array_is_filled_with_the_result(T, dtype, rng):
    a, b = ints(rng, (3, 4), dtype), ints(rng, (3, 4), dtype)
    out = np.full((3, 4), np.nan, dtype)
    add2d(T)(a, b, out=out)
    np.testing.assert_array_equal(out, a + b)


@pytest.mark.parametrize("T, dtype", FLOATS)
def test_out_tuple_fills_each_given_array(T, dtype, rng):
    a, b = ints(rng, (5,), dtype), ints(rng, (5,), dtype)
    s_out, d_out = np.full(5, np.nan, dtype), np.full(5, np.nan, dtype)
    s, d = add_sub(T)(a, b, out=(s_out, d_out))
    assert s is s_out and d is d_out
    np.testing.assert_array_equal(s_out, a + b)
    np.testing.assert_array_equal(d_out, a - b)


@pytest.mark.parametrize("T, dtype", FLOATS)
def test_out_tuple_none_entry_allocates_that_output(T, dtype, rng):
    a, b = ints(rng, (5,), dtype), ints(rng, (5,), dtype)
    d_out = np.full(5, np.nan, dtype)
    s, d = add_sub(T)(a, b, out=(None, d_out))
    assert d is d_out
    assert s.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(d_out, a - b)


OUT_VIEWS = [
    # (shape of the backing array, view of it that has shape (3, 4))
    pytest.param((6, 9), lambda big: big[::2, 1::2], id="strided"),
    pytest.param((4, 3), lambda big: big.T, id="transposed"),
    pytest.param((3, 7), lambda big: big[:, 2:6], id="column-slice"),
    pytest.param((3, 4), lambda big: big[::-1, ::-1], id="reversed"),
]


@pytest.mark.parametrize("T, dtype", FLOATS)
@pytest.mark.parametrize("big_shape, make_view", OUT_VIEWS)
def test_out_noncontiguous_view_receives_the_result(T, dtype, big_shape, make_view, rng):
    a, b = ints(rng, (3, 4), dtype), ints(rng, (3, 4), dtype)
    big = np.full(big_shape, -100, dtype)
    view = make_view(big)
    returned = add2d(T)(a, b, out=view)
    assert returned is view
    np.testing.assert_array_equal(view, a + b)


@pytest.mark.parametrize("T, dtype", FLOATS)
@pytest.mark.parametrize("big_shape, make_view", OUT_VIEWS)
def test_out_noncontiguous_view_leaves_other_elements_untouched(T, dtype, big_shape, make_view, rng):
    a, b = ints(rng, (3, 4), dtype), ints(rng, (3, 4), dtype)
    big = np.arange(np.prod(big_shape), dtype=dtype).reshape(big_shape) + 1000
    before = big.copy()
    covered = np.zeros(big_shape, bool)
    make_view(covered)[...] = True
    add2d(T)(a, b, out=make_view(big))
    np.testing.assert_array_equal(big[~covered], before[~covered])


# --------------------------------------------------------------------------------------
# Return conventions


def test_outputs_come_first_then_scalar_results(rng):
    k = kernel(DOUBLE_WITH_RESULTS, "double_sum", lambda a: None)
    a = ints(rng, (6,), np.float32)
    returned = k(a)
    assert isinstance(returned, tuple) and len(returned) == 3
    c, total, n = returned
    np.testing.assert_array_equal(c, 2 * a)
    assert total == a.sum()
    assert n == len(a)


def test_single_output_is_returned_bare(rng):
    a, b = ints(rng, (2, 3), np.float32), ints(rng, (2, 3), np.float32)
    assert isinstance(add2d("f32")(a, b), np.ndarray)


@pytest.mark.parametrize("T, dtype", FLOATS)
def test_single_scalar_result_is_returned_as_the_value(T, dtype, rng):
    total = kernel(loop_total(T), "total", lambda a: None)
    a = ints(rng, (9,), dtype)
    result = total(a)
    assert not isinstance(result, tuple)
    assert result.dtype == np.dtype(dtype)
    assert result == a.sum()


def test_several_scalar_results_are_returned_as_a_tuple(rng):
    k = kernel(SUM_COUNT, "sum_count", lambda a: None)
    a = ints(rng, (5,), np.float32)
    assert k(a) == (a.sum(), len(a))


@pytest.mark.parametrize("T, dtype", FLOATS)
def test_in_place_style_returns_none_and_modifies_the_array(T, dtype, rng):
    x = ints(rng, (7,), dtype)
    expected = x * dtype(3)
    assert scale(T)(x, 3.0) is None
    np.testing.assert_array_equal(x, expected)


IN_PLACE_VIEWS = [
    pytest.param(lambda base: base[::2], id="every-other"),
    pytest.param(lambda base: base[::-1], id="reversed"),
    pytest.param(lambda base: base[1::3], id="offset-stride-3"),
    pytest.param(lambda base: base.reshape(4, 3)[:, 1], id="column-of-2d"),
]


@pytest.mark.parametrize("T, dtype", FLOATS)
@pytest.mark.parametrize("make_view", IN_PLACE_VIEWS)
def test_in_place_write_to_a_noncontiguous_view_lands_in_the_caller_view(T, dtype, make_view, rng):
    base = ints(rng, (12,), dtype)
    expected = base.copy()
    make_view(expected)[...] *= dtype(3)
    scale(T)(make_view(base), 3.0)
    np.testing.assert_array_equal(base, expected)  # the view scaled, every other element as it was


@pytest.mark.parametrize("make_view", [pytest.param(lambda x: x, id="contiguous"), *IN_PLACE_VIEWS])
def test_same_array_passed_twice_in_place_matches_numpy_in_place_add(make_view, rng):
    base = ints(rng, (12,), np.float32)
    expected = base.copy()
    view = make_view(expected)
    view += view
    x = make_view(base)
    accumulate()(x, x)
    np.testing.assert_array_equal(base, expected)


@pytest.mark.parametrize("make_view", [pytest.param(lambda x: x, id="contiguous"), *IN_PLACE_VIEWS])
def test_same_array_passed_twice_in_place_is_one_buffer(make_view, rng):
    # b[i] = a[i-1] + b[i] in ascending i: on one buffer that is a running sum.
    shifted = kernel(SHIFTED_ACCUMULATE, "shifted_accumulate", lambda a, b: None)
    base = ints(rng, (12,), np.float32)
    expected = base.copy()
    make_view(expected)[...] = np.cumsum(make_view(expected))
    x = make_view(base)
    shifted(x, x)
    np.testing.assert_array_equal(base, expected)


# --------------------------------------------------------------------------------------
# The decorated function's body


def test_body_is_called_with_the_call_arguments(rng):
    recorder = Recorder(lambda a, b: (a.shape[0], b.shape[1]))
    iota = kernel(IOTA_2D, "iota2d", lambda a, b: recorder.body(a, b))
    a, b = ints(rng, (2, 3), np.float32), ints(rng, (3, 4), np.float32)
    np.testing.assert_array_equal(iota(a, b), np.arange(8, dtype=np.float32).reshape(2, 4))
    assert len(recorder.calls) == 1
    assert recorder.calls[0][0] is a and recorder.calls[0][1] is b


def test_body_receives_keyword_arguments_in_parameter_order(rng):
    recorder = Recorder(lambda a, b: (a.shape[0], b.shape[1]))
    iota = kernel(IOTA_2D, "iota2d", lambda a, b: recorder.body(a, b))
    a, b = ints(rng, (2, 3), np.float32), ints(rng, (3, 4), np.float32)
    np.testing.assert_array_equal(iota(b=b, a=a), np.arange(8, dtype=np.float32).reshape(2, 4))
    assert recorder.calls[0][0] is a and recorder.calls[0][1] is b


def test_body_is_called_once_per_call_for_several_dynamic_outputs(rng):
    recorder = Recorder()
    k = kernel(UNTIED_TWO_OUTPUTS, "untied_two", lambda a, b: recorder.body(a, b))
    a, b = ints(rng, (4,), np.float32), ints(rng, (4,), np.float32)
    k(a, b)
    k(a, b)
    assert len(recorder.calls) == 2


@pytest.mark.parametrize("source, name", [(DYNAMIC_MATMUL, "dynamic_matmul"), (ADD_SUB, "add_sub")])
def test_body_is_not_called_when_the_kernels_ties_give_every_output_dim(source, name, rng):
    recorder = Recorder()
    k = kernel(source, name, lambda a, b: recorder.body(a, b), "f32")
    shapes = ((2, 3), (3, 4)) if name == "dynamic_matmul" else ((4,), (4,))
    a, b = ints(rng, shapes[0], np.float32), ints(rng, shapes[1], np.float32)
    expected = a @ b if name == "dynamic_matmul" else (a + b, a - b)
    for got, want in zip(k(a, b) if name == "add_sub" else (k(a, b),), expected if name == "add_sub" else (expected,)):
        np.testing.assert_array_equal(got, want)
    assert recorder.calls == []


def test_body_is_not_called_when_every_output_is_static(rng):
    recorder = Recorder()
    matmul = kernel(STATIC_MATMUL, "static_matmul", lambda a, b: recorder.body(a, b), "f32")
    a, b = ints(rng, (2, 3), np.float32), ints(rng, (3, 4), np.float32)
    np.testing.assert_array_equal(matmul(a, b), a @ b)
    assert recorder.calls == []


def test_body_is_not_called_when_out_supplies_the_dynamic_output(rng):
    recorder = Recorder()
    add = kernel(ADD_2D, "add2d", lambda a, b: recorder.body(a, b), "f32")
    a, b = ints(rng, (2, 3), np.float32), ints(rng, (2, 3), np.float32)
    add(a, b, out=np.zeros((2, 3), np.float32))
    assert recorder.calls == []


def test_body_is_not_called_when_out_leaves_only_a_static_output(rng):
    recorder = Recorder()
    k = kernel(TRANSPOSE_COLSUM, "transpose_colsum", lambda a: recorder.body(a))
    a = ints(rng, (5, 3), np.float32)
    t_out = np.zeros((3, 5), np.float32)
    t, s = k(a, out=(t_out, None))
    assert recorder.calls == []
    assert t is t_out
    np.testing.assert_array_equal(t_out, a.T)
    np.testing.assert_array_equal(s, a.sum(axis=0))


def test_body_is_not_called_in_in_place_style(rng):
    recorder = Recorder()
    k = kernel(scale_in_place("f32"), "scale", lambda a, s: recorder.body(a, s))
    k(ints(rng, (3,), np.float32), 2.0)
    assert recorder.calls == []
