"""The compile worker's side (see :mod:`memkernel.compile.worker` for the caller's): a fresh Python that
imports the compiler and the MLIR bindings once, sets its LLVM options, and answers requests
``(function, args)`` on stdin with pickled replies on stdout, one at a time, until the caller closes the pipe."""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
from typing import IO, Any

from . import decoration, engine  # noqa: F401  # what requests run, and the MLIR bindings, loaded before the first request
from ..errors import CompileError
from .llvm import parse_llvm_options
from .stderr import SERVING
from ..subprocesses import last

_REPLIED_BYTES = 4 << 20
"""How much of what a request wrote on stderr its reply carries."""


def _truncate_stderr() -> None:
    sys.stderr.flush()
    with contextlib.suppress(OSError):
        os.ftruncate(2, 0)


def reply(replies: IO[bytes], status: str, value: Any) -> None:
    """Write the pickled reply ``(status, value, what the request wrote on stderr)`` to ``replies``."""
    sys.stderr.flush()
    stderr = last(2, _REPLIED_BYTES)
    try:
        data = pickle.dumps((status, value, stderr), protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)  # what the caller will do: an exception class may not rebuild from its args
    except Exception:  # an MLIR exception (a class made inside the bindings) does not: send its text instead
        said = f"{type(value).__name__}: {value}" if status == "raised" else f"a reply that did not pickle: {value!r}"
        data = pickle.dumps(("raised", CompileError(said), stderr))
    replies.write(data)
    replies.flush()


def answer(function: Any, args: Any) -> tuple[str, Any]:
    """``("ok", function(*args))``, or ``("raised", the exception)``."""
    try:
        return "ok", function(*args)
    except Exception as exc:
        return "raised", exc


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """Answer requests ``(function, args)`` until ``requests`` ends."""
    while True:
        try:
            function, args = pickle.load(requests)
        except EOFError:
            return
        _truncate_stderr()
        reply(replies, *answer(function, args))


def main() -> None:
    """The worker process: set the LLVM options of ``sys.argv[2:]``, then serve requests on stdin/stdout.

    Replies go to a copy of descriptor 1, which is then pointed at stderr, so
    that nothing else printed can mix with them.
    """
    SERVING[0] = True
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = os.fdopen(os.dup(0), "rb")
    if not parse_llvm_options(sys.argv[2:]):
        sys.exit(1)
    try:
        reply(replies, "ok", None)
        serve(requests, replies)
    except BrokenPipeError:  # the caller is gone
        pass
