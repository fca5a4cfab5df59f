"""The layout guard and the switch: the fast path runs only where the layout holds and it is not switched off."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from memkernel import ArgumentError, mlir_kernel
from memkernel.fastpath import abi

from ..kernels import elementwise

AXPY_AND_SQUARE = """
func.func @axpy_and_square(%alpha: f64, %k: i64, %x: memref<?xf64>, %y: memref<?xf64>) -> i64 {
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                  iterator_types = ["parallel"]}
      ins(%x : memref<?xf64>) outs(%y : memref<?xf64>) {
  ^bb0(%a: f64, %b: f64):
    %m = arith.mulf %alpha, %a : f64
    %s = arith.addf %m, %b : f64
    linalg.yield %s : f64
  }
  %sq = arith.muli %k, %k : i64
  return %sq : i64
}"""

# For each field, a value another CPython or numpy could have: a neighbouring field's offset, another flag bit.
WRONG = {
    "ob_type": 0,
    "tuple_size": 8,
    "tuple_items": 16,
    "float_value": 8,
    "array_data": 24,
    "array_nd": 16,
    "array_dims": 40,
    "array_strides": 32,
    "array_descr": 48,
    "array_flags": 56,
    "c_contiguous": 0x2,
    "aligned": 0x200,
    "writeable": 0x100,
}


@pytest.fixture(autouse=True)
def variable_unset(monkeypatch):
    """Each test starts without MEMKERNEL_FAST_PATH, also when the suite runs with it set to 0."""
    monkeypatch.delenv(abi.FAST_PATH_VARIABLE, raising=False)


@pytest.fixture
def fresh_check():
    """Forget the process's answer to the layout check before and after the test."""
    abi.fast_path_supported.cache_clear()
    yield
    abi.fast_path_supported.cache_clear()


@pytest.fixture
def wrong_layout(monkeypatch, fresh_check):
    """numpy's descr pointer one field later, as if numpy had inserted a field before it."""
    monkeypatch.setattr(abi, "LAYOUT", dataclasses.replace(abi.LAYOUT, array_descr=abi.LAYOUT.array_descr - 8))


def _add():
    return mlir_kernel(elementwise("arith.addf", "memref<?x?xf32>", "f32", 2), name="k", cache=False)(lambda a, b: None)


def _axpy_and_square():
    return mlir_kernel(AXPY_AND_SQUARE, cache=False)(lambda alpha, k, x, y: None)


def _check_calls_match_numpy(path: str) -> None:
    """Compile both kernels now, call them, compare with numpy, and check which path served the calls."""
    add = _add()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((3, 4), 0.5, np.float32)
    np.testing.assert_array_equal(add(a, b), a + b)
    assert add.invoker.last_path == path

    axpy = _axpy_and_square()
    x, y = np.linspace(-1.0, 1.0, 7), np.arange(7.0)
    expected = 2.5 * x + y
    assert axpy(2.5, -9, x, y) == 81
    np.testing.assert_array_equal(y, expected)
    assert axpy.invoker.last_path == path
    assert (add.invoker.fast is None) == (axpy.invoker.fast is None) == (path == "checked")


def test_the_layout_holds_on_this_interpreter(fresh_check):
    assert abi._layout_holds()
    assert abi.fast_path_supported()


def test_every_field_of_the_layout_has_a_wrong_value_to_test():
    assert set(WRONG) == {field.name for field in dataclasses.fields(abi.Layout)}
    assert all(getattr(abi.LAYOUT, name) != value for name, value in WRONG.items())


@pytest.mark.parametrize("field, value", WRONG.items(), ids=WRONG.keys())
def test_a_wrong_offset_or_flag_bit_fails_the_check(field, value, monkeypatch, fresh_check):
    monkeypatch.setattr(abi, "LAYOUT", dataclasses.replace(abi.LAYOUT, **{field: value}))
    assert not abi._layout_holds()
    assert not abi.fast_path_supported()


def test_numpy_s_zeros_from_its_c_api_table_is_checked(fresh_check):
    assert abi._numpy_zeros_holds()


def test_a_wrong_index_in_numpy_s_c_api_table_fails_the_check(monkeypatch, fresh_check):
    monkeypatch.setattr(abi, "NUMPY_ARRAY_TYPE", abi.NUMPY_ARRAY_TYPE + 1)
    assert not abi._layout_holds()
    assert not abi.fast_path_supported()


def test_kernels_use_the_fast_path_when_the_layout_holds(fresh_check):
    _check_calls_match_numpy("fast")


def test_a_wrong_layout_leaves_kernels_without_fast_path_and_right_answers(wrong_layout):
    assert not abi.fast_path_enabled()
    _check_calls_match_numpy("checked")


def test_kernels_compiled_after_the_check_failed_still_report_errors(wrong_layout):
    add = _add()
    message = "k(): argument 'a' expects memref<?x?xf32> (float32, 2-d); got float64[2, 2]. Pass a.astype(np.float32)."
    with pytest.raises(ArgumentError, match=re.escape(message)):
        add(np.ones((2, 2)), np.ones((2, 2), np.float32))
    assert add.invoker.fast is None


def test_memkernel_fast_path_0_switches_the_fast_path_off(monkeypatch):
    monkeypatch.setenv(abi.FAST_PATH_VARIABLE, "0")
    assert not abi.fast_path_enabled()
    _check_calls_match_numpy("checked")


@pytest.mark.parametrize("value", [None, "1", ""])
def test_the_fast_path_is_on_unless_the_variable_is_0(value, monkeypatch):
    if value is not None:
        monkeypatch.setenv(abi.FAST_PATH_VARIABLE, value)
    assert abi.fast_path_enabled() == abi.fast_path_supported()
    assert abi.fast_path_enabled()


def test_the_variable_is_read_at_each_compile(monkeypatch):
    monkeypatch.setenv(abi.FAST_PATH_VARIABLE, "0")
    off = _add().compile()
    monkeypatch.setenv(abi.FAST_PATH_VARIABLE, "1")
    on = _add().compile()
    assert off.invoker.fast is None
    assert on.invoker.fast is not None
