"""The worker process: rebuilds kernels from their definitions and calls them on shared memory.

Started by :mod:`memkernel.isolate.process`, which calls its :func:`serve` with
the socket ``FD``, the ``PARENT`` pid and the control block and eventfds of
:mod:`memkernel.isolate.control`. It makes its C stdout unbuffered (what a
kernel prints must be in the file before a crash), dies with its parent, and
answers requests until the caller asks it to end:

- a call (``control.CALL``), packed in the control block (see :mod:`memkernel.isolate.request`): run it on
  the memory it names; the reply's status and any results or error go back in the block;
- ``control.MESSAGE``: the next pickled message on the socket, answered there:

  - ``("hello",)``: ready (the imports are done); the reply is how many kernels it holds;
  - ``("segment", size)`` with a ``memfd``: map the new call segment;
  - ``("map", number, size)`` with a ``memfd``: map shared array segment ``number``;
  - ``("forget", tokens, numbers)``: drop the kernels (their Kernel is gone in the caller) and unmap the
    shared segments (no array uses them any more) so named;
  - ``("define", token, Definition)``: build the kernel and compile it (from the disk cache when it holds it);
  - ``("call", body)``: a call too large for the control block, packed as there.

  Each reply is ``("ok", value)`` or ``("error", exception)``.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..kernel import Kernel
from . import channel, control
from .definition import Results, encode_results
from .request import CALL_SEGMENT, TOKEN, Decoder

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
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class _Kernel:
    """A kernel the worker built: how its calls decode and run, whether it has results to send back, and its
    last request with the arguments decoded from it (a loop's calls repeat theirs: they are decoded once)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.decoder = Decoder(kernel.spec.contracts)
        self.run = _runner(kernel)
        self.has_results = bool(kernel.spec.signature.results)
        self.last_request = b""
        self.last_arguments: list[Any] = []


def _runner(kernel: Kernel) -> Callable[[list[Any]], Any]:
    """How the worker calls ``kernel`` on decoded arguments, every output given: its compiled entry when it
    has one (no Python frame on the way), else its invoker."""
    spec = kernel.spec
    split = spec.n_inputs
    invoker = kernel.invoker
    entry = invoker.entry
    if entry is not None and spec.n_outputs == 1:
        return lambda arguments: entry(*arguments[:split], out=arguments[split])
    if entry is not None and spec.n_outputs == 0:
        return lambda arguments: entry(*arguments)
    if spec.n_outputs == 0:
        return lambda arguments: invoker(tuple(arguments), {}, None)
    return lambda arguments: invoker(tuple(arguments[:split]), {}, tuple(arguments[split:]))


class _Server:
    """What the worker holds between requests: the kernels it built and the segments it maps (numbered as in
    :mod:`memkernel.isolate.request`: 0 the call segment, the others shared arrays' segments)."""

    def __init__(self) -> None:
        self.kernels: dict[int, _Kernel] = {}
        self.segments: dict[int, mmap.mmap] = {}
        self.bases: dict[int, tuple[int, int]] = {}
        """Each segment's address and size, by number: where a returned array may alias an argument."""

    def handle(self, message: tuple[Any, ...], fds: list[int]) -> Any:
        kind = message[0]
        for held in self.kernels.values():  # a segment may be replaced, mapped, unmapped: decode afresh
            held.last_request = b""
            held.last_arguments = []
        if kind == "hello":
            return len(self.kernels)
        if kind == "segment":
            self._map(CALL_SEGMENT, message[1], fds)
            return None
        if kind == "map":
            self._map(message[1], message[2], fds)
            return None
        if kind == "forget":
            _, tokens, numbers = message
            for token in tokens:
                self.kernels.pop(token, None)
            for number in numbers:
                self.bases.pop(number, None)
                _unmap(self.segments.pop(number, None))
            return None
        if kind == "define":
            _, token, definition = message
            kernel = Kernel(definition.stand_in(), definition.options)  # in process, output capture off
            kernel.compile()
            self.kernels[token] = _Kernel(kernel)
            return kernel.invoker.may_print
        return self.call(message[1])  # ("call", body): a call too large for the control block

    def _map(self, number: int, size: int, fds: list[int]) -> None:
        """Map segment ``number``, sent as ``fds[0]``, in place of the last one so numbered; OSError (the last
        one kept) if it cannot."""
        if not fds:
            raise OSError(errno.EMFILE, "the segment's descriptor did not arrive: the worker has none left")
        try:
            segment = mmap.mmap(fds[0], size)
        finally:
            for fd in fds:
                os.close(fd)
        old = self.segments.get(number)
        self.segments[number] = segment
        self.bases[number] = (np.frombuffer(segment, np.uint8).ctypes.data, size)
        _unmap(old)

    def call(self, request: bytes) -> Results | None:
        """Run the call packed in ``request`` (see :mod:`memkernel.isolate.request`): its results, or None when
        it has none (its outputs are in the caller's memory already)."""
        (token,) = TOKEN.unpack_from(request, 0)
        held = self.kernels[token]
        if request != held.last_request:
            held.last_arguments = held.decoder.decode(request, TOKEN.size, self.segments)
            held.last_request = request
        returned = held.run(held.last_arguments)
        if not held.has_results:
            return None
        spec = held.kernel.spec
        if spec.n_outputs + len(spec.signature.results) == 1:
            returned = (returned,)
        return encode_results(returned[spec.n_outputs:], self.bases)


def _unmap(mapping: mmap.mmap | None) -> None:
    """Unmap now, or when the last view of it goes (a result the worker still holds)."""
    if mapping is not None:
        try:
            mapping.close()
        except BufferError:
            pass


def _answer(server: _Server, block: mmap.mmap, length: int) -> tuple[int, Any]:
    """Run the call in the control block; its reply status, and the reply to send on the socket when it does not
    fit the block. Results or an error are pickled into the block's reply body, after their length."""
    try:
        results = server.call(block[control.REQUEST_AT:control.REQUEST_AT + length])
    except Exception as exc:
        reply: tuple[str, Any] = ("error", _picklable(exc))
        status = control.FAILED
    else:
        if results is None:
            return control.DONE, None
        reply = ("ok", results)
        status = control.RESULTS
    data = pickle.dumps(reply[1], protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > control.REPLY_ROOM - control.LENGTH.size:
        return control.ON_SOCKET, reply
    control.LENGTH.pack_into(block, control.REPLY_AT, len(data))
    start = control.REPLY_AT + control.LENGTH.size
    block[start:start + len(data)] = data
    return status, None


def serve(fd: int, parent: int, block_fd: int, wake: int, answer: int) -> None:
    """Answer requests until the caller asks to end or closes the socket ``fd``: calls through the control block
    ``block_fd`` (rung on eventfd ``wake``, answered on eventfd ``answer``), other messages on the socket."""
    _unbuffered_c_stdout()
    _die_with(parent)
    server = _Server()
    sock = socket.socket(fileno=fd)
    block = control.worker_end(block_fd)
    worker = os.getpid()
    rung = 0
    while True:
        control.spin_until(block, control.RUNG_AT, rung + 1)  # a loop's next call comes while this spins
        os.eventfd_read(wake)
        (rung,) = control.WORD.unpack_from(block, control.RUNG_AT)
        kind, sequence, length = control.HEADER.unpack_from(block, control.REQUEST_HEADER_AT)
        if kind == control.CALL:
            started = time.monotonic_ns()
            status, reply = _answer(server, block, length)
            if os.getpid() != worker:
                os._exit(0)  # a child the kernel forked: only the worker answers
            control.HEADER.pack_into(block, control.REPLY_HEADER_AT, status, sequence, time.monotonic_ns() - started)
            os.eventfd_write(answer, 1)
            if status == control.ON_SOCKET:  # after the wake-up: the caller reads while this writes
                channel.send(sock, reply)
            continue
        if kind != control.MESSAGE:
            return
        try:
            message, fds = channel.receive(sock, with_fds=True)
        except EOFError:
            return
        try:
            answered: tuple[str, Any] = ("ok", server.handle(message, fds))
        except Exception as exc:
            answered = ("error", _picklable(exc))
        if os.getpid() != worker:
            os._exit(0)  # a child the kernel forked: only the worker answers on the channel
        channel.send(sock, answered)
