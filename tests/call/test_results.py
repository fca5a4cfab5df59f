"""Memrefs returned by a kernel become numpy arrays that own their memory."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import numpy as np
import pytest

import memkernel.call.results
from memkernel import AllocationError, mlir_kernel

REPO = str(Path(__file__).resolve().parents[2])

# iota(n)[i] = i * step, for the element type T.
IOTA = """
func.func @iota(%n: index, %step: {t}) -> memref<?x{t}> {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %out = memref.alloc(%n) : memref<?x{t}>
  scf.for %i = %c0 to %n step %c1 {{
    %ii = arith.index_cast %i : index to i64
    %f = arith.sitofp %ii : i64 to {t}
    %v = arith.mulf %f, %step : {t}
    memref.store %v, %out[%i] : memref<?x{t}>
  }}
  return %out : memref<?x{t}>
}}"""


@pytest.fixture
def freed(monkeypatch):
    """The allocated pointers memkernel frees, recorded as they are freed."""
    pointers = []
    real = memkernel.call.results._free

    def recording(pointer):
        pointers.append(pointer)
        real(pointer)

    monkeypatch.setattr(memkernel.call.results, "_free", recording)
    return pointers


@pytest.mark.parametrize("t, dtype", [("f32", np.float32), ("f64", np.float64)])
def test_allocated_dynamic_result_is_an_array_of_the_right_dtype(t, dtype):
    @mlir_kernel(IOTA.format(t=t))
    def iota(n, step): ...

    result = iota(6, 0.5)
    assert result.dtype == dtype and result.shape == (6,)
    np.testing.assert_array_equal(result, np.arange(6, dtype=dtype) * dtype(0.5))


def test_allocated_static_result():
    @mlir_kernel("""
func.func @eye() -> memref<3x3xf64> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %one = arith.constant 1.0 : f64
  %zero = arith.constant 0.0 : f64
  %m = memref.alloc() : memref<3x3xf64>
  linalg.fill ins(%zero : f64) outs(%m : memref<3x3xf64>)
  scf.for %i = %c0 to %c3 step %c1 {
    memref.store %one, %m[%i, %i] : memref<3x3xf64>
  }
  return %m : memref<3x3xf64>
}""")
    def eye(): ...

    np.testing.assert_array_equal(eye(), np.eye(3))


def test_result_owns_its_heap_buffer_and_frees_it_once(freed):
    @mlir_kernel(IOTA.format(t="f64"))
    def iota(n, step): ...

    result = iota(4, 1.0)
    assert result.flags.writeable
    result[0] = 42.0  # the memory is the array's to write
    probe = weakref.ref(result.base)
    pointer = result.base.base.owner.allocated
    del result
    gc.collect()
    assert probe() is None
    assert freed == [pointer]


SUBVIEW = """
func.func @middle(%n: index) -> memref<?x?xf32, strided<[?, 2], offset: ?>> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %m = memref.alloc(%n, %n) : memref<?x?xf32>
  scf.for %i = %c0 to %n step %c1 {
    scf.for %j = %c0 to %n step %c1 {
      %k = arith.muli %i, %n : index
      %l = arith.addi %k, %j : index
      %li = arith.index_cast %l : index to i64
      %f = arith.sitofp %li : i64 to f32
      memref.store %f, %m[%i, %j] : memref<?x?xf32>
    }
  }
  %rows = arith.subi %n, %c2 : index
  %cols = arith.divui %n, %c2 : index
  %s = memref.subview %m[1, 0] [%rows, %cols] [1, 2]
      : memref<?x?xf32> to memref<?x?xf32, strided<[?, 2], offset: ?>>
  return %s : memref<?x?xf32, strided<[?, 2], offset: ?>>
}"""


def test_strided_subview_result_honours_offset_and_strides(freed):
    @mlir_kernel(SUBVIEW)
    def middle(n): ...

    full = np.arange(36, dtype=np.float32).reshape(6, 6)
    result = middle(6)
    np.testing.assert_array_equal(result, full[1:5, 0:6:2])
    assert result.strides == full[1:5, 0:6:2].strides
    del result
    gc.collect()
    assert len(freed) == 1


def test_unranked_result_has_the_rank_the_kernel_gave_it():
    @mlir_kernel("""
func.func @grid(%n: index) -> memref<*xi32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %seven = arith.constant 7 : i32
  %m = memref.alloc(%n, %n) : memref<?x?xi32>
  linalg.fill ins(%seven : i32) outs(%m : memref<?x?xi32>)
  %u = memref.cast %m : memref<?x?xi32> to memref<*xi32>
  return %u : memref<*xi32>
}""")
    def grid(n): ...

    np.testing.assert_array_equal(grid(3), np.full((3, 3), 7, np.int32))


def test_zero_d_result():
    @mlir_kernel("""
func.func @total(%x: memref<?xi64>) -> memref<i64> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xi64>
  %acc = memref.alloc() : memref<i64>
  %zero = arith.constant 0 : i64
  memref.store %zero, %acc[] : memref<i64>
  scf.for %i = %c0 to %n step %c1 {
    %v = memref.load %x[%i] : memref<?xi64>
    %a = memref.load %acc[] : memref<i64>
    %s = arith.addi %a, %v : i64
    memref.store %s, %acc[] : memref<i64>
  }
  return %acc : memref<i64>
}""")
    def total(x): ...

    x = np.arange(11, dtype=np.int64)
    result = total(x)
    assert result.shape == () and result.dtype == np.int64 and result[()] == x.sum()


ALIAS = """
func.func @tail(%x: memref<?xf32>) -> memref<?xf32, strided<[1], offset: 1>> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %m = arith.subi %n, %c1 : index
  %s = memref.subview %x[1] [%m] [1] : memref<?xf32> to memref<?xf32, strided<[1], offset: 1>>
  return %s : memref<?xf32, strided<[1], offset: 1>>
}"""


def test_result_aliasing_an_argument_is_a_view_of_the_callers_array(freed):
    @mlir_kernel(ALIAS)
    def tail(x): ...

    x = np.arange(5, dtype=np.float32)
    result = tail(x)
    np.testing.assert_array_equal(result, x[1:])
    result[0] = -1.0
    assert x[1] == -1.0
    del result
    gc.collect()
    assert freed == []


def test_result_from_a_global_is_a_copy_never_freed(freed):
    @mlir_kernel("""
memref.global "private" constant @data : memref<4xf32> = dense<[1.0, 2.0, 3.0, 4.0]>
func.func @table() -> memref<4xf32> {
  %g = memref.get_global @data : memref<4xf32>
  return %g : memref<4xf32>
}""")
    def table(): ...

    first = table()
    first[0] = 100.0  # a copy: the global is untouched
    second = table()
    np.testing.assert_array_equal(second, [1.0, 2.0, 3.0, 4.0])
    del first, second
    gc.collect()
    assert freed == []


def test_two_results_sharing_one_buffer_free_it_once(freed):
    @mlir_kernel("""
func.func @twice(%n: index) -> (memref<?xf64>, memref<*xf64>) {
  %one = arith.constant 1.5 : f64
  %m = memref.alloc(%n) : memref<?xf64>
  linalg.fill ins(%one : f64) outs(%m : memref<?xf64>)
  %u = memref.cast %m : memref<?xf64> to memref<*xf64>
  return %m, %u : memref<?xf64>, memref<*xf64>
}""")
    def twice(n): ...

    a, b = twice(4)
    np.testing.assert_array_equal(a, np.full(4, 1.5))
    a[2] = 9.0
    assert b[2] == 9.0
    del a
    gc.collect()
    assert len(freed) == 1  # the heap copy of the unranked descriptor only
    del b
    gc.collect()
    assert len(freed) == 2


def test_outputs_come_first_then_results_in_mlir_order():
    @mlir_kernel("""
func.func @split(%x: memref<?xf32>, %n: index, %out: memref<?xf32>) -> (f32, memref<?xf32>, i64) {
  %c0 = arith.constant 0 : index
  %two = arith.constant 2.0 : f32
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>], iterator_types = ["parallel"]}
      ins(%x : memref<?xf32>) outs(%out : memref<?xf32>) {
  ^bb0(%a: f32, %b: f32):
    %m = arith.mulf %a, %two : f32
    linalg.yield %m : f32
  }
  %first = memref.load %x[%c0] : memref<?xf32>
  %copy = memref.alloc(%n) : memref<?xf32>
  memref.copy %x, %copy : memref<?xf32> to memref<?xf32>
  %count = arith.index_cast %n : index to i64
  return %first, %copy, %count : f32, memref<?xf32>, i64
}""")
    def split(x, n): ...

    x = np.array([3.0, 1.0, 2.0], np.float32)
    doubled, first, copy, count = split(x, 3)
    np.testing.assert_array_equal(doubled, 2 * x)
    assert first == np.float32(3.0) and type(first) is np.float32
    np.testing.assert_array_equal(copy, x)
    assert not np.shares_memory(copy, x)
    assert count == 3 and type(count) is np.int64


LEAK_CHECK = textwrap.dedent("""
    import numpy as np
    from memkernel import mlir_kernel
    kernel = mlir_kernel('''{source}''', name="iota")(lambda n, step: None)

    def resident_mb():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096 / 2**20

    for _ in range(2000):
        kernel(1000, 1.0)
    before = resident_mb()
    for _ in range(100_000):
        kernel(1000, 1.0)
    print(resident_mb() - before)
""")


@pytest.mark.slow
def test_a_hundred_thousand_allocating_calls_keep_resident_memory_flat():
    # Each call allocates 8 KB: a leak would add about 800 MB.
    script = LEAK_CHECK.format(source=IOTA.format(t="f64"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 20.0


def test_a_returned_memref_larger_than_any_array_is_an_allocation_error():
    """``memref.alloc(2**62)`` of f32 asks for 2**64 bytes, which wraps to a small size that malloc would
    grant (before: a bare ValueError from numpy, naming nothing): the kernel's size check stops it."""
    big = mlir_kernel("""
func.func @big(%n: index) -> memref<?xf32> {
  %m = memref.alloc(%n) : memref<?xf32>
  return %m : memref<?xf32>
}""")(lambda n: None)
    with pytest.raises(AllocationError, match=r"big\(\): a memref\.alloc in the kernel asked for 2\*\*63 bytes or "
                                              "more"):
        big(2**62)
    np.testing.assert_array_equal(big(3).shape, (3,))
