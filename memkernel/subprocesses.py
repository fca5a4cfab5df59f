"""What memkernel's two worker processes (the compile worker, :mod:`memkernel.compile.worker`, and the
isolate worker, :mod:`memkernel.isolate.process`) share: how a worker is started with a safe path, the
appending files their output goes to, and how the end of what a worker wrote is read back."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import sys
import tempfile
from typing import IO

SAFE_PATH = ("-P",) if sys.version_info >= (3, 11) else ()
"""Python's flag for not putting the current folder first on a worker's path (the bootstraps remove it too)."""

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The folder this memkernel is imported from, which a worker puts on its path."""

SAFE_BOOTSTRAP = """import os, sys
sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
if sys.argv[1] not in sys.path:
    sys.path.insert(0, sys.argv[1])
"""
"""The start of a worker's program: the caller's folder off the path (a ``numpy.py`` there must not run in
the worker), then this memkernel's folder (``sys.argv[1]``) first on it, unless it is on it already."""


LLVM_QUIET = {"LLVM_DISABLE_SYMBOLIZATION": "1", "LLVM_DISABLE_CRASH_REPORT": "1"}
"""The environment a compile worker adds to its caller's: LLVM's crash handler kept from looking for a
symbolizer or writing a crash report."""


def worker_command(program: str, *arguments: str) -> list[str]:
    """The command line of a worker that runs ``program`` (after :data:`SAFE_BOOTSTRAP`) with ``arguments``
    (``sys.argv[2:]``)."""
    return [sys.executable, *SAFE_PATH, "-c", SAFE_BOOTSTRAP + program, PACKAGE_ROOT, *arguments]


def appending_file() -> IO[bytes]:
    """An anonymous temporary file opened for appending: a worker's descriptor 1 or 2 goes there, so what it
    wrote survives its death and is read back with :func:`last`."""
    file = tempfile.TemporaryFile()
    fcntl.fcntl(file.fileno(), fcntl.F_SETFL, fcntl.fcntl(file.fileno(), fcntl.F_GETFL) | os.O_APPEND)
    return file


def last(fd: int, limit: int, start: int = 0) -> str:
    """The last ``limit`` bytes from ``start`` on of the file open as ``fd``, as text."""
    size = os.fstat(fd).st_size
    begin = max(start, size - limit)
    return os.pread(fd, max(0, size - begin), begin).decode(errors="replace")


def last_lines(text: str, count: int) -> str:
    """The last ``count`` lines of ``text``."""
    return "\n".join(text.splitlines()[-count:])


_CREDENTIALS = struct.Struct("3i")


def peer_credentials(connection: socket.socket) -> tuple[int, int]:
    """The process id and user id of the process at the other end of Unix socket ``connection``
    (``SO_PEERCRED``: as the kernel saw them when the connection was made, which the peer cannot forge)."""
    pid, uid, _ = _CREDENTIALS.unpack(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                            _CREDENTIALS.size))
    return pid, uid
