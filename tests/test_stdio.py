"""What kernels print reaches sys.stdout/sys.stderr, in order; MLIR's IR at each stage can be read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

import memkernel.stdio
from memkernel import CompileError, mlir_kernel

from .kernels import MISSING_GLOBAL, PARALLEL_FILL, elementwise

SHOW = """
func.func private @printMemrefF32(memref<*xf32>) attributes {llvm.emit_c_interface}
func.func @show(%x: memref<?xf32>, %s: f32) {
  %u = memref.cast %x : memref<?xf32> to memref<*xf32>
  call @printMemrefF32(%u) : (memref<*xf32>) -> ()
  vector.print %s : f32
  return
}"""


def show_kernel(**options):
    return mlir_kernel(SHOW, name="show", shared_libs=["mlir_runner_utils"], **options)(lambda x, s: None)


def test_printed_output_reaches_capsys_in_order(capsys):
    show = show_kernel()
    print("before")
    show(np.array([1.0, 2.0, 3.0], np.float32), 2.5)
    print("after")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "before" and lines[-1] == "after"
    assert "[1,  2,  3]" in out and "2.5" in lines[-2]


def test_capture_output_false_leaves_the_c_streams_alone(capfd):
    show = show_kernel(capture_output=False)
    show(np.array([4.0], np.float32), 1.5)
    assert "[4]" in capfd.readouterr().out


def test_a_kernel_that_cannot_print_is_never_captured(monkeypatch, capsys):
    def refuse(call):
        raise AssertionError("captured a kernel that cannot print")

    monkeypatch.setattr(memkernel.stdio, "captured", refuse)
    kernel = mlir_kernel(elementwise("math.sin", "memref<?xf64>", "f64", 1, n_inputs=1), name="k",
                         cache=False)(lambda a: None)
    np.testing.assert_allclose(kernel(np.linspace(0, 1, 5)), np.sin(np.linspace(0, 1, 5)))


def test_capture_output_true_captures_even_in_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(memkernel.stdio, "python_streams_are_the_c_streams", lambda: True)
    show = show_kernel(capture_output=True)
    show(np.array([7.0], np.float32), 0.5)
    assert "[7]" in capsys.readouterr().out


NOT_FOUND = "Symbols not found: [ missing_table ]"


def descriptor_2() -> tuple[int, int]:
    status = os.fstat(2)
    return status.st_dev, status.st_ino


def shown_rows(out: str) -> list[int]:
    """The values ``show`` printed, one per call, in order: its ``[i]`` lines."""
    return [int(value) for value in re.findall(r"^\[(\d+)\]$", out, re.MULTILINE)]


def run_threads(*targets: Callable[[], None], timeout: float = 120.0) -> None:
    """Run each target on a thread of its own; re-raise the first error; fail on a thread still running."""
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                errors.append(exc)
        return run

    threads = [threading.Thread(target=guarded(target), daemon=True) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a thread did not finish: deadlock?"
    if errors:
        raise errors[0]


@pytest.fixture
def descriptor_2_kept():
    """Descriptor 2 as the test found it; put back afterwards, so a failure does not spill into later tests."""
    before, saved = descriptor_2(), os.dup(2)
    try:
        yield before
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def test_compiles_overlapping_captured_calls_leave_descriptor_2_and_lose_nothing(descriptor_2_kept, capsys):
    show = show_kernel(capture_output=True).compile()
    compiled = threading.Event()
    messages: list[str] = []
    calls: list[None] = []

    def call_until_compiled() -> None:
        while not compiled.is_set() or len(calls) < 50:
            show(np.array([len(calls)], np.float32), 0.5)
            calls.append(None)

    def compile_some() -> None:
        try:
            for attempt in range(8):
                with pytest.raises(CompileError) as failed:
                    mlir_kernel(MISSING_GLOBAL, name="k", cache=False)(lambda o: None)(np.zeros(4, np.float32))
                messages.append(str(failed.value))
                kernel = mlir_kernel(elementwise("arith.addf", "memref<?xf64>", "f64", 1), name="k",
                                     cache=False)(lambda a, b: None)
                np.testing.assert_array_equal(kernel(np.arange(3.0), np.full(3, float(attempt))),
                                              np.arange(3.0) + attempt)
        finally:
            compiled.set()

    run_threads(call_until_compiled, compile_some)
    assert descriptor_2() == descriptor_2_kept
    assert len(messages) == 8 and all(NOT_FOUND in message for message in messages)
    assert shown_rows(capsys.readouterr().out) == list(range(len(calls)))


def test_captured_calls_on_two_threads_lose_nothing(capsys):
    show = show_kernel(capture_output=True).compile()

    def calls(first: int) -> Callable[[], None]:
        def run() -> None:
            for value in range(first, first + 200):
                show(np.array([value], np.float32), 0.5)
        return run

    run_threads(calls(0), calls(1000))
    rows = shown_rows(capsys.readouterr().out)
    assert [row for row in rows if row < 1000] == list(range(200))
    assert [row for row in rows if row >= 1000] == list(range(1000, 1200))


def run_python(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` run in a fresh interpreter, which must succeed; a deadlock fails the test through the timeout."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


NESTED_SCRIPT = f"""
import io, sys
import numpy as np
from memkernel import mlir_kernel
show = mlir_kernel({SHOW!r}, name="show", shared_libs=["mlir_runner_utils"], capture_output=CAPTURE)(
    lambda x, s: None)

def visit():
    show(np.array([1.0, 2.0], np.float32), 0.5)
    print("callback done")

outer = mlir_kernel('''
func.func private @visit()
func.func @outer(%s: f32) {{
  vector.print %s : f32
  func.call @visit() : () -> ()
  vector.print %s : f32
  return
}}''', name="outer", callbacks={{"visit": visit}}, capture_output=CAPTURE)(lambda s: None)
terminal = sys.stdout
if CAPTURE is None:
    sys.stdout = io.StringIO()
print("before")
outer(7.0)
print("after")
if CAPTURE is None:
    terminal.write(sys.stdout.getvalue())
"""


@pytest.mark.parametrize("capture", [True, None], ids=["capture_output=True", "sys.stdout-not-descriptor-1"])
def test_a_callback_calling_a_capturing_kernel_prints_in_order(capture):
    out = run_python(NESTED_SCRIPT.replace("CAPTURE", repr(capture))).stdout
    lines = [line for line in out.splitlines() if not line.startswith("Unranked Memref")]
    assert lines == ["before", "7", "[1,  2]", "0.5", "callback done", "7", "after"]


PARALLEL_SCRIPT = """
import threading
import numpy as np
from memkernel import mlir_kernel
say = mlir_kernel('''
func.func @say(%v: i64) {
  vector.print %v : i64
  return
}''', name="say", capture_output=True)(lambda v: None)
threads = set()

def visit(i):
    threads.add(threading.get_ident())
    say(i)

fill = mlir_kernel(SOURCE, name="fill", parallel=True, callbacks={"visit": visit},
                   capture_output=True)(lambda out: None)
out = np.zeros(2048, np.int64)
fill(out)
assert (out == 2 * np.arange(2048)).all()
print("worker threads", len(threads - {threading.get_ident()}))
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to run callbacks on a worker thread")
def test_callbacks_on_worker_threads_calling_a_capturing_kernel_lose_nothing():
    script = PARALLEL_SCRIPT.replace("SOURCE", repr(PARALLEL_FILL))
    printed, workers = run_python(script).stdout.rsplit("worker threads ", 1)
    assert int(workers) >= 1
    # Kernels printing at the same time on several threads may interleave a number and its newline, as in
    # a terminal; what must hold is that every character arrives.
    assert Counter(printed) == Counter("".join(f"{i}\n" for i in range(2048)))


COMPILE_IN_CALLBACK_SCRIPT = f"""
import os
import numpy as np
from memkernel import CompileError, mlir_kernel
before = os.fstat(2).st_ino
missing = mlir_kernel({MISSING_GLOBAL!r}, name="k", cache=False)(lambda o: None)

def visit():
    missing(np.zeros(4, np.float32))

outer = mlir_kernel('''
func.func private @visit()
func.func @outer(%s: f32) {{
  func.call @visit() : () -> ()
  vector.print %s : f32
  return
}}''', name="outer", callbacks={{"visit": visit}}, capture_output=True)(lambda s: None)
try:
    outer(3.0)
except CompileError as exc:
    print("raised:", str(exc).replace(chr(10), " | "))
assert os.fstat(2).st_ino == before
"""


def test_a_compile_inside_a_captured_call_keeps_its_own_stderr_for_the_error():
    done = run_python(COMPILE_IN_CALLBACK_SCRIPT)
    assert done.stdout.splitlines()[0] == "3"
    assert re.search(r"^raised: JIT compilation of @k failed: .*" + re.escape(NOT_FOUND), done.stdout, re.MULTILINE)


def test_what_a_compile_inside_a_captured_call_wrote_on_c_stderr_also_reaches_the_captured_stderr():
    assert NOT_FOUND in run_python(COMPILE_IN_CALLBACK_SCRIPT).stderr


def test_memref_kernel_stages():
    kernel = mlir_kernel(elementwise("arith.addf", "memref<?xf32>", "f32", 1), name="k")(lambda a, b: None)
    assert "linalg.generic" in kernel.ir("input") and "llvm.emit_c_interface" in kernel.ir("input")
    assert kernel.ir("bufferized") == kernel.ir("input")
    loops = kernel.ir("loops")
    assert "linalg" not in loops and "cf.cond_br" in loops
    llvm = kernel.ir("llvm")
    assert "llvm.func @k(" in llvm and "func.func" not in llvm


def test_tensor_kernel_stages_show_bufferization():
    kernel = mlir_kernel("""func.func @twice(%a: tensor<?xf32>) -> tensor<?xf32> {
  %r = arith.addf %a, %a : tensor<?xf32>
  return %r : tensor<?xf32>
}""")(lambda a: None)
    assert "tensor<?xf32>" in kernel.ir("input")
    bufferized = kernel.ir("bufferized")
    assert "tensor<" not in bufferized and "memref.alloc" in bufferized


def test_llvm_ir_is_the_translated_module():
    kernel = mlir_kernel(elementwise("arith.mulf", "memref<?xf64>", "f64", 1), name="k")(lambda a, b: None)
    text = kernel.llvm_ir()
    assert "define void @k(" in text and "fmul" in text


def test_unknown_stage_is_a_value_error():
    kernel = mlir_kernel(elementwise("arith.addf", "memref<?xf32>", "f32", 1), name="k")(lambda a, b: None)
    with pytest.raises(memkernel.OptionError, match="stage must be one of 'input', 'bufferized', 'vectorized', 'loops', 'llvm'"):
        kernel.ir("machine")


def test_custom_pipeline_has_input_and_llvm_stages_only():
    pipeline = ("func.func(convert-linalg-to-loops),expand-strided-metadata,lower-affine,convert-scf-to-cf,"
                "convert-arith-to-llvm,finalize-memref-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,"
                "reconcile-unrealized-casts")
    kernel = mlir_kernel(elementwise("arith.addf", "memref<?xf32>", "f32", 1), name="k",
                         pipeline=pipeline)(lambda a, b: None)
    assert "llvm.func @k(" in kernel.ir("llvm")
    with pytest.raises(ValueError, match="a custom pipeline has the stages 'input' and 'llvm'"):
        kernel.ir("loops")


@pytest.mark.parametrize("name, prints", [("puts", True), ("printf", True), ("write", True), ("putchar", True),
                                          ("printMemrefF32", True), ("expf", False), ("sinf", False),
                                          ("copysign", False), ("malloc", False), ("memrefCopy", False)])
def test_a_kernel_may_print_unless_all_it_calls_is_silent_or_libms_own(name, prints):
    """A lookup through libm finds libc's symbols too (libm depends on libc): puts is libc's, expf libm's."""
    assert memkernel.stdio.may_print([name]) is prints


PUTS = """
llvm.mlir.global internal constant @message("from puts\\00") {addr_space = 0 : i32}
llvm.func @puts(!llvm.ptr) -> i32
func.func @say(%a: memref<?xf32>, %o: memref<?xf32>) {
  %p = llvm.mlir.addressof @message : !llvm.ptr
  %r = llvm.call @puts(%p) : (!llvm.ptr) -> i32
  memref.copy %a, %o : memref<?xf32> to memref<?xf32>
  return
}"""


@pytest.mark.parametrize("isolate", [False, True])
def test_what_a_kernel_writes_with_libcs_puts_comes_in_order_with_python_prints(capsys, isolate):
    say = mlir_kernel(PUTS, isolate=isolate)(lambda a: None)
    a = np.ones(2, np.float32)
    for i in range(3):
        print(f"call {i}")
        np.testing.assert_array_equal(say(a), a)
    assert capsys.readouterr().out.splitlines() == ["call 0", "from puts", "call 1", "from puts", "call 2",
                                                    "from puts"]


ASSERT_POSITIVE = """func.func @positive(%a: memref<?xf32>, %x: f32) {
  %z = arith.constant 0.0 : f32
  %ok = arith.cmpf ogt, %x, %z : f32
  cf.assert %ok, "x must be positive"
  return
}"""


@pytest.mark.parametrize("case", ["checked=True", "cf.assert"])
def test_the_guards_puts_on_its_way_to_abort_does_not_make_a_kernel_one_that_may_print(case):
    """A failed assertion returns to the guard; only an unguarded one prints (then aborts the process). A kernel
    that may print has its output captured at every call, and no compiled entry (9.9x a checked 16-float call)."""
    if case == "checked=True":
        kernel = mlir_kernel(elementwise("arith.addf", "memref<?xf32>", "f32", 1), checked=True, cache=False)(
            lambda a, b: None)
    else:
        kernel = mlir_kernel(ASSERT_POSITIVE, cache=False)(lambda a, x: None)
    assert kernel.invoker.may_print is False


PUTS_THROUGH_A_GLOBAL = """
llvm.mlir.global internal constant @message("through a global\\00") {addr_space = 0 : i32}
llvm.func @puts(!llvm.ptr) -> i32
llvm.mlir.global internal constant @say() {addr_space = 0 : i32} : !llvm.ptr {
  %f = llvm.mlir.addressof @puts : !llvm.ptr
  llvm.return %f : !llvm.ptr
}
func.func @indirect(%a: memref<?xf32>) {
  %g = llvm.mlir.addressof @say : !llvm.ptr
  %f = llvm.load %g : !llvm.ptr -> !llvm.ptr
  %p = llvm.mlir.addressof @message : !llvm.ptr
  %r = llvm.call %f(%p) : !llvm.ptr, (!llvm.ptr) -> i32
  return
}"""


def test_a_kernel_calling_puts_through_a_global_function_pointer_may_print(capsys):
    indirect = mlir_kernel(PUTS_THROUGH_A_GLOBAL, cache=False)(lambda a: None)
    print("before")
    indirect(np.ones(1, np.float32))
    print("after")
    assert indirect.invoker.may_print is True
    assert capsys.readouterr().out.splitlines() == ["before", "through a global", "after"]
