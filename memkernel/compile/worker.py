"""Compilation in a worker process: an abort in MLIR or LLVM ends the worker, never the caller.

The LLVM build memkernel runs on has assertions on, and a pass bug or a
construct LLVM does not support aborts the process that compiles (SIGABRT,
or an "LLVM ERROR" and exit). So lowering, LLVM code generation and
:meth:`~memkernel.Kernel.ir` run in a compile worker: a fresh Python
running :func:`memkernel.compile.server.main`) that
imports the MLIR bindings once and serves requests, one at a time, over a
pipe; requests from several threads at once get more workers, up to one per
core (see :class:`CompileWorker`). It returns the kernel's relocatable object, which the caller links with
:class:`~memkernel.load.objects.LoadedObject` (as it links a disk cache
entry), or the error the request raised.

A worker that dies during a request becomes a CompileError naming the signal
(or exit status) and carrying the last lines it wrote on stderr, which is
where LLVM puts an assertion's text; the next request starts a new worker.
The first request of a process starts its worker, so a process that finds
all its kernels in the caches never starts one.

LLVM's command-line options (``llvm_options=``) are process-global, so each
set of options has a worker of its own, which sets them once at start. A
worker ends when the caller closes its end of the pipe: at the caller's exit
or death. It runs in a session of its own, so a Ctrl-C in the terminal
reaches only the caller, which then ends the worker. A forked child starts its
own workers.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import IO, Any, TypeVar

from ..errors import CompileError
from .. import forking
from ..forking import close_descriptor
from ..subprocesses import LLVM_QUIET, appending_file, worker_command
from ..load.cache import disk_cache
from . import resident
from .replies import crash_message, death, report

T = TypeVar("T")

_PROGRAM = """from memkernel.compile.server import main
main()"""
"""The worker's program (after the safe bootstrap of :mod:`memkernel.subprocesses`)."""


class _Died(Exception):
    """The worker process ended before it replied."""


def _spawn(options: tuple[str, ...], stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start a worker process that sets LLVM ``options``, in the caller's environment (LLVM's crash
    handler kept from looking for a symbolizer)."""
    environment = {**os.environ, **LLVM_QUIET}
    return subprocess.Popen(worker_command(_PROGRAM, *options), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=stderr, start_new_session=True, env=environment)


class _Process:
    """One running worker: its pipes and the file its stderr goes to."""

    def __init__(self, options: tuple[str, ...]) -> None:
        self.options = options
        self.stderr = appending_file()
        try:
            self.popen = _spawn(options, self.stderr)
        except OSError as exc:
            self.stderr.close()
            raise CompileError(f"memkernel could not start its compile worker ({sys.executable}): {exc}") from None
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.requests, self.replies = self.popen.stdin, self.popen.stdout
        self.ready = False

    def exchange(self, request: bytes) -> tuple[str, Any, str]:
        """Send the pickled ``request`` and read the reply; _Died if the worker ended first."""
        try:
            if not self.ready:
                self._receive()
                self.ready = True
            self.requests.write(request)
            self.requests.flush()
            return self._receive()
        except (EOFError, OSError, pickle.UnpicklingError):
            raise _Died() from None

    def _receive(self) -> tuple[str, Any, str]:
        reply: tuple[str, Any, str] = pickle.load(self.replies)
        return reply

    def death(self) -> str:
        """How the worker ended, once it has: the signal or exit status and its last lines on stderr."""
        try:
            status = self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.end()
            status = self.popen.wait()
        said = death(status, self.stderr.fileno())
        self.close()
        return said

    def end(self) -> None:
        """Kill the worker now."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self.close()

    def close(self) -> None:
        """Close the pipes (which ends an idle worker) and the stderr file."""
        for file in (self.requests, self.replies, self.stderr):
            with contextlib.suppress(OSError):
                file.close()

    def forget(self) -> None:
        """In a forked child: close the descriptors, never the buffered files, whose locks a thread of the
        parent may have held at the fork (one waits in :meth:`exchange` while it compiles)."""
        for file in (self.requests, self.replies, self.stderr):
            close_descriptor(file)


MAX_POOL = 4
"""The most worker processes per set of options by default, whatever the number of cores."""

SPARE_SECONDS = 10.0
"""How long a worker process beyond the first stays running while idle (each holds about 190 MB)."""


def pool_size() -> int:
    """How many worker processes one set of LLVM options may run at once: ``$MEMKERNEL_COMPILE_WORKERS``,
    else the cores this process may use, at most :data:`MAX_POOL` (each is an interpreter with MLIR loaded)."""
    text = os.environ.get("MEMKERNEL_COMPILE_WORKERS", "").strip()
    if text:
        try:
            size = int(text)
        except ValueError:
            size = 0
        if size < 1:
            raise CompileError(f"$MEMKERNEL_COMPILE_WORKERS must be a positive number of processes; got {text!r}")
        return size
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_POOL, cores))


class CompileWorker:
    """The worker processes for one set of LLVM options: the first started at the first request (or by
    :meth:`start`), another only when every one is busy with another thread's request, up to
    :func:`pool_size`; a crashed one is replaced at the next request.

    So a process that compiles one kernel at a time runs one worker, and kernels compiled from several
    threads at once (a test session, a notebook's first cell) compile in parallel.
    """

    def __init__(self, options: tuple[str, ...]) -> None:
        self.options = options
        self._lock = forking.lock()
        self._returned = forking.condition(self._lock)
        self._idle: list[_Process] = []
        self._busy: set[_Process] = set()
        self._trim: threading.Timer | None = None

    def run(self, what: str, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` run in a worker process (both must pickle; the function by name).

        Returns its result or raises the exception it raised. CompileError if
        the worker dies meanwhile, with ``what`` (e.g. ``"compiling @k"``)
        naming the work, the signal and the worker's last lines on stderr.
        Anything else that interrupts the wait (a KeyboardInterrupt) ends the worker.
        """
        request = pickle.dumps((function, args), protocol=pickle.HIGHEST_PROTOCOL)
        process = self._take()
        try:
            status, value, stderr = process.exchange(request)
        except _Died:
            self._give_back(process, keep=False)
            raise CompileError(crash_message("compile worker", self.options, what, process.death(),
                                             process.ready)) from None
        except BaseException:
            self._give_back(process, keep=False)
            process.end()
            raise
        self._give_back(process, keep=True)
        report(stderr, failed=status != "ok")
        if status != "ok":
            raise value
        return value  # type: ignore[no-any-return]

    def _take(self) -> _Process:
        """An idle process (one ended while idle, killed from outside, is dropped: not this request's doing),
        else a new one while the pool has room, else the first one another request gives back."""
        size = pool_size()
        with self._returned:
            while True:
                while self._idle:
                    process = self._idle.pop()
                    if process.popen.poll() is None:
                        self._busy.add(process)
                        return process
                    process.close()
                if len(self._busy) < size:
                    process = _Process(self.options)
                    self._busy.add(process)
                    return process
                self._returned.wait()

    def _give_back(self, process: _Process, *, keep: bool) -> None:
        with self._returned:
            self._busy.discard(process)
            if keep:
                self._idle.append(process)
            self._returned.notify()
            if len(self._idle) + len(self._busy) > 1 and self._trim is None:
                self._schedule_trim()

    def _schedule_trim(self) -> None:
        """Look for spare processes to end in :data:`SPARE_SECONDS` (the caller holds the lock)."""
        self._trim = threading.Timer(SPARE_SECONDS, self._end_spares)
        self._trim.daemon = True
        self._trim.start()

    def _end_spares(self) -> None:
        """End the idle processes beyond the first once none is busy (the burst of compiles is over);
        else look again later."""
        with self._lock:
            self._trim = None
            if self._busy:
                spares: list[_Process] = []
                self._schedule_trim()
            else:
                spares, self._idle = self._idle[:-1], self._idle[-1:]
        for process in spares:
            self._end(process)

    def busy(self) -> bool:
        """Whether a process of this worker is serving a request."""
        return bool(self._busy)

    def start(self) -> None:
        """Start a worker process now, unless one runs, so that its start (importing MLIR) overlaps what the
        caller does until its first request. A process that cannot start is left for that request to report."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if not self._idle and not self._busy:
                self._idle.append(_Process(self.options))
        except CompileError:
            pass
        finally:
            self._lock.release()

    def close(self) -> None:
        """End the idle processes (one serving a request goes back to the pool when it is done)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for process in idle:
            self._end(process)

    def close_if_idle(self) -> None:
        """End the processes unless one is serving a request (they start again at the next one)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._busy:
                return
            idle, self._idle = self._idle, []
        finally:
            self._lock.release()
        for process in idle:
            self._end(process)

    @staticmethod
    def _end(process: _Process) -> None:
        process.close()
        try:
            process.popen.wait(timeout=2)
        except subprocess.TimeoutExpired:
            process.end()

    def pid(self) -> int | None:
        """The process id of a running worker process (the next one to serve), or None when none runs."""
        for process in [*reversed(self._idle), *self._busy]:
            if process.popen.poll() is None:
                return process.popen.pid
        return None

    def forget(self) -> None:
        """In a forked child: let go of the parent's processes without touching their files' locks (the
        parent's trimming timer does not run in the child)."""
        for process in [*self._idle, *self._busy]:
            process.forget()


_workers: dict[tuple[str, ...], CompileWorker] = {}
"""The compile workers by LLVM options, the most recently used last."""
_workers_lock = forking.lock()

KEEP_RUNNING = 2
"""How many compile workers, the most recently used, are left running when idle: each is an interpreter with
MLIR loaded (about 190 MB resident), and a process that compiles with many sets of ``llvm_options`` would
otherwise keep one per set. An ended worker starts again (about a second) at its next request."""


def worker(options: Sequence[str] = ()) -> CompileWorker:
    """The process's compile worker for LLVM ``options`` (a worker is started by its first request).

    Workers beyond the :data:`KEEP_RUNNING` most recently used are ended if idle.
    """
    key = tuple(options)
    with _workers_lock:
        chosen = _workers.pop(key, None) or CompileWorker(key)
        _workers[key] = chosen
    _end_idle_workers()
    return chosen


def _end_idle_workers() -> None:
    """End the idle workers beyond the :data:`KEEP_RUNNING` most recently used; after each request too, so a
    worker that was busy when another set of options came along is not left running."""
    with _workers_lock:
        others = list(_workers.values())[:-KEEP_RUNNING]
    for each in others:
        each.close_if_idle()


def in_process() -> bool:
    """Whether ``$MEMKERNEL_COMPILE_WORKER`` is ``0``: compile in this process, where an abort ends it.

    For debugging the compilation itself (a debugger, a patched pass or preset).
    """
    return os.environ.get("MEMKERNEL_COMPILE_WORKER", "").strip() == "0"


_set_here: tuple[str, ...] = ()


def _run_here(options: tuple[str, ...], function: Callable[..., T], args: tuple[Any, ...]) -> T:
    global _set_here
    with _workers_lock:
        if options and options != _set_here:
            if _set_here:
                raise CompileError(
                    f"LLVM options are set once per process: this one compiles with llvm_options={_set_here!r} "
                    f"and cannot switch to {options!r}. Unset MEMKERNEL_COMPILE_WORKER to compile in workers.")
            from .llvm import parse_llvm_options

            if not parse_llvm_options(options):
                raise CompileError(f"LLVM refused llvm_options={options!r}; its reason is on stderr above.")
            _set_here = options
    return function(*args)


def run(options: Sequence[str], what: str, function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in the compile worker for LLVM ``options``: the resident compile server (see
    :mod:`memkernel.compile.resident`) when the disk cache is on and ``$MEMKERNEL_COMPILE_SERVER_IDLE`` is not
    ``0``, else a worker process of this process's own (see :meth:`CompileWorker.run`); or in this process
    when :func:`in_process`."""
    if in_process():
        return _run_here(tuple(options), function, args)
    if resident.idle_seconds() > 0:
        with disk_cache() as folder:
            if folder is not None:
                return resident.run(folder, tuple(options), pool_size(), what, function, *args)
    try:
        return worker(options).run(what, function, *args)
    finally:
        _end_idle_workers()


def start(options: Sequence[str] = ()) -> None:
    """Start the compile worker for LLVM ``options`` now (see :meth:`CompileWorker.start` and
    :func:`memkernel.compile.resident.start`), unless compiles run in this process: decoration that must read a
    kernel's source starts it, since a compile follows."""
    if in_process():
        return
    try:
        if resident.idle_seconds() > 0:
            with disk_cache() as folder:
                if folder is not None:
                    resident.start(folder, tuple(options))
                    return
    except CompileError:  # left for the first request to report
        return
    worker(options).start()


def _close_all() -> None:
    with _workers_lock:
        workers = list(_workers.values())
    for each in workers:
        each.close()


def _forget_in_child() -> None:
    """A forked child leaves its parent's workers (and their pipes) and its connections to the compile server
    alone and starts its own."""
    global _workers
    resident.forget_in_child()
    for each in _workers.values():
        each.forget()
    _workers = {}


atexit.register(_close_all)
os.register_at_fork(after_in_child=_forget_in_child)
