"""Compilation in a worker process: an abort in MLIR or LLVM is a CompileError, and this process lives on."""

from __future__ import annotations

import io
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import memkernel.compile.worker as compile_worker
from memkernel import subprocesses
from memkernel.compile import server
from memkernel import ArgumentError, CompileError, mlir_kernel

from ..kernels import elementwise
from ..processes import alive, run_python
from ..threads import run_together

REPO = str(Path(__file__).resolve().parents[2])

# A row-major 4x5 matrix, read as a vector, is a column-major 5x4 one: its transpose, column-major 4x5,
# is the row-major 5x4 transpose. llvm.intr.matrix.* needs LLVM's -enable-matrix: without it, code
# generation ends in "LLVM ERROR: Do not know how to widen the result of this operator!" and an abort.
FLAT_TRANSPOSE = """
func.func @transpose(%a: memref<20xf64>, %t: memref<20xf64>) {
  %c0 = arith.constant 0 : index
  %v = vector.load %a[%c0] : memref<20xf64>, vector<20xf64>
  %r = llvm.intr.matrix.transpose %v {rows = 5 : i32, columns = 4 : i32} : vector<20xf64> into vector<20xf64>
  vector.store %r, %t[%c0] : memref<20xf64>, vector<20xf64>
  return
}"""

# Bufferizing tensor.extract on a tensor of i1 gives a memref.load of an i1 element, on which
# finalize-memref-to-llvm asserts; the preset pipelines rewrite those loads first, this one does not.
I1_LOAD = """
func.func @first(%t: tensor<4xi1>) -> i1 {
  %c0 = arith.constant 0 : index
  %v = tensor.extract %t[%c0] : tensor<4xi1>
  return %v : i1
}"""
SKIPS_I1_REWRITE = ("one-shot-bufferize{bufferize-function-boundaries=1},convert-func-to-llvm,"
                    "finalize-memref-to-llvm,convert-arith-to-llvm,reconcile-unrealized-casts")
I1_ASSERTION = "Assertion `integralElementType.getWidth() >= 8' failed"

MATRIX = ("-enable-matrix",)


def flat_transpose(**options):
    return mlir_kernel(FLAT_TRANSPOSE, name="transpose", **options)(lambda a: None)


def i1_load():
    return mlir_kernel(I1_LOAD, name="first", pipeline=SKIPS_I1_REWRITE, cache=False)(lambda t: None)


def unique_add() -> tuple[str, str]:
    name = f"add_{uuid.uuid4().hex[:12]}"
    return elementwise("arith.addf", "memref<?xf64>", "f64", 1, name=name), name


def add_kernel(**options):
    source, name = unique_add()
    return mlir_kernel(source, name=name, **options)(lambda a, b: None)


def check_add(kernel) -> None:
    a, b = np.arange(7.0), np.linspace(-1.0, 1.0, 7)
    np.testing.assert_array_equal(kernel(a, b), a + b)


def test_flat_transpose_without_enable_matrix_is_a_compile_error_naming_the_abort():
    with pytest.raises(CompileError) as failed:
        flat_transpose(cache=False).compile()
    message = str(failed.value)
    assert "compiling @transpose crashed the compile worker: it was killed by SIGABRT" in message
    assert "LLVM ERROR: Do not know how to widen the result of this operator!" in message
    assert "llvm_options=" in message and "-enable-matrix" in message
    assert isinstance(failed.value, RuntimeError)


def test_the_compile_after_a_crash_works():
    with pytest.raises(CompileError, match="SIGABRT"):
        flat_transpose(cache=False).compile()
    check_add(add_kernel(cache=False))


def test_flat_transpose_with_enable_matrix_gives_numpys_transpose():
    a = np.random.default_rng(1).standard_normal((4, 5))
    transposed = flat_transpose(cache=False, llvm_options=MATRIX)(a.ravel())
    np.testing.assert_array_equal(transposed.reshape(5, 4), a.T)


def test_llvm_options_are_part_of_the_cache_key(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    a = np.arange(20.0)
    np.testing.assert_array_equal(flat_transpose(llvm_options=MATRIX)(a).reshape(5, 4), a.reshape(4, 5).T)
    # The same source without the option must compile again (and abort), not reuse the code made with it.
    with pytest.raises(CompileError, match="SIGABRT"):
        flat_transpose().compile()


def test_an_assertion_in_the_lowering_is_a_compile_error_with_its_text():
    with pytest.raises(CompileError) as failed:
        i1_load().compile()
    message = str(failed.value)
    assert "compiling @first crashed the compile worker: it was killed by SIGABRT" in message
    assert I1_ASSERTION in message


def test_ir_runs_in_the_worker_and_an_aborting_stage_is_a_compile_error():
    kernel = i1_load()
    assert "tensor.extract" in kernel.ir("input")
    with pytest.raises(CompileError) as failed:
        kernel.ir("llvm")
    assert "lowering @first to stage 'llvm' crashed the compile worker" in str(failed.value)
    assert I1_ASSERTION in str(failed.value)
    source, name = unique_add()
    assert f"llvm.func @{name}(" in mlir_kernel(source, name=name)(lambda a, b: None).ir("llvm")


def test_kernels_compile_from_two_threads_at_once():
    kernels = [add_kernel(cache=False), flat_transpose(cache=False, llvm_options=MATRIX)]
    barrier = threading.Barrier(2 * len(kernels))
    errors: list[BaseException] = []

    def compile_one(kernel) -> None:
        barrier.wait()
        try:
            kernel.compile()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    run_together(compile_one, kernels * 2)
    assert errors == []
    check_add(kernels[0])
    a = np.arange(20.0)
    np.testing.assert_array_equal(kernels[1](a).reshape(5, 4), a.reshape(4, 5).T)


def test_kernels_with_callbacks_compile_in_the_worker_and_call_back_here():
    source = """
    func.func private @scale(f64, index) -> f64
    func.func @scaled(%a: memref<?xf64>, %o: memref<?xf64>) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %n = memref.dim %a, %c0 : memref<?xf64>
      scf.for %i = %c0 to %n step %c1 {
        %x = memref.load %a[%i] : memref<?xf64>
        %y = func.call @scale(%x, %i) : (f64, index) -> f64
        memref.store %y, %o[%i] : memref<?xf64>
      }
      return
    }"""
    seen: list[int] = []

    def scale(x: float, i: int) -> float:
        seen.append(i)
        return x * (i + 1)

    kernel = mlir_kernel(source, name="scaled", callbacks={"scale": scale})(lambda a: None)
    a = np.linspace(0.5, 3.0, 6)
    np.testing.assert_array_equal(kernel(a), a * np.arange(1, 7))
    assert seen == list(range(6))
    assert compile_worker.worker(()).pid() is not None


def test_bad_llvm_options_are_refused():
    with pytest.raises(ArgumentError, match=r"llvm_options expects a sequence of LLVM options.*got str"):
        flat_transpose(llvm_options="-enable-matrix")
    with pytest.raises(ArgumentError, match=r"each a str starting with '-'.*got 'enable-matrix'"):
        flat_transpose(llvm_options=("enable-matrix",))
    with pytest.raises(CompileError) as failed:
        flat_transpose(cache=False, llvm_options=("-no-such-llvm-option",)).compile()
    message = str(failed.value)
    assert "compile worker with llvm_options=('-no-such-llvm-option',) exited with status 1" in message
    assert "Unknown command line argument '-no-such-llvm-option'" in message


def run_script(script: str, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO, "MEMKERNEL_CACHE_DIR": str(cache)})


WARM_CACHE_RUN = """
import sys
import numpy as np
import memkernel.compile.worker
from memkernel import mlir_kernel
if sys.argv[2] == "forbid-the-worker":
    def refuse(*args, **kwargs):
        raise AssertionError("started a compile worker")
    memkernel.compile.worker._spawn = refuse
kernel = mlir_kernel(open(sys.argv[1]).read(), name=sys.argv[3])(lambda a, b: None)
a, b = np.arange(100.0), np.full(100, 0.5)
assert np.array_equal(kernel(a, b), a + b)
print("ok")
"""


def test_a_process_with_a_warm_disk_cache_starts_no_worker(tmp_path):
    source, name = unique_add()
    source_file = tmp_path / "kernel.mlir"
    source_file.write_text(source)
    cold = run_script(WARM_CACHE_RUN, tmp_path / "cache", str(source_file), "forbid-the-worker", name)
    assert cold.returncode != 0 and "started a compile worker" in cold.stderr  # the cache is cold: it must compile
    first = run_script(WARM_CACHE_RUN, tmp_path / "cache", str(source_file), "compile", name)
    assert first.stdout == "ok\n", first.stderr
    warm = run_script(WARM_CACHE_RUN, tmp_path / "cache", str(source_file), "forbid-the-worker", name)
    assert warm.stdout == "ok\n", warm.stderr


def test_the_worker_ends_when_its_caller_dies(tmp_path):
    script = f"""
    import os, signal, sys
    import memkernel.compile.worker
    from memkernel import mlir_kernel
    mlir_kernel({unique_add()[0]!r}, cache=False)(lambda a, b: None).compile()
    print(memkernel.compile.worker.worker(()).pid(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
    done = run_script(script, tmp_path / "cache")
    assert done.returncode == -signal.SIGKILL
    pid = int(done.stdout)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_a_worker_killed_while_idle_is_replaced_without_an_error():
    check_add(add_kernel(cache=False))
    pid = compile_worker.worker(()).pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    while compile_worker.worker(()).pid() is not None:  # until its whole thread group has exited
        time.sleep(0.01)
    check_add(add_kernel(cache=False))
    assert compile_worker.worker(()).pid() not in (None, pid)


def test_compile_worker_0_compiles_in_this_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("started a compile worker")

    monkeypatch.setenv("MEMKERNEL_COMPILE_WORKER", "0")
    monkeypatch.setattr(compile_worker, "_spawn", refuse)
    check_add(add_kernel(cache=False))
    source, name = unique_add()
    assert f"llvm.func @{name}(" in mlir_kernel(source, name=name)(lambda a, b: None).ir("llvm")


def test_what_llvm_reports_for_an_option_reaches_sys_stderr(capsys):
    source, name = unique_add()
    kernel = mlir_kernel(source, name=name, cache=False, llvm_options=("-print-after=finalize-isel",))(
        lambda a, b: None)
    check_add(kernel)
    assert f"# Machine code for function {name}:" in capsys.readouterr().err


OPTION_SETS = [("-enable-matrix",), ("-enable-loop-distribute",), ("-enable-unroll-and-jam",),
               ("-enable-matrix", "-enable-loop-distribute")]


def test_idle_workers_beyond_the_most_recent_are_ended_and_start_again_when_needed():
    a = np.arange(5, dtype=np.float64)
    for options in OPTION_SETS:
        add_kernel(cache=False, llvm_options=options).compile()
    # Read without worker(), which would mark each set as just used.
    running = [options for options in OPTION_SETS if compile_worker._workers[options].pid() is not None]
    assert running == OPTION_SETS[-compile_worker.KEEP_RUNNING:]
    np.testing.assert_array_equal(add_kernel(cache=False, llvm_options=OPTION_SETS[0])(a, a), a + a)
    assert compile_worker._workers[OPTION_SETS[0]].pid() is not None


def test_a_busy_worker_is_not_ended_to_make_room():
    busy = compile_worker.worker(OPTION_SETS[0])
    add_kernel(cache=False, llvm_options=OPTION_SETS[0]).compile()
    pid = busy.pid()
    with busy._lock:  # as while it serves a request from another thread
        for options in OPTION_SETS[1:]:
            compile_worker.worker(options)
        assert busy.pid() == pid


def test_workers_busy_while_others_were_asked_for_end_once_idle():
    barrier = threading.Barrier(len(OPTION_SETS))
    errors: list[BaseException] = []

    def compile_with(options) -> None:
        barrier.wait()
        try:
            add_kernel(cache=False, llvm_options=options).compile()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    run_together(compile_with, OPTION_SETS)
    assert errors == []
    running = [options for options in compile_worker._workers if compile_worker._workers[options].pid() is not None]
    assert len(running) <= compile_worker.KEEP_RUNNING


def test_a_worker_started_in_the_callers_checkout_imports_that_memkernel(tmp_path: Path):
    """A caller that runs in the folder holding memkernel (a checkout) has it on its path as the current
    folder, which a worker takes off its own: the bootstrap puts that folder back, not another memkernel."""
    (tmp_path / "memkernel").mkdir()
    (tmp_path / "memkernel" / "__init__.py").write_text("raise ImportError('another memkernel')\n")
    command = subprocesses.worker_command("import memkernel\nprint(memkernel.__file__)")
    done = subprocess.run(command, cwd=subprocesses.PACKAGE_ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(Path(subprocesses.PACKAGE_ROOT) / "memkernel" / "__init__.py")


# Forks while another thread waits on the compile worker (in the buffered read of the reply, holding that
# file's lock); prints how the fork child ended: 0 once it ran, None if it hung.
FORK_WHILE_A_THREAD_WAITS = """
import multiprocessing, threading, time
import memkernel.compile.worker as compile_worker
waiting = threading.Thread(target=compile_worker.run, args=((), "sleeping", time.sleep, 4))
waiting.start()
while not compile_worker.worker(()).busy():
    time.sleep(0.01)
time.sleep(0.3)
exits = []
for _ in range(3):
    child = multiprocessing.get_context("fork").Process(target=print, args=("the child ran",))
    child.start()
    child.join(5)
    if child.is_alive():
        child.kill()
        child.join()
        exits.append(None)
    else:
        exits.append(child.exitcode)
waiting.join()
print(exits)
"""


def test_a_child_forked_while_another_thread_waits_on_the_compile_worker_runs(tmp_path):
    done = run_script(FORK_WHILE_A_THREAD_WAITS, tmp_path / "cache")
    assert done.stdout.splitlines()[-1] == "[0, 0, 0]", done.stderr
    assert done.stdout.count("the child ran") == 3


def test_decoration_that_reads_the_source_starts_the_compile_worker(tmp_path):
    """The worker's start (an interpreter importing MLIR, about as long as decoration) overlaps what the
    caller does before the first call; a kernel decorated for an isolated worker starts none here."""
    out = run_python("""
        import sys
        import numpy as np
        sys.path.append("tests")
        from kernels import elementwise
        from memkernel import mlir_kernel
        import memkernel.compile.worker as compile_worker
        isolated = mlir_kernel(elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="iso"),
                               isolate=True)(lambda a, b: None)
        print(compile_worker.worker(()).pid() is None)
        add = mlir_kernel(elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="add"))(lambda a, b: None)
        print(compile_worker.worker(()).pid() is not None)
        x = np.arange(5, dtype=np.float32)
        print(np.array_equal(add(x, x), x + x))
    """, MEMKERNEL_CACHE_DIR=str(tmp_path))
    assert out.split() == ["True", "True", "True"]


def _sleep_in_two_threads(seconds: float) -> float:
    """Seconds two threads take to each run a ``seconds``-long request in the compile worker at once."""
    threads = [threading.Thread(target=compile_worker.run, args=((), "sleeping", time.sleep, seconds))
               for _ in range(2)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def test_requests_from_two_threads_at_once_run_in_two_worker_processes(monkeypatch):
    monkeypatch.setenv("MEMKERNEL_COMPILE_WORKERS", "2")
    check_add(add_kernel(cache=False))  # one worker process ready; the second starts for the second request
    assert _sleep_in_two_threads(3.0) < 5.5


def test_memkernel_compile_workers_1_serves_requests_one_at_a_time(monkeypatch):
    monkeypatch.setenv("MEMKERNEL_COMPILE_WORKERS", "1")
    compile_worker.worker(()).close()  # processes an earlier test left idle would serve too
    assert _sleep_in_two_threads(1.5) >= 3.0


def test_spare_worker_processes_end_once_the_burst_of_compiles_is_over(monkeypatch):
    monkeypatch.setenv("MEMKERNEL_COMPILE_WORKERS", "2")
    monkeypatch.setattr(compile_worker, "SPARE_SECONDS", 0.5)
    _sleep_in_two_threads(1.0)
    pool = compile_worker.worker(())
    pids = {process.popen.pid for process in pool._idle}
    assert len(pids) == 2
    deadline = time.monotonic() + 20
    while len(pool._idle) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pool._idle) == 1
    kept = pool._idle[0].popen.pid
    for pid in pids - {kept}:
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid)
    check_add(add_kernel(cache=False))
    assert pool.pid() == kept


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_memkernel_compile_workers_must_be_a_positive_number(monkeypatch, value):
    monkeypatch.setenv("MEMKERNEL_COMPILE_WORKERS", value)
    with pytest.raises(CompileError, match=rf"\$MEMKERNEL_COMPILE_WORKERS must be a positive number of "
                                           rf"processes; got '{value}'"):
        add_kernel(cache=False).compile()


def test_an_exception_that_does_not_pickle_reaches_the_caller_as_a_compile_error_with_its_text():
    class LocalError(Exception):  # as the MLIR bindings make MLIRError: a local class, which pickle cannot name
        pass

    replies = io.BytesIO()
    server.reply(replies, "raised", LocalError("Unable to parse module assembly: error: 1:2: bad"))
    status, value, _ = pickle.loads(replies.getvalue())
    assert status == "raised"
    assert isinstance(value, CompileError)
    assert str(value) == "LocalError: Unable to parse module assembly: error: 1:2: bad"


@pytest.mark.parametrize("text", ["0", "-2", "many"])
def test_memkernel_compile_workers_that_is_not_a_positive_number_is_a_compile_error(monkeypatch, text):
    monkeypatch.setenv("MEMKERNEL_COMPILE_WORKERS", text)
    with pytest.raises(CompileError, match=re.escape(
            f"$MEMKERNEL_COMPILE_WORKERS must be a positive number of processes; got {text!r}")):
        compile_worker.pool_size()
