"""The default pipeline's optional lowerings: sparse tensors, the async dialect and ``vector.mask`` run
through ``mlir_kernel`` with no ``pipeline=``, checked against numpy; and a module that needs none of
them is lowered by the same passes as before."""

from __future__ import annotations

import re

import numpy as np
import pytest
from mlir import ir

from memkernel import mlir_kernel
from memkernel.analysis.lowerings import Needs, needs
from memkernel.analysis.source import MLIR_LOCK, shared_context
from memkernel.compile.pipeline import pre_lowering
from memkernel.errors import KernelAssertionError, ShapeError

SPARSE_MATVEC = """
#CSR = #sparse_tensor.encoding<{ map = (d0, d1) -> (d0 : dense, d1 : compressed) }>
func.func @spmv(%a: tensor<?x?xf64>, %x: tensor<?xf64>) -> tensor<?xf64> {
  %c0 = arith.constant 0 : index
  %s = sparse_tensor.convert %a : tensor<?x?xf64> to tensor<?x?xf64, #CSR>
  %n = tensor.dim %a, %c0 : tensor<?x?xf64>
  %zero = arith.constant 0.0 : f64
  %e = tensor.empty(%n) : tensor<?xf64>
  %y0 = linalg.fill ins(%zero : f64) outs(%e : tensor<?xf64>) -> tensor<?xf64>
  %y = linalg.matvec ins(%s, %x : tensor<?x?xf64, #CSR>, tensor<?xf64>) outs(%y0 : tensor<?xf64>) -> tensor<?xf64>
  bufferization.dealloc_tensor %s : tensor<?x?xf64, #CSR>
  return %y : tensor<?xf64>
}
"""

ASYNC_TWICE = """
func.func @twice(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %t = async.execute {
    scf.for %i = %c0 to %n step %c1 {
      %v = memref.load %x[%i] : memref<?xf32>
      %w = arith.addf %v, %v : f32
      memref.store %w, %y[%i] : memref<?xf32>
    }
    async.yield
  }
  async.await %t : !async.token
  return
}
"""

ASYNC_VALUE = """
func.func @sum_async(%x: memref<?xf32>) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %zero = arith.constant 0.0 : f32
  %token, %value = async.execute -> !async.value<f32> {
    %s = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> f32 {
      %v = memref.load %x[%i] : memref<?xf32>
      %a = arith.addf %acc, %v : f32
      scf.yield %a : f32
    }
    async.yield %s : f32
  }
  %r = async.await %value : !async.value<f32>
  return %r : f32
}
"""

ASYNC_FAILS = """
func.func @fails(%x: memref<4xf32>) {
  %false = arith.constant false
  %t = async.execute {
    cf.assert %false, "never true"
    async.yield
  }
  async.await %t : !async.token
  return
}
"""

MASKED_DOUBLE = """
func.func @double_first_five(%x: memref<8xf32>, %y: memref<8xf32>) {
  %c0 = arith.constant 0 : index
  %c5 = arith.constant 5 : index
  %pad = arith.constant 0.0 : f32
  %mask = vector.create_mask %c5 : vector<8xi1>
  %v = vector.mask %mask { vector.transfer_read %x[%c0], %pad : memref<8xf32>, vector<8xf32> } : vector<8xi1> -> vector<8xf32>
  %w = arith.addf %v, %v : vector<8xf32>
  vector.mask %mask { vector.transfer_write %w, %y[%c0] : vector<8xf32>, memref<8xf32> } : vector<8xi1>
  return
}
"""

PLAIN_ADD = """
func.func @add(%a: memref<?xf32>, %b: memref<?xf32>, %c: memref<?xf32>) {
  linalg.add ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%c : memref<?xf32>)
  return
}
"""


def _needs(source: str) -> Needs:
    with MLIR_LOCK, shared_context():
        return needs(ir.Module.parse(source).operation)


# -- sparse tensors -----------------------------------------------------------------------------


def test_sparse_kernel_on_dense_inputs_matches_numpy() -> None:
    spmv = mlir_kernel(SPARSE_MATVEC, cache=False)(lambda a, x: None)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 5)) * (rng.random((6, 5)) < 0.3)
    x = rng.standard_normal(5)
    np.testing.assert_allclose(spmv(a, x), a @ x, rtol=1e-12, atol=1e-12)


def test_sparse_convert_ties_the_dims_its_result_is_used_with() -> None:
    spmv = mlir_kernel(SPARSE_MATVEC, cache=False)(lambda a, x: None)
    with pytest.raises(ShapeError, match=re.escape(
            "spmv(): a has 3 elements on dim 1 but x has 5 on dim 0; @spmv's linalg.matvec needs them equal.")):
        spmv(np.ones((4, 3)), np.ones(5))


def test_sparse_encoding_is_found_in_a_function_signature() -> None:
    source = """#SV = #sparse_tensor.encoding<{ map = (d0) -> (d0 : compressed) }>
    func.func private @f(tensor<8xf32, #SV>)"""
    assert _needs(source) == Needs(sparse=True, asynchronous=False, masks=False)


# -- the async dialect ----------------------------------------------------------------------------


def test_async_execute_kernel_matches_numpy() -> None:
    twice = mlir_kernel(ASYNC_TWICE, cache=False)(lambda x: None)
    x = np.arange(1000, dtype=np.float32)
    np.testing.assert_array_equal(twice(x), x + x)


def test_async_value_kernel_returns_what_its_region_yields() -> None:
    sum_async = mlir_kernel(ASYNC_VALUE, cache=False)(lambda x: None)
    x = np.arange(10, dtype=np.float32)
    assert sum_async(x) == np.float32(x.sum())


def test_awaiting_a_failed_async_region_raises_kernel_assertion_error() -> None:
    fails = mlir_kernel(ASYNC_FAILS, cache=False)(lambda x: None)
    with pytest.raises(KernelAssertionError, match="fails"):
        fails(np.zeros(4, np.float32))


def test_async_kernel_is_read_as_running_on_the_async_runtime() -> None:
    twice = mlir_kernel(ASYNC_TWICE, cache=False)(lambda x: None)
    plain = mlir_kernel(PLAIN_ADD, cache=False)(lambda a, b: None)
    assert (twice._pending._parallel, plain._pending._parallel) == (True, False)


def test_async_func_is_found() -> None:
    source = "async.func @f() -> !async.token {\n  return\n}"
    assert _needs(source) == Needs(sparse=False, asynchronous=True, masks=False)


# -- vector.mask -------------------------------------------------------------------------------


def test_masked_vector_kernel_matches_numpy() -> None:
    double = mlir_kernel(MASKED_DOUBLE, cache=False)(lambda x: None)
    x = np.arange(1, 9, dtype=np.float32)
    expected = np.where(np.arange(8) < 5, 2 * x, 0).astype(np.float32)
    np.testing.assert_array_equal(double(x), expected)


# -- the common case ---------------------------------------------------------------------------------


def test_plain_kernel_needs_no_optional_lowering() -> None:
    assert _needs(PLAIN_ADD) == Needs(sparse=False, asynchronous=False, masks=False)


def test_plain_kernel_is_lowered_without_the_optional_passes() -> None:
    text = pre_lowering(False, _needs(PLAIN_ADD))
    assert "async" not in text and "lower-vector-mask" not in text


def test_async_kernel_is_lowered_with_the_async_runtime_passes() -> None:
    text = pre_lowering(False, _needs(ASYNC_TWICE))
    assert "async-to-async-runtime" in text and "convert-async-to-llvm" in text


ASYNC_CALLBACK = """
func.func private @note(memref<?xf32>)
func.func @notes(%x: memref<?xf32>) {
  %t = async.execute {
    func.call @note(%x) : (memref<?xf32>) -> ()
    async.yield
  }
  async.await %t : !async.token
  return
}
"""


def test_callback_error_on_an_async_worker_is_raised_by_the_call() -> None:
    def note(a: np.ndarray) -> None:
        raise RuntimeError("from the callback")

    notes = mlir_kernel(ASYNC_CALLBACK, callbacks={"note": note})(lambda x: None)
    with pytest.raises(RuntimeError, match="from the callback"):
        notes(np.ones(3, np.float32))
