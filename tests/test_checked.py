"""A failed cf.assert is a KernelAssertionError, and checked=True adds MLIR's runtime verification."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memkernel import CompileError, KernelAssertionError, mlir_kernel

from .kernels import FILL
from .threads import run_together

REPO = str(Path(__file__).resolve().parents[1])
F32 = np.float32

# Stores x[i] into out, then asserts ok: the store happens before the check.
STORE_THEN_ASSERT = """func.func @k(%ok: i1, %x: memref<?xf32>, %i: index, %out: memref<f32>) {
  %v = memref.load %x[%i] : memref<?xf32>
  memref.store %v, %out[] : memref<f32>
  cf.assert %ok, "ok must be true"
  return
}"""

VERIFYING_PIPELINE = (
    "builtin.module(generate-runtime-verification, convert-scf-to-cf, expand-strided-metadata, "
    "finalize-memref-to-llvm, convert-arith-to-llvm, convert-cf-to-llvm, convert-func-to-llvm, "
    "reconcile-unrealized-casts)"
)
LOAD = """func.func @load(%a: memref<?xf32>, %i: index) -> f32 {
  %v = memref.load %a[%i] : memref<?xf32>
  return %v : f32
}"""

# A window of 4 elements of x at offset o.
WINDOW_SUM = """func.func @window(%x: memref<?xf32>, %o: index, %out: memref<f32>) {
  %w = memref.subview %x[%o] [4] [1] : memref<?xf32> to memref<4xf32, strided<[1], offset: ?>>
  linalg.reduce ins(%w : memref<4xf32, strided<[1], offset: ?>>) outs(%out : memref<f32>) dimensions = [0]
    (%a: f32, %b: f32) {
      %s = arith.addf %a, %b : f32
      linalg.yield %s : f32
    }
  return
}"""


def test_a_failed_assertion_of_the_source_is_an_exception_with_its_line():
    k = mlir_kernel(STORE_THEN_ASSERT)(lambda ok, x, i: None)
    x = np.arange(4, dtype=F32)
    with pytest.raises(KernelAssertionError, match=re.escape(
            "k(): the kernel stopped at a failed assertion:\nok must be true\nLocation: line 4, column 3\n"
            '    cf.assert %ok, "ok must be true"')):
        k(False, x, 2)
    assert k(True, x, 2) == 2.0  # the process and the kernel live on


@pytest.mark.parametrize("isolate", [False, True])
def test_a_failed_assertion_gives_its_message_as_the_source_writes_it(isolate):
    k = mlir_kernel(STORE_THEN_ASSERT, isolate=isolate)(lambda ok, x, i: None)
    with pytest.raises(KernelAssertionError) as failed:
        k(False, np.arange(4, dtype=F32), 2)
    assert failed.value.assertion == "ok must be true"


@pytest.mark.parametrize("message", ["index out of range\\nLocation: loc(unknown)", "two\\nlines"])
def test_a_failed_assertion_keeps_a_message_of_several_lines_as_written(message):
    k = mlir_kernel(STORE_THEN_ASSERT.replace('"ok must be true"', f'"{message}"'))(lambda ok, x, i: None)
    with pytest.raises(KernelAssertionError) as failed:
        k(False, np.arange(4, dtype=F32), 2)
    assert failed.value.assertion == message.replace("\\n", "\n")


def test_a_write_completed_before_the_failure_is_kept():
    k = mlir_kernel(STORE_THEN_ASSERT)(lambda ok, x, i: None)
    out = np.zeros((), F32)
    with pytest.raises(KernelAssertionError):
        k(False, np.arange(4, dtype=F32), 3, out=out)
    assert out == 3.0


def test_without_checked_an_assertion_free_kernel_keeps_the_fast_path(monkeypatch):
    monkeypatch.delenv("MEMKERNEL_FAST_PATH", raising=False)  # whatever the session says
    fill = mlir_kernel(FILL, cache=False)(lambda y, n: None)
    y = np.zeros(3, F32)
    fill(y, 3)
    assert fill.invoker.fast is not None and fill.invoker.last_path == "fast"


def test_a_checked_kernel_takes_the_fast_path_and_fails_there_as_on_the_checked_path(monkeypatch):
    monkeypatch.delenv("MEMKERNEL_FAST_PATH", raising=False)  # whatever the session says
    fill = mlir_kernel(FILL, checked=True, cache=False)(lambda y, n: None)
    y = np.zeros(3, F32)
    fill(y, 3)
    assert fill.invoker.last_path == "fast"
    with pytest.raises(KernelAssertionError) as fast:
        fill(y, 5)
    with pytest.raises(KernelAssertionError) as checked:
        fill.invoker.plan.call((y, 5), ())
    assert str(fast.value) == str(checked.value) and "out-of-bounds access" in str(fast.value)


def test_checked_turns_an_out_of_bounds_store_into_an_exception():
    fill = mlir_kernel(FILL, checked=True)(lambda y, n: None)
    big = np.zeros(8, F32)
    y = big[:3]
    with pytest.raises(KernelAssertionError, match=r"(?s)Runtime op verification failed.*out-of-bounds access.*"
                                                   r"memref.store %one, %y\[%i\]"):
        fill(y, 5)
    np.testing.assert_array_equal(big, [1, 1, 1, 0, 0, 0, 0, 0])  # stopped at the first bad store
    fill(y, 3)
    np.testing.assert_array_equal(y, [1, 1, 1])


def test_checked_copies_back_what_was_written_into_a_copied_view():
    fill = mlir_kernel(FILL, checked=True)(lambda y, n: None)
    base = np.zeros(8, F32)
    y = base[::2]  # not contiguous: the kernel works on a copy, written back after the call
    with pytest.raises(KernelAssertionError):
        fill(y, 6)
    np.testing.assert_array_equal(base, [1, 0, 1, 0, 1, 0, 1, 0])


def test_checked_catches_a_subview_past_the_end():
    window = mlir_kernel(WINDOW_SUM, checked=True)(lambda x, o: None)
    x = np.arange(6, dtype=F32)
    assert window(x, 2) == x[2:6].sum()
    with pytest.raises(KernelAssertionError, match="memref.subview"):
        window(x, 3)


def test_memkernel_checked_in_the_environment_checks(monkeypatch):
    monkeypatch.setenv("MEMKERNEL_CHECKED", "1")
    fill = mlir_kernel(FILL)(lambda y, n: None)
    with pytest.raises(KernelAssertionError):
        fill(np.zeros(2, F32), 3)


def test_memkernel_checked_in_the_environment_leaves_parallel_kernels_unchecked(monkeypatch):
    monkeypatch.setenv("MEMKERNEL_CHECKED", "1")
    fill = mlir_kernel(FILL, parallel=True)(lambda y, n: None)  # checked=True here would be refused
    assert "cf.assert" not in fill.ir("vectorized")
    assert "cf.assert" in mlir_kernel(FILL)(lambda y, n: None).ir("vectorized")  # the serial one is checked
    y = np.zeros(3, F32)
    fill(y, 2)
    np.testing.assert_array_equal(y, [1, 1, 0])


def test_checked_with_parallel_is_refused():
    with pytest.raises(CompileError, match="checked=True stops a kernel at its first failed check"):
        mlir_kernel(FILL, checked=True, parallel=True)(lambda y, n: None)


def test_each_thread_gets_its_own_failures():
    k = mlir_kernel(STORE_THEN_ASSERT)(lambda ok, x, i: None)
    x = np.arange(4, dtype=F32)
    wrong: list[str] = []

    def calls(ok: bool) -> None:
        for _ in range(300):
            try:
                result = k(ok, x, 1)
            except KernelAssertionError:
                if ok:
                    wrong.append("an assertion failed in a call whose check holds")
            else:
                if not ok or result != 1.0:
                    wrong.append(f"a failing call returned {result}")

    run_together(calls, [i % 2 == 0 for i in range(4)])
    assert wrong == []


def test_a_kernel_loaded_from_the_disk_cache_is_still_guarded(tmp_path):
    script = "\n".join([
        "import numpy as np",
        "from memkernel import KernelAssertionError, mlir_kernel",
        f"k = mlir_kernel({STORE_THEN_ASSERT!r})(lambda ok, x, i: None)",
        "try:",
        "    k(False, np.arange(4, dtype=np.float32), 1)",
        "except KernelAssertionError:",
        "    print('raised')",
    ])
    env = {"MEMKERNEL_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "PYTHONPATH": REPO}
    for _ in range(2):  # the first run compiles and stores, the second loads
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                              env=env)
        assert done.stdout.strip() == "raised", done.stderr


# q = a / b (or the other op) elementwise, one scalar at a time: the division is on line 6.
DIVIDE = """func.func @divide(%a: memref<?x{t}>, %b: memref<?x{t}>, %q: memref<?x{t}>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %a, %c0 : memref<?x{t}>
  scf.for %i = %c0 to %n step %c1 {{
    %x = memref.load %a[%i] : memref<?x{t}>
    %y = memref.load %b[%i] : memref<?x{t}>
    %r = arith.{op} %x, %y : {t}
    memref.store %r, %q[%i] : memref<?x{t}>
  }}
  return
}}"""

# The same with vector<4x...> operands: every lane is checked.
VECTOR_DIVIDE = """func.func @divide(%a: memref<4xi32>, %b: memref<4xi32>, %q: memref<4xi32>) {
  %c0 = arith.constant 0 : index
  %pad = arith.constant 0 : i32
  %x = vector.transfer_read %a[%c0], %pad : memref<4xi32>, vector<4xi32>
  %y = vector.transfer_read %b[%c0], %pad : memref<4xi32>, vector<4xi32>
  %r = arith.divsi %x, %y : vector<4xi32>
  vector.transfer_write %r, %q[%c0] : vector<4xi32>, memref<4xi32>
  return
}"""

TRAPPING = [
    ("divsi", "i32", np.int32, [7, 1], [0, 1], "integer division by zero (divsi)"),
    ("remsi", "i64", np.int64, [7, 1], [1, 0], "integer division by zero (remsi)"),
    ("divui", "i8", np.uint8, [7, 200], [3, 0], "integer division by zero (divui)"),
    ("remui", "i16", np.uint16, [7, 1], [0, 0], "integer division by zero (remui)"),
    ("floordivsi", "i32", np.int32, [5, 1], [0, 2], "integer division by zero (floordivsi)"),
    ("ceildivsi", "i32", np.int32, [5, 1], [2, 0], "integer division by zero (ceildivsi)"),
    ("divsi", "i32", np.int32, [7, -2**31], [2, -1],
     "integer overflow: -2147483648 divided by -1 (divsi) does not fit i32"),
    ("remsi", "i8", np.int8, [-128, 5], [-1, 2], "integer overflow: -128 divided by -1 (remsi) does not fit i8"),
]


@pytest.mark.parametrize("op, t, dtype, a, b, message", TRAPPING)
def test_checked_turns_a_trapping_integer_division_into_an_exception_with_its_line(op, t, dtype, a, b, message):
    divide = mlir_kernel(DIVIDE.format(op=op, t=t), checked=True)(lambda a, b: None)
    with pytest.raises(KernelAssertionError, match=re.escape(
            f"divide(): the kernel stopped at a failed assertion:\n{message}\nLocation: line 8, column 10\n"
            f"    %r = arith.{op} %x, %y : {t}")):
        divide(np.array(a, dtype), np.array(b, dtype))


@pytest.mark.parametrize("op, t, dtype, numpy_op", [
    ("divsi", "i32", np.int32, lambda a, b: np.trunc(a / b)), ("remsi", "i32", np.int32, np.fmod),
    ("divui", "i8", np.uint8, np.floor_divide), ("remui", "i8", np.uint8, np.remainder),
    ("floordivsi", "i64", np.int64, np.floor_divide),
])
def test_checked_divisions_that_do_not_trap_compute_numpys_answer(op, t, dtype, numpy_op):
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True)
    b[b == 0] = 3
    if info.min < 0:
        b[(a == info.min) & (b == -1)] = 2
    divide = mlir_kernel(DIVIDE.format(op=op, t=t), checked=True)(lambda a, b: None)
    expected = numpy_op(a.astype(np.float64) if op == "divsi" else a, b).astype(dtype)
    np.testing.assert_array_equal(divide(a, b).view(dtype), expected)  # an i8 output is allocated as int8


def test_a_custom_pipelines_runtime_check_is_a_kernel_assertion_error():
    load = mlir_kernel(LOAD, pipeline=VERIFYING_PIPELINE, cache=False)(lambda a, i: None)
    a = np.arange(4, dtype=np.float32)
    assert load(a, 2) == 2.0
    with pytest.raises(KernelAssertionError, match="out-of-bounds access"):
        load(a, 7)


def test_a_failing_kernel_inside_a_callback_raises_from_its_own_call():
    inner = mlir_kernel(LOAD, pipeline=VERIFYING_PIPELINE, cache=False)(lambda a, i: None)
    seen: list[str] = []

    def callback(i: int) -> int:
        try:
            inner(np.ones(4, np.float32), i)
        except KernelAssertionError:
            seen.append("inner")
        return 0

    outer = mlir_kernel("""
        func.func private @cb(i64) -> i64
        func.func @outer(%i: i64) -> i64 {
          %r = func.call @cb(%i) : (i64) -> i64
          return %r : i64
        }""", callbacks={"cb": callback})(lambda i: None)
    for _ in range(300):  # skipped Python frames would exhaust the recursion limit long before this
        assert outer(100) == 0
    assert seen == ["inner"] * 300


def test_checked_checks_every_lane_of_a_vector_division():
    divide = mlir_kernel(VECTOR_DIVIDE, checked=True)(lambda a, b: None)
    a = np.array([8, 9, 10, -2**31], np.int32)
    np.testing.assert_array_equal(divide(a, np.array([2, 3, 5, 1], np.int32)), [4, 3, 2, -2**31])
    with pytest.raises(KernelAssertionError, match=r"integer division by zero \(divsi\)"):
        divide(a, np.array([2, 3, 0, 1], np.int32))
    with pytest.raises(KernelAssertionError, match=r"integer overflow: -2147483648 divided by -1"):
        divide(a, np.array([2, 3, 5, -1], np.int32))


def test_checked_index_division_by_zero_is_an_exception():
    source = DIVIDE.replace("%r = arith.{op} %x, %y : {t}", "%xi = arith.index_cast %x : {t} to index\n"
                            "    %yi = arith.index_cast %y : {t} to index\n"
                            "    %ri = arith.divsi %xi, %yi : index\n"
                            "    %r = arith.index_cast %ri : index to {t}")
    divide = mlir_kernel(source.format(t="i64"), checked=True)(lambda a, b: None)
    np.testing.assert_array_equal(divide(np.array([9], np.int64), np.array([-2], np.int64)), [-4])
    with pytest.raises(KernelAssertionError, match=r"integer division by zero \(divsi\)"):
        divide(np.array([9], np.int64), np.array([0], np.int64))


@pytest.mark.parametrize("op, message", [("divs", "integer division by zero (divs)"),
                                         ("remu", "integer division by zero (remu)"),
                                         ("floordivs", "integer division by zero (floordivs)")])
def test_checked_checks_the_index_dialects_divisions(op, message):
    divide = mlir_kernel(f"""func.func @divide(%a: index, %b: index) -> index {{
  %q = index.{op} %a, %b
  return %q : index
}}""", checked=True)(lambda a, b: None)
    assert divide(17, 5) == {"divs": 3, "remu": 2, "floordivs": 3}[op]
    with pytest.raises(KernelAssertionError, match=re.escape(message)):
        divide(17, 0)
