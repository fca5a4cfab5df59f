"""Which memref arguments a kernel may write, as read off its IR."""

from __future__ import annotations

import numpy as np
import pytest

from memkernel import ArgumentError, mlir_kernel
from memkernel.spec.writes import written_arguments
from memkernel.spec.source import parse_source


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


SUM = """
func.func @total(%x: memref<?xi64>) -> i64 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xi64>
  %zero = arith.constant 0 : i64
  %s = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> i64 {
    %v = memref.load %x[%i] : memref<?xi64>
    %r = arith.addi %acc, %v : i64
    scf.yield %r : i64
  }
  return %s : i64
}"""


def test_a_list_is_accepted_for_an_argument_the_kernel_only_reads():
    @mlir_kernel(SUM)
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
    @mlir_kernel(SUM)
    def total(x): ...

    data = np.arange(10, dtype=np.int64)
    data.flags.writeable = False
    assert total(data[::3]) == int(np.sum(data[::3]))
