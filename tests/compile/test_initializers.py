"""Global constructors run once per load of a kernel's code, before its first call; destructors once, at
release or exit, in LLVM's order (checked against mlir-runner)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlir import ir as mlir_ir

from memkernel import mlir_kernel

REPO = str(Path(__file__).resolve().parents[2])
TOOLS = Path(mlir_ir.__file__).parent

# Each constructor appends its digit: the value read tells which ran, in which order, and how often.
DIGITS = """
llvm.mlir.global internal @digits(0 : i64) {addr_space = 0 : i32} : i64
llvm.mlir.global_ctors ctors = [@three, @one, @two], priorities = [3 : i32, 1 : i32, 2 : i32],
  data = [#llvm.zero, #llvm.zero, #llvm.zero]
llvm.func @append(%digit: i64) {
  %at = llvm.mlir.addressof @digits : !llvm.ptr
  %old = llvm.load %at : !llvm.ptr -> i64
  %ten = llvm.mlir.constant(10 : i64) : i64
  %shifted = llvm.mul %old, %ten : i64
  %new = llvm.add %shifted, %digit : i64
  llvm.store %new, %at : i64, !llvm.ptr
  llvm.return
}
llvm.func @one() {
  %d = llvm.mlir.constant(1 : i64) : i64
  llvm.call @append(%d) : (i64) -> ()
  llvm.return
}
llvm.func @two() {
  %d = llvm.mlir.constant(2 : i64) : i64
  llvm.call @append(%d) : (i64) -> ()
  llvm.return
}
llvm.func @three() {
  %d = llvm.mlir.constant(3 : i64) : i64
  llvm.call @append(%d) : (i64) -> ()
  llvm.return
}
func.func @digits_read(%out: memref<1xi64>) {
  %at = llvm.mlir.addressof @digits : !llvm.ptr
  %value = llvm.load %at : !llvm.ptr -> i64
  %c0 = arith.constant 0 : index
  memref.store %value, %out[%c0] : memref<1xi64>
  return
}
"""


def _digits_kernel(cache: bool):  # noqa: ANN202 - a Kernel
    # At -O0: from -O2 on, LLVM runs constructors this simple at compile time, into the global's value.
    @mlir_kernel(DIGITS, cache=cache, opt_level=0)
    def digits_read(): ...

    return digits_read


@pytest.mark.parametrize("cache", [False, True])
def test_constructors_run_once_by_ascending_priority_before_the_first_call(cache: bool) -> None:
    kernel = _digits_kernel(cache)
    assert kernel()[0] == 123
    assert kernel()[0] == 123


def test_kernels_sharing_loaded_code_run_its_constructors_once() -> None:
    first, second = _digits_kernel(True), _digits_kernel(True)
    assert first()[0] == 123 and second()[0] == 123


# Upstream's mlir/test/mlir-runner/global-constructors.mlir, with more of each and priorities out of order.
PRINTING = """
module {{
  llvm.func @printNewline()
  llvm.func @printI64(i64)
  llvm.mlir.global_ctors ctors = [@ctor2, @ctor1], priorities = [2 : i32, 1 : i32], data = [#llvm.zero, #llvm.zero]
  llvm.mlir.global_dtors dtors = [{dtors}], priorities = [{priorities}], data = [#llvm.zero, #llvm.zero, #llvm.zero]
  llvm.func @print(%v: i64) {{
    llvm.call @printI64(%v) : (i64) -> ()
    llvm.call @printNewline() : () -> ()
    llvm.return
  }}
""" + "".join(f"""
  llvm.func @{name}() {{{{
    %0 = llvm.mlir.constant({value} : i64) : i64
    llvm.call @print(%0) : (i64) -> ()
    llvm.return
  }}}}""" for name, value in (("ctor1", 1), ("ctor2", 2), ("entry", 3), ("dtor4", 4), ("dtor5", 5), ("dtor6", 6))) + """
}}
"""
SAME_PRIORITY = PRINTING.format(dtors="@dtor4, @dtor5, @dtor6", priorities="0 : i32, 0 : i32, 0 : i32")
# The MLIR and LLVM documentation: destructors by descending priority (mlir-runner's ORC runs them ascending).
BY_PRIORITY = PRINTING.format(dtors="@dtor5, @dtor4, @dtor6", priorities="1 : i32, 2 : i32, 1 : i32")


def test_memkernel_run_runs_constructors_and_destructors_as_mlir_runner_does(tmp_path: Path) -> None:
    path = tmp_path / "global-constructors.mlir"
    path.write_text(SAME_PRIORITY)
    expected = subprocess.run([str(TOOLS / "bin" / "mlir-runner"), str(path), "-e", "entry",
                               "-entry-point-result=void", f"-shared-libs={TOOLS / 'lib' / 'libmlir_c_runner_utils.so'}"],
                              capture_output=True, text=True, check=True, timeout=120).stdout
    assert expected.split() == ["1", "2", "3", "4", "5", "6"]
    for _ in range(2):  # compiled, then from the disk cache
        run = subprocess.run([sys.executable, "-m", "memkernel.cli", "run", str(path), "-e", "entry"],
                             capture_output=True, text=True, timeout=300, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": REPO, "MEMKERNEL_CACHE_DIR": str(tmp_path / "cache")})
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout == expected


def test_destructors_run_once_by_descending_priority_when_the_code_is_released() -> None:
    script = textwrap.dedent("""
        import gc, sys
        from memkernel import mlir_kernel

        kernel = mlir_kernel(sys.argv[1], name="entry", cache=False, capture_output=False)(lambda: None)
        kernel()
        del kernel
        gc.collect()
        print("released", flush=True)
    """)
    run = subprocess.run([sys.executable, "-c", script, BY_PRIORITY], capture_output=True, text=True, timeout=300,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": REPO, "MEMKERNEL_CACHE_DIR": ""})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["1", "2", "3", "4", "5", "6", "released"]  # and none at exit



# A constructor whose allocation fails: it wrote through NULL (SIGSEGV) before the guard ran it.
FAILING_CONSTRUCTOR = """
llvm.mlir.global_ctors ctors = [@grab], priorities = [0 : i32], data = [#llvm.zero]
llvm.func @malloc(i64) -> !llvm.ptr
llvm.func @grab() {
  %size = llvm.mlir.constant(9223372036854775807 : i64) : i64
  %p = llvm.call @malloc(%size) : (i64) -> !llvm.ptr
  %one = llvm.mlir.constant(1.0 : f32) : f32
  llvm.store %one, %p : f32, !llvm.ptr
  llvm.return
}
func.func @k() {
  return
}
"""


def test_a_constructor_whose_allocation_fails_is_an_allocation_error_at_every_call() -> None:
    script = textwrap.dedent("""
        import sys
        from memkernel import AllocationError, mlir_kernel

        kernel = mlir_kernel(sys.argv[1], cache=False, opt_level=0)(lambda: None)
        for _ in range(2):
            try:
                kernel()
            except AllocationError as error:
                print(error)
    """)
    run = subprocess.run([sys.executable, "-c", script, FAILING_CONSTRUCTOR], capture_output=True, text=True,
                         timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO, "MEMKERNEL_CACHE_DIR": ""})
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]
    assert lines[0].startswith("k(): a memref.alloc in its global constructors or destructors could not get "
                               "9223372036854775807 bytes (8.59e+09 GiB): malloc returned NULL.")
