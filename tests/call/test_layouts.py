"""Strides, offsets, views and layouts: the seed's lessons, checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memkernel import ArgumentError, mlir_kernel

from .. import kernels
from ..kernels import elementwise, loop_map

DTYPES = [np.float32, np.float64]
MLIR = {np.float32: "f32", np.float64: "f64"}

STRIDED_2D = "strided<[?, ?], offset: ?>"


def add_kernel(memref: str, element: str, rank: int = 2):
    return mlir_kernel(elementwise("arith.addf", memref, element, rank), name="k")(lambda a, b: None)


@pytest.fixture(scope="module", params=DTYPES, ids=["f32", "f64"])
def dtype(request):
    return request.param


@pytest.fixture(scope="module")
def dynamic_add(dtype):
    return add_kernel(f"memref<?x?x{MLIR[dtype]}>", MLIR[dtype])


@pytest.fixture(scope="module")
def strided_add(dtype):
    return add_kernel(f"memref<?x?x{MLIR[dtype]}, {STRIDED_2D}>", MLIR[dtype])


def data(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# -- the seed's 2-D adds --------------------------------------------------------


@pytest.mark.parametrize("memref", ["memref<?x?x{t}>", "memref<3x5x{t}>", "memref<3x?x{t}>", "memref<?x5x{t}>"],
                         ids=["dynamic", "static", "mixed-3x?", "mixed-?x5"])
def test_2d_add_matches_numpy(memref, dtype):
    kernel = add_kernel(memref.format(t=MLIR[dtype]), MLIR[dtype])
    a, b = data((3, 5), dtype, 1), data((3, 5), dtype, 2)
    c = kernel(a, b)
    assert c.dtype == dtype
    np.testing.assert_array_equal(c, a + b)


# -- views through identity layouts (copied to contiguous buffers) -----------------

VIEWS = {
    "step-slice": lambda x: x[::2, ::3],
    "transpose": lambda x: x.T,
    "negative-strides": lambda x: x[::-1, ::-2],
    "offset": lambda x: x[1:, 2:],
    "fortran-order": lambda x: np.asfortranarray(x),
}


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
def test_view_input_to_identity_layout_gives_numpy_answer(view, dynamic_add, dtype):
    base_a, base_b = data((8, 9), dtype, 1), data((8, 9), dtype, 2)
    a, b = view(base_a), view(base_b)
    np.testing.assert_array_equal(dynamic_add(a, b), a + b)


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
def test_view_input_to_identity_layout_is_left_unchanged(view, dynamic_add, dtype):
    base = data((8, 9), dtype, 1)
    before = base.copy()
    dynamic_add(view(base), view(base))
    np.testing.assert_array_equal(base, before)


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
def test_view_output_to_identity_layout_is_written_without_touching_gaps(view, dynamic_add, dtype):
    a_base, b_base = data((8, 9), dtype, 1), data((8, 9), dtype, 2)
    big = np.full((8, 9), -7.0, dtype)
    out = view(big)
    a, b = view(a_base), view(b_base)
    expected_big = big.copy()
    view(expected_big)[...] = a + b
    returned = dynamic_add(a, b, out=out)
    assert returned is out
    np.testing.assert_array_equal(big, expected_big)


def test_static_identity_memref_accepts_a_transposed_view(dtype):
    kernel = add_kernel(f"memref<4x3x{MLIR[dtype]}>", MLIR[dtype])
    a, b = data((3, 4), dtype, 1).T, data((3, 4), dtype, 2).T
    np.testing.assert_array_equal(kernel(a, b), a + b)


# -- views through strided layouts (passed zero-copy) -------------------------------


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
def test_view_input_to_strided_layout_gives_numpy_answer(view, strided_add, dtype):
    a, b = view(data((8, 9), dtype, 1)), view(data((8, 9), dtype, 2))
    np.testing.assert_array_equal(strided_add(a, b), a + b)


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
def test_view_output_to_strided_layout_is_written_without_touching_gaps(view, strided_add, dtype):
    a, b = view(data((8, 9), dtype, 1)), view(data((8, 9), dtype, 2))
    big = np.full((8, 9), 5.0, dtype)
    expected_big = big.copy()
    view(expected_big)[...] = a + b
    assert strided_add(a, b, out=view(big)) is not None
    np.testing.assert_array_equal(big, expected_big)


POINTER_OF = """
func.func @where(%a: memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> (index, index, index, index) {{
  %base, %offset, %sizes:2, %strides:2 = memref.extract_strided_metadata %a
      : memref<?x?x{t}, strided<[?, ?], offset: ?>> -> memref<{t}>, index, index, index, index, index
  %p = memref.extract_aligned_pointer_as_index %a : memref<?x?x{t}, strided<[?, ?], offset: ?>> -> index
  return %p, %offset, %strides#0, %strides#1 : index, index, index, index
}}
"""


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
def test_strided_layout_describes_the_callers_memory_in_elements(view, dtype):
    @mlir_kernel(POINTER_OF.format(t=MLIR[dtype]))
    def where(a): ...

    a = view(data((8, 9), dtype))
    pointer, offset, s0, s1 = (int(x) for x in where(a))
    itemsize = a.itemsize
    assert pointer + offset * itemsize == a.ctypes.data
    assert (s0 * itemsize, s1 * itemsize) == a.strides


def test_static_offset_sets_the_aligned_pointer_back(dtype):
    t = MLIR[dtype]
    memref = f"memref<?x?x{t}, strided<[?, 1], offset: 3>>"
    source = f"""
func.func @first(%a: {memref}) -> {t} {{
  %c0 = arith.constant 0 : index
  %v = memref.load %a[%c0, %c0] : {memref}
  return %v : {t}
}}"""

    @mlir_kernel(source)
    def first(a): ...

    a = data((4, 6), dtype)[1:, 2:]
    assert first(a) == a[0, 0]


def test_static_strides_that_match_are_passed_zero_copy(dtype):
    t = MLIR[dtype]
    memref = f"memref<4x4x{t}, strided<[8, 1]>>"
    kernel = add_kernel(memref, t)
    big_a, big_b = data((4, 8), dtype, 1), data((4, 8), dtype, 2)
    out_big = np.zeros((4, 8), dtype)
    kernel(big_a[:, :4], big_b[:, :4], out=out_big[:, :4])
    np.testing.assert_array_equal(out_big[:, :4], big_a[:, :4] + big_b[:, :4])
    np.testing.assert_array_equal(out_big[:, 4:], 0)


def test_static_strides_that_no_copy_can_realize_are_an_error(dtype):
    t = MLIR[dtype]
    kernel = add_kernel(f"memref<4x4x{t}, strided<[8, 1]>>", t)
    a = data((4, 4), dtype)
    with pytest.raises(ArgumentError, match=r"argument 'a' expects memref<4x4x.*strided<\[8, 1\]>>.*strides"):
        kernel(a, a)


def test_column_major_static_strides_take_a_c_ordered_array_by_copy(dtype):
    t = MLIR[dtype]
    kernel = add_kernel(f"memref<3x4x{t}, strided<[1, 3]>>", t)
    a, b = data((3, 4), dtype, 1), data((3, 4), dtype, 2)
    np.testing.assert_array_equal(kernel(a, b), a + b)


def test_byte_strides_not_divisible_by_itemsize_are_copied(dtype):
    record = np.zeros(6, dtype=[("tag", np.int8), ("x", dtype)])  # packed: unaligned, odd strides
    record["x"] = np.arange(6)
    kernel = add_kernel(f"memref<?x{MLIR[dtype]}, strided<[?], offset: ?>>", MLIR[dtype], rank=1)
    field = record["x"]
    assert field.strides[0] % field.itemsize != 0
    np.testing.assert_array_equal(kernel(field, field), 2 * np.arange(6, dtype=dtype))


def test_structured_array_field_to_identity_layout_is_copied(dtype):
    record = np.zeros(5, dtype=np.dtype([("a", np.int32), ("x", dtype)], align=True))
    record["x"] = np.arange(5) * 1.5
    kernel = add_kernel(f"memref<?x{MLIR[dtype]}>", MLIR[dtype], rank=1)
    np.testing.assert_array_equal(kernel(record["x"], record["x"]), 3.0 * np.arange(5, dtype=dtype))


def test_size_one_dim_with_a_stride_unlike_the_layouts_is_accepted(dtype):
    t = MLIR[dtype]
    kernel = add_kernel(f"memref<1x4x{t}, strided<[4, 1]>>", t)
    big = data((5, 4), dtype)
    odd = np.lib.stride_tricks.as_strided(big[2:], shape=(1, 4), strides=(999 * big.itemsize, big.itemsize))
    np.testing.assert_array_equal(kernel(odd, odd), odd + odd)


# -- in-place style: writes land in the caller's array --------------------------------

def test_in_place_write_to_a_copied_view_is_copied_back(dtype):
    t = MLIR[dtype]
    @mlir_kernel(loop_map("scale", t, f"%two = arith.constant 2.0 : {t}", f"%r = arith.mulf %v, %two : {t}",
                          in_place=True))
    def scale(x): ...

    base = data(10, dtype)
    expected = base.copy()
    expected[::-3] *= 2
    assert scale(base[::-3]) is None
    np.testing.assert_array_equal(base, expected)


def test_same_view_passed_twice_stays_one_buffer(dtype):
    @mlir_kernel(kernels.accumulate(MLIR[dtype]))
    def accumulate(a, b): ...

    base = data(12, dtype)
    expected = base.copy()
    view = expected[1::2]
    view += view
    accumulate(base[1::2], base[1::2])
    np.testing.assert_array_equal(base, expected)


# -- 0-d and unranked -------------------------------------------------------------------

ZERO_D = """
func.func @axpy0(%a: {t}, %x: memref<{t}>, %y: memref<{t}>) {{
  %v = memref.load %x[] : memref<{t}>
  %w = arith.mulf %a, %v : {t}
  memref.store %w, %y[] : memref<{t}>
  return
}}
"""


def test_zero_d_memrefs_in_and_out(dtype):
    @mlir_kernel(ZERO_D.format(t=MLIR[dtype]))
    def axpy0(a, x): ...

    y = axpy0(3.0, np.array(2.5, dtype))
    assert y.shape == () and y.dtype == dtype
    assert y[()] == dtype(3.0) * dtype(2.5)


UNRANKED_SUM = """
func.func @total(%u: memref<*x{t}>) -> {t} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %flat = memref.cast %u : memref<*x{t}> to memref<?x{t}>
  %n = memref.dim %flat, %c0 : memref<?x{t}>
  %zero = arith.constant 0.0 : {t}
  %s = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> {t} {{
    %v = memref.load %flat[%i] : memref<?x{t}>
    %r = arith.addf %acc, %v : {t}
    scf.yield %r : {t}
  }}
  return %s : {t}
}}
"""

UNRANKED_RANK = """
func.func @rank(%u: memref<*x{t}>) -> index {{
  %r = memref.rank %u : memref<*x{t}>
  return %r : index
}}
"""


@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 4)])
def test_unranked_memref_takes_any_rank(shape, dtype):
    @mlir_kernel(UNRANKED_RANK.format(t=MLIR[dtype]))
    def rank(u): ...

    assert rank(np.zeros(shape, dtype)) == len(shape)


def test_unranked_memref_gets_a_contiguous_buffer(dtype):
    @mlir_kernel(UNRANKED_SUM.format(t=MLIR[dtype]))
    def total(u): ...

    view = data(20, dtype)[::-3]
    assert total(view) == pytest.approx(float(np.sum(view, dtype=np.float64)), rel=1e-5)


# -- the space of shapes and strides ---------------------------------------------------

slices = st.tuples(st.integers(0, 3), st.sampled_from([1, 2, 3, -1, -2]))


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 9), s0=slices, s1=slices, transpose=st.booleans())
def test_any_view_through_either_layout_matches_numpy(rows, cols, s0, s1, transpose):
    kernels = [_ADD_F64_IDENTITY, _ADD_F64_STRIDED]
    base = np.arange(rows * cols, dtype=np.float64).reshape(rows, cols)
    view = base[s0[0]::s0[1], s1[0]::s1[1]]
    if transpose:
        view = view.T
    for kernel in kernels:
        out_big = np.full((view.shape[0] * 2 + 1, view.shape[1] * 2 + 1), -1.0)
        out = out_big[1::2, 1::2]
        kernel(view, view * 10, out=out)
        np.testing.assert_array_equal(out, view + view * 10)
        assert np.all(out_big[0::2] == -1.0) and np.all(out_big[:, 0::2] == -1.0)


_ADD_F64_IDENTITY = add_kernel("memref<?x?xf64>", "f64")
_ADD_F64_STRIDED = add_kernel(f"memref<?x?xf64, {STRIDED_2D}>", "f64")
