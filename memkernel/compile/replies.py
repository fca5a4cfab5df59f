"""What a compile worker's reply or death becomes in the caller, for both kinds of worker: the private ones of
:mod:`memkernel.compile.worker` and the resident compile server of :mod:`memkernel.compile.resident`.

A reply passes on what the request wrote on stderr (:func:`report`); a worker
that died during a request becomes a CompileError naming the signal or exit
status and carrying the last lines it wrote on stderr (:func:`death` and
:func:`crash_message`), which is where LLVM puts an assertion's text.
"""

from __future__ import annotations

import os
import signal
import sys

from ..subprocesses import last, last_lines

TAIL_LINES = 20
"""How many of the last lines a crashed worker wrote on stderr its CompileError carries."""

_TAIL_BYTES = 64 << 10


def tail(fd: int) -> str:
    """The last :data:`TAIL_LINES` lines of the file open as ``fd``."""
    return last_lines(last(fd, _TAIL_BYTES), TAIL_LINES)


def death(status: int | None, stderr_fd: int) -> str:
    """How a worker ended: the signal (``status`` ``-N``, as :class:`subprocess.Popen` reports it), the exit
    status, or, when None, that it is unknown; then its last lines on stderr (the file open as ``stderr_fd``)."""
    if status is None:
        how = "ended"
    elif status < 0:
        how = f"was killed by {signal.Signals(-status).name}"
    else:
        how = f"exited with status {status}"
    text = tail(stderr_fd)
    said = "\n".join(f"  {line}" for line in text.splitlines()) if text else "  (nothing)"
    return f"{how}. Its last lines on stderr:\n{said}"


def options_text(options: tuple[str, ...]) -> str:
    """`` with llvm_options=(...)``, or nothing for none."""
    return f" with llvm_options={options!r}" if options else ""


def crash_message(worker: str, options: tuple[str, ...], what: str, died: str, started: bool,
                  gone: bool = False) -> str:
    """The CompileError text for ``worker`` (e.g. ``"compile worker"``) of LLVM ``options`` that ``died``
    (see :func:`death`) during the request ``what``, or, unless ``started``, before it could serve one; ``gone``:
    the whole server went away without saying how the request ended (killed from outside, say)."""
    named = f"{worker}{options_text(options)}"
    if gone:
        return (f"the {named} went away during {what} without a reply: it was killed, or MLIR or LLVM aborted on "
                f"this kernel. It {died}\nThis process is unharmed and the next compile starts a new server; if "
                "the kernel fails the same way again, change it or pipeline=.")
    if not started:
        return (f"memkernel's {named} {died}\nIt ended before it could compile; if LLVM "
                "refused an option above, fix or drop it in llvm_options=.")
    return (f"{what} crashed the {named}: it {died}\nMLIR or LLVM aborted on this "
            "kernel (a bug, or a construct it does not support); this process is unharmed and the next "
            "compile starts a new worker. Change the kernel or pipeline=, or, for LLVM features behind an "
            "option (llvm.intr.matrix.* needs -enable-matrix), pass llvm_options=.")


def report(stderr: str, *, failed: bool) -> None:
    """Pass on what the worker wrote on stderr during a request, as a compile in this process would.

    A failed compile's text is already in its error; it goes, as a compile's
    C stderr does, to a kernel-output capture in place (see
    :func:`memkernel.stdio.capture_c_stderr`). What a successful one wrote
    (LLVM's own reports, asked for with ``llvm_options=``) goes to ``sys.stderr``.
    """
    if not stderr:
        return
    if failed:
        from ..stdio import capture_c_stderr

        with capture_c_stderr():
            os.write(2, stderr.encode())
    else:
        sys.stderr.write(stderr)
        sys.stderr.flush()
