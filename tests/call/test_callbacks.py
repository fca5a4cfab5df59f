"""Python callbacks bound to the kernel's private declarations."""

from __future__ import annotations

import numpy as np
import pytest

from memkernel import CompileError, SignatureError, mlir_kernel

ROWS = """
func.func private @visit_row(memref<?xf64, strided<[1], offset: ?>>, index) -> f64
func.func private @visit_all(memref<*xf64>)
func.func private @visit_total(memref<f64>, i1) -> i64
func.func @rows(%m: memref<?x?xf64>) -> (f64, i64) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %m, %c0 : memref<?x?xf64>
  %k = memref.dim %m, %c1 : memref<?x?xf64>
  %zero = arith.constant 0.0 : f64
  %sum = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> f64 {
    %row = memref.subview %m[%i, 0] [1, %k] [1, 1]
        : memref<?x?xf64> to memref<?xf64, strided<[1], offset: ?>>
    %v = func.call @visit_row(%row, %i) : (memref<?xf64, strided<[1], offset: ?>>, index) -> f64
    %s = arith.addf %acc, %v : f64
    scf.yield %s : f64
  }
  %all = memref.cast %m : memref<?x?xf64> to memref<*xf64>
  func.call @visit_all(%all) : (memref<*xf64>) -> ()
  %cell = memref.alloca() : memref<f64>
  memref.store %sum, %cell[] : memref<f64>
  %true = arith.constant true
  %code = func.call @visit_total(%cell, %true) : (memref<f64>, i1) -> i64
  return %sum, %code : f64, i64
}"""


def make_rows(**callbacks):
    return mlir_kernel(ROWS, name="rows", callbacks=callbacks)(lambda m: None)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def row(self, row, i):
        self.calls.append(("row", i, row.copy()))
        return float(row.max())

    def all(self, whole):
        self.calls.append(("all", whole.copy()))

    def total(self, cell, flag):
        self.calls.append(("total", cell.shape, float(cell[()]), flag))
        return 42


def test_callbacks_see_the_kernels_memrefs_and_scalars():
    record = Recorder()
    rows = make_rows(visit_row=record.row, visit_all=record.all, visit_total=record.total)
    m = np.arange(12.0).reshape(3, 4)
    total, code = rows(m)
    assert total == m.max(axis=1).sum()  # each row's max, returned by the callback, summed by the kernel
    assert code == 42 and type(code) is np.int64
    kinds = [c[0] for c in record.calls]
    assert kinds == ["row", "row", "row", "all", "total"]
    for i, (_, index, row) in enumerate(record.calls[:3]):
        assert index == i
        np.testing.assert_array_equal(row, m[i])
    np.testing.assert_array_equal(record.calls[3][1], m)
    assert record.calls[4] == ("total", (), m.max(axis=1).sum(), True)


def test_callback_writes_reach_the_kernels_memory():
    source = """
func.func private @fill(memref<?xi32>)
func.func @filled(%n: index) -> memref<?xi32> {
  %m = memref.alloc(%n) : memref<?xi32>
  func.call @fill(%m) : (memref<?xi32>) -> ()
  return %m : memref<?xi32>
}"""

    def fill(view):
        view[:] = np.arange(view.size) * 3

    filled = mlir_kernel(source, callbacks={"fill": fill})(lambda n: None)
    np.testing.assert_array_equal(filled(5), np.arange(5) * 3)


def test_an_exception_in_a_callback_is_raised_from_the_kernel_call():
    record = Recorder()

    def failing_row(row, i):
        raise KeyError(f"row {i}")

    rows = make_rows(visit_row=failing_row, visit_all=record.all, visit_total=record.total)
    with pytest.raises(KeyError, match="row 0"):
        rows(np.ones((2, 2)))
    assert [c[0] for c in record.calls] == ["all", "total"]  # the kernel ran on to its end


def test_a_kernel_call_after_a_failed_one_starts_clean():
    calls = {"n": 0}

    def sometimes(row, i):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("first call fails")
        return 1.0

    rows = make_rows(visit_row=sometimes, visit_all=lambda m: None, visit_total=lambda c, f: 0)
    with pytest.raises(RuntimeError, match="first call fails"):
        rows(np.ones((1, 2)))
    total, _ = rows(np.ones((2, 2)))
    assert total == 2.0


def test_binding_a_name_that_is_not_declared_is_a_signature_error():
    with pytest.raises(SignatureError, match=r"callbacks: no func.func private @visit_col declaration .*"
                                             r"\(declarations: @visit_row, @visit_all, @visit_total\)"):
        make_rows(visit_col=print)


def test_a_callback_must_be_callable():
    with pytest.raises(SignatureError, match=r"@visit_row is bound to 3, which is not callable"):
        make_rows(visit_row=3, visit_all=print, visit_total=print)


def test_unsupported_callback_types_are_a_signature_error():
    source = """
func.func private @half(f16)
func.func @k(%x: f16) {
  func.call @half(%x) : (f16) -> ()
  return
}"""
    with pytest.raises(SignatureError, match=r"callback @half argument #0 is f16: callback scalars must be"):
        mlir_kernel(source, callbacks={"half": print})(lambda x: None)


def test_a_declaration_left_unbound_names_its_symbol_at_compile_time():
    rows = make_rows(visit_row=lambda r, i: 0.0, visit_all=print)
    with pytest.raises(CompileError, match=r"@rows calls visit_total, which no linked library defines\. "
                                           r"Bind a declaration to Python with callbacks="):
        rows.compile()
