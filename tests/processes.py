"""Running a test's calls in a fresh interpreter, where a crash or a hang fails the test and not the session."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])


def run_python(script: str, timeout: float = 120, **environ: str | None) -> str:
    """What ``script`` (dedented) printed, run with this checkout's memkernel and the session's environment,
    ``environ`` set on top (None removes a variable); it must exit 0 within ``timeout`` seconds."""
    env = {**os.environ, "PYTHONPATH": REPO, **environ}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={k: v for k, v in env.items() if v is not None})
    assert done.returncode == 0, f"exit status {done.returncode}:\n{done.stderr}"
    return done.stdout


def wait_for(condition: Callable[[], bool], seconds: float = 10) -> bool:
    """Whether ``condition()`` became true within ``seconds`` (looked at every 50 ms): for what another process
    does in its own time."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not). A process reaped between the open and the read of its
    status file makes the read fail with ESRCH, which counts as ended too."""
    try:
        with open(f"/proc/{pid}/stat") as status:
            return status.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
