"""Python callbacks bound to the kernel's private declarations."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import numpy as np
import pytest

from memkernel import CompileError, SignatureError, ValueRangeError, mlir_kernel
from memkernel.call.callbacks import PendingErrors
from memkernel.errors import CallbackError

from ..threads import run_together

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


ANSWER = """
func.func private @answer(index) -> {T}
func.func @ask(%i: index) -> {T} {{
  %r = func.call @answer(%i) : (index) -> {T}
  return %r : {T}
}}"""


def ask_kernel(mlir_type, returned):
    source = ANSWER.format(T=mlir_type)
    return mlir_kernel(source, callbacks={"answer": lambda i: returned})(lambda i: None)


@pytest.mark.parametrize("mlir_type, value", [("i32", -7), ("i32", 2**32 - 1), ("i64", -2**63), ("i8", 255),
                                              ("i1", True), ("index", 2**40), ("f32", 1.5), ("f64", 3)])
def test_a_callback_result_that_fits_reaches_the_kernel(mlir_type, value):
    expected = np.array(value).astype(ask_kernel(mlir_type, 0).mlir_signature.results[0].element.dtype)
    assert ask_kernel(mlir_type, value)(0) == expected[()]


@pytest.mark.parametrize("mlir_type, value, reason", [
    ("i32", 2**40 + 5, r"value 1099511627781 is out of range for i32 \(-2147483648 \.\. 4294967295\)"),
    ("i32", 2**100, r"value 1267650600228229401496703205376 is out of range for i32 \(-2147483648 \.\. 4294967295\)"),
    ("i8", -129, r"value -129 is out of range for i8 \(-128 \.\. 255\)"),
    ("f32", 1e300, r"value 1e\+300 overflows f32"),
])
def test_a_callback_result_out_of_range_is_a_value_range_error(mlir_type, value, reason):
    ask = ask_kernel(mlir_type, value)
    with pytest.raises(ValueRangeError, match=rf"^ask\(\): callback @answer returned {re.escape(repr(value))} for its "
                                              rf"{mlir_type} result \({reason}\)\. Return a value that fits "
                                              rf"{mlir_type} from the function bound to @answer\.$"):
        ask(0)


@pytest.mark.parametrize("mlir_type, value, reason", [
    ("i32", "x", r"expects an integer for i32, got str"),
    ("i64", 2.5, r"expects an integer for i64, got float 2\.5; convert it with int\(\) if truncation is intended"),
    ("f64", "x", r"expects a real number for f64, got str"),
    ("f32", None, r"expects a real number for f32, got NoneType"),
])
def test_a_callback_result_of_the_wrong_kind_is_a_callback_error(mlir_type, value, reason):
    ask = ask_kernel(mlir_type, value)
    with pytest.raises(CallbackError, match=rf"^ask\(\): callback @answer returned {value!r} for its "
                                            rf"{mlir_type} result \({reason}\)\. Return a value that fits "
                                            rf"{mlir_type} from the function bound to @answer\.$") as raised:
        ask(0)
    assert isinstance(raised.value, TypeError)


# Calls @check for every i below %n and sums its answers: LLVM cannot drop the loop.
CHECKED_SUM = """
func.func private @check(i64, index) -> i64
func.func @checked_sum(%x: i64, %n: index) -> i64 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0 : i64
  %s = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> i64 {
    %v = func.call @check(%x, %i) : (i64, index) -> i64
    %r = arith.addi %acc, %v : i64
    scf.yield %r : i64
  }
  return %s : i64
}"""


class ItsOwnError(Exception):
    pass


def test_each_threads_call_raises_its_own_callbacks_error_and_no_other():
    n = 50

    def check(x, i):
        if x % 3 == 0 and i == n // 2:
            raise ItsOwnError(x)
        return x

    checked_sum = mlir_kernel(CHECKED_SUM, callbacks={"check": check},
                              capture_output=False)(lambda x, n: None)  # capturing would serialize the calls
    checked_sum(1, n)  # compile once, before the threads start
    outcomes: dict[int, object] = {}

    def caller(first):
        for x in range(first, first + 300):
            try:
                outcomes[x] = checked_sum(x, n)
            except ItsOwnError as error:
                outcomes[x] = error

    run_together(caller, [t * 1000 for t in range(4)])
    assert len(outcomes) == 1200
    for x, outcome in outcomes.items():
        if x % 3 == 0:
            assert isinstance(outcome, ItsOwnError) and outcome.args == (x,), (x, outcome)
        else:
            assert outcome == x * n, (x, outcome)


PARALLEL_CHECK = """
func.func private @check(i64, index)
func.func @checked(%x: i64, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  scf.parallel (%i) = (%c0) to (%n) step (%c1) {
    func.call @check(%x, %i) : (i64, index) -> ()
    scf.reduce
  }
  return
}"""


def test_each_threads_call_of_a_parallel_kernel_raises_its_own_callbacks_error():
    workers = set()

    def check(x, i):
        workers.add(threading.get_ident())
        if x % 3 == 0 and i == 10:
            raise ItsOwnError(x)

    checked = mlir_kernel(PARALLEL_CHECK, callbacks={"check": check}, parallel=True,
                          capture_output=False)(lambda x, n: None)  # capturing would serialize the calls
    checked(1, 2048)
    assert len(workers) > 1  # the callbacks ran on the async runtime's worker threads
    outcomes: dict[int, object] = {}

    def caller(first):
        for x in range(first, first + 10):
            try:
                checked(x, 2048)
                outcomes[x] = None
            except ItsOwnError as error:
                outcomes[x] = error.args[0]

    run_together(caller, [t * 1000 for t in range(4)])
    assert outcomes == {x: x if x % 3 == 0 else None for t in range(4) for x in range(t * 1000, t * 1000 + 10)}


def raise_from_another_thread(pending, error):
    """A kernel call whose callback runs on a worker thread (as with parallel=True) and raises ``error``."""
    worker = threading.Thread(target=pending.add, args=(error,))
    worker.start()
    worker.join()
    return "returned"


def test_a_parallel_kernels_calls_raise_the_errors_of_their_worker_threads_callbacks():
    pending = PendingErrors(parallel=True)
    outcomes: dict[int, object] = {}

    def caller(first):
        for x in range(first, first + 200):
            try:
                outcomes[x] = pending.run(lambda: raise_from_another_thread(pending, ItsOwnError(x))
                                          if x % 2 else "returned")
            except ItsOwnError as error:
                outcomes[x] = error.args[0]

    run_together(caller, [t * 1000 for t in range(4)])
    assert outcomes == {x: x if x % 2 else "returned" for t in range(4) for x in range(t * 1000, t * 1000 + 200)}


def test_a_serial_kernel_call_raises_the_error_of_a_callback_run_on_a_worker_thread():
    pending = PendingErrors(parallel=False)
    with pytest.raises(ItsOwnError, match="from a worker"):
        pending.run(lambda: raise_from_another_thread(pending, ItsOwnError("from a worker")))
    assert pending.run(lambda: 7) == 7


def test_a_nested_call_on_the_same_thread_keeps_its_errors_apart():
    pending = PendingErrors(parallel=False)

    def outer():
        with pytest.raises(ItsOwnError, match="inner"):
            pending.run(lambda: pending.add(ItsOwnError("inner")))
        pending.add(ItsOwnError("outer"))

    with pytest.raises(ItsOwnError, match="outer"):
        pending.run(outer)


# Fills a heap buffer of %n f64 with 0, 1, 2..., lends it to @keep, returns its element 0
# (which @keep may have changed) and frees the buffer.
KEEP = """
func.func private @keep(memref<?xf64>)
func.func @lend(%n: index) -> f64 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = memref.alloc(%n) : memref<?xf64>
  scf.for %i = %c0 to %n step %c1 {
    %j = arith.index_cast %i : index to i64
    %v = arith.sitofp %j : i64 to f64
    memref.store %v, %m[%i] : memref<?xf64>
  }
  func.call @keep(%m) : (memref<?xf64>) -> ()
  %first = memref.load %m[%c0] : memref<?xf64>
  memref.dealloc %m : memref<?xf64>
  return %first : f64
}"""

KEPT_AFTER_FREE = f"""
import numpy as np
from memkernel import mlir_kernel

kept = []

def keep(array):
    kept.append(array)
    array[0] = 42.0

lend = mlir_kernel({KEEP!r}, callbacks={{"keep": keep}})(lambda n: None)
n = 1 << 21  # 16 MiB: malloc maps it, and free unmaps it
print(lend(n))
for _ in range(3):
    lend(n)
kept[0][1] = -1.0  # the callback's array is its own memory, even after the call
print(kept[0][:3].tolist(), float(kept[0][2:].sum()), kept[0].flags.writeable)
"""


def test_a_callback_may_keep_its_array_after_the_kernel_frees_the_memref():
    done = subprocess.run([sys.executable, "-c", KEPT_AFTER_FREE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    n = 1 << 21
    expected = np.arange(n, dtype=np.float64)
    expected[0], expected[1] = 42.0, -1.0
    assert done.stdout.split("\n")[:2] == [
        "42.0", f"{expected[:3].tolist()} {float(expected[2:].sum())} True"]


def test_a_callbacks_writes_reach_the_kernel_and_only_the_elements_it_changed():
    source = """
func.func private @touch(memref<?x?xi32, strided<[?, ?], offset: ?>>)
func.func @touched(%m: memref<?x?xi32, strided<[?, ?], offset: ?>>) {
  func.call @touch(%m) : (memref<?x?xi32, strided<[?, ?], offset: ?>>) -> ()
  return
}"""

    def touch(view):
        view[1, :] *= 10
        view[0, 0] = view[0, 0]  # an unchanged value is not a change

    touched = mlir_kernel(source, callbacks={"touch": touch})(lambda m: None)
    big = np.arange(24, dtype=np.int32).reshape(4, 6)
    expected = big.copy()
    expected[1:4:2, ::2][1, :] *= 10
    touched(big[1:4:2, ::2])
    np.testing.assert_array_equal(big, expected)


def calling(callback: str, kernel: str) -> str:
    """``func.func @kernel(%m: memref<4xf32>)`` that calls ``@callback(%m)`` once."""
    return f"""
func.func private @{callback}(memref<4xf32>)
func.func @{kernel}(%m: memref<4xf32>) {{
  func.call @{callback}(%m) : (memref<4xf32>) -> ()
  return
}}"""


def test_a_callback_that_raises_still_writes_what_it_wrote_before():
    source = calling("half", "halved")

    def half(view):
        view[:2] = 0.5
        raise ItsOwnError("after writing")

    halved = mlir_kernel(source, callbacks={"half": half})(lambda m: None)
    m = np.ones(4, np.float32)
    with pytest.raises(ItsOwnError, match="after writing"):
        halved(m)
    np.testing.assert_array_equal(m, np.array([0.5, 0.5, 1, 1], np.float32))


def test_a_callback_that_changes_its_arrays_shape_in_place_is_an_error():
    source = calling("reshape", "reshaped")

    def reshape(view):
        view.shape = (2, 2)

    reshaped = mlir_kernel(source, callbacks={"reshape": reshape})(lambda m: None)
    m = np.ones(4, np.float32)
    with pytest.raises(CallbackError, match=r"^reshaped\(\): callback @reshape argument #0 was given "
                                            r"float32\[4\] and changed it in place to float32\[2, 2\] "
                                            r"\(strides \(8, 4\)\); its changes cannot go back to the "
                                            r"kernel's memref\. Write into the array, and reshape or view a "
                                            r"new one instead\.$"):
        reshaped(m)
    np.testing.assert_array_equal(m, np.ones(4, np.float32))
