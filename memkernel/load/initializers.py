"""Running a loaded module's global constructors and destructors: the functions
:func:`memkernel.compile.initializers.gather` made of its ``llvm.mlir.global_ctors`` and ``global_dtors``,
the constructors once per load before the first call, the destructors once when the code is released or the
interpreter exits."""

from __future__ import annotations

import ctypes
import functools
import threading

from ..stdio import flush_streams
from .objects import LoadedObject

CONSTRUCTORS = "__memkernel_constructors"
DESTRUCTORS = "__memkernel_destructors"


_VOID = ctypes.CFUNCTYPE(None)


def _call(address: int) -> None:
    """Call the ``void f(void)`` at ``address``, with Python's and C's buffered output written out around it."""
    flush_streams()
    _VOID(address)()
    flush_streams()


class Construction:
    """A loaded module's constructors, run once, and its destructors, run when its code is released."""

    def __init__(self, loaded: LoadedObject) -> None:
        self._loaded = loaded
        self._constructors = loaded.symbol(CONSTRUCTORS)
        self._destructors = loaded.symbol(DESTRUCTORS)
        self._lock = threading.Lock()
        self._done = False

    def run_once(self) -> None:
        """Run the constructors, unless they ran for this load already; the destructors then run once, when
        the code is released or at the interpreter's exit."""
        with self._lock:
            if self._done:
                return
            self._done = True
            _call(self._constructors)
            self._loaded.at_release(functools.partial(_call, self._destructors))
