"""Containment: the workers, the guard and isolation keep the caller alive and its answers right.

Workers never import from the caller's folder; runtime checks are raised from their own call; isolation
survives forks and the thread that started it; the disk cache key follows memkernel's own code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from memkernel import KernelAssertionError, KernelTimeout, mlir_kernel
from memkernel.load import cache

from .kernels import WAIT_FOR_FLAG, elementwise

REPO = Path(__file__).resolve().parents[1]

VERIFYING_PIPELINE = (
    "builtin.module(generate-runtime-verification, convert-scf-to-cf, expand-strided-metadata, "
    "finalize-memref-to-llvm, convert-arith-to-llvm, convert-cf-to-llvm, convert-func-to-llvm, "
    "reconcile-unrealized-casts)"
)
LOAD = """func.func @load(%a: memref<?xf32>, %i: index) -> f32 {
  %v = memref.load %a[%i] : memref<?xf32>
  return %v : f32
}"""


def run(script: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MEMKERNEL_CACHE_DIR": ""}
    return subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=env)


def test_workers_never_import_from_the_callers_folder(tmp_path):
    """A numpy.py in the folder a user starts from must not run in memkernel's worker processes."""
    planted = tmp_path / "untrusted"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "numpy.py").write_text(f"open({str(marker)!r}, 'a').write('ran')\nraise ImportError('planted')\n")
    script = tmp_path / "victim.py"
    script.write_text(textwrap.dedent("""
        from memkernel import mlir_kernel
        k = mlir_kernel("func.func @q(%x: i64) -> i64 { return %x : i64 }", cache=False)(lambda x: None)
        i = mlir_kernel("func.func @r(%x: i64) -> i64 { return %x : i64 }", isolate=True)(lambda x: None)
        print(k(3), i(4))
    """))
    done = run(str(script), cwd=planted)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "4"]
    assert not marker.exists()


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


HANG = """func.func @hang(%x: i64) -> i64 {
  %r = scf.while (%i = %x) : (i64) -> i64 {
    %go = arith.constant true
    scf.condition(%go) %i : i64
  } do {
  ^bb0(%i: i64):
    scf.yield %i : i64
  }
  return %r : i64
}"""


def test_timeout_alone_isolates_the_call():
    hang = mlir_kernel(HANG, timeout=2.0)(lambda x: None)
    with pytest.raises(KernelTimeout):
        hang(1)


def test_an_isolated_kernel_that_forks_keeps_its_answers_in_step():
    forking = mlir_kernel("""
        llvm.func @fork() -> i32
        func.func @f(%x: i64, %fork: i1) -> i64 {
          scf.if %fork {
            %pid = llvm.call @fork() : () -> i32
          }
          return %x : i64
        }""", isolate=True, timeout=30)(lambda x, fork: None)
    assert [forking(1, True), forking(2, False), forking(3, False)] == [1, 2, 3]


def test_the_disk_cache_key_changes_with_memkernels_own_code(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "memkernel", copy / "memkernel", ignore=shutil.ignore_patterns("__pycache__"))
    assertions = copy / "memkernel" / "compile" / "assertions.py"
    assertions.write_text(assertions.read_text() + "\n# a change\n")
    assert cache.code_digest(copy / "memkernel") != cache.code_digest(REPO / "memkernel")
    assert cache.code_digest() in cache.CacheKey.of(source="s").fields["memkernel"]


def test_the_isolate_worker_outlives_the_thread_that_started_it():
    """A worker started by a thread that then ends must not die in the middle of another thread's call."""
    import threading
    import time

    import memkernel.isolate.process

    spin = mlir_kernel(WAIT_FOR_FLAG, isolate=True, cache=False)(lambda flag, limit: None)
    flag = np.zeros(1, np.int32)
    with memkernel.isolate.process.lock():  # this test's own worker, started by the thread below
        if memkernel.isolate.process._worker is not None:
            memkernel.isolate.process._worker.close()
        memkernel.isolate.process._worker = None
    go = threading.Event()

    def start_then_end() -> None:
        spin(flag, 1)
        go.wait()

    starter = threading.Thread(target=start_then_end)
    starter.start()
    while not spin.compiled:
        time.sleep(0.01)
    outcome: list[object] = []
    caller = threading.Thread(target=lambda: outcome.append(spin(flag, 200_000_000)))
    caller.start()
    time.sleep(0.5)
    go.set()  # the starting thread ends while the other call runs in the worker
    starter.join()
    caller.join(timeout=120)
    assert outcome == [200_000_000]


REPEATED_CTRL_C = """
import os, random, signal, sys, threading, time
import numpy as np
from memkernel import mlir_kernel
add = mlir_kernel(open(sys.argv[1]).read(), name="add")(lambda a, b: None)
armed = [False]
def handler(signum, frame):
    if armed[0]:
        armed[0] = False
        raise KeyboardInterrupt
signal.signal(signal.SIGINT, handler)
def ping():
    while True:
        time.sleep(random.uniform(0.0005, 0.05))
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
threading.Thread(target=ping, daemon=True).start()
x = np.arange(8, dtype=np.float32)
done, started = 0, time.time()
while time.time() - started < 4:
    try:
        armed[0] = True
        result = add(x, x)
        armed[0] = False
        assert np.array_equal(result, x + x)
        done += 1
    except KeyboardInterrupt:
        armed[0] = False
print("ok")
"""


def test_repeated_ctrl_c_during_a_first_call_never_crashes_the_process(tmp_path):
    """A KeyboardInterrupt inside the first import of the MLIR bindings' native modules left them half made, and
    freeing its traceback crashed the process (SIGSEGV in 2 of 3 runs before the fix)."""
    source = tmp_path / "add.mlir"
    source.write_text(elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="add"))
    for run in range(2):
        done = subprocess.run([sys.executable, "-c", REPEATED_CTRL_C, str(source)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "MEMKERNEL_CACHE_DIR": str(tmp_path / f"cache{run}")})
        assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr[-2000:]
