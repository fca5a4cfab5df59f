"""The "fast" preset: vectorized where a strategy applies, the default lowering elsewhere, always numpy's answer."""

from __future__ import annotations

import functools
import os
import re
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memkernel.compile.pipeline
import memkernel.options
import memkernel.compile.presets
from memkernel import CompileError, mlir_kernel
from memkernel.compile.presets import CONVOLUTIONS, PRESETS, Strategy
from memkernel.analysis.source import parse_source

from ..kernels import PARALLEL_FILL, elementwise

MATMUL = """func.func @matmul(%a: {A}, %b: {B}, %c: {C}) {{
  linalg.matmul ins(%a, %b : {A}, {B}) outs(%c : {C})
  return
}}"""

TENSOR_SUM = """func.func @total(%x: tensor<?x{t}>) -> tensor<{t}> {{
  %zero = arith.constant 0.0 : {t}
  %empty = tensor.empty() : tensor<{t}>
  %init = linalg.fill ins(%zero : {t}) outs(%empty : tensor<{t}>) -> tensor<{t}>
  %sum = linalg.reduce ins(%x : tensor<?x{t}>) outs(%init : tensor<{t}>) dimensions = [0]
    (%v: {t}, %acc: {t}) {{
      %s = arith.addf %v, %acc : {t}
      linalg.yield %s : {t}
    }}
  return %sum : tensor<{t}>
}}"""

CONV = """func.func @conv(%x: memref<1x10x12x3xf32>, %w: memref<3x3x3x8xf32>, %y: memref<1x8x10x8xf32>) {
  linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%x, %w : memref<1x10x12x3xf32>, memref<3x3x3x8xf32>) outs(%y : memref<1x8x10x8xf32>)
  return
}"""


def dynamic_matmul(t: str, pipeline: str = "fast", parallel: bool = False):
    memref = f"memref<?x?x{t}>"
    source = MATMUL.format(A=memref, B=memref, C=memref)
    return mlir_kernel(source, pipeline=pipeline, parallel=parallel)(lambda a, b: (a.shape[0], b.shape[1]))


def few_rows_matmul(m: int, t: str):
    """A fast matmul of a static number of rows ``m`` (N and K dynamic)."""
    source = MATMUL.format(A=f"memref<{m}x?x{t}>", B=f"memref<?x?x{t}>", C=f"memref<{m}x?x{t}>")
    return mlir_kernel(source, pipeline="fast")(lambda a, b: (m, b.shape[1]))


FAST_MATMULS = {t: dynamic_matmul(t) for t in ("f32", "f64")}
PARALLEL_MATMULS = {t: dynamic_matmul(t, parallel=True) for t in ("f32", "f64")}
FEW_ROWS_MATMULS = {(m, t): few_rows_matmul(m, t) for m in (1, 3, 7) for t in ("f32", "f64")}
DTYPES = {"f32": np.float32, "f64": np.float64}


def inputs(m: int, n: int, k: int, dtype, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(-4, 5, (m, k)).astype(dtype), rng.integers(-4, 5, (k, n)).astype(dtype)


def test_fast_matmul_is_vectorized_and_default_is_not():
    assert "vector.fma" in FAST_MATMULS["f32"].ir("vectorized")
    assert "vector." not in dynamic_matmul("f32", "default").ir("vectorized")


@pytest.mark.parametrize("t", ["f32", "f64"])
def test_fast_matmul_vectorizes_every_tile_and_packs_b(t):
    vectorized = FAST_MATMULS[t].ir("vectorized")
    assert "linalg.matmul" not in vectorized  # the partial tiles too: none is left to the default lowering
    assert "memref.alloc" in vectorized and "alignment = 64" in vectorized  # B's packed panel


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 70), n=st.integers(0, 70), k=st.integers(0, 40), t=st.sampled_from(["f32", "f64"]))
def test_fast_dynamic_matmul_matches_numpy_on_any_shape(m, n, k, t):
    a, b = inputs(m, n, k, DTYPES[t])
    np.testing.assert_array_equal(FAST_MATMULS[t](a, b), a @ b)  # small integers: exact


@pytest.mark.parametrize("m, n, k", [(64, 64, 64), (33, 65, 17), (8, 32, 8), (1, 100, 3), (130, 40, 9),
                                     (513, 257, 129), (1, 512, 512), (263, 7, 300)])
@pytest.mark.parametrize("t", ["f32", "f64"])
def test_fast_static_matmul_matches_numpy(m, n, k, t):
    source = MATMUL.format(A=f"memref<{m}x{k}x{t}>", B=f"memref<{k}x{n}x{t}>", C=f"memref<{m}x{n}x{t}>")
    kernel = mlir_kernel(source, pipeline="fast")(lambda a, b: None)
    a, b = inputs(m, n, k, DTYPES[t], seed=m + n + k)
    np.testing.assert_array_equal(kernel(a, b), a @ b)


def test_fast_matmul_through_strided_views():
    a, b = inputs(90, 70, 50, np.float32)
    np.testing.assert_array_equal(FAST_MATMULS["f32"](a[::2], b[:, ::-1]), a[::2] @ b[:, ::-1])


@settings(max_examples=30, deadline=None)
@given(m=st.integers(0, 300), n=st.integers(0, 70), k=st.integers(0, 40), t=st.sampled_from(["f32", "f64"]))
def test_parallel_fast_dynamic_matmul_matches_numpy_on_any_shape(m, n, k, t):
    a, b = inputs(m, n, k, DTYPES[t])
    np.testing.assert_array_equal(PARALLEL_MATMULS[t](a, b), a @ b)


@pytest.mark.parametrize("m, n, k", [(513, 257, 129), (129, 33, 5), (1, 100, 3), (300, 7, 30)])
@pytest.mark.parametrize("t", ["f32", "f64"])
def test_parallel_fast_static_matmul_matches_numpy(m, n, k, t):
    source = MATMUL.format(A=f"memref<{m}x{k}x{t}>", B=f"memref<{k}x{n}x{t}>", C=f"memref<{m}x{n}x{t}>")
    kernel = mlir_kernel(source, pipeline="fast", parallel=True)(lambda a, b: None)
    assert "linalg.matmul" not in kernel.ir("vectorized")
    a, b = inputs(m, n, k, DTYPES[t], seed=m + n + k)
    np.testing.assert_array_equal(kernel(a, b), a @ b)


def test_parallel_fast_matmul_through_strided_views():
    a, b = inputs(600, 70, 50, np.float32)
    np.testing.assert_array_equal(PARALLEL_MATMULS["f32"](a[::2], b[:, ::-1]), a[::2] @ b[:, ::-1])


def test_parallel_fast_matmul_makes_its_blocks_of_rows_async_tasks_and_serial_does_not():
    """The tasks run on the runtime's workers: see test_parallel_true_runs_loop_iterations_on_several_threads."""
    assert "async.execute" in PARALLEL_MATMULS["f32"].ir("vectorized")
    assert "async." not in FAST_MATMULS["f32"].ir("vectorized")
    assert "scf.parallel" not in PARALLEL_MATMULS["f32"].ir("vectorized")  # all of them made tasks


@pytest.mark.skipif(os.cpu_count() < 2, reason="needs two cores to show a second thread")
def test_parallel_fast_matmul_computes_on_other_threads_than_the_callers():
    """The process spends CPU time beyond the calling thread's: the blocks other than its own ran elsewhere."""
    a, b = inputs(1024, 512, 512, np.float32)
    PARALLEL_MATMULS["f32"](a, b)
    process, thread = time.process_time(), time.thread_time()
    for _ in range(3):
        c = PARALLEL_MATMULS["f32"](a, b)
    process, thread = time.process_time() - process, time.thread_time() - thread
    np.testing.assert_array_equal(c, a @ b)
    assert process - thread > 0.3 * process


def test_parallel_and_serial_fast_pipelines_have_different_cache_keys():
    serial = memkernel.compile.pipeline.parse_pipeline("fast")
    parallel = memkernel.compile.pipeline.parse_pipeline("fast", parallel=True)
    assert serial.describe() != parallel.describe()


@settings(max_examples=40, deadline=None)
@given(m=st.sampled_from([1, 3, 7]), n=st.integers(0, 150), k=st.integers(0, 40), t=st.sampled_from(["f32", "f64"]))
def test_fast_matmul_of_few_static_rows_matches_numpy_on_any_shape(m, n, k, t):
    a, b = inputs(m, n, k, DTYPES[t])
    np.testing.assert_array_equal(FEW_ROWS_MATMULS[m, t](a, b), a @ b)


@pytest.mark.parametrize("t", ["f32", "f64"])
def test_fast_matmul_of_few_static_rows_reads_b_in_place_and_vectorizes_every_tile(t):
    vectorized = FEW_ROWS_MATMULS[3, t].ir("vectorized")
    assert "linalg.matmul" not in vectorized and "vector.fma" in vectorized
    assert "memref.alloc" not in vectorized  # no packed panel


def test_fast_matmul_of_one_static_row_cuts_k_into_steps_outside_the_column_tiles():
    """A vector-matrix product reads B's rows end to end, eight at a time (as sgemv does), not down its columns."""
    vectorized = FEW_ROWS_MATMULS[1, "f32"].ir("vectorized")
    k_loop, column_loop = vectorized.find("step %c8 {"), vectorized.find("step %c64 {")
    assert 0 < k_loop < column_loop
    assert "step %c8 {" not in FEW_ROWS_MATMULS[3, "f32"].ir("vectorized")  # a C tile of 3 rows is stored once


def test_fast_dynamic_matmul_splits_off_the_rows_it_reads_b_in_place_for():
    vectorized = FAST_MATMULS["f32"].ir("vectorized")
    assert "memkernel.few_rows" in vectorized  # the split point: M when M < 8, else 0
    assert "linalg.matmul" not in vectorized and "alignment = 64" in vectorized


TWO_MATMULS = """func.func @two(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %c: memref<?x?xf32>, %d: memref<?x?xf32>) {
  linalg.matmul ins(%a, %b : memref<?x?xf32>, memref<?x?xf32>) outs(%c : memref<?x?xf32>)
  linalg.matmul ins(%b, %a : memref<?x?xf32>, memref<?x?xf32>) outs(%d : memref<?x?xf32>)
  return
}"""


@pytest.mark.parametrize("parallel", [False, True])
def test_two_fast_dynamic_matmuls_in_one_kernel_match_numpy(parallel):
    kernel = mlir_kernel(TWO_MATMULS, pipeline="fast", parallel=parallel)(
        lambda a, b: ((a.shape[0], b.shape[1]), (b.shape[0], a.shape[1])))
    assert "linalg.matmul" not in kernel.ir("vectorized")
    for m, k in [(3, 40), (37, 20)]:
        a, b = inputs(m, m, k, np.float32)
        c, d = kernel(a, b)
        np.testing.assert_array_equal(c, a @ b)
        np.testing.assert_array_equal(d, b @ a)


def test_fast_matmul_of_few_static_rows_through_strided_views():
    a, b = inputs(6, 70, 50, np.float64)
    np.testing.assert_array_equal(FEW_ROWS_MATMULS[3, "f64"](a[::2], b[:, ::-1]), a[::2] @ b[:, ::-1])


def test_integer_matmul_takes_the_default_lowering_with_fast():
    kernel = dynamic_matmul("i32")
    assert "vector." not in kernel.ir("vectorized")
    a, b = inputs(13, 9, 7, np.int32)
    np.testing.assert_array_equal(kernel(a, b), a @ b)


@pytest.mark.parametrize("n", [0, 1, 7, 64, 257, 10_000])
@pytest.mark.parametrize("t", ["f32", "f64"])
def test_fast_tensor_sum_matches_numpy(n, t):
    kernel = mlir_kernel(TENSOR_SUM.format(t=t), pipeline="fast")(lambda x: None)
    x = np.random.default_rng(n).standard_normal(n).astype(DTYPES[t])
    np.testing.assert_allclose(kernel(x), np.sum(x, dtype=np.float64), rtol=1e-4 if t == "f32" else 1e-12,
                               atol=1e-3 if t == "f32" else 1e-9)


SUM_OF_SQUARES = """
#id = affine_map<(i) -> (i)>
#scalar = affine_map<(i) -> ()>
func.func @sumsq(%x: tensor<?xf64>) -> tensor<f64> {
  %zero = arith.constant 0.0 : f64
  %empty = tensor.empty() : tensor<f64>
  %init = linalg.fill ins(%zero : f64) outs(%empty : tensor<f64>) -> tensor<f64>
  %r = linalg.generic {indexing_maps = [#id, #scalar], iterator_types = ["reduction"]}
      ins(%x : tensor<?xf64>) outs(%init : tensor<f64>) {
  ^bb0(%v: f64, %acc: f64):
    %sq = arith.mulf %v, %v : f64
    %s = arith.addf %sq, %acc : f64
    linalg.yield %s : f64
  } -> tensor<f64>
  return %r : tensor<f64>
}"""


@pytest.mark.parametrize("n", [0, 5, 300, 4099])
def test_fast_generic_reduction_matches_numpy_and_is_vectorized(n):
    kernel = mlir_kernel(SUM_OF_SQUARES, pipeline="fast")(lambda x: None)
    assert "vector.multi_reduction" in kernel.ir("bufferized")
    x = np.random.default_rng(n).standard_normal(n)
    np.testing.assert_allclose(kernel(x), np.dot(x, x), rtol=1e-12)


def test_fast_tensor_sum_is_vectorized():
    kernel = mlir_kernel(TENSOR_SUM.format(t="f32"), pipeline="fast")(lambda x: None)
    assert "vector.multi_reduction" in kernel.ir("bufferized")


@pytest.mark.parametrize("op", ["arith.addf", "arith.mulf", "arith.maximumf"])
def test_fast_elementwise_matches_numpy(op):
    kernel = mlir_kernel(elementwise(op, "memref<?x?xf32>", "f32", 2), name="k", pipeline="fast")(
        lambda a, b: None)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((37, 29)).astype(np.float32), rng.standard_normal((37, 29)).astype(np.float32)
    expected = {"arith.addf": a + b, "arith.mulf": a * b, "arith.maximumf": np.maximum(a, b)}[op]
    np.testing.assert_array_equal(kernel(a, b), expected)


def test_fast_convolution_matches_numpy():
    kernel = mlir_kernel(CONV, pipeline="fast")(lambda x, w: None)
    rng = np.random.default_rng(2)
    x = rng.integers(-3, 4, (1, 10, 12, 3)).astype(np.float32)
    w = rng.integers(-3, 4, (3, 3, 3, 8)).astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(1, 2))  # n, oh, ow, c, kh, kw
    expected = np.einsum("nhwcij,ijcf->nhwf", windows, w)
    np.testing.assert_array_equal(kernel(x, w), expected)


CONVOLUTION = """func.func @conv(%x: {X}, %w: {W}, %y: {Y}) {{
  linalg.{op} {{dilations = dense<{d}> : tensor<{r}xi64>, strides = dense<{s}> : tensor<{r}xi64>}}
      ins(%x, %w : {X}, {W}) outs(%y : {Y})
  return
}}"""
# Each convolution's input and filter layouts, as einsum subscripts with its output's.
CONVOLUTION_EINSUM = {
    "conv_2d_nhwc_hwcf": "nhwc,cf->nhwf",
    "conv_1d_nwc_wcf": "nwc,cf->nwf",
    "depthwise_conv_2d_nhwc_hwc": "nhwc,c->nhwc",
}


def convolution_reference(op: str, x: np.ndarray, w: np.ndarray, stride: int, dilation: int) -> np.ndarray:
    """The convolution as a sum over the filter window of strided input slices times filter taps."""
    window = w.shape[:x.ndim - 2]
    out = [(size - dilation * (k - 1) - 1) // stride + 1 for size, k in zip(x.shape[1:-1], window)]
    total = None
    for tap in np.ndindex(*window):
        part = x[(slice(None), *(slice(dilation * t, dilation * t + stride * (o - 1) + 1, stride)
                                 for t, o in zip(tap, out)))]
        term = np.einsum(CONVOLUTION_EINSUM[op], part, w[tap])
        total = term if total is None else total + term
    return total


def convolution_shapes(op: str, n: int, spatial: tuple[int, ...], window: tuple[int, ...], c: int, f: int,
                       stride: int, dilation: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The input, filter and output shapes; the output extents may be 0 or less when the window does not fit."""
    out = tuple((size - dilation * (k - 1) - 1) // stride + 1 for size, k in zip(spatial, window))
    if op == "depthwise_conv_2d_nhwc_hwc":
        return (n, *spatial, c), (*window, c), (n, *out, c)
    return (n, *spatial, c), (*window, c, f), (n, *out, f)


def convolution_source(op: str, t: str, shapes=None, stride: int = 1, dilation: int = 1) -> str:
    """The kernel of ``op`` on static memrefs of ``shapes``, or on dynamic ones without them."""
    rank = 1 if op == "conv_1d_nwc_wcf" else 2
    filter_rank = rank + (1 if op == "depthwise_conv_2d_nhwc_hwc" else 2)
    if shapes:
        x, w, y = (f"memref<{'x'.join(map(str, shape))}x{t}>" for shape in shapes)
    else:
        x = y = f"memref<{'?x' * (rank + 2)}{t}>"
        w = f"memref<{'?x' * filter_rank}{t}>"
    return CONVOLUTION.format(op=op, X=x, W=w, Y=y, r=rank, s=stride, d=dilation)


def convolution_kernel(op: str, t: str, shapes=None, stride: int = 1, dilation: int = 1):
    return mlir_kernel(convolution_source(op, t, shapes, stride, dilation), pipeline="fast")(lambda x, w: None)


@functools.cache
def dynamic_convolution(op: str, t: str, stride: int, dilation: int):
    return convolution_kernel(op, t, stride=stride, dilation=dilation)


def check_convolution(kernel, op: str, shapes, dtype, stride: int = 1, dilation: int = 1, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    x, w = (rng.integers(-3, 4, shape).astype(dtype) for shape in shapes[:2])
    y = np.zeros(shapes[2], dtype)
    kernel(x, w, out=y)
    np.testing.assert_array_equal(y, convolution_reference(op, x, w, stride, dilation))  # small integers: exact


@settings(max_examples=40, deadline=None)
@given(op=st.sampled_from(sorted(CONVOLUTION_EINSUM)), n=st.integers(1, 2), size=st.integers(1, 70),
       rows=st.integers(1, 9), c=st.integers(1, 70), f=st.integers(1, 70), window=st.integers(1, 3),
       t=st.sampled_from(["f32", "f64"]))
def test_fast_dynamic_convolutions_match_numpy_on_any_shape(op, n, size, rows, c, f, window, t):
    rank = 1 if op == "conv_1d_nwc_wcf" else 2
    spatial, kernel_window = ((size,), (window,)) if rank == 1 else ((rows, size), (window, window))
    shapes = convolution_shapes(op, n, spatial, kernel_window, c, f, 1, 1)
    if min(shapes[2]) < 1:
        return  # the window does not fit the input
    check_convolution(dynamic_convolution(op, t, 1, 1), op, shapes, DTYPES[t])


@pytest.mark.parametrize("stride, dilation", [(2, 1), (1, 2), (3, 2)])
def test_fast_strided_and_dilated_convolutions_match_numpy(stride, dilation):
    op = "conv_2d_nhwc_hwcf"
    shapes = convolution_shapes(op, 2, (13, 29), (3, 2), 7, 40, stride, dilation)
    check_convolution(convolution_kernel(op, "f32", shapes, stride, dilation), op, shapes, np.float32, stride,
                      dilation)


@pytest.mark.parametrize("op, spatial, window, c, f", [
    ("conv_2d_nhwc_hwcf", (8, 56), (3, 3), 64, 64),  # the benchmark's rows, full register tiles
    ("conv_2d_nhwc_hwcf", (9, 17), (2, 3), 5, 70),  # partial tiles on every tiled loop
    ("conv_1d_nwc_wcf", (40,), (3,), 16, 64),
    ("conv_1d_nwc_wcf", (17,), (4,), 5, 33),
    ("depthwise_conv_2d_nhwc_hwc", (20, 20), (3, 3), 64, 0),
    ("depthwise_conv_2d_nhwc_hwc", (9, 13), (2, 3), 37, 0),
])
@pytest.mark.parametrize("t", ["f32", "f64"])
def test_fast_static_convolutions_match_numpy_and_are_vectorized(op, spatial, window, c, f, t):
    shapes = convolution_shapes(op, 1, spatial, window, c, f, 1, 1)
    kernel = convolution_kernel(op, t, shapes)
    # The depthwise convolution's multiply-adds stay arith ops, on vectors.
    assert re.search(r"vector\.fma" if f else r"arith\.mulf .* : vector<", kernel.ir("vectorized"))
    check_convolution(kernel, op, shapes, DTYPES[t], seed=c + f)


TENSOR_CONVOLUTION = """func.func @conv(%x: tensor<2x9x11x5xf32>, %w: tensor<3x3x5x20xf32>) -> tensor<2x7x9x20xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<2x7x9x20xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<2x7x9x20xf32>) -> tensor<2x7x9x20xf32>
  %y = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%x, %w : tensor<2x9x11x5xf32>, tensor<3x3x5x20xf32>) outs(%init : tensor<2x7x9x20xf32>)
      -> tensor<2x7x9x20xf32>
  return %y : tensor<2x7x9x20xf32>
}"""


def test_fast_tensor_convolution_is_vectorized_after_bufferization_and_its_fill_is_a_loop():
    kernel = mlir_kernel(TENSOR_CONVOLUTION, pipeline="fast")(lambda x, w: None)
    vectorized = kernel.ir("vectorized")
    assert "vector.fma" in vectorized
    # The fill is a loop of scalar stores (for LLVM to vectorize), not unrolled vector stores.
    assert "memref.store" in vectorized and "arith.constant dense<0.0" not in vectorized
    rng = np.random.default_rng(4)
    x = rng.integers(-3, 4, (2, 9, 11, 5)).astype(np.float32)
    w = rng.integers(-3, 4, (3, 3, 5, 20)).astype(np.float32)
    np.testing.assert_array_equal(kernel(x, w), convolution_reference("conv_2d_nhwc_hwcf", x, w, 1, 1))


def test_fast_convolution_through_strided_views():
    op = "conv_2d_nhwc_hwcf"
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, (1, 20, 40, 9)).astype(np.float32)
    w = rng.integers(-3, 4, (3, 3, 9, 40)).astype(np.float32)
    view_x, view_w = x[:, ::2, ::-1], w[..., ::3]
    expected = convolution_reference(op, view_x, view_w, 1, 1)
    np.testing.assert_array_equal(dynamic_convolution(op, "f32", 1, 1)(view_x, view_w, out=np.zeros_like(expected)),
                                  expected)


def test_integer_convolution_takes_the_default_lowering_with_fast():
    op = "conv_2d_nhwc_hwcf"
    shapes = convolution_shapes(op, 1, (6, 7), (3, 3), 4, 5, 1, 1)
    kernel = convolution_kernel(op, "i32", shapes)
    assert "vector." not in kernel.ir("vectorized")
    check_convolution(kernel, op, shapes, np.int32)


def test_a_kernel_whose_convolution_strategy_fails_computes_with_the_default_lowering(monkeypatch):
    """The preset is lowered here with a strategy that fails (the compile worker has the real one), and
    what it keeps is the default lowering's input: the op itself, which the default pipeline computes."""
    op = "conv_2d_nhwc_hwcf"
    shapes = convolution_shapes(op, 1, (6, 7), (3, 3), 4, 5, 1, 1)
    parameters = CONVOLUTIONS[f"linalg.{op}"].parameters(f"linalg.{op}", {"ow": 6, "f": 16, "c": 4})
    broken = Strategy("convolution.mlir", False, lambda module, parallel: {**parameters, "channel_loop": "7"})
    monkeypatch.setitem(PRESETS, "fast", (broken,))
    source = convolution_source(op, "f32", shapes)
    parsed = parse_source(source)
    with parsed.context:
        lowered = str(memkernel.compile.pipeline.lower(parsed.module, memkernel.compile.pipeline.parse_pipeline(
            "fast"), source, "vectorized"))
    assert "vector." not in lowered and f"linalg.{op}" in lowered
    check_convolution(mlir_kernel(source, cache=False)(lambda x, w: None), op, shapes, np.float32)


def test_a_failing_convolution_strategy_falls_back_to_the_default_lowering():
    op = "conv_2d_nhwc_hwcf"
    shapes = convolution_shapes(op, 1, (6, 7), (3, 3), 4, 5, 1, 1)
    parsed = parse_source(convolution_source(op, "f32", shapes))
    parameters = CONVOLUTIONS[f"linalg.{op}"].parameters(f"linalg.{op}", {"ow": 6, "f": 16, "c": 4})
    broken = Strategy("convolution.mlir", False, lambda module, parallel: {**parameters, "channel_loop": "7"})
    with parsed.context:
        before = str(parsed.module)
        assert broken.applied(parsed.module) is parsed.module
        assert str(parsed.module) == before


def test_fast_i1_kernel_is_left_to_the_byte_safe_lowering():
    kernel = mlir_kernel(elementwise("arith.andi", "memref<?xi1>", "i1", 1), name="k", pipeline="fast")(
        lambda a, b: None)
    a = np.array([True, False, True, True])
    b = np.array([True, True, False, True])
    np.testing.assert_array_equal(kernel(a, b), a & b)


def test_a_failing_strategy_leaves_the_module_unchanged():
    parsed = parse_source(elementwise("arith.addf", "memref<?xf32>", "f32", 1))
    broken = Strategy("matmul.mlir", False, lambda module, parallel: {"blocks": "oops", "register_rows": "1",
                                                             "register_columns": "1", "leftover_columns": "1"})
    with parsed.context:
        before = str(parsed.module)
        assert broken.applied(parsed.module) is parsed.module
        assert str(parsed.module) == before


def test_a_failing_parallel_matmul_strategy_computes_with_the_default_lowering(monkeypatch):
    """As for the convolution: lowered here with a broken strategy, the matmul op is kept for the default lowering."""
    memref = "memref<?x?xf32>"
    source = MATMUL.format(A=memref, B=memref, C=memref)
    parsed = parse_source(source)
    with parsed.context:
        parameters = memkernel.compile.presets._matmul_parameters(parsed.module, True)
        # Panels of no columns: N is left whole, and the strategy fails.
        broken = Strategy("matmul.mlir", False, lambda module, parallel: {**parameters, "register_columns": "0"},
                          memkernel.compile.presets._mark_row_split)
        assert broken.applied(parsed.module, True) is parsed.module
        monkeypatch.setitem(PRESETS, "fast", (broken,))
        lowered = str(memkernel.compile.pipeline.lower(parsed.module, memkernel.compile.pipeline.parse_pipeline(
            "fast", parallel=True), source, "vectorized"))
    assert "vector." not in lowered and "async." not in lowered and "linalg.matmul" in lowered
    kernel = mlir_kernel(source, parallel=True, cache=False)(lambda a, b: (a.shape[0], b.shape[1]))
    a, b = inputs(200, 30, 20, np.float32)
    np.testing.assert_array_equal(kernel(a, b), a @ b)


def test_the_fast_fingerprint_changes_with_the_tile_sizes(monkeypatch):
    before = memkernel.compile.presets.fingerprint("fast")
    monkeypatch.setattr(memkernel.compile.presets, "_TUNING", (1, 2, 3, 4, 5))
    assert memkernel.compile.presets.fingerprint("fast") != before


def test_unknown_preset_lists_the_presets():
    with pytest.raises(CompileError, match=r"name a preset \('default', 'fast'\)"):
        dynamic_matmul("f32", "fastest")
    assert set(PRESETS) == {"default", "fast"}


@pytest.mark.parametrize("parallel", [False, True])
def test_parallel_loops_compute_the_same_answer(parallel):
    kernel = mlir_kernel(elementwise("math.exp", "memref<?x?xf64>", "f64", 2, n_inputs=1), name="k",
                         parallel=parallel)(lambda a: None)
    x = np.linspace(-1, 1, 3000 * 7).reshape(3000, 7)
    np.testing.assert_allclose(kernel(x), np.exp(x), rtol=1e-14)


@pytest.mark.skipif(os.cpu_count() < 2, reason="needs two cores to show a second thread")
def test_parallel_true_runs_loop_iterations_on_several_threads():
    threads = set()
    kernel = mlir_kernel(PARALLEL_FILL, parallel=True, callbacks={"visit": lambda i: threads.add(
        threading.get_ident())})(lambda out: None)
    out = np.zeros(8192, np.int64)
    kernel(out)
    np.testing.assert_array_equal(out, 2 * np.arange(8192))
    assert len(threads) >= 2


def test_serial_pipeline_runs_scf_parallel_on_the_calling_thread():
    threads = set()
    kernel = mlir_kernel(PARALLEL_FILL, callbacks={"visit": lambda i: threads.add(threading.get_ident())})(
        lambda out: None)
    out = np.zeros(4096, np.int64)
    kernel(out)
    np.testing.assert_array_equal(out, 2 * np.arange(4096))
    assert threads == {threading.get_ident()}


def test_parallel_without_the_async_runtime_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(memkernel.options, "find_library", lambda name: None)
    with pytest.raises(CompileError, match=r"parallel=True runs parallel loops on the MLIR async runtime, "
                                           r"libmlir_async_runtime, which is not installed: pip install "):
        mlir_kernel(PARALLEL_FILL, parallel=True)(lambda out: None)


def test_parallel_with_a_custom_pipeline_is_an_error():
    with pytest.raises(CompileError, match="parallel=True applies to the preset pipelines"):
        mlir_kernel(PARALLEL_FILL, parallel=True, pipeline="canonicalize")(lambda out: None)


def test_an_exception_in_a_callback_on_a_worker_thread_is_raised_from_the_call():
    def visit(i):
        if i == 6000:
            raise LookupError("iteration 6000")

    kernel = mlir_kernel(PARALLEL_FILL, parallel=True, callbacks={"visit": visit})(lambda out: None)
    out = np.zeros(8192, np.int64)
    with pytest.raises(LookupError, match="iteration 6000"):
        kernel(out)
    np.testing.assert_array_equal(out, 2 * np.arange(8192))


def static_matmul(m: int, k: int, n: int):
    a, b, c = (f"memref<{r}x{s}xf32>" for r, s in ((m, k), (k, n), (m, n)))
    return mlir_kernel(f"""func.func @mm(%a: {a}, %b: {b}, %c: {c}) {{
      linalg.matmul ins(%a, %b : {a}, {b}) outs(%c : {c})
      return }}""", pipeline="fast", cache=False)(lambda a, b: None)


@pytest.mark.parametrize("m, k, n", [(2, 0, 5), (1, 5, 0), (16, 0, 16), (16, 16, 0), (0, 4, 4), (1, 0, 3)])
def test_fast_matmul_with_a_static_zero_dim_takes_the_default_lowering_and_matches_numpy(m, k, n):
    """Tiling a static zero dim made an upstream utility assert (the compile worker died): no strategy applies."""
    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    c = np.full((m, n), 3, np.float32)
    np.testing.assert_array_equal(static_matmul(m, k, n)(a, b, out=c.copy()), c + a @ b)


def test_fast_convolution_with_no_input_channels_takes_the_default_lowering():
    x, w, y = "memref<1x6x6x0xf32>", "memref<3x3x0x4xf32>", "memref<1x4x4x4xf32>"
    conv = mlir_kernel(f"""func.func @cv(%x: {x}, %w: {w}, %y: {y}) {{
      linalg.conv_2d_nhwc_hwcf {{dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}}
        ins(%x, %w : {x}, {w}) outs(%y : {y})
      return }}""", pipeline="fast", cache=False)(lambda x, w: None)
    y0 = np.full((1, 4, 4, 4), 2, np.float32)
    np.testing.assert_array_equal(conv(np.ones((1, 6, 6, 0), np.float32), np.ones((3, 3, 0, 4), np.float32),
                                       out=y0.copy()), y0)
