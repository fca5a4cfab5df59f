"""The compiled entry: calling a compiled kernel reaches machine code that takes ``out=``, allocates and returns.

What it does not take (keywords other than ``out=``, values the fast path
declines, outputs it cannot shape) goes on to the Python path, which gives
the same answers and the same errors.
"""

from __future__ import annotations

import gc
import re
import sys
import weakref

import numpy as np
import pytest

from memkernel import AllocationError, ArgumentError, Kernel, MemkernelError, ShapeError, mlir_kernel

from memkernel.call import allocation

from ..kernels import elementwise, loop_map, total
from .conftest import HAS_ENTRIES, with_fast_path

pytestmark = pytest.mark.skipif(not HAS_ENTRIES, reason="Python 3.10 exports no PyObject_Vectorcall: no compiled "
                                                        "entries there, calls take the fast path's builtin")

FIRST_ONLY = """
func.func @first_only(%x: memref<?xf32>, %y: memref<64xf32>) {
  %c0 = arith.constant 0 : index
  %v = memref.load %x[%c0] : memref<?xf32>
  memref.store %v, %y[%c0] : memref<64xf32>
  return
}"""

UNTIED = """
func.func @untied(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %v = memref.load %x[%c0] : memref<?xf32>
  memref.store %v, %y[%c0] : memref<?xf32>
  return
}"""

TOO_BIG = """
func.func @too_big(%x: memref<?xf32>, %y: memref<1152921504606846976xf32>) {
  return
}"""

INCREMENT = loop_map("increment", "i64", "%one = arith.constant 1 : i64", "%r = arith.addi %v, %one : i64",
                     in_place=True)

TOTAL = total()

SUM = """
func.func @total(%x: memref<?xf64>) -> f64 {
  %c0 = arith.constant 0 : index
  %v = memref.load %x[%c0] : memref<?xf64>
  return %v : f64
}"""


def _add(**options) -> Kernel:
    return mlir_kernel(elementwise("arith.addf", "memref<?x?xf32>", "f32", 2), name="k", cache=False,
                       **options)(lambda a, b: None)


def _operands() -> tuple[np.ndarray, np.ndarray]:
    return np.arange(12, dtype=np.float32).reshape(3, 4), np.full((3, 4), 0.5, np.float32)


def _has_entry(kernel: Kernel) -> bool:
    entry = kernel.invoker.entry
    return entry is not None and type(kernel).__call__ is entry


@pytest.fixture
def python_allocation_refused(monkeypatch):
    """Allocating an output in Python fails the test: the compiled entry must allocate it."""

    def refused(*args):
        raise AssertionError(f"the output was allocated in Python: {args}")

    monkeypatch.setattr(allocation, "zeros", refused)


@pytest.fixture
def add() -> Kernel:
    return with_fast_path(_add())


def test_a_compiled_kernel_is_called_through_its_entry_and_still_looks_like_a_kernel(add):
    assert _has_entry(add)
    assert isinstance(add, Kernel) and type(add).__name__ == "Kernel" and type(add).__module__ == Kernel.__module__
    assert repr(add).startswith("<memkernel.Kernel k(")


def test_out_by_keyword_is_written_and_returned(add):
    a, b = _operands()
    out = np.full((3, 4), 7, np.float32)
    assert add(a, b, out=out) is out
    np.testing.assert_array_equal(out, a + b)
    assert add.invoker.last_path == "fast"


@pytest.mark.parametrize("call", [lambda k, a, b: k(a, b), lambda k, a, b: k(a, b, out=None)],
                         ids=["no out", "out=None"])
def test_the_output_is_allocated_in_compiled_code(add, call, python_allocation_refused):
    a, b = _operands()
    got = call(add, a, b)
    assert type(got) is np.ndarray and got.dtype == np.float32 and got.flags.c_contiguous and got.flags.owndata
    np.testing.assert_array_equal(got, a + b)
    assert add.invoker.last_path == "fast"


def test_an_allocated_output_is_zero_where_the_kernel_does_not_write(python_allocation_refused):
    first_only = with_fast_path(mlir_kernel(FIRST_ONLY, cache=False)(lambda x: None))
    assert _has_entry(first_only)
    x = np.arange(1.0, 65.0, dtype=np.float32)
    for _ in range(50):
        junk = np.full(64, 9.0, np.float32)
        del junk  # numpy hands its memory to the next array of that size
        got = first_only(x)
        np.testing.assert_array_equal(got, np.r_[1.0, np.zeros(63)].astype(np.float32))
    assert first_only.invoker.last_path == "fast"


@pytest.mark.parametrize("call", [
    lambda k, a, b: k(a, b=b),
    lambda k, a, b: k(a=a, b=b),
    lambda k, a, b: k(a, b, **{"".join(["o", "ut"]): None}),  # a keyword name that is not the interned "out"
    lambda k, a, b: k(*[a, b], out=(None,)),
    lambda k, a, b: k(a.tolist(), b),
    lambda k, a, b: k(a.T.copy().T, b),
], ids=["keyword input", "keyword inputs", "uninterned out", "out tuple", "list input", "fortran input"])
def test_calls_the_entry_declines_give_the_same_answer(add, call):
    a, b = _operands()
    np.testing.assert_array_equal(call(add, a, b), a + b)
    assert add.invoker.last_path in ("fast", "checked")


@pytest.mark.parametrize("call, message", [
    (lambda k, a, b: k(a, b, a), "takes 2 positional arguments but 3 were given"),
    (lambda k, a, b: k(a, b, c=a), "got an unexpected keyword argument 'c'"),
    (lambda k, a, b: k(a), "missing argument 'b'"),
    (lambda k, a, b: k(a, b.astype(np.float64)), "argument 'b' expects memref<?x?xf32> (float32, 2-d); got float64"),
    (lambda k, a, b: k(a, b[:2]), "a has 3 elements on dim 0 but b has 2"),
    (lambda k, a, b: k(a, b, out=np.zeros((3, 4))), "'out' expects memref<?x?xf32> (float32, 2-d); got float64"),
], ids=["too many", "unknown keyword", "missing", "dtype", "shape", "out dtype"])
def test_errors_come_from_the_python_path_unchanged(add, call, message):
    a, b = _operands()
    checked = with_fast_path(_add(), enabled=False)
    with pytest.raises(MemkernelError) as from_checked:
        call(checked, a, b)
    assert message in str(from_checked.value)
    with pytest.raises(type(from_checked.value), match=re.escape(str(from_checked.value))):
        call(add, a, b)


def test_an_allocation_numpy_refuses_is_explained_by_the_python_path():
    too_big = with_fast_path(mlir_kernel(TOO_BIG, cache=False)(lambda x: None))
    checked = with_fast_path(mlir_kernel(TOO_BIG, cache=False)(lambda x: None), enabled=False)
    assert _has_entry(too_big)
    x = np.zeros(3, np.float32)
    with pytest.raises(AllocationError) as expected:  # 4 EiB: a size int64 can count, memory cannot hold
        checked(x)
    with pytest.raises(AllocationError, match=re.escape(str(expected.value))):
        too_big(x)
    with pytest.raises(AllocationError, match=re.escape(str(expected.value))):
        too_big(x, out=None)


def test_a_0_d_output_that_the_kernel_accumulates_into_starts_at_zero(python_allocation_refused):
    total = with_fast_path(mlir_kernel(TOTAL, cache=False)(lambda x: None))
    assert _has_entry(total)
    x = np.arange(10, dtype=np.float32)
    for _ in range(3):  # each call a fresh zero: nothing carried over from the last
        got = total(x)
        assert got.shape == () and got.dtype == np.float32 and got == x.sum()
    assert total.invoker.last_path == "fast"


def test_an_output_the_ties_do_not_shape_is_shaped_by_the_python_path(monkeypatch):
    untied = with_fast_path(mlir_kernel(UNTIED, cache=False)(lambda x: (5,)))
    assert _has_entry(untied)
    shapes = []
    monkeypatch.setattr(allocation, "zeros", lambda kernel, name, shape, dtype: shapes.append(shape) or
                        np.zeros(shape, dtype))
    got = untied(np.arange(1.0, 4.0, dtype=np.float32))
    np.testing.assert_array_equal(got, [1.0, 0.0, 0.0, 0.0, 0.0])
    assert shapes == [(5,)]


def test_kernels_sharing_compiled_code_each_keep_their_own_python_path():
    """Two kernels of one source share the compiled code in this process, not their shape functions."""
    three = with_fast_path(mlir_kernel(UNTIED, name="untied")(lambda x: (3,)))
    five = with_fast_path(mlir_kernel(UNTIED, name="untied")(lambda x: (5,)))
    x = np.arange(1.0, 4.0, dtype=np.float32)
    assert three(x).shape == (3,) and five(x).shape == (5,) and three(x).shape == (3,)


def test_an_in_place_kernel_returns_none_and_takes_no_out():
    increment = with_fast_path(mlir_kernel(INCREMENT, cache=False)(lambda x: None))
    assert _has_entry(increment)
    x = np.arange(5)
    assert increment(x) is None
    np.testing.assert_array_equal(x, np.arange(1, 6))
    assert increment.invoker.last_path == "fast"
    with pytest.raises(ArgumentError, match="takes no out=: the kernel has no output arguments"):
        increment(x, out=x)
    np.testing.assert_array_equal(x, np.arange(1, 6))


def test_references_are_counted_right():
    """Many calls leave ``out``, None and the dtype with the references they had; results are owned once."""
    add = with_fast_path(_add())
    a, b = _operands()
    out = np.zeros((3, 4), np.float32)
    dtype = np.dtype(np.float32)
    add(a, b, out=out)
    add(a, b)
    before = [sys.getrefcount(x) for x in (out, a, b, dtype, None)]
    for _ in range(1000):
        add(a, b, out=out)
        add(a, b)
        add(a, b, out=None)
    assert [sys.getrefcount(x) for x in (out, a, b, dtype, None)] == before
    made = add(a, b)
    assert sys.getrefcount(made) == 2  # ``made`` and the argument


def test_a_kernel_called_through_its_entry_is_collected_when_dropped():
    """The entry holds the invoker (through its fallback) and the invoker the entry: a cycle the GC frees."""
    add = with_fast_path(_add())
    a, b = _operands()
    add(a, b)
    kernel, invoker, kernel_type = weakref.ref(add), weakref.ref(add.invoker), weakref.ref(type(add))
    del add
    gc.collect()
    assert kernel() is None and invoker() is None and kernel_type() is None


@pytest.mark.parametrize("make", [
    lambda: with_fast_path(_add(), enabled=False),
    lambda: with_fast_path(_add(capture_output=True)),
    lambda: with_fast_path(mlir_kernel(SUM, cache=False)(lambda x: None)),
], ids=["MEMKERNEL_FAST_PATH=0", "capture_output=True", "scalar result"])
def test_kernels_that_keep_their_python_wrapping_get_no_entry(make):
    kernel = make()
    assert kernel.invoker.entry is None
    assert type(kernel) is Kernel


def test_a_kernel_with_callbacks_gets_no_entry():
    source = """
func.func private @seen(f32)
func.func @watched(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %v = memref.load %x[%c0] : memref<?xf32>
  func.call @seen(%v) : (f32) -> ()
  memref.store %v, %y[%c0] : memref<?xf32>
  return
}"""
    seen = []
    watched = with_fast_path(mlir_kernel(source, callbacks={"seen": seen.append})(lambda x: None))
    assert watched.invoker.entry is None and type(watched) is Kernel
    np.testing.assert_array_equal(watched(np.array([2.0, 3.0], np.float32)), [2.0, 0.0])
    assert seen == [2.0]
