"""The compiled fast path: it runs the common calls, declines everything else to the checked path."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from memkernel import ArgumentError, ShapeError, ValueRangeError, mlir_kernel
from memkernel.fastpath.abi import fast_path_supported

from ..kernels import WAIT_FOR_FLAG, axpy, elementwise, strided_window
from ..processes import run_python
from .conftest import with_fast_path

AXPY_F32 = axpy("f32", in_place=True)

SUM_AND_SHIFT = """
func.func @stats(%x: memref<?xi64>, %shift: i8, %flag: i1) -> (i64, i8, i1) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xi64>
  %zero = arith.constant 0 : i64
  %s = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> i64 {
    %v = memref.load %x[%i] : memref<?xi64>
    %r = arith.addi %acc, %v : i64
    scf.yield %r : i64
  }
  %one = arith.constant 1 : i8
  %shifted = arith.addi %shift, %one : i8
  %true = arith.constant true
  %not = arith.xori %flag, %true : i1
  return %s, %shifted, %not : i64, i8, i1
}"""

pytestmark = pytest.mark.skipif(not fast_path_supported(), reason="fast path off on this interpreter")


@pytest.fixture(scope="module")
def add():
    return with_fast_path(mlir_kernel(elementwise("arith.addf", "memref<?x?xf32>", "f32", 2), name="k")(lambda a, b: None))


@pytest.fixture(scope="module")
def axpy32():
    @mlir_kernel(AXPY_F32)
    def axpy(alpha, x, y): ...

    return with_fast_path(axpy)


@pytest.fixture(scope="module")
def stats():
    @mlir_kernel(SUM_AND_SHIFT)
    def stats(x, shift, flag): ...

    return with_fast_path(stats)


def test_common_call_never_reaches_the_checked_path(add):
    a, b = np.ones((3, 4), np.float32), np.full((3, 4), 2.0, np.float32)
    out = np.zeros((3, 4), np.float32)
    np.testing.assert_array_equal(add(a, b), a + b)
    assert add.invoker.last_path == "fast"
    assert add(a, b, out=out) is out
    assert add.invoker.last_path == "fast"
    np.testing.assert_array_equal(out, a + b)


def test_scalars_and_results_go_through_the_fast_path(stats):
    x = np.arange(10, dtype=np.int64)
    total, shifted, negated = stats(x, 100, True)
    assert stats.invoker.last_path == "fast"
    assert (total, shifted, negated) == (45, 101, False)
    assert (type(total), type(shifted), type(negated)) == (np.int64, np.int8, np.bool_)


DECLINED = {
    "transposed view": lambda a: (a.T.copy().T, None),
    "step slice": lambda a: (np.repeat(a, 2, axis=1)[:, ::2], None),
    "Fortran order": lambda a: (np.asfortranarray(a), None),
    "list": lambda a: (a.tolist(), None),
    "ndarray subclass": lambda a: (a.view(type("Sub", (np.ndarray,), {})), None),
}


@pytest.mark.parametrize("make", DECLINED.values(), ids=DECLINED.keys())
def test_unusual_input_is_handled_by_the_checked_path(make, add):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    value, _ = make(a)
    np.testing.assert_array_equal(add(value, a), a + a)
    assert add.invoker.last_path == "checked"


@pytest.mark.parametrize("bad, error", [
    (np.ones((3, 4), np.float64), ArgumentError),
    (np.ones(12, np.float32), ArgumentError),
    (np.ones((3, 4), np.float32).astype(">f4"), ArgumentError),
])
def test_wrong_input_is_declined_and_explained(bad, error, add):
    with pytest.raises(error, match="argument 'a'"):
        add(bad, np.ones((3, 4), np.float32))


def test_read_only_output_is_declined_and_explained(add):
    out = np.zeros((3, 4), np.float32)
    out.flags.writeable = False
    with pytest.raises(ArgumentError, match="read-only"):
        add(np.ones((3, 4), np.float32), np.ones((3, 4), np.float32), out=out)


def test_static_dim_mismatch_is_declined_and_explained():
    kernel = mlir_kernel(elementwise("arith.addf", "memref<3x?xf32>", "f32", 2), name="k")(lambda a, b: None)
    with pytest.raises(ShapeError, match="dim 0 is 4, not 3"):
        kernel(np.ones((4, 2), np.float32), np.ones((4, 2), np.float32))


@pytest.mark.parametrize("alpha", [2.5, -0.0, float("inf"), float("nan"), 3.4e38])
def test_python_float_for_f32_matches_numpy_rounding(alpha, axpy32):
    x, y = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = np.float32(alpha) * x + y
    axpy32(alpha, x, y)
    np.testing.assert_array_equal(y, expected)


def test_float_overflowing_f32_is_declined_and_explained(axpy32):
    with pytest.raises(ValueRangeError, match="overflows f32"):
        axpy32(1e39, np.ones(2, np.float32), np.ones(2, np.float32))


@pytest.mark.parametrize("value", [-128, 255, 0, 127, 128])
def test_signless_i8_takes_both_readings_of_its_bits(value, stats):
    _, shifted, _ = stats(np.zeros(1, np.int64), value, False)
    assert shifted == np.array((value + 1) % 256, np.uint8).view(np.int8)


@pytest.mark.parametrize("value", [256, -129, 2**70])
def test_out_of_range_int_is_declined_and_explained(value, stats):
    with pytest.raises(ValueRangeError, match="argument 'shift'"):
        stats(np.zeros(1, np.int64), value, False)


@pytest.mark.parametrize("value, converted", [(np.int8(5), 6), (True, 2)])
def test_int_like_values_the_fast_path_declines_still_work(value, converted, stats):
    _, shifted, _ = stats(np.zeros(1, np.int64), value, False)
    assert stats.invoker.last_path == "checked"
    assert shifted == converted


@pytest.mark.parametrize("through", ["fast path", "checked path"])
def test_gil_is_released_while_the_kernel_runs(through):
    """The kernel spins until another Python thread sets a flag: that thread can run only without the GIL."""

    @mlir_kernel(WAIT_FOR_FLAG)
    def wait_for(flag, limit): ...

    with_fast_path(wait_for)
    flag = np.zeros(1, np.int32)
    limit = 20_000_000_000  # some seconds of spinning: the bound only matters if the GIL is held
    argument = limit if through == "fast path" else np.int64(limit)  # a numpy int is declined
    started = threading.Event()

    def setter():
        started.wait()
        flag[0] = 1

    thread = threading.Thread(target=setter)
    thread.start()
    started.set()
    iterations = wait_for(flag, argument)
    thread.join()
    assert flag[0] == 1 and iterations < limit


@pytest.mark.parametrize("form", ["positional", "keywords"])  # the compiled entry (from 3.11); the fast builtin
def test_a_window_whose_reach_passes_2_to_the_63_is_declined_and_explained(form):
    """``x`` must reach ``2 * (len(y) - 1) + len(w)``: for a stride-0 ``y`` of 2**62 + 1 elements that is past
    2**63, which 64-bit arithmetic wraps to a negative reach that any ``x`` passes (SIGSEGV, before)."""
    n = 2**62 + 1
    printed = run_python(f"""
        import numpy as np
        from memkernel import ShapeError, mlir_kernel
        window = mlir_kernel({strided_window()!r})(lambda x, w: None)
        x, w = np.arange(4, dtype=np.int8), np.ones(1, np.int8)
        y = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), shape=({n},), strides=(0,), writeable=True)
        try:
            window({"x, w" if form == "positional" else "x=x, w=w"}, out=y)
        except ShapeError as exc:
            print(window.invoker.fast is not None, window.invoker.last_path, exc)
        """, MEMKERNEL_FAST_PATH=None)
    needed = 2 * (n - 1) + 1
    assert printed == (f"True checked window(): x has 4 elements on dim 0 but @window's linalg.generic reads up to "
                       f"index {needed - 1} there (out dim 0 = {n}, w dim 0 = 1); pass at least {needed}.\n")
