"""What a kernel prints on the C streams reaches ``sys.stdout`` and ``sys.stderr``.

``printMemrefF32``, ``vector.print`` and ``printf`` write to file descriptors 1
and 2. In a terminal that is where the user looks; in Jupyter or under pytest's
``capsys``, ``sys.stdout`` is not descriptor 1 and the text would be lost or
out of order. For a kernel that may print (it calls a function that is neither
an allocator, ``memrefCopy``, a libm function nor an APFloat routine), a call
redirects both descriptors to files, flushes C's buffers after the kernel, and
writes what was captured to ``sys.stdout``/``sys.stderr``, in order with the
Python prints around it. The redirection is process-wide, so captured calls are
serialized; a kernel that cannot print never pays for any of this.
"""

from __future__ import annotations

import ctypes
import functools
import io
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from typing import Any

_SILENT = frozenset({"malloc", "free", "aligned_alloc", "memrefCopy"})
_lock = threading.Lock()
_libc = ctypes.CDLL(None)


@functools.lru_cache(maxsize=None)
def _libm() -> ctypes.CDLL:
    return ctypes.CDLL("libm.so.6")


def may_print(external_functions: Iterable[str]) -> bool:
    """Whether a kernel calling these functions may write to the C streams."""
    libm = _libm()
    return any(
        name not in _SILENT and not name.startswith("_mlir_apfloat_") and not hasattr(libm, name)
        for name in external_functions
    )


def python_streams_are_the_c_streams() -> bool:
    """True in a terminal: ``sys.stdout``/``sys.stderr`` write to descriptors 1 and 2."""
    try:
        return sys.stdout.fileno() == 1 and sys.stderr.fileno() == 2
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return False


@functools.lru_cache(maxsize=None)
def _sinks() -> tuple[Any, Any]:
    return tempfile.TemporaryFile(), tempfile.TemporaryFile()


def _flush_c() -> None:
    _libc.fflush(None)


def captured(call: Callable[[], Any]) -> Any:
    """Run ``call`` with descriptors 1 and 2 captured, then echo them to the Python streams."""
    with _lock:
        sinks = _sinks()
        sys.stdout.flush()
        sys.stderr.flush()
        _flush_c()
        saved = [os.dup(1), os.dup(2)]
        for sink in sinks:
            sink.seek(0)
            sink.truncate()
        os.dup2(sinks[0].fileno(), 1)
        os.dup2(sinks[1].fileno(), 2)
        try:
            return call()
        finally:
            _flush_c()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            for sink, stream in zip(sinks, (sys.stdout, sys.stderr)):
                sink.seek(0)
                text = sink.read().decode(errors="replace")
                if text:
                    stream.write(text)
                    stream.flush()
