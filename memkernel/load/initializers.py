"""Running a loaded module's global constructors and destructors: the functions
:func:`memkernel.compile.initializers.gather` made of its ``llvm.mlir.global_ctors`` and ``global_dtors``,
the constructors once per load before the first call, the destructors once when the code is released or the
interpreter exits."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

from ..errors import MemkernelError
from ..stdio import flush_streams
from .guard import FRAME_SIZE, failure_error
from .objects import LoadedObject
from .. import forking

CONSTRUCTORS = "__memkernel_constructors"
DESTRUCTORS = "__memkernel_destructors"


_VOID = ctypes.CFUNCTYPE(None)
_GUARDED = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class Construction:
    """A loaded module's constructors, run once, and its destructors, run when its code is released.

    In a module with a guard (``guard``, its address), they run through it, as calls do: a failed assertion
    or heap allocation in them raises the call's error (see :mod:`memkernel.load.guard`).
    """

    def __init__(self, loaded: LoadedObject, guard: int = 0) -> None:
        self._loaded = loaded
        self._constructors = loaded.symbol(CONSTRUCTORS)
        self._destructors = loaded.symbol(DESTRUCTORS)
        self._guard = _GUARDED(guard) if guard else None
        self._lock = forking.lock()
        self._done = False
        self._failure: MemkernelError | None = None

    def run_once(self, kernel: str, source: str) -> None:
        """Run the constructors, unless they ran for this load already; the destructors then run once, when
        the code is released or at the interpreter's exit. ``kernel`` and ``source`` name the kernel in the
        error that a failure in them raises; the code is not called again after one (each later
        ``run_once`` raises it again)."""
        with self._lock:
            if not self._done:
                self._done = True
                # Refers to the code's addresses only: the loaded object must stay collectable.
                self._loaded.at_release(functools.partial(_call, self._guard, self._destructors, kernel, source))
                try:
                    _call(self._guard, self._constructors, kernel, source)
                except MemkernelError as exc:
                    self._failure = exc
            if self._failure is not None:
                raise type(self._failure)(*self._failure.args)


def call_void(address: int) -> None:
    """Call the ``void f(void)`` at ``address`` (a constructor, a destructor), with Python's and C's buffered
    output written out around it."""
    flush_streams()
    try:
        _VOID(address)()
    finally:
        flush_streams()


def _call(guarded: Callable[[int, int, None], int] | None, address: int, kernel: str, source: str) -> None:
    """Call the ``void f(void)`` at ``address`` (through ``guarded``, the module's guard, if any), with Python's
    and C's buffered output written out around it."""
    if guarded is None:
        call_void(address)
        return
    flush_streams()
    try:
        frame = ctypes.create_string_buffer(FRAME_SIZE + 16)
        at = (ctypes.addressof(frame) + 15) & ~15
        if guarded(at, address, None):
            raise failure_error(kernel, source, at, "its global constructors or destructors")
    finally:
        flush_streams()
