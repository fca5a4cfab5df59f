"""Forking from a test: the child's outcome, bounded in time."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable


def exit_code_of_child(run: Callable[[], bool], timeout: float = 10) -> int | None:
    """Fork, run ``run`` in the child (exit 0 if it returns True), and return its exit code; None if it hangs
    past ``timeout`` seconds (then it is killed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a process with threads: the point here
        pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if run() else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None
