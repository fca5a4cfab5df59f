"""A forked child never waits for what another thread of its parent held at the fork."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import memkernel
from memkernel import forking, mlir_kernel

from .forks import exit_code_of_child
from .kernels import PARALLEL_FILL


def test_a_lock_held_by_another_thread_at_the_fork_is_free_in_the_child():
    held = forking.lock()
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with held:
            taken.set()
            release.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    taken.wait()
    try:
        assert exit_code_of_child(lambda: held.acquire(timeout=2)) == 0
        assert held.locked()  # still the parent thread's
    finally:
        release.set()
        thread.join()


def test_a_buffered_pipe_another_thread_was_reading_closes_in_the_child():
    read_end, write_end = os.pipe()
    reader = os.fdopen(read_end, "rb")
    thread = threading.Thread(target=reader.read, args=(1,))  # blocks in the read, holding the buffer's lock
    thread.start()
    time.sleep(0.2)

    def close_and_drop() -> bool:
        nonlocal reader
        forking.close_descriptor(reader)
        closed = reader.closed
        del reader  # its collection must not take the lock either
        return closed

    try:
        assert exit_code_of_child(close_and_drop) == 0
    finally:
        os.write(write_end, b"x")
        thread.join()
        os.close(write_end)
        reader.close()


WAIT_THEN_PRINT = """
func.func private @wait(index)
func.func private @printI64(i64)
func.func @wait_then_print(%a: i64) {
  %c0 = arith.constant 0 : index
  func.call @wait(%c0) : (index) -> ()
  func.call @printI64(%a) : (i64) -> ()
  return
}"""

PRINT = """
func.func private @printI64(i64)
func.func @say(%a: i64) {
  func.call @printI64(%a) : (i64) -> ()
  return
}"""


def _in_a_thread_until_entered(call: Callable[[], object], entered: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=call)
    thread.start()
    assert entered.wait(60), "the kernel call in the other thread never reached its callback"
    return thread


def _descriptor(fd: int) -> tuple[int, int]:
    status = os.fstat(fd)
    return status.st_dev, status.st_ino


def test_a_child_forked_during_another_threads_captured_call_calls_a_printing_kernel():
    entered, release = threading.Event(), threading.Event()

    def wait(_: int) -> None:
        entered.set()
        release.wait(60)

    slow = mlir_kernel(WAIT_THEN_PRINT, name="wait_then_print", capture_output=True, callbacks={"wait": wait},
                       shared_libs=["mlir_c_runner_utils"])(lambda a: None).compile()
    say = mlir_kernel(PRINT, name="say", capture_output=True, shared_libs=["mlir_c_runner_utils"])(
        lambda a: None).compile()
    before = _descriptor(1), _descriptor(2)
    thread = _in_a_thread_until_entered(lambda: slow(1), entered)
    try:
        assert _descriptor(1) != before[0]  # the capture is in place in the parent
        assert exit_code_of_child(lambda: say(2) is None and (_descriptor(1), _descriptor(2)) == before,
                                  timeout=30) == 0
    finally:
        release.set()
        thread.join()
    assert (_descriptor(1), _descriptor(2)) == before


def test_a_child_forked_during_another_threads_parallel_call_with_callbacks_calls_the_kernel():
    entered, release = threading.Event(), threading.Event()

    def visit(i: int) -> None:
        if i == 0:
            entered.set()
            release.wait(60)

    fill = mlir_kernel(PARALLEL_FILL, name="fill", parallel=True, callbacks={"visit": visit})(
        lambda out: None).compile()
    expected = 2 * np.arange(64, dtype=np.int64)

    def fill_in_child() -> bool:
        release.set()  # the child's own calls must not wait on the callback
        out = np.zeros(64, np.int64)
        fill(out)
        return bool(np.array_equal(out, expected))

    thread = _in_a_thread_until_entered(lambda: fill(np.zeros(64, np.int64)), entered)
    try:
        assert exit_code_of_child(fill_in_child, timeout=30) == 0
    finally:
        release.set()
        thread.join()


_MADE_BY_THREADING = re.compile(r"threading\.(Lock|RLock|Condition|Event|Semaphore|BoundedSemaphore|Barrier)\(")


def test_every_lock_and_condition_of_the_package_is_made_free_in_a_forked_child():
    package = Path(memkernel.__file__).parent
    made_elsewhere = sorted(
        f"{path.relative_to(package)}:{number}"
        for path in package.rglob("*.py")
        if path.name != "forking.py" and path.relative_to(package).parts[0] != "isolate"  # it keeps its own
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if _MADE_BY_THREADING.search(line)
    )
    assert made_elsewhere == [], "make these with memkernel.forking.lock(), rlock() or condition()"


def test_a_semaphore_of_the_package_has_all_its_slots_free_in_a_forked_child():
    slots = forking.semaphore(2)
    assert slots.acquire(timeout=1) and slots.acquire(timeout=1)
    pid = os.fork()
    if pid == 0:
        os._exit(0 if slots.acquire(timeout=2) and slots.acquire(timeout=2) and not slots.acquire(timeout=0.1) else 1)
    assert os.waitpid(pid, 0)[1] == 0
