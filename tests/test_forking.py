"""A forked child never waits for what another thread of its parent held at the fork."""

from __future__ import annotations

import os
import threading
import time

from memkernel import forking

from .forks import exit_code_of_child


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
