"""The resident compile server: a compile worker that outlives the process that started it.

A fresh process that must compile (a script re-run in an edit-run loop, the
next pytest session) would otherwise pay for a new interpreter importing the
MLIR bindings (about 350 ms) before its first compile. Instead, the first
process that needs one starts a server, detached from it, which imports MLIR,
sets its LLVM options, and listens on a Unix socket in the disk cache's folder
(:func:`memkernel.load.cache.disk_cache`, private to the user); later processes
connect to it and pay only the compile. Each request is served by a process
the server forks for it (so requests from several threads or processes run in
parallel, and an abort in MLIR or LLVM ends only that process: the
:mod:`memkernel.compile.resident_server` side).

- **Which server.** The socket's name is a digest of everything that must
  match: the cache key's environment (memkernel's source digest, the MLIR,
  LLVM, numpy and Python versions, the host CPU), the Python executable and
  version, the LLVM options, and the environment variables that decide which
  MLIR and LLVM the server loads (``PYTHONPATH``, ``LD_LIBRARY_PATH``). The
  compile itself reads no ``MEMKERNEL_*`` variable: the caller resolves
  them into the request.
- **Who may connect.** Only the same user, checked with ``SO_PEERCRED`` on both
  sides: a request is a pickled function, so a connection runs code in the server.
- **Lifetime.** The server ends after :func:`idle_seconds` without a request
  (``$MEMKERNEL_COMPILE_SERVER_IDLE``, 60 s by default; ``0`` switches the
  server off, and compiles go to the private workers of
  :mod:`memkernel.compile.worker`), and at once when its socket file is
  removed or replaced (its cache folder deleted). With the disk cache off there
  is no server. Two processes that need one at once start one: the starter holds
  ``<name>.lock`` (``flock``) until the server is ready, and replaces a socket
  whose server is gone. The server's own stderr goes to ``<name>.log``.
- **Containment.** A request's process that dies is a CompileError naming the
  signal and carrying the last lines it wrote on stderr (a file of the caller's,
  passed with the request); the server itself goes on. A server that is gone
  (killed) is a CompileError too, and the next request starts a new one. A
  caller that dies or is interrupted (Ctrl-C) during a request closes its
  connection, and the server kills the request's process. Each request has a
  connection of its own, which a forked child never shares.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import pickle
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from ..errors import CompileError
from .. import forking
from ..forking import close_descriptor
from ..load.cache import Folder, environment
from ..subprocesses import LLVM_QUIET, appending_file, peer_credentials, worker_command
from .replies import crash_message, death, options_text, report

T = TypeVar("T")

IDLE_VARIABLE = "MEMKERNEL_COMPILE_SERVER_IDLE"
DEFAULT_IDLE_SECONDS = 60.0
"""How long a compile server waits for a request before it ends, unless ``$MEMKERNEL_COMPILE_SERVER_IDLE`` says."""

REQUEST = b"R"
"""The byte a request is sent as; the request itself, and the reply after it, are in the file sent with it."""
TAKEN = b"T"
"""The byte the server answers once it has forked the request's process."""
STATUS = struct.Struct("<i")
"""How the request's process ended, sent by the server once it has: ``-N`` for signal N, else its exit status."""

_PROGRAM = """if os.fork():
    os._exit(0)
from memkernel.compile.resident_server import main
main()"""
"""The server's program (after the safe bootstrap of :mod:`memkernel.subprocesses`): it forks at once, and the
process that started it exits, so the server is nobody's child."""

_MAX_ADDRESS = 100
"""The longest socket path given as is (Linux's ``sun_path`` holds 108 bytes); a longer one goes through the
folder's descriptor in ``/proc/self/fd``."""


def idle_seconds() -> float:
    """``$MEMKERNEL_COMPILE_SERVER_IDLE`` (seconds, ``0`` for no server), else :data:`DEFAULT_IDLE_SECONDS`."""
    text = os.environ.get(IDLE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_IDLE_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise CompileError(f"${IDLE_VARIABLE} must be a number of seconds (0 for no compile server); got {text!r}")
    return seconds


@functools.lru_cache(maxsize=None)
def _software() -> str:
    return json.dumps({"environment": environment(), "executable": sys.executable, "python": sys.version},
                      sort_keys=True)


def server_name(options: tuple[str, ...]) -> str:
    """The name of the socket of the server for LLVM ``options`` (see the module's docstring)."""
    fields = {"software": _software(), "llvm_options": list(options),
              **{variable: os.environ.get(variable) for variable in ("PYTHONPATH", "LD_LIBRARY_PATH")}}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return f"compile-{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def address(folder: Path, handle: int, name: str) -> str:
    """The address of socket ``name`` in ``folder`` (open as ``handle``), short enough for ``sun_path``."""
    plain = str(folder / name)
    return plain if len(plain.encode()) <= _MAX_ADDRESS else f"/proc/self/fd/{handle}/{name}"


def _connect(folder: Path, handle: int, name: str) -> socket.socket | None:
    """A connection to the server ``name`` in ``folder`` (open as ``handle``), or None when none listens there."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(address(folder, handle, name))
    except OSError:
        connection.close()
        return None
    _, uid = peer_credentials(connection)
    if uid != os.geteuid():
        connection.close()
        raise CompileError(f"memkernel's compile server socket {folder / name} belongs to a process of uid "
                           f"{uid}, not yours ({os.geteuid()}); a request is code it would run. Remove the "
                           "socket, or set MEMKERNEL_COMPILE_SERVER_IDLE=0.")
    return connection


_state_lock = forking.lock()
_starting: dict[str, threading.Thread] = {}
"""The threads of this process starting a server, by name (see :func:`start`)."""
_held: set[int] = set()
"""The lock files this process holds while a server it started gets ready."""
_in_flight: set[tuple[socket.socket, IO[bytes], IO[bytes]]] = set()
"""The connections and files of the requests under way."""
_slots: dict[str, threading.Semaphore] = {}


def _ensure_server(folder_path: Path, name: str, options: tuple[str, ...]) -> None:
    """Start the server ``name`` and wait until it listens, unless one does; holds ``<name>.lock`` meanwhile,
    so that another process waits, then finds it. CompileError, with the server's last lines on stderr, if it
    ended before it was ready."""
    handle = os.open(folder_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    lock = -1
    try:
        lock = os.open(f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=handle)
        with _state_lock:
            _held.add(lock)
        fcntl.flock(lock, fcntl.LOCK_EX)
        running = _connect(folder_path, handle, name)
        if running is not None:
            running.close()
            return
        try:
            os.unlink(name, dir_fd=handle)  # a socket whose server is gone
        except FileNotFoundError:
            pass
        _spawn(folder_path, handle, name, options)
    finally:
        if lock >= 0:
            with _state_lock:
                _held.discard(lock)
            os.close(lock)
        os.close(handle)


def _spawn(folder: Path, handle: int, name: str, options: tuple[str, ...]) -> None:
    """Start the server ``name`` in ``folder`` (open as ``handle``) and wait until it listens."""
    log = os.open(f"{name}.log", os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o600, dir_fd=handle)
    ready, told = os.pipe()
    try:
        command = worker_command(_PROGRAM, str(folder), name, repr(idle_seconds()), str(told), *options)
        try:
            subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                           pass_fds=(told,), start_new_session=True, env={**os.environ, **LLVM_QUIET}, check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise CompileError(f"memkernel could not start its compile server ({sys.executable}): {exc}") from None
        os.close(told)
        told = -1
        if os.read(ready, 1) != b"1":  # the server's end closed: it ended before it listened
            raise CompileError(crash_message("compile server", options, "", death(None, log), started=False))
    finally:
        for descriptor in (ready, told, log):
            if descriptor >= 0:
                os.close(descriptor)


def start(folder: Folder, options: tuple[str, ...]) -> None:
    """Have the server for ``options`` start now, unless it listens or is starting, in a thread of this
    process, so that its start overlaps what the caller does until its first request. A server that cannot
    start is left for that request to report."""
    name = server_name(options)
    running = _connect(folder.path, folder.handle, name)
    if running is not None:
        running.close()
        return
    with _state_lock:
        if name in _starting and _starting[name].is_alive():
            return
        thread = threading.Thread(target=_start_quietly, args=(folder.path, name, options), daemon=True,
                                  name="memkernel compile server start")
        _starting[name] = thread
    thread.start()


STARTING_AT_EXIT_SECONDS = 30.0
"""How long a process that exits while a server it started gets ready waits for it: the server is for the
next process, and a thread ended half way would leave none."""


def _let_starting_servers_be_ready() -> None:
    with _state_lock:
        threads = list(_starting.values())
    deadline = time.monotonic() + STARTING_AT_EXIT_SECONDS
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


atexit.register(_let_starting_servers_be_ready)


def _start_quietly(folder_path: Path, name: str, options: tuple[str, ...]) -> None:
    try:
        _ensure_server(folder_path, name, options)
    except (CompileError, OSError):
        pass


def _connection(folder: Folder, name: str, options: tuple[str, ...]) -> socket.socket:
    connection = _connect(folder.path, folder.handle, name)
    if connection is None:
        with _state_lock:
            starting = _starting.get(name)
        if starting is not None:
            starting.join()
            connection = _connect(folder.path, folder.handle, name)
    if connection is None:
        _ensure_server(folder.path, name, options)
        connection = _connect(folder.path, folder.handle, name)
    if connection is None:
        raise CompileError(f"memkernel's compile server{options_text(options)} started, but does not answer on "
                           f"{folder.path / name}.")
    return connection


def run(folder: Folder, options: tuple[str, ...], at_once: int, what: str, function: Callable[..., T],
        *args: Any) -> T:
    """``function(*args)`` run by the server for LLVM ``options`` whose socket is in ``folder`` (started now
    unless it runs), at most ``at_once`` requests of this process at a time.

    Returns its result or raises the exception it raised. CompileError if the
    process serving it dies meanwhile, with ``what`` (e.g. ``"compiling @k"``)
    naming the work, the signal and its last lines on stderr. Anything else
    that interrupts the wait (a KeyboardInterrupt) closes the connection, and
    the server ends the request's process.
    """
    request = pickle.dumps((function, args), protocol=pickle.HIGHEST_PROTOCOL)
    name = server_name(options)
    with _state_lock:
        slots = _slots.setdefault(name, forking.semaphore(at_once))
    with slots:
        for _ in range(_ATTEMPTS):
            with contextlib.suppress(_NotTaken):
                return _exchange(_connection(folder, name, options), options, what, request)  # type: ignore[no-any-return]
    raise CompileError(f"memkernel's compile server{options_text(options)} in {folder.path} closed {_ATTEMPTS} "
                       f"connections in a row without taking the request; its stderr is in "
                       f"{folder.path / (name + '.log')}. Set MEMKERNEL_COMPILE_SERVER_IDLE=0 to compile without it.")


_ATTEMPTS = 3
"""How many servers a request is sent to when each ends before it takes the request (one that ended when
idle just as the request came: the next connection starts a new one)."""


class _NotTaken(Exception):
    """The server closed the connection before it took the request."""


def _exchange(connection: socket.socket, options: tuple[str, ...], what: str, request: bytes) -> Any:
    exchange, stderr = tempfile.TemporaryFile(), appending_file()
    flight = (connection, exchange, stderr)
    with _state_lock:
        _in_flight.add(flight)
    try:
        exchange.write(request)
        exchange.flush()
        try:
            socket.send_fds(connection, [REQUEST], [exchange.fileno(), stderr.fileno()])
            taken = connection.recv(len(TAKEN))
        except ConnectionError:
            taken = b""
        if taken != TAKEN:
            raise _NotTaken()
        status: int | None
        try:
            status = _status(connection)
        except ConnectionError:
            status = None
        reply = _reply(exchange.fileno(), len(request)) if status in (0, None) else None
        if reply is None:
            # The server forks a process for each request: the one that died was this request's, unless none said
            # how it ended (gone), when the server itself went away.
            named = "compile server" if status is None else "compile server's process for it"
            raise CompileError(crash_message(named, options, what, death(status, stderr.fileno()),
                                             started=True, gone=status is None)) from None
    finally:
        with _state_lock:
            _in_flight.discard(flight)
        connection.close()
        exchange.close()
        stderr.close()
    kind, value, written = reply
    report(written, failed=kind != "ok")
    if kind != "ok":
        raise value
    return value


def _status(connection: socket.socket) -> int | None:
    """How the request's process ended, or None if the server closed the connection without saying (it is gone)."""
    data = b""
    while len(data) < STATUS.size:
        more = connection.recv(STATUS.size - len(data))
        if not more:
            return None
        data += more
    (status,) = STATUS.unpack(data)
    return int(status)


def _reply(fd: int, start: int) -> tuple[str, Any, str] | None:
    """The reply written after the request (at ``start``) in the file open as ``fd``; None if there is none
    whole."""
    size = os.fstat(fd).st_size
    if size <= start:
        return None
    try:
        reply: tuple[str, Any, str] = pickle.loads(os.pread(fd, size - start, start))
    except Exception:
        return None
    return reply


def server_pid(folder: Folder, options: tuple[str, ...]) -> int | None:
    """The process id of the server for ``options`` whose socket is in ``folder``, or None when none listens."""
    connection = _connect(folder.path, folder.handle, server_name(options))
    if connection is None:
        return None
    with connection:
        return peer_credentials(connection)[0]


def forget_in_child() -> None:
    """In a forked child: close the parent's connections, files and locks (its threads that used them are not
    in the child), and start afresh."""
    for connection, exchange, stderr in list(_in_flight):
        connection.close()
        close_descriptor(exchange)
        close_descriptor(stderr)
    for lock in list(_held):
        os.close(lock)
    _in_flight.clear()
    _held.clear()
    _starting.clear()
    _slots.clear()
