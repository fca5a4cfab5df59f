"""The per-call channel between a caller and its worker: a shared control block and two eventfds.

A call crosses without pickling and without the socket: the caller writes the
request, a few 64-bit words (see :mod:`memkernel.isolate.request`), into a
small ``memfd`` both processes map, and adds 1 to the worker's eventfd; the
worker, blocked reading that eventfd, runs the call, writes the reply's
status in the block and adds 1 to the caller's eventfd. The caller waits with
``poll`` on its eventfd and on the worker's ``pidfd`` together, so a worker
that dies (a signal, an exit) wakes it as a reply would; ``poll``'s timeout
is the call's ``timeout=``.

A wake-up of a process that sleeps on another CPU is dear on a virtual
machine (an eventfd round trip between two sleeping Python processes took
about 48 µs on a 2-CPU cloud machine, 6 µs on one CPU), so each side first
spins for :data:`SPIN_SECONDS` on a word of the block that the other side
bumps: the caller on the reply's sequence, the worker, after each reply, on
the count of rings (:data:`RUNG_AT`), where a loop's next call arrives
while it still spins. Only the eventfd orders the memory: a spinner that
saw the word change still reads the eventfd (at once, it was written after
the word) before it reads the rest. With the spins a round trip took about
5 µs on that machine. A process allowed only one CPU does not spin: the
other side could not run meanwhile.

The rare messages (a kernel's definition, a segment to map, kernels to drop)
and the replies that do not fit the block still cross as pickles on the
socket (:mod:`memkernel.isolate.channel`): the caller writes :data:`MESSAGE`
as the request and the worker then reads the socket.

The block holds, from its start: the request header (kind, sequence, body
length), the count of rings, the reply header (status, sequence), the
request body from :data:`REQUEST_AT` and the reply body from :data:`REPLY_AT`.
"""

from __future__ import annotations

import mmap
import os
import struct
import time

SIZE = 1 << 20
"""Bytes of the control block: half for the request body, half for the reply body."""

HEADER = struct.Struct("<qqq")
"""kind (request) or status (reply), the call's sequence number, and the request body's length (request) or the
nanoseconds the worker took to answer (reply)."""
LENGTH = struct.Struct("<q")
"""Before a pickled reply body: its length."""

WORD = struct.Struct("<q")

REQUEST_HEADER_AT = 0
RUNG_AT = 24
"""How many times the caller rang the worker (a word the worker spins on)."""
REPLY_HEADER_AT = 32
REPLY_SEQUENCE_AT = REPLY_HEADER_AT + 8
"""The sequence number of the call last answered (a word the caller spins on)."""
REQUEST_AT = 64
REPLY_AT = SIZE // 2
REQUEST_ROOM = REPLY_AT - REQUEST_AT
REPLY_ROOM = SIZE - REPLY_AT

CALL = 1
"""Request: run the call written in the body."""
MESSAGE = 2
"""Request: read the next pickled message on the socket and answer it there."""
EXIT = 3
"""Request: end."""

DONE = 0
"""Reply: the call returned nothing to send back (its outputs are in the caller's memory)."""
RESULTS = 1
"""Reply: the body is the pickled :class:`~memkernel.isolate.definition.Results`."""
FAILED = 2
"""Reply: the body is the pickled exception the call raised."""
ON_SOCKET = 3
"""Reply: too large for the block, it follows on the socket as ``("ok", Results)`` or ``("error", exception)``."""


SPIN_SECONDS = 200e-6 if len(os.sched_getaffinity(0)) > 1 else 0.0
"""How long each side busy-waits for the other before it sleeps on its eventfd (see the module's docstring)."""


def spin_until(block: mmap.mmap, at: int, value: int, seconds: float = SPIN_SECONDS) -> bool:
    """Whether the word at ``at`` of ``block`` became ``value`` within ``seconds`` of busy waiting. It says only
    that the other side is about to write its eventfd: read that before the rest of the block."""
    if seconds <= 0:
        return False
    read = WORD.unpack_from
    deadline = time.perf_counter() + seconds
    while read(block, at)[0] != value:
        if time.perf_counter() > deadline:
            return False
    return True


def read_at_once(fd: int) -> bool:
    """Whether the eventfd ``fd`` (made non-blocking) had been written: read it if so. After a spin saw the
    reply, it has been, unless the worker died between the two writes (then the caller polls, and sees it)."""
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        return False
    return True


class ControlBlock:
    """The caller's end: the block and both eventfds, made before the worker starts (which inherits them)."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("memkernel-isolate-control", os.MFD_CLOEXEC)
        self.to_worker = self.to_caller = -1
        try:
            os.ftruncate(self.fd, SIZE)
            self.map = mmap.mmap(self.fd, SIZE)
            self.to_worker = os.eventfd(0, os.EFD_CLOEXEC)
            self.to_caller = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # see read_at_once
        except BaseException:
            for fd in (self.fd, self.to_worker, self.to_caller):
                if fd >= 0:
                    os.close(fd)
            raise

    def inherited(self) -> tuple[int, int, int]:
        """The descriptors the worker inherits: the block, its eventfd, the caller's."""
        return self.fd, self.to_worker, self.to_caller

    def started(self) -> None:
        """The worker has started, holding its copies: close the ones only it needs."""
        os.close(self.fd)
        self.fd = -1

    def close(self) -> None:
        """Close the descriptors and unmap the block (twice does nothing)."""
        for name in ("fd", "to_worker", "to_caller"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)
        if not self.map.closed:
            try:
                self.map.close()
            except BufferError:  # a view of it is alive: the mapping goes with it
                pass


def worker_end(fd: int) -> mmap.mmap:
    """The worker's mapping of the block open as ``fd`` (closed once mapped)."""
    try:
        return mmap.mmap(fd, SIZE)
    finally:
        os.close(fd)
