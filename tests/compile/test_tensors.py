"""Tensor functions: bufferized by the default pipeline, called with numpy arrays in and out."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from memkernel import ArgumentError, mlir_kernel

MATMUL = """
func.func @matmul(%a: tensor<?x?x{t}>, %b: tensor<?x?x{t}>) -> tensor<?x?x{t}> {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = tensor.dim %a, %c0 : tensor<?x?x{t}>
  %n = tensor.dim %b, %c1 : tensor<?x?x{t}>
  %zero = arith.constant 0.0 : {t}
  %empty = tensor.empty(%m, %n) : tensor<?x?x{t}>
  %init = linalg.fill ins(%zero : {t}) outs(%empty : tensor<?x?x{t}>) -> tensor<?x?x{t}>
  %c = linalg.matmul ins(%a, %b : tensor<?x?x{t}>, tensor<?x?x{t}>) outs(%init : tensor<?x?x{t}>) -> tensor<?x?x{t}>
  return %c : tensor<?x?x{t}>
}}"""

ELEMENTWISE = """
func.func @fma(%a: tensor<?xf32>, %b: tensor<?xf32>, %c: tensor<?xf32>) -> tensor<?xf32> {
  %p = arith.mulf %a, %b : tensor<?xf32>
  %s = arith.addf %p, %c : tensor<?xf32>
  return %s : tensor<?xf32>
}"""

ROW_SUMS = """
func.func @row_sums(%a: tensor<?x?xf64>) -> (tensor<?xf64>, f64) {
  %c0 = arith.constant 0 : index
  %rows = tensor.dim %a, %c0 : tensor<?x?xf64>
  %zero = arith.constant 0.0 : f64
  %empty = tensor.empty(%rows) : tensor<?xf64>
  %init = linalg.fill ins(%zero : f64) outs(%empty : tensor<?xf64>) -> tensor<?xf64>
  %sums = linalg.reduce ins(%a : tensor<?x?xf64>) outs(%init : tensor<?xf64>) dimensions = [1]
    (%x: f64, %acc: f64) {
      %y = arith.addf %x, %acc : f64
      linalg.yield %y : f64
    }
  %first = tensor.extract %sums[%c0] : tensor<?xf64>
  return %sums, %first : tensor<?xf64>, f64
}"""

IN_PLACE_IF_ALLOWED = """
func.func @double(%a: tensor<4xf32>) -> tensor<4xf32> {
  %r = linalg.add ins(%a, %a : tensor<4xf32>, tensor<4xf32>) outs(%a : tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}"""

IDENTITY = "func.func @same(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }"


@pytest.mark.parametrize("t, dtype", [("f32", np.float32), ("f64", np.float64)])
def test_matmul_on_tensors_matches_numpy(t, dtype):
    @mlir_kernel(MATMUL.format(t=t))
    def matmul(a, b): ...

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 3)).astype(dtype), rng.standard_normal((3, 4)).astype(dtype)
    result = matmul(a, b)
    assert result.dtype == dtype
    np.testing.assert_allclose(result, a @ b, rtol=1e-5)


def test_arith_on_tensors_is_elementwise():
    @mlir_kernel(ELEMENTWISE)
    def fma(a, b, c): ...

    a, b, c = (np.arange(6, dtype=np.float32) + k for k in range(3))
    np.testing.assert_array_equal(fma(a, b, c), a * b + c)


def test_reduction_returns_a_tensor_and_a_scalar():
    @mlir_kernel(ROW_SUMS)
    def row_sums(a): ...

    a = np.arange(12.0).reshape(3, 4)
    sums, first = row_sums(a)
    np.testing.assert_array_equal(sums, a.sum(axis=1))
    assert first == a[0].sum() and type(first) is np.float64


def test_inputs_are_never_modified():
    @mlir_kernel(IN_PLACE_IF_ALLOWED)
    def double(a): ...

    a = np.arange(4, dtype=np.float32)
    before = a.copy()
    np.testing.assert_array_equal(double(a), 2 * before)
    np.testing.assert_array_equal(a, before)


def test_a_returned_input_is_a_copy_not_a_view():
    @mlir_kernel(IDENTITY)
    def same(a): ...

    a = np.arange(4, dtype=np.float32)
    result = same(a)
    np.testing.assert_array_equal(result, a)
    assert not np.shares_memory(result, a)


def test_views_and_lists_are_accepted_as_tensor_inputs():
    @mlir_kernel(ELEMENTWISE)
    def fma(a, b, c): ...

    base = np.arange(20, dtype=np.float32)
    a, b = base[::-2], base[1::2]
    np.testing.assert_array_equal(fma(a, b, [1.0] * 10), a * b + 1.0)


def test_the_signature_shown_is_the_tensor_one():
    @mlir_kernel(ROW_SUMS)
    def row_sums(a): ...

    assert str(inspect.signature(row_sums)) == "(a: tensor<?x?xf64>) -> tuple[tensor<?xf64>, f64]"


def test_argument_errors_name_the_tensor_type():
    @mlir_kernel(MATMUL.format(t="f32"))
    def matmul(a, b): ...

    with pytest.raises(ArgumentError, match=r"argument 'b' expects tensor<\?x\?xf32> \(float32, 2-d\); "
                                            r"got float64\[3, 4\]"):
        matmul(np.ones((5, 3), np.float32), np.ones((3, 4)))


COMPLEX_CONSTANT = """
func.func @shifted(%a: tensor<3x3xcomplex<{t}>>) -> tensor<3x3xcomplex<{t}>> {{
  %c = arith.constant dense<(1.000000e+01,5.000000e+00)> : tensor<3x3xcomplex<{t}>>
  %empty = tensor.empty() : tensor<3x3xcomplex<{t}>>
  %sum = linalg.generic {{indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>,
                                          affine_map<(i, j) -> (i, j)>],
                         iterator_types = ["parallel", "parallel"]}}
      ins(%a, %c : tensor<3x3xcomplex<{t}>>, tensor<3x3xcomplex<{t}>>) outs(%empty : tensor<3x3xcomplex<{t}>>) {{
  ^bb0(%x: complex<{t}>, %y: complex<{t}>, %out: complex<{t}>):
    %s = complex.add %x, %y : complex<{t}>
    linalg.yield %s : complex<{t}>
  }} -> tensor<3x3xcomplex<{t}>>
  return %sum : tensor<3x3xcomplex<{t}>>
}}"""


@pytest.mark.parametrize(("element", "dtype"), [("f32", np.complex64), ("f64", np.complex128)])
def test_a_complex_dense_constant_compiles_and_holds_its_value(element: str, dtype: type) -> None:
    @mlir_kernel(COMPLEX_CONSTANT.format(t=element), cache=False)
    def shifted(a): ...

    a = (np.arange(9) + 1j * np.arange(9, 18)).reshape(3, 3).astype(dtype)
    np.testing.assert_array_equal(shifted(a), a + (10 + 5j))
