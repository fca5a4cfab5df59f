"""Ops on reshapes of an argument (collapse_shape, expand_shape, reinterpret_cast, memref.view) put rules on the
argument's dims, and a reshape whose sizes cannot be read is refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memkernel import ShapeError, SignatureError, mlir_kernel

from ..fastpath.conftest import with_fast_path

REPO = str(Path(__file__).resolve().parents[2])
F32 = np.float32

# The issue's kernel: out = collapse(x) + y.
COLLAPSED_ADD = """func.func @add(%x: memref<?x?xf32>, %y: memref<?xf32>, %out: memref<?xf32>) {
  %c = memref.collapse_shape %x [[0, 1]] : memref<?x?xf32> into memref<?xf32>
  linalg.add ins(%c, %y : memref<?xf32>, memref<?xf32>) outs(%out : memref<?xf32>)
  return
}"""

# out = expand(x, ? x 4) + y, the first size what 4 leaves of x's length.
EXPANDED_ADD = """func.func @add(%x: memref<?xf32>, %y: memref<?x4xf32>, %out: memref<?x4xf32>) {
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %rows = arith.divui %n, %c4 : index
  %e = memref.expand_shape %x [[0, 1]] output_shape [%rows, 4] : memref<?xf32> into memref<?x4xf32>
  linalg.add ins(%e, %y : memref<?x4xf32>, memref<?x4xf32>) outs(%out : memref<?x4xf32>)
  return
}"""

# y = expand(x, ? x 4), the first size read from y's dims: x must hold exactly y's elements.
EXPANDED_LIKE = """func.func @unflatten(%x: memref<?xf32>, %y: memref<?x4xf32>) {
  %c0 = arith.constant 0 : index
  %m = memref.dim %y, %c0 : memref<?x4xf32>
  %e = memref.expand_shape %x [[0, 1]] output_shape [%m, 4] : memref<?xf32> into memref<?x4xf32>
  memref.copy %e, %y : memref<?x4xf32> to memref<?x4xf32>
  return
}"""

# out = x[2:18] as 4 x 4.
CAST_STATIC = """func.func @rc(%x: memref<?xf32>, %out: memref<4x4xf32>) {
  %v = memref.reinterpret_cast %x to offset: [2], sizes: [4, 4], strides: [4, 1]
      : memref<?xf32> to memref<4x4xf32, strided<[4, 1], offset: 2>>
  linalg.copy ins(%v : memref<4x4xf32, strided<[4, 1], offset: 2>>) outs(%out : memref<4x4xf32>)
  return
}"""

# y = x as y's shape, the cast's sizes and strides read from y's dims.
CAST_LIKE = """func.func @rc(%x: memref<?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = memref.dim %y, %c0 : memref<?x?xf32>
  %n = memref.dim %y, %c1 : memref<?x?xf32>
  %v = memref.reinterpret_cast %x to offset: [0], sizes: [%m, %n], strides: [%n, 1]
      : memref<?xf32> to memref<?x?xf32, strided<[?, 1]>>
  linalg.copy ins(%v : memref<?x?xf32, strided<[?, 1]>>) outs(%y : memref<?x?xf32>)
  return
}"""

# y = the floats in bytes 4 onwards of x.
VIEWED = """func.func @vw(%x: memref<?xi8>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %n = memref.dim %y, %c0 : memref<?xf32>
  %v = memref.view %x[%c4][%n] : memref<?xi8> to memref<?xf32>
  linalg.copy ins(%v : memref<?xf32>) outs(%y : memref<?xf32>)
  return
}"""

TENSOR_COLLAPSED_ADD = """func.func @add(%x: tensor<?x?xf32>, %y: tensor<?xf32>) -> tensor<?xf32> {
  %c = tensor.collapse_shape %x [[0, 1]] : tensor<?x?xf32> into tensor<?xf32>
  %r = arith.addf %c, %y : tensor<?xf32>
  return %r : tensor<?xf32>
}"""

# The element at index 5 of the collapse of x.
LOAD_FROM_COLLAPSE = """func.func @sixth(%x: memref<?x?xf32>) -> f32 {
  %c5 = arith.constant 5 : index
  %c = memref.collapse_shape %x [[0, 1]] : memref<?x?xf32> into memref<?xf32>
  %v = memref.load %c[%c5] : memref<?xf32>
  return %v : f32
}"""


@pytest.mark.parametrize("fast", [True, False])
def test_a_collapse_shape_of_an_argument_ties_the_product_of_its_dims(fast):
    add = with_fast_path(mlir_kernel(COLLAPSED_ADD)(lambda x, y: None), fast)
    x, y = np.arange(6, dtype=F32).reshape(2, 3), np.full(6, 10, F32)
    np.testing.assert_array_equal(add(x, y), x.ravel() + y)
    with pytest.raises(ShapeError, match=re.escape(
            "add(): y has 7 elements on dim 0 but @add's memref.collapse_shape of x has 6 on dim 0; "
            "@add's linalg.add needs them equal.")):
        add(x, np.ones(7, F32))
    with pytest.raises(ShapeError, match="y has 6 elements on dim 0 but out has 5 on dim 0"):
        add(x, y, out=np.zeros(5, F32))


def test_the_issues_collapsed_read_is_an_error_in_a_live_process():
    script = "\n".join([
        "import numpy as np",
        "from memkernel import ShapeError, mlir_kernel",
        f"add = mlir_kernel({COLLAPSED_ADD!r})(lambda x, y: None)",
        "try:",
        "    add(np.ones((2, 2), np.float32), np.ones(2**20, np.float32))",
        "except ShapeError as exc:",
        "    print('ShapeError:', exc)",
    ])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "y has 1048576 elements on dim 0 but @add's memref.collapse_shape of x has 4 on dim 0" in done.stdout


def test_an_expand_shape_splits_its_source_into_what_the_static_sizes_leave():
    add = mlir_kernel(EXPANDED_ADD)(lambda x, y: None)
    x, y = np.arange(12, dtype=F32), np.ones((3, 4), F32)
    np.testing.assert_array_equal(add(x, y), x.reshape(3, 4) + y)
    with pytest.raises(ShapeError, match=re.escape(
            "add(): y has 30 elements on dim 0 but @add's memref.expand_shape of x has 3 on dim 0; "
            "@add's linalg.add needs them equal.")):
        add(x, np.ones((30, 4), F32))
    with pytest.raises(ShapeError, match=re.escape(
            "add(): x has 10 elements on dim 0 but @add's memref.expand_shape splits it into 2 x 4 = 8; "
            "pass x with dim 0 a multiple of 4.")):
        add(np.arange(10, dtype=F32), np.ones((2, 4), F32))


def test_a_reinterpret_cast_must_stay_inside_its_argument():
    cast = mlir_kernel(CAST_STATIC)(lambda x: None)
    x = np.arange(18, dtype=F32)
    np.testing.assert_array_equal(cast(x), x[2:18].reshape(4, 4))
    with pytest.raises(ShapeError, match=re.escape(
            "rc(): @rc's memref.reinterpret_cast of x, of shape (4, 4), reaches up to element 17 of x, which has 17; "
            "pass x with at least 18 elements.")):
        cast(x[:17])


@pytest.mark.parametrize("source, message", [
    pytest.param(EXPANDED_LIKE, "unflatten(): x has 8 elements on dim 0 but @unflatten's memref.expand_shape splits "
                                "it into 3 x 4 = 12; the parts must multiply to x's dim 0.", id="expand_shape"),
    pytest.param(CAST_LIKE, "rc(): @rc's memref.reinterpret_cast of x, of shape (3, 4), reaches up to element 11 of "
                            "x, which has 8; pass x with at least 12 elements.", id="reinterpret_cast"),
])
def test_a_reshape_into_sizes_read_from_another_arguments_dims_needs_its_source_to_fit(source, message):
    reshape = mlir_kernel(source)(lambda x, y: None)
    x, y = np.arange(12, dtype=F32), np.zeros((3, 4), F32)
    reshape(x, y)
    np.testing.assert_array_equal(y, x.reshape(3, 4))
    with pytest.raises(ShapeError, match=re.escape(message)):
        reshape(x[:8], y)


def test_a_reinterpret_cast_of_an_unranked_argument_must_stay_inside_its_elements():
    cast = mlir_kernel("""func.func @u(%x: memref<*xf32>, %y: memref<4x4xf32>) {
  %v = memref.reinterpret_cast %x to offset: [0], sizes: [4, 4], strides: [4, 1] : memref<*xf32> to memref<4x4xf32>
  memref.copy %v, %y : memref<4x4xf32> to memref<4x4xf32>
  return
}""")(lambda x: None)
    x = np.arange(16, dtype=F32).reshape(2, 8)
    np.testing.assert_array_equal(cast(x), x.reshape(4, 4))
    with pytest.raises(ShapeError, match=re.escape(
            "u(): @u's memref.reinterpret_cast of x, of shape (4, 4), reaches up to element 15 of x, which has 15; "
            "pass x with at least 16 elements.")):
        cast(x.ravel()[:15])


def test_a_memref_view_must_stay_inside_its_byte_buffer():
    view = mlir_kernel(VIEWED)(lambda x, y: None)
    floats = np.arange(5, dtype=F32)
    y = np.zeros(4, F32)
    view(floats.view(np.int8), y)
    np.testing.assert_array_equal(y, floats[1:])
    with pytest.raises(ShapeError, match=re.escape(
            "vw(): @vw's memref.view of x, of shape (4,), reaches up to element 19 of x, which has 19; "
            "pass x with at least 20 elements.")):
        view(floats.view(np.int8)[:19], y)


def test_a_tensor_collapse_shape_ties_like_a_memref_one():
    add = mlir_kernel(TENSOR_COLLAPSED_ADD)(lambda x, y: None)
    x = np.arange(6, dtype=F32).reshape(3, 2)
    np.testing.assert_array_equal(add(x, np.ones(6, F32)), x.ravel() + 1)
    with pytest.raises(ShapeError, match=re.escape(
            "add(): @add's tensor.collapse_shape of x has 6 elements on dim 0 but y has 5 on dim 0; "
            "@add's arith.addf needs them equal.")):
        add(x, np.ones(5, F32))


def test_a_load_from_a_collapse_shape_at_a_constant_index_is_bounded():
    sixth = mlir_kernel(LOAD_FROM_COLLAPSE)(lambda x: None)
    x = np.arange(6, dtype=F32).reshape(2, 3)
    assert sixth(x) == x.ravel()[5]
    with pytest.raises(ShapeError, match=re.escape(
            "sixth(): @sixth's memref.collapse_shape of x has 4 elements on dim 0 but @sixth's memref.load reaches "
            "up to index 5 there; pass at least 6.")):
        sixth(x[:, :2])


CAST_OF_A_SCALAR_SIZE = """func.func @rc(%x: memref<?xf32>, %n: index, %y: memref<?xf32>) {
  %v = memref.reinterpret_cast %x to offset: [0], sizes: [%n], strides: [1]
      : memref<?xf32> to memref<?xf32, strided<[1]>>
  linalg.copy ins(%v : memref<?xf32, strided<[1]>>) outs(%y : memref<?xf32>)
  return
}"""

VIEW_AT_A_SCALAR_SHIFT = """func.func @vw(%x: memref<?xi8>, %shift: index, %y: memref<4xf32>) {
  %v = memref.view %x[%shift][] : memref<?xi8> to memref<4xf32>
  memref.copy %v, %y : memref<4xf32> to memref<4xf32>
  return
}"""

EXPAND_INTO_SCALAR_SIZES = """func.func @ex(%x: memref<?xf32>, %m: index, %n: index, %y: memref<?x?xf32>) {
  %e = memref.expand_shape %x [[0, 1]] output_shape [%m, %n] : memref<?xf32> into memref<?x?xf32>
  memref.copy %e, %y : memref<?x?xf32> to memref<?x?xf32>
  return
}"""

CAST_OF_A_STRIDED_ARGUMENT = """func.func @rc(%x: memref<?xf32, strided<[?]>>, %y: memref<4xf32>) {
  %v = memref.reinterpret_cast %x to offset: [0], sizes: [4], strides: [1]
      : memref<?xf32, strided<[?]>> to memref<4xf32>
  memref.copy %v, %y : memref<4xf32> to memref<4xf32>
  return
}"""


@pytest.mark.parametrize("source, function, message", [
    pytest.param(CAST_OF_A_SCALAR_SIZE, lambda x, n: None, (
        "rc(): @rc's memref.reinterpret_cast of x takes its size of dim 0 from a value that is not a constant, a "
        "memref.dim of an argument or a product of those: memkernel cannot check that the view stays inside x, so "
        "it refuses the kernel. Compute the size of dim 0 that way, or take a memref.subview, whose bounds "
        "memkernel checks."), id="cast-size"),
    pytest.param(VIEW_AT_A_SCALAR_SHIFT, lambda x, shift: None, (
        "vw(): @vw's memref.view of x takes its byte shift from a value that is not a constant"), id="view-shift"),
    pytest.param(EXPAND_INTO_SCALAR_SIZES, lambda x, m, n: None, (
        "ex(): @ex's memref.expand_shape of x splits its dim 0 into ? x ?, with sizes not a constant, a memref.dim "
        "of an argument or a product of those: memkernel cannot tell the view's dims, so it refuses the kernel."),
        id="expand-sizes"),
    pytest.param(CAST_OF_A_STRIDED_ARGUMENT, lambda x: None, (
        "rc(): @rc's memref.reinterpret_cast of x reinterprets memory that is not one identity-layout argument's "
        "buffer (x has a strided layout, or was shifted by a memref.view)"), id="strided-cast"),
])
def test_a_reshape_whose_reach_cannot_be_read_is_refused_at_decoration(source, function, message):
    with pytest.raises(SignatureError, match=re.escape(message)):
        mlir_kernel(source)(function)


def test_a_reshape_under_scf_if_is_not_refused():
    source = """func.func @rc(%x: memref<?xf32>, %n: index, %go: i1, %y: memref<?xf32>) {
  scf.if %go {
    %v = memref.reinterpret_cast %x to offset: [0], sizes: [%n], strides: [1]
        : memref<?xf32> to memref<?xf32, strided<[1]>>
    linalg.copy ins(%v : memref<?xf32, strided<[1]>>) outs(%y : memref<?xf32>)
  }
  return
}"""
    cast = mlir_kernel(source)(lambda x, n, go: None)
    x = np.arange(4, dtype=F32)
    y = np.zeros(3, F32)
    cast(x, 3, True, out=y)
    np.testing.assert_array_equal(y, x[:3])
