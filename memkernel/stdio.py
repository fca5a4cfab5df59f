"""The C streams: what a kernel prints reaches ``sys.stdout``/``sys.stderr``; what MLIR prints, the errors.

This module is the one place that redirects file descriptors 1 and 2. It does
so for two reasons:

* A kernel that may print (``printMemrefF32``, ``vector.print``, ``printf``:
  it calls a function that is neither an allocator, ``memrefCopy``, a libm
  function nor an APFloat routine) writes to descriptors 1 and 2. In a terminal
  that is where the user looks; in Jupyter or under pytest's ``capsys``,
  ``sys.stdout`` is not descriptor 1 and the text would be lost or out of
  order. :func:`captured` points both descriptors at files around the call,
  then writes what they got to ``sys.stdout``/``sys.stderr``, in order with the
  Python prints around it. A kernel that cannot print never pays for any of
  this: the call path does not even reach this module.
* MLIR's ExecutionEngine and the JIT linker report on C ``stderr`` only.
  :func:`capture_c_stderr` points descriptor 2 at a file around a compilation
  so that the text ends up in the :class:`~memkernel.errors.CompileError`.

Descriptors belong to the process, so the two must agree. The rules:

* Every redirection saves the descriptor it replaces and puts it back on exit,
  and a lock (:data:`_descriptors`, re-entrant) is held while it does, so the
  saves and restores nest like a stack, whatever the threads.
* One kernel-output capture is in place at a time, and a capture nests. A
  call that wants one while one is in place joins it if it runs inside the
  call that put it in place: on the same thread (a callback of a serial
  kernel), or on a thread Python did not start (an async-runtime worker
  running a callback of a ``parallel=True`` kernel). It must not wait for the
  call it runs inside. Its text goes to the same files; when it ends it writes
  out what they got so far, so a callback's prints stay in order; and the call
  that put the capture in place waits for every call that joined it before it
  puts the descriptors back. A call on another Python thread waits for the
  capture to end, so two threads' kernels do not print over each other. (So a
  Python thread that a callback starts and waits for must not call a kernel
  that captures: it would wait for the call the callback runs in.)
* A C-stderr capture holds the lock for the whole compilation (which runs no
  Python code, so it always ends), so it always returns its own text. If a
  kernel-output capture was in place, what it got is passed on to that capture
  too, so nothing a running kernel printed meanwhile is lost.
* A child forked while another thread of the parent had a capture in place
  (or a call waiting for one) finds the lock and the capture free, and
  descriptors 1 and 2 (and 2 of a C-stderr capture) pointing where they
  pointed before the captures: its own output goes where the parent's went
  before, never into the parent's capture files, which it does not share.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TypeVar

from . import forking

T = TypeVar("T")

_SILENT = frozenset({"malloc", "free", "aligned_alloc", "memrefCopy"})
_libc = ctypes.CDLL(None)

_descriptors = forking.rlock()
"""Held while descriptors 1 and 2 are pointed somewhere else or put back, and through a C-stderr capture."""

_redirected: list[tuple[int, int]] = []
"""The redirections in place, the latest last: a descriptor and a copy of what it pointed at before."""


def _point(fd: int, at: int) -> None:
    """Point descriptor ``fd`` at ``at``'s file, keeping what it pointed at (with :data:`_descriptors` held)."""
    _redirected.append((fd, os.dup(fd)))
    os.dup2(at, fd)


def _put_back() -> None:
    """Undo the latest redirection (with :data:`_descriptors` held)."""
    fd, saved = _redirected.pop()
    os.dup2(saved, fd)
    os.close(saved)


@functools.lru_cache(maxsize=None)
def _libm() -> ctypes.CDLL:
    return ctypes.CDLL("libm.so.6")


class _SymbolInfo(ctypes.Structure):
    """glibc's ``Dl_info``: the object defining an address, and the symbol."""

    _fields_ = [("file", ctypes.c_char_p), ("base", ctypes.c_void_p), ("symbol", ctypes.c_char_p),
                ("address", ctypes.c_void_p)]


@functools.lru_cache(maxsize=None)
def _libm_defines(name: str) -> bool:
    """Whether libm itself defines ``name``. A lookup through libm also finds what the libraries it depends on
    define (libc's ``puts`` and ``printf``): ``dladdr`` says which object the symbol found is in."""
    try:
        found = ctypes.cast(getattr(_libm(), name), ctypes.c_void_p)
        dladdr = _libc.dladdr
    except AttributeError:
        return False
    info = _SymbolInfo()
    if not dladdr(found, ctypes.byref(info)) or not info.file:
        return False
    return os.path.basename(info.file).startswith(b"libm.")


def may_print(external_functions: Iterable[str]) -> bool:
    """Whether a kernel calling these functions may write to the C streams: it calls one that is neither an
    allocator, ``memrefCopy``, an APFloat routine nor one libm defines."""
    return any(
        name not in _SILENT and not name.startswith("_mlir_apfloat_") and not _libm_defines(name)
        for name in external_functions
    )


def _writes_to(stream: IO[str], fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return False


def python_streams_are_the_c_streams() -> bool:
    """True in a terminal: ``sys.stdout``/``sys.stderr`` write to descriptors 1 and 2."""
    return _writes_to(sys.stdout, 1) and _writes_to(sys.stderr, 2)


def _flush_c() -> None:
    _libc.fflush(None)


def _flush_python() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


def flush_streams() -> None:
    """Write out what Python's streams, then C's, hold: what native code prints next comes after it.

    A Python stream that is gone or closed (at the interpreter's exit) is skipped.
    """
    with contextlib.suppress(AttributeError, ValueError, OSError):
        _flush_python()
    _flush_c()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


@functools.lru_cache(maxsize=None)
def _sinks() -> tuple[IO[bytes], IO[bytes]]:
    import tempfile  # only where output is captured: not at every import of memkernel

    return tempfile.TemporaryFile(), tempfile.TemporaryFile()


def _runs_inside_a_kernel_call() -> bool:
    """Whether this thread was not started by Python: a runtime's worker thread running a kernel's callback."""
    return isinstance(threading.current_thread(), threading._DummyThread)


class _KernelOutput:
    """The kernel-output capture: which thread put it in place, the calls that joined it, what was echoed."""

    def __init__(self) -> None:
        self.changed = forking.condition()
        self.owner: int | None = None
        self._inner = 0
        self._echoed = [0, 0]

    def forget(self) -> None:
        """No capture in place and no call in it: in a forked child, where their threads are not."""
        self.owner = None
        self._inner = 0

    def enter(self) -> bool:
        """Join the capture in place, or put one in place; True for the call that put it in place."""
        me = threading.get_ident()
        with self.changed:
            if self.owner is not None and (self.owner == me or _runs_inside_a_kernel_call()):
                self._inner += 1
                _flush_python()
                return False
            while self.owner is not None:
                self.changed.wait()
            with _descriptors:
                _flush_python()
                _flush_c()
                for fd, sink in enumerate(_sinks(), start=1):
                    os.ftruncate(sink.fileno(), 0)
                    os.lseek(sink.fileno(), 0, os.SEEK_SET)
                    _point(fd, sink.fileno())
                self._echoed = [0, 0]
                self.owner = me
            return True

    def leave(self, opened: bool) -> None:
        """Leave the capture; the call that put it in place waits for the others, then puts fds 1 and 2 back."""
        with self.changed:
            if not opened:
                self._inner -= 1
                self.changed.notify_all()
                _flush_c()
                self._echo(in_place=True)
                return
            while self._inner:
                self.changed.wait()
            with _descriptors:
                _flush_python()
                _flush_c()
                _put_back()
                _put_back()
                self.owner = None
            self._echo(in_place=False)
            self.changed.notify_all()

    def _echo(self, *, in_place: bool) -> None:
        """Write what the files got since the last echo to the Python streams.

        While the files are in place, a Python stream that writes to its
        descriptor writes into them, in order, already: it is left alone.
        """
        for index, (sink, stream) in enumerate(zip(_sinks(), (sys.stdout, sys.stderr))):
            if in_place and _writes_to(stream, index + 1):
                continue
            end = os.fstat(sink.fileno()).st_size
            data = os.pread(sink.fileno(), end - self._echoed[index], self._echoed[index])
            self._echoed[index] = end
            if data:
                stream.write(data.decode(errors="replace"))
                stream.flush()


_kernel_output = _KernelOutput()


def captured(call: Callable[[], T]) -> T:
    """Run ``call`` with what it prints on descriptors 1 and 2 written to ``sys.stdout``/``sys.stderr``.

    Safe to nest, on the same thread or from a thread that runs inside the call
    (a callback); see the module docstring. Returns what ``call`` returns and
    raises what it raises.
    """
    opened = _kernel_output.enter()
    try:
        return call()
    finally:
        _kernel_output.leave(opened)


@contextlib.contextmanager
def capture_c_stderr() -> Iterator[list[str]]:
    """Point descriptor 2 at a file for the duration of the block, for a compilation.

    Yields a list that holds the captured text once the block exits. Other
    threads' redirections wait for the block, so the block must not wait for
    another thread: it is meant for a compilation, never a kernel call. The
    text also goes on to the kernel-output capture in place, if any.
    """
    import tempfile  # only where output is captured: not at every import of memkernel

    captured_text: list[str] = []
    with _descriptors, tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        _flush_c()
        _point(2, sink.fileno())
        try:
            yield captured_text
        finally:
            _flush_c()
            _put_back()
            data = os.pread(sink.fileno(), os.fstat(sink.fileno()).st_size, 0)
            if _kernel_output.owner is not None:
                _write_all(2, data)
            captured_text.append(data.decode(errors="replace"))


@forking.reset_in_child
def _release_in_child() -> None:
    """Put the descriptors back, end the capture, and drop the capture files, which the parent still uses."""
    while _redirected:
        _put_back()
    _kernel_output.forget()
    if _sinks.cache_info().currsize:
        for sink in _sinks():
            forking.close_descriptor(sink)
        _sinks.cache_clear()
