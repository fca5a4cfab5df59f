"""The resident compile server's side (see :mod:`memkernel.compile.resident` for the caller's and the design).

A fork server: the process imports the compiler and the MLIR bindings once and
sets its LLVM options, then never compiles itself. For each request it forks a
process that has all of that already, which runs the request and ends. So
requests run in parallel, one request's abort ends only its own process (the
server reports how it ended to the caller), and the server stays
single-threaded, as ``fork()`` needs: it creates no MLIR context, so no
thread pool.

Only connections from processes of the server's own user are served
(``SO_PEERCRED``): a request is a pickled function, which the forked process
runs, so a connection is code execution.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import selectors
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

from . import decoration, engine
from .fast_path import fast_path
from .llvm import parse_llvm_options
from .pipeline import parse_pipeline
from .resident import REQUEST, STATUS, TAKEN, address
from .server import answer, reply
from .stderr import SERVING
from ..fastpath.abi import fast_path_supported
from ..model.kernel_spec import bind
from ..options import KernelOptions
from ..subprocesses import peer_credentials

CHECK_SECONDS = 0.25
"""How often the server looks whether its socket file is still its own and whether it has been idle long enough."""

WARM_AFTER_SECONDS = 0.5
"""How long the server waits without a request before it warms up (see :func:`_warm_up`), once."""

SILENT_SECONDS = 10.0
"""How long a connection may stay without sending its request before the server drops it."""


def _listen(folder: Path, handle: int, name: str) -> tuple[socket.socket, tuple[int, int]]:
    """A socket listening as ``name`` in ``folder``: bound under a temporary name, then renamed into place, so
    that a caller that connects finds it ready. Returns it and the socket file's identity."""
    temporary = f".{name}.{os.getpid()}"
    try:
        os.unlink(temporary, dir_fd=handle)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address(folder, handle, temporary))
    os.chmod(temporary, 0o600, dir_fd=handle)
    listener.listen(64)
    status = os.stat(temporary, dir_fd=handle, follow_symlinks=False)
    os.replace(temporary, name, src_dir_fd=handle, dst_dir_fd=handle)
    listener.setblocking(False)
    return listener, (status.st_dev, status.st_ino)


class _Server:
    """The accept loop: connections waiting for their request, the processes serving requests, and when to end."""

    def __init__(self, listener: socket.socket, handle: int, name: str, identity: tuple[int, int],
                 idle: float) -> None:
        self.listener, self.handle, self.name, self.identity, self.idle = listener, handle, name, identity, idle
        self.waiting: dict[socket.socket, float] = {}
        self.serving: dict[int, socket.socket | None] = {}
        self.connections: dict[socket.socket, int] = {}
        self.selector = selectors.DefaultSelector()
        self.last = time.monotonic()
        self.listening = True
        self.warm = False
        self.pid = os.getpid()
        self.wake_read, self.wake_write = os.pipe()

    def run(self) -> None:
        """Serve until idle for ``idle`` seconds or the socket file is no longer this server's, then finish the
        requests under way and those already connected."""
        for descriptor in (self.wake_read, self.wake_write):
            os.set_blocking(descriptor, False)
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda number, frame: None)
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_read, selectors.EVENT_READ)
        while self.listening or self.waiting or self.serving or self._accept():
            for key, _ in self.selector.select(CHECK_SECONDS):
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj == self.wake_read:
                    while _drained(self.wake_read):
                        pass
                elif isinstance(key.fileobj, socket.socket):
                    self._readable(key.fileobj)
            self._reap()
            self._drop_silent()
            if self.listening and (not self._own_socket() or self._idle(self.idle)):
                self._stop_listening()
            elif not self.warm and self._idle(WARM_AFTER_SECONDS):
                _warm_up()
                self.warm = True

    def _accept(self) -> bool:
        """Take a waiting connection, if any (only from this user); whether there was one."""
        try:
            connection, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return False
        self.last = time.monotonic()
        if peer_credentials(connection)[1] != os.geteuid():
            connection.close()
            return True
        connection.setblocking(False)
        self.waiting[connection] = self.last
        self.selector.register(connection, selectors.EVENT_READ)
        return True

    def _readable(self, connection: socket.socket) -> None:
        if connection in self.waiting:
            self._request(connection)
            return
        pid = self.connections.pop(connection, None)  # the caller closed it, gone or interrupted: end its request
        self._close(connection)
        if pid is not None:
            self.serving[pid] = None
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _request(self, connection: socket.socket) -> None:
        try:
            message, descriptors, _, _ = socket.recv_fds(connection, len(REQUEST), 2)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            message, descriptors = b"", []
        del self.waiting[connection]
        if message != REQUEST or len(descriptors) != 2:
            for descriptor in descriptors:
                os.close(descriptor)
            self._close(connection)
            return
        pid = os.fork()
        if pid == 0:
            try:
                self._child(connection, descriptors[0], descriptors[1])
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(70)
        for descriptor in descriptors:
            os.close(descriptor)
        self.serving[pid] = connection
        self.connections[connection] = pid
        try:
            connection.send(TAKEN)
        except OSError:
            pass

    def _child(self, connection: socket.socket, exchange: int, stderr: int) -> None:
        """In the forked process: let go of the server's sockets (a caller must see the server's end close when
        it ends), run the request in the exchange file with stderr on the caller's file, append the reply."""
        _die_with(self.pid)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for descriptor in (self.wake_read, self.wake_write, self.selector.fileno()):
            os.close(descriptor)
        self.listener.close()
        for other in [*self.waiting, *self.connections]:
            if other is not connection:
                other.close()
        os.dup2(stderr, 2)
        os.dup2(stderr, 1)
        os.close(stderr)
        size = os.fstat(exchange).st_size
        function, args = pickle.loads(os.pread(exchange, size, 0))
        with os.fdopen(exchange, "ab") as replies:
            reply(replies, *answer(function, args))
        os._exit(0)

    def _reap(self) -> None:
        """Collect the ended request processes, and tell each one's caller how it ended."""
        while self.serving:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.serving.clear()
                return
            if pid == 0:
                return
            self.last = time.monotonic()
            connection = self.serving.pop(pid, None)
            if connection is None:
                continue
            self.connections.pop(connection, None)
            try:
                connection.send(STATUS.pack(os.waitstatus_to_exitcode(status)))
            except OSError:
                pass
            self._close(connection)

    def _drop_silent(self) -> None:
        now = time.monotonic()
        for connection, since in list(self.waiting.items()):
            if now - since > SILENT_SECONDS:
                del self.waiting[connection]
                self._close(connection)

    def _close(self, connection: socket.socket) -> None:
        self.selector.unregister(connection)
        connection.close()

    def _own_socket(self) -> bool:
        """Whether the socket file is still this server's (not removed, as with its folder, nor replaced)."""
        try:
            status = os.stat(self.name, dir_fd=self.handle, follow_symlinks=False)
        except OSError:
            return False
        return (status.st_dev, status.st_ino) == self.identity

    def _idle(self, seconds: float) -> bool:
        return not self.waiting and not self.serving and time.monotonic() - self.last >= seconds

    def _stop_listening(self) -> None:
        """Remove the socket file if it is still this server's: a caller that connects from now on starts a new
        server, and the loop ends once those already connected are served."""
        if self._own_socket():
            try:
                os.unlink(self.name, dir_fd=self.handle)
            except FileNotFoundError:
                pass
        self.listening = False


_WARM_UP_KERNEL = """func.func @warm_up(%a: memref<16xf32>, %b: memref<16xf32>, %c: memref<16xf32>) {
  linalg.add ins(%a, %b : memref<16xf32>, memref<16xf32>) outs(%c : memref<16xf32>)
  return
}"""


def _warm_up() -> None:
    """Read and compile a small kernel here, with its fast path, once, so that what LLVM and MLIR set up at a
    process's first read and compile is already done in the processes forked for requests (each compile then
    takes about 40 ms less). It creates no thread: the server stays fit to fork."""
    try:
        kernel_ir, _ = decoration.read_kernel(KernelOptions(_WARM_UP_KERNEL), "warm_up", ("a", "b"))
        spec = bind(kernel_ir, lambda a, b: None)
        fast = fast_path(spec, spec.signature.results) if fast_path_supported() else None
        engine.object_code(_WARM_UP_KERNEL, "warm_up", parse_pipeline(None), 3, (), fast, ())
    except Exception as exc:  # noqa: BLE001  (the requests will meet and report the same failure)
        print(f"memkernel's compile server could not warm up: {exc}", file=sys.stderr)


_PR_SET_PDEATHSIG = 1


def _die_with(server: int) -> None:
    """Have this forked process killed when the server ends (killed), so that its caller sees the connection
    close then, not at the end of a compile nobody will take."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server:  # it ended before that
        os._exit(71)


def _drained(descriptor: int) -> bool:
    try:
        return bool(os.read(descriptor, 512))
    except (BlockingIOError, InterruptedError):
        return False


def main() -> None:
    """The server process: ``sys.argv[2:]`` are the cache folder, the socket's name, the idle seconds, the
    descriptor to write ``1`` on once listening, and the LLVM options."""
    folder, name, idle, ready = Path(sys.argv[2]), sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
    SERVING[0] = True
    if not parse_llvm_options(sys.argv[6:]):
        sys.exit(1)
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    listener, identity = _listen(folder, handle, name)
    try:
        os.write(ready, b"1")
    except BrokenPipeError:  # the process that started it is gone: the server is for the next one
        pass
    os.close(ready)
    _Server(listener, handle, name, identity, idle).run()
