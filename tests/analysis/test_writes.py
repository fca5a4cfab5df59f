"""Which memref arguments a kernel may write, as read off its IR."""

from __future__ import annotations

import numpy as np
import pytest

from memkernel import ArgumentError, mlir_kernel
from memkernel.analysis.writes import written_arguments
from memkernel.analysis.source import parse_source

from ..kernels import loop_total


def written(body: str, args: str) -> frozenset[int]:
    parsed = parse_source(f"func.func @f({args}) {{\n{body}\n  return\n}}")
    with parsed.context:
        return written_arguments(parsed.module, "f")


LOAD_STORE = """
  %c0 = arith.constant 0 : index
  %v = memref.load %a[%c0] : memref<?xf32>
  memref.store %v, %b[%c0] : memref<?xf32>"""


def test_load_reads_and_store_writes():
    assert written(LOAD_STORE, "%a: memref<?xf32>, %b: memref<?xf32>") == {1}


def test_linalg_ins_are_read_and_outs_written():
    body = "  linalg.add ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%c : memref<?xf32>)"
    assert written(body, "%a: memref<?xf32>, %b: memref<?xf32>, %c: memref<?xf32>") == {2}


def test_copy_reads_its_source_and_writes_its_target():
    body = "  memref.copy %a, %b : memref<?xf32> to memref<?xf32>"
    assert written(body, "%a: memref<?xf32>, %b: memref<?xf32>") == {1}


def test_write_through_a_subview_counts_as_a_write():
    body = """
  %c0 = arith.constant 0 : index
  %s = memref.subview %a[1] [2] [1] : memref<?xf32> to memref<2xf32, strided<[1], offset: 1>>
  %one = arith.constant 1.0 : f32
  memref.store %one, %s[%c0] : memref<2xf32, strided<[1], offset: 1>>"""
    assert written(body, "%a: memref<?xf32>") == {0}


def test_read_through_a_cast_is_only_a_read():
    body = """
  %c0 = arith.constant 0 : index
  %r = memref.cast %a : memref<?xf32> to memref<4xf32>
  %v = memref.load %r[%c0] : memref<4xf32>"""
    assert written(body, "%a: memref<?xf32>") == frozenset()


def test_unknown_use_counts_as_a_write():
    source = """
func.func private @opaque(memref<?xf32>)
func.func @f(%a: memref<?xf32>) {
  call @opaque(%a) : (memref<?xf32>) -> ()
  return
}"""
    parsed = parse_source(source)
    with parsed.context:
        assert written_arguments(parsed.module, "f") == {0}


def test_scalars_are_never_written():
    assert written("  %x = arith.addf %s, %s : f32", "%s: f32") == frozenset()


def test_a_list_is_accepted_for_an_argument_the_kernel_only_reads():
    @mlir_kernel(loop_total("i64"))
    def total(x): ...

    assert total([1, 2, 3, 40]) == sum([1, 2, 3, 40])


def test_a_list_is_refused_for_an_argument_the_kernel_may_write():
    source = LOAD_STORE.join(["func.func @move(%a: memref<?xf32>, %b: memref<?xf32>) {", "\n  return\n}"])

    @mlir_kernel(source)
    def move(a, b): ...

    with pytest.raises(ArgumentError, match=r"argument 'b' expects memref<\?xf32>; got list\. It is an "
                                            r"argument the kernel may write"):
        move(np.zeros(2, np.float32), [1.0, 2.0])


def test_read_only_view_copied_for_a_read_only_argument_is_accepted():
    @mlir_kernel(loop_total("i64"))
    def total(x): ...

    data = np.arange(10, dtype=np.int64)
    data.flags.writeable = False
    assert total(data[::3]) == int(np.sum(data[::3]))


# Writes %a[i] = i for every i when %k is 0; otherwise recurses with %a and %b swapped, so
# with an odd %k it writes %b, which no op of its own writes.
SWAP = """
func.func @swap(%a: memref<?xf32>, %b: memref<?xf32>, %k: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %more = arith.cmpi sgt, %k, %c0 : index
  scf.if %more {
    %next = arith.subi %k, %c1 : index
    func.call @swap(%b, %a, %next) : (memref<?xf32>, memref<?xf32>, index) -> ()
  } else {
    %n = memref.dim %a, %c0 : memref<?xf32>
    scf.for %i = %c0 to %n step %c1 {
      %j = arith.index_cast %i : index to i64
      %v = arith.sitofp %j : i64 to f32
      memref.store %v, %a[%i] : memref<?xf32>
    }
  }
  return
}"""


def written_in(source: str, function: str) -> frozenset[int]:
    parsed = parse_source(source)
    with parsed.context:
        return written_arguments(parsed.module, function)


def test_an_argument_written_only_through_a_recursive_call_counts_as_written():
    assert written_in(SWAP, "swap") == {0, 1}


def test_a_write_through_mutual_recursion_reaches_the_caller():
    source = """
func.func @ping(%a: memref<?xf32>, %b: memref<?xf32>) {
  func.call @pong(%b, %a) : (memref<?xf32>, memref<?xf32>) -> ()
  return
}
func.func @pong(%c: memref<?xf32>, %d: memref<?xf32>) {
  func.call @ping(%d, %c) : (memref<?xf32>, memref<?xf32>) -> ()
  %c0 = arith.constant 0 : index
  %one = arith.constant 1.0 : f32
  memref.store %one, %c[%c0] : memref<?xf32>
  return
}"""
    assert written_in(source, "ping") == {1}
    assert written_in(source, "pong") == {0}


def test_a_recursion_that_only_reads_is_read_only():
    source = """
func.func @peek(%a: memref<?xf32>, %k: index) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %more = arith.cmpi sgt, %k, %c0 : index
  %r = scf.if %more -> f32 {
    %next = arith.subi %k, %c1 : index
    %v = func.call @peek(%a, %next) : (memref<?xf32>, index) -> f32
    scf.yield %v : f32
  } else {
    %v = memref.load %a[%c0] : memref<?xf32>
    scf.yield %v : f32
  }
  return %r : f32
}"""
    assert written_in(source, "peek") == frozenset()


def swap_kernel():
    return mlir_kernel(SWAP)(lambda a, b, k: None)


def test_a_read_only_array_is_refused_for_an_argument_written_through_recursion():
    swap = swap_kernel()
    b = np.zeros(4, np.float32)
    b.flags.writeable = False
    with pytest.raises(ArgumentError, match=r"argument 'b' .*got a read-only array .* for an argument "
                                            r"the kernel may write\. Pass a writable array, e\.g\. b\.copy\(\)"):
        swap(np.zeros(4, np.float32), b, 1)
    np.testing.assert_array_equal(b, np.zeros(4, np.float32))


def test_writes_through_recursion_reach_a_copied_view():
    swap = swap_kernel()
    a = np.full(4, -1.0, np.float32)
    big = np.full(8, -1.0, np.float32)
    swap(a, big[::2], 1)  # a non-contiguous view of an identity-layout memref is passed as a copy
    expected = np.full(8, -1.0, np.float32)
    expected[::2] = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(big, expected)
    np.testing.assert_array_equal(a, np.full(4, -1.0, np.float32))
