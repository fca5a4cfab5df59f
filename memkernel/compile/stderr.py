"""What a block of compiling code wrote on descriptor 2, where LLVM and MLIR write their reasons:
:func:`stderr_written`, in the compile worker (:mod:`memkernel.compile.server`) and in a process that
compiles for itself alike."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from ..stdio import capture_c_stderr

SERVING = [False]
"""Whether this process is a compile worker (set once by :func:`memkernel.compile.server.main`)."""


@contextlib.contextmanager
def stderr_written() -> Iterator[list[str]]:
    """Yields a list that holds what the block wrote on descriptor 2 once it ends.

    In the worker, descriptor 2 stays the file the caller reads after a
    crash, so the text of an abort in the block is not lost with the worker.
    In another process, this is :func:`memkernel.stdio.capture_c_stderr`.
    """
    if not SERVING[0]:
        with capture_c_stderr() as captured:
            yield captured
        return
    sys.stderr.flush()
    start = os.fstat(2).st_size
    text: list[str] = []
    try:
        yield text
    finally:
        sys.stderr.flush()
        end = os.fstat(2).st_size
        text.append(os.pread(2, end - start, start).decode(errors="replace") if end > start else "")
