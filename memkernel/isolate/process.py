"""The caller's side of the worker process: start it, talk to it, notice that it died, echo what it printed.

One worker serves every isolated kernel of the process, one call at a time.
It is a fresh Python running :func:`memkernel.isolate.server.serve`, started at the
first isolated call and again after a crash or a timeout, in a session of its
own (a Ctrl-C in the terminal reaches the caller, which then ends the
worker). Calls cross through the control block (:mod:`memkernel.isolate.control`),
the rare messages as pickles on a socket (:mod:`memkernel.isolate.channel`).
Its descriptors 1 and 2 go to files opened for appending; after
every request the caller writes what they got since the last request to
``sys.stdout``/``sys.stderr``, so what a kernel printed reaches the caller
even when the worker died right after printing (the worker's C stdout is
unbuffered).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any


from . import channel, control, release, shared_arrays
from ..forking import close_descriptor
from ..subprocesses import appending_file, last_lines, worker_command
from .shared import Segment

TRIM_AT = 1 << 20
"""Once the output files hold this many bytes already echoed, they are emptied."""

TAIL_LINES = 20
"""How many of the lines a crashed worker wrote on stderr a KernelCrashed carries."""


WAIT_SLICE = 0.1
"""Seconds a wait for the worker blocks at a time: a signal another thread received (``signal.raise_signal`` from
a timer, say) interrupts no wait of this thread, and its handler (Ctrl-C's KeyboardInterrupt) runs only once the
wait returns."""


def _poll(poller: select.poll, timeout: float | None) -> list[tuple[int, int]]:
    """``poller.poll()`` for at most ``timeout`` seconds (None: until an event), in slices of :data:`WAIT_SLICE` so
    that Python runs its signal handlers in between; the events, or [] when the time ran out."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = WAIT_SLICE if deadline is None else min(WAIT_SLICE, deadline - time.monotonic())
        ready = poller.poll(max(0, math.ceil(left * 1000)))  # whole ms: a deadline is met within 1 ms
        if ready or (deadline is not None and time.monotonic() >= deadline):
            return ready


def _spin(deadline: float | None) -> float:
    """How long a call busy-waits for the reply before it polls: :data:`~memkernel.isolate.control.SPIN_SECONDS`,
    or, when less than a millisecond (``poll``'s unit) is left before ``deadline``, all of it, so that a
    ``timeout=`` under a millisecond holds (where the process may spin at all)."""
    if deadline is None or not control.SPIN_SECONDS:
        return control.SPIN_SECONDS
    left = deadline - time.monotonic()
    return left if left < 0.001 else min(control.SPIN_SECONDS, left)


class WorkerDied(Exception):
    """The worker process ended during a request: ``signal`` names the signal, else ``status`` is its exit status."""

    def __init__(self, signal_name: str | None, status: int | None, output: str) -> None:
        super().__init__(signal_name or f"exit status {status}")
        self.signal = signal_name
        self.status = status
        self.output = output


class WorkerTimedOut(Exception):
    """A request took longer than its timeout: the worker was killed, or, when ``took`` (seconds) is given, its
    reply came past the deadline (the caller was not running to see the deadline pass) and was dropped."""

    def __init__(self, took: float | None = None) -> None:
        super().__init__(took)
        self.took = took


class SegmentUnavailable(Exception):
    """No shared-memory segment of ``size`` bytes could be had: ``error`` says why, ``where`` what failed
    (``"made in this process"``, ``"mapped in the worker"``)."""

    def __init__(self, size: int, error: OSError, where: str) -> None:
        super().__init__(f"{size} bytes {where}: {error}")
        self.size = size
        self.error = error
        self.where = where


_PROGRAM = """from memkernel.isolate.server import serve
serve(*map(int, sys.argv[2:]))"""
"""The worker's program (after the safe bootstrap of :mod:`memkernel.subprocesses`)."""


class Worker:
    """One worker process and the channel to it; what it has been sent so far."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self._outputs = (appending_file(), appending_file())
        self._echoed = [0, 0]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._control = control.ControlBlock()
        with theirs:
            inherited = (theirs.fileno(), *self._control.inherited())
            self.process = subprocess.Popen(
                worker_command(_PROGRAM, str(theirs.fileno()), str(self.owner),
                               *map(str, self._control.inherited())),
                pass_fds=inherited, stdin=subprocess.DEVNULL, stdout=self._outputs[0],
                stderr=self._outputs[1], start_new_session=True,
                env={**os.environ, "MEMKERNEL_ISOLATE": "0"},
            )
        self._control.started()
        self._socket = ours
        self.block = self._control.map
        """The control block, where a call is packed (see :mod:`memkernel.isolate.request`)."""
        self._sequence = 0
        self._rung = 0
        self._waiting = select.poll()
        self._waiting.register(self._control.to_caller, select.POLLIN)
        try:
            self._death: int | socket.socket = os.pidfd_open(self.process.pid)
        except OSError:  # no pidfd (Linux before 5.3): the socket hangs up when the worker ends
            self._death = ours
        self._waiting.register(self._death, select.POLLIN | select.POLLHUP)
        self._gone = select.poll()
        self._gone.register(self._death, select.POLLIN)
        self.defined: set[int] = set()
        self.mapped: set[int] = set()
        """The shared array segments (by number) the worker has mapped."""
        self.segment: Segment | None = None
        self._needed_more = float("-inf")
        """When a call last needed more of the segment than release.KEEP_MAPPED (``time.monotonic()``)."""
        self.request(("hello",))

    def forget_dropped(self) -> None:
        """Have the worker drop the kernels dropped here and unmap the shared segments no array uses any more
        since the last call (one message, only when there are any)."""
        if not dropped and not shared_arrays.released:
            return
        tokens = []
        while dropped:
            tokens.append(dropped.pop())
        numbers = []
        while shared_arrays.released:
            numbers.append(shared_arrays.released.pop())
        self.defined.difference_update(tokens)
        unmap = [n for n in numbers if n in self.mapped]
        self.mapped.difference_update(unmap)
        if tokens or unmap:
            self.request(("forget", tuple(tokens), tuple(unmap)))

    def map_shared(self, segment: shared_arrays.SharedSegment) -> None:
        """Have the worker map a shared array's ``segment`` (once); SegmentUnavailable if it cannot."""
        if segment.number in self.mapped:
            return
        segment.sent = True
        status, error = self.request(("map", segment.number, segment.size), fds=(segment.fd,))
        if status != "ok":
            raise SegmentUnavailable(segment.size, error, "mapped in the worker")
        self.mapped.add(segment.number)

    def alive(self) -> bool:
        """Whether this process started the worker and it still runs (one ``poll`` of its pidfd, cheaper than
        ``Popen.poll``)."""
        if self.owner != os.getpid() or self.process.returncode is not None or self._control.to_caller < 0:
            return False
        if isinstance(self._death, int):
            return not self._gone.poll(0)
        return self.process.poll() is None

    def segment_for(self, size: int) -> Segment:
        """A segment of at least ``size`` bytes that the worker has mapped: the current one, or a bigger one.

        SegmentUnavailable if none can be made or the worker cannot map it; the current one is then kept.
        """
        self.needed(size)
        if self.segment is None or self.segment.size < size:
            grown = self._new_segment(size)
            status, error = self.request(("segment", grown.size), fds=(grown.fd,))
            if status != "ok":
                grown.close()
                raise SegmentUnavailable(grown.size, error, "mapped in the worker") from None
            if self.segment is not None:
                self.segment.close()
            self.segment = grown
        return self.segment

    def needed(self, size: int) -> None:
        """A call needs ``size`` bytes of the segment, at its start and at its end: past KEEP_MAPPED, the segment
        is shrunk once none needed as much for RELEASE_AFTER seconds (see :mod:`memkernel.isolate.release`)."""
        if size > release.KEEP_MAPPED:
            self._needed_more = time.monotonic()
            release.later(self._shrink_when_idle)

    def _shrink_when_idle(self) -> None:
        """Replace a segment larger than KEEP_MAPPED by one of KEEP_MAPPED bytes, unless a call needed more
        in the last RELEASE_AFTER seconds; on the release timer's thread."""
        with lock():
            if (not self.alive() or self.segment is None or self.segment.size <= release.KEEP_MAPPED
                    or time.monotonic() - self._needed_more < release.RELEASE_AFTER):
                return
            try:
                smaller = Segment(release.KEEP_MAPPED)
            except OSError:
                return
            try:
                status, _ = self.request(("segment", smaller.size), fds=(smaller.fd,))
            except WorkerDied:  # it died while idle: the next call starts another
                status = "died"
            if status != "ok":
                smaller.close()
                return
            self.segment.close()
            self.segment = smaller

    def _new_segment(self, size: int) -> Segment:
        """Twice the current segment, so that calls of growing sizes make few; ``size`` bytes if that fails."""
        doubled = max(size, 2 * self.segment.size if self.segment else 0)
        if doubled > size:
            with contextlib.suppress(OSError):
                return Segment(doubled)
        try:
            return Segment(size)
        except OSError as exc:
            raise SegmentUnavailable(size, exc, "made in this process") from None

    def call(self, request: bytes, timeout: float | None = None, quiet: bool = False) -> tuple[str, Any] | None:
        """Run the call packed in ``request`` (see :mod:`memkernel.isolate.request`), through the control block
        (on the socket when it does not fit there): None when it returned nothing to send back, else
        ``("ok", Results)`` or ``("error", exception)``. Echoes what the worker printed meanwhile, unless the
        kernel is ``quiet`` (it writes nothing) and the call returned: that saves two system calls.

        Raises WorkerDied when the worker ended, WorkerTimedOut (after killing
        it) when ``timeout`` seconds passed; any other exception while waiting
        (a KeyboardInterrupt) kills the worker too, since the channel is then
        out of step.
        """
        length = len(request)
        if length > control.REQUEST_ROOM:
            status, value = self.request(("call", request), timeout=timeout)
            return None if status == "ok" and value is None else (status, value)
        self.block[control.REQUEST_AT:control.REQUEST_AT + length] = request
        self._sequence += 1
        answered = self._control.to_caller
        deadline = None if timeout is None else time.monotonic() + timeout
        echo = True
        try:
            self._ring(control.CALL, self._sequence, length)
            if not (control.spin_until(self.block, control.REPLY_SEQUENCE_AT, self._sequence, _spin(deadline))
                    and control.read_at_once(answered)):
                ready = _poll(self._waiting, None if deadline is None else deadline - time.monotonic())
                if not ready:
                    self.kill()
                    raise WorkerTimedOut()
                if ready[0][0] != answered and (len(ready) == 1 or ready[1][0] != answered):
                    raise self._died() from None
                os.eventfd_read(answered)
            status, sequence, took = control.HEADER.unpack_from(self.block, control.REPLY_HEADER_AT)
            assert sequence == self._sequence, (sequence, self._sequence)
            late = timeout is not None and took > timeout * 1e9  # the worker's own count of the call's time
            echo = not quiet or late or status not in (control.DONE, control.RESULTS)
            if status == control.DONE and not late:
                return None
            if status == control.ON_SOCKET:
                self._socket.settimeout(None)
                reply, _ = channel.receive(self._socket)
            if late:
                raise WorkerTimedOut(took / 1e9)
            if status == control.ON_SOCKET:
                return reply  # type: ignore[no-any-return]
            (length,) = control.LENGTH.unpack_from(self.block, control.REPLY_AT)
            start = control.REPLY_AT + control.LENGTH.size
            value = pickle.loads(self.block[start:start + length])
            return ("ok", value) if status == control.RESULTS else ("error", value)
        except (EOFError, ConnectionError):
            raise self._died() from None
        except (WorkerTimedOut, WorkerDied):
            raise
        except BaseException:
            self.kill()
            raise
        finally:
            if echo:
                self._echo()

    def request(self, message: Any, fds: tuple[int, ...] = (), timeout: float | None = None) -> Any:
        """Send ``message``, wait for the reply and echo what the worker printed meanwhile.

        Raises WorkerDied when the worker ended, WorkerTimedOut (after killing
        it) when ``timeout`` seconds passed; any other exception while waiting
        (a KeyboardInterrupt) kills the worker too, since the channel is then
        out of step.
        """
        try:
            self._ring(control.MESSAGE, 0, 0)
            self._socket.settimeout(timeout)
            channel.send(self._socket, message, fds)
            replied = select.poll()
            replied.register(self._socket, select.POLLIN)
            if not _poll(replied, timeout):
                raise TimeoutError
            reply, _ = channel.receive(self._socket)
        except (EOFError, ConnectionError):
            raise self._died() from None
        except TimeoutError:
            self.kill()
            raise WorkerTimedOut() from None
        except BaseException:
            self.kill()
            raise
        finally:
            self._echo()
        return reply

    def _ring(self, kind: int, sequence: int, length: int) -> None:
        """Write the request's header, count the ring (where a spinning worker sees it) and wake the worker."""
        control.HEADER.pack_into(self.block, control.REQUEST_HEADER_AT, kind, sequence, length)
        self._rung += 1
        control.WORD.pack_into(self.block, control.RUNG_AT, self._rung)
        os.eventfd_write(self._control.to_worker, 1)

    def _died(self) -> WorkerDied:
        try:
            status = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            status = self.process.wait()
        start = self._echoed[1]
        self._echo()
        written = self._read(1, start, self._echoed[1]).decode(errors="replace")
        tail = last_lines(written, TAIL_LINES)
        self._close_channel()
        if status < 0:
            return WorkerDied(signal.Signals(-status).name, None, tail)
        return WorkerDied(None, status, tail)

    def kill(self) -> None:
        """End the worker now (it is restarted by the next call)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._close_channel()

    def _close_channel(self) -> None:
        self._socket.close()
        if isinstance(self._death, int) and self._death >= 0:
            os.close(self._death)
            self._death = -1
        self._control.close()

    def close(self) -> None:
        """Ask the worker to end; kill it if it does not."""
        if self.owner != os.getpid():
            return
        if self._control.to_worker >= 0 and self.process.poll() is None:
            self._ring(control.EXIT, 0, 0)
        self._close_channel()
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.kill()
        if self.segment is not None:
            self.segment.close()
        for file in self._outputs:
            file.close()

    def forget(self) -> None:
        """In a forked child: close the child's copies of the channel, the output files and the segment.

        Kept, they would hold the parent's worker to a channel the parent
        closed and the segment's memory mapped in the child. The buffered
        files close through their raw files (see :mod:`memkernel.forking`).
        """
        self._close_channel()
        for file in self._outputs:
            close_descriptor(file)
        if self.segment is not None:
            self.segment.close()

    def _read(self, index: int, start: int, end: int) -> bytes:
        return os.pread(self._outputs[index].fileno(), end - start, start)

    def _echo(self) -> None:
        """Write what the worker printed since the last echo to ``sys.stdout``/``sys.stderr``."""
        for index, stream in enumerate((sys.stdout, sys.stderr)):
            fd = self._outputs[index].fileno()
            end = os.lseek(fd, 0, os.SEEK_END)  # where the next append goes: what was written (cheaper than fstat)
            if end == self._echoed[index]:
                continue
            for start in range(self._echoed[index], end, ECHO_CHUNK):  # bounded memory, however much it printed
                stream.write(self._read(index, start, min(start + ECHO_CHUNK, end)).decode(errors="replace"))
            if end > self._echoed[index]:
                stream.flush()
            self._echoed[index] = end
            if end >= TRIM_AT and self.process.poll() is None:
                os.ftruncate(fd, 0)
                self._echoed[index] = 0


ECHO_CHUNK = 1 << 20
"""How much of what the worker printed is read and written at a time."""

_lock = threading.Lock()
_worker: Worker | None = None

dropped: list[int] = []
"""The tokens of isolated kernels that are gone (appended by their finalizers, from any thread)."""


def worker() -> Worker:
    """The process's worker, started now if there is none (or the last one died or was killed)."""
    global _worker
    if _worker is None or not _worker.alive():
        if _worker is not None and _worker.owner == os.getpid():
            _worker.close()
        _worker = Worker()
    return _worker


def lock() -> threading.Lock:
    """Held around every isolated call: one worker, one segment, one call at a time."""
    return _lock


def _forget_in_child() -> None:
    """A forked child starts its own worker; the parent's belongs to the parent."""
    global _lock, _worker
    if _worker is not None:
        _worker.forget()
    _lock = threading.Lock()
    _worker = None


def _close_at_exit() -> None:
    if _worker is not None:
        _worker.close()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_close_at_exit)
