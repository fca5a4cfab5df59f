"""Reductions on memrefs with the "fast" preset: reassociated so LLVM vectorizes them, always numpy's answer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memkernel.call.plan
import memkernel.compile.reassociation
from memkernel import mlir_kernel
from memkernel.compile.presets import fingerprint

SUM = """func.func @total(%x: memref<?x{t}{layout}>, %out: memref<{t}>) {{
  linalg.reduce ins(%x : memref<?x{t}{layout}>) outs(%out : memref<{t}>) dimensions = [0]
    (%v: {t}, %acc: {t}) {{
      %s = arith.{op} %v, %acc : {t}
      linalg.yield %s : {t}
    }}
  return
}}"""

STRIDED = ", strided<[?], offset: ?>"

SUM_OF_SQUARES = """
#id = affine_map<(i) -> (i)>
#scalar = affine_map<(i) -> ()>
func.func @sumsq(%x: memref<?xf64>, %out: memref<f64>) {
  linalg.generic {indexing_maps = [#id, #scalar], iterator_types = ["reduction"]}
      ins(%x : memref<?xf64>) outs(%out : memref<f64>) {
  ^bb0(%v: f64, %acc: f64):
    %sq = arith.mulf %v, %v : f64
    %s = arith.addf %sq, %acc : f64
    linalg.yield %s : f64
  }
  return
}"""

ROW_SUMS = """
#in = affine_map<(i, j) -> (i, j)>
#out = affine_map<(i, j) -> (i)>
func.func @rows(%x: memref<?x?xf32>, %out: memref<?xf32>) {
  linalg.generic {indexing_maps = [#in, #out], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<?x?xf32>) outs(%out : memref<?xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %s = arith.addf %v, %acc : f32
    linalg.yield %s : f32
  }
  return
}"""

DTYPES = {"f32": np.float32, "f64": np.float64}
TOLERANCE = {"f32": {"rtol": 1e-5, "atol": 1e-3}, "f64": {"rtol": 1e-12, "atol": 1e-9}}


def kernel(source: str, pipeline: str = "fast"):
    return mlir_kernel(source, pipeline=pipeline)(lambda x: None)


SUMS = {(t, layout): kernel(SUM.format(t=t, op="addf", layout=layout)) for t in DTYPES for layout in ("", STRIDED)}


@pytest.mark.parametrize("n", [0, 1, 7, 64, 257, 10_000, 100_003])
@pytest.mark.parametrize("t", ["f32", "f64"])
def test_fast_memref_sum_matches_numpy(n, t):
    x = np.random.default_rng(n).standard_normal(n).astype(DTYPES[t])
    np.testing.assert_allclose(SUMS[t, ""](x), np.sum(x, dtype=np.float64), **TOLERANCE[t])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 3000), step=st.integers(-3, 3).filter(bool), t=st.sampled_from(["f32", "f64"]))
def test_fast_strided_memref_sum_matches_numpy_on_views(n, step, t):
    x = np.random.default_rng(n).standard_normal(n).astype(DTYPES[t])[::step]
    np.testing.assert_allclose(SUMS[t, STRIDED](x), np.sum(x, dtype=np.float64), **TOLERANCE[t])


def test_fast_memref_sum_adds_to_the_given_output():
    x = np.arange(1000, dtype=np.float32)
    out = np.array(0.5, np.float32)
    SUMS["f32", ""](x, out=out)
    assert out == np.float32(0.5 + x.sum(dtype=np.float64))


def test_a_sum_into_an_element_of_its_own_input_reads_the_input_as_it_was():
    x = np.random.default_rng(0).standard_normal(5000).astype(np.float32)
    before = x.copy()
    SUMS["f32", ""](x, out=x[3:4].reshape(()))
    expected = before.copy()
    expected[3] = before[3] + np.sum(before, dtype=np.float64)
    np.testing.assert_allclose(x, expected, rtol=1e-5, atol=1e-3)


def test_fast_memref_product_matches_numpy():
    x = (1 + np.random.default_rng(1).standard_normal(4099) / 1000).astype(np.float64)
    product = kernel(SUM.format(t="f64", op="mulf", layout=""))
    np.testing.assert_allclose(product(x, out=np.array(1.0)), np.prod(x), rtol=1e-12)


def test_only_the_accumulating_op_is_reassociated():
    compiled = kernel(SUM_OF_SQUARES)
    lines = compiled.ir("vectorized").splitlines()
    assert any("arith.addf" in line and "fastmath<reassoc>" in line for line in lines)
    assert not any("arith.mulf" in line and "fastmath" in line for line in lines)
    x = np.random.default_rng(2).standard_normal(777)
    np.testing.assert_allclose(compiled(x), np.dot(x, x), rtol=1e-12)


def test_the_default_preset_keeps_the_order_of_a_sum():
    compiled = kernel(SUM.format(t="f32", op="addf", layout=""), pipeline="default")
    assert "fastmath" not in compiled.ir("vectorized")
    x = np.random.default_rng(3).standard_normal(3000).astype(np.float32)
    sequential = np.float32(0)
    for value in x:
        sequential = np.float32(sequential + value)
    assert compiled(x) == sequential


def test_a_maximum_is_left_as_written():
    compiled = kernel(SUM.format(t="f32", op="maximumf", layout=""))
    assert "fastmath" not in compiled.ir("vectorized")
    x = np.random.default_rng(4).standard_normal(3000).astype(np.float32)
    assert compiled(x, out=np.array(-np.inf, np.float32)) == x.max()


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (1, 1), (17, 1000), (300, 33)])
def test_fast_row_sums_on_memrefs_match_numpy(shape):
    compiled = mlir_kernel(ROW_SUMS, pipeline="fast")(lambda x: (x.shape[0],))
    assert "fastmath<reassoc>" in compiled.ir("vectorized")
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(compiled(x), x.sum(axis=1, dtype=np.float64), rtol=1e-5, atol=1e-3)


def test_the_fast_fingerprint_covers_the_rule(monkeypatch):
    before = fingerprint("fast")
    monkeypatch.setattr(memkernel.compile.reassociation.Reassociation, "text", "another rule")
    assert fingerprint("fast") != before


@pytest.mark.parametrize("position", [0, 5, 2048, 4095])
def test_the_vectorized_sum_is_still_the_loop_as_written_when_its_output_is_inside_its_input(monkeypatch, position):
    # memkernel copies an input that an output overlaps, so only a call past that rule shows what the compiled
    # loop does with aliased memory: LLVM vectorizes it behind a runtime overlap check, and here the check must
    # send it down the loop as written, each partial sum stored into the input before it is read again.
    monkeypatch.setattr(memkernel.call.plan.CallPlan, "_separate_overlaps", lambda self, checked: None)
    x = np.arange(1, 4097, dtype=np.float32) / 7
    expected = x.copy()
    for i in range(len(expected)):
        expected[position] = np.float32(expected[i] + expected[position])
    SUMS["f32", ""](x, out=x[position:position + 1].reshape(()))
    assert SUMS["f32", ""].invoker.last_path == "checked"
    np.testing.assert_array_equal(x, expected)
