"""The worker process: rebuilds kernels from their definitions and calls them on shared memory.

Started by :mod:`memkernel.isolate.process`, which calls its :func:`serve` with
the socket ``FD`` and the ``PARENT`` pid. It makes its C stdout unbuffered (what a
kernel prints must be in the file before a crash), dies with its parent, and
answers requests on the socket ``FD`` until the caller closes it:

- ``("hello",)``: ready (the imports are done); the reply is how many kernels it holds;
- ``("segment", size)`` with a ``memfd``: map the new shared-memory segment;
- ``("define", token, Definition)``: build the kernel and compile it (from the disk cache when it holds it);
- ``("call", token, values, n_outputs, dropped)``: call it, after dropping the kernels named in ``dropped``
  (their Kernel is gone in the caller); the reply holds its results.

Each reply is ``("ok", value)`` or ``("error", exception)``.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import socket
import threading
import time
from typing import Any

import numpy as np

from ..kernel import Kernel
from . import channel
from .definition import Results, Value, encode_results

_IONBF = 2
_PARENT_POLL = 0.5
"""Seconds between the worker's checks that its parent still runs."""


def _unbuffered_c_stdout() -> None:
    libc = ctypes.CDLL(None)
    stdout = ctypes.c_void_p.in_dll(libc, "stdout")
    libc.setvbuf(stdout, None, _IONBF, 0)


def _die_with(parent: int) -> None:
    """End this worker when ``parent`` is gone, even in the middle of a kernel (which releases the GIL).

    Polled, not ``PR_SET_PDEATHSIG``: that signal comes when the parent's *thread* that started the worker
    ends, which killed a worker started by a short-lived thread in the middle of another thread's call.
    """
    if os.getppid() != parent:
        os._exit(0)

    def watch() -> None:
        while True:
            time.sleep(_PARENT_POLL)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="memkernel-parent-watch", daemon=True).start()


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError with its type and message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class _Server:
    """What the worker holds between requests: the kernels it built and the segment it maps."""

    def __init__(self) -> None:
        self.kernels: dict[str, Kernel] = {}
        self.segment: mmap.mmap | None = None
        self.base = 0

    def handle(self, message: tuple[Any, ...], fds: list[int]) -> Any:
        kind = message[0]
        if kind == "hello":
            return len(self.kernels)
        if kind == "segment":
            self._map(message[1], fds)
            return None
        if kind == "define":
            _, token, definition = message
            kernel = Kernel(definition.stand_in(), definition.options)  # in process, output capture off
            kernel.compile()
            self.kernels[token] = kernel
            return None
        _, token, values, n_outputs, dropped = message
        for name in dropped:
            self.kernels.pop(name, None)
        return self._call(self.kernels[token], values, n_outputs)

    def _map(self, size: int, fds: list[int]) -> None:
        """Map the segment sent as ``fds[0]`` in place of the last one; OSError (the last one kept) if it cannot."""
        if not fds:
            raise OSError(errno.EMFILE, "the segment's descriptor did not arrive: the worker has none left")
        try:
            segment = mmap.mmap(fds[0], size)
        finally:
            for fd in fds:
                os.close(fd)
        self.segment = segment
        self.base = np.frombuffer(self.segment, np.uint8).ctypes.data

    def _call(self, kernel: Kernel, values: list[Value], n_outputs: int) -> Results:
        assert self.segment is not None or not any(v[0] == "array" for v in values)
        arguments = [_value(v, self.segment) for v in values]
        split = len(arguments) - n_outputs
        out = tuple(arguments[split:]) if n_outputs else None
        returned = kernel.invoker(tuple(arguments[:split]), {}, out)
        n_returned = n_outputs + len(kernel.spec.signature.results)
        if n_returned == 0:
            return Results([], b"")
        results = (returned,) if n_returned == 1 else returned
        return encode_results(results[n_outputs:], self.base, len(self.segment) if self.segment else 0)


def _value(value: Value, segment: mmap.mmap | None) -> Any:
    kind, payload = value
    if kind == "array":
        assert segment is not None
        return payload.view(segment)
    return payload


def serve(fd: int, parent: int) -> None:
    """Answer requests on socket ``fd`` until it closes."""
    _unbuffered_c_stdout()
    _die_with(parent)
    server = _Server()
    sock = socket.socket(fileno=fd)
    worker = os.getpid()
    while True:
        try:
            message, fds = channel.receive(sock, with_fds=True)
        except EOFError:
            return
        try:
            reply: tuple[str, Any] = ("ok", server.handle(message, fds))
        except Exception as exc:
            reply = ("error", _picklable(exc))
        if os.getpid() != worker:
            os._exit(0)  # a child the kernel forked: only the worker answers on the channel
        channel.send(sock, reply)

