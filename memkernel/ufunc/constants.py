"""The gufunc loop's constants table: process-specific addresses, named once with what fills them.

As the fast path's (see :mod:`memkernel.fastpath.constants`), the loop's
compiled code holds no address of this process: it loads the C functions it
calls (the GIL, the Python call that raises a failed call's error, ``malloc``,
threads) from the global ``__memkernel_guconsts_<name>``, which :func:`fill`
writes after the code is loaded.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from enum import IntEnum

from ..fastpath.abi import c_function
from ..load.guard import FRAME_SIZE

STATUS_OFFSET = FRAME_SIZE - 24
"""Where the loop stores why a range of the batch stopped, in the guard frame of the thread that ran it."""


class Status(IntEnum):
    """Why a range of the batch stopped (0: it ran to its end)."""

    UNWOUND = 1
    """The kernel unwound to its guard: a failed assertion or heap allocation (the frame says which)."""
    NO_MEMORY = 2
    """The copy of a non-contiguous core could not be allocated (the frame's size slot holds the bytes)."""


class GuSlot(IntEnum):
    """The slots of the table; :func:`fill` says what each holds."""

    GIL_ENSURE = 0
    GIL_RELEASE = 1
    FROM_VOID_PTR = 2
    TUPLE_NEW = 3
    TUPLE_SET_ITEM = 4
    CALL = 5
    DECREF = 6
    FAILED = 7
    MALLOC = 8
    FREE = 9
    THREAD_CREATE = 10
    THREAD_JOIN = 11
    THREADS = 12


def _libc(name: str) -> int:
    return ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value or 0


def threads() -> int:
    """How many threads a ``parallel=True`` gufunc spreads its batch over: the cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def fill(address: int, failed: Callable[[int], object]) -> None:
    """Write this process's addresses into the table at ``address``, and ``failed``: what the loop calls,
    holding the GIL, with the address of a guard frame whose range stopped (it raises the call's error).
    The caller keeps ``failed`` alive as long as the code can run."""
    values = {
        GuSlot.GIL_ENSURE: c_function("PyGILState_Ensure"),
        GuSlot.GIL_RELEASE: c_function("PyGILState_Release"),
        GuSlot.FROM_VOID_PTR: c_function("PyLong_FromVoidPtr"),
        GuSlot.TUPLE_NEW: c_function("PyTuple_New"),
        GuSlot.TUPLE_SET_ITEM: c_function("PyTuple_SetItem"),
        GuSlot.CALL: c_function("PyObject_Call"),
        GuSlot.DECREF: c_function("Py_DecRef"),
        GuSlot.FAILED: id(failed),
        GuSlot.MALLOC: _libc("malloc"),
        GuSlot.FREE: _libc("free"),
        GuSlot.THREAD_CREATE: _libc("pthread_create"),
        GuSlot.THREAD_JOIN: _libc("pthread_join"),
        GuSlot.THREADS: threads(),
    }
    table = (ctypes.c_int64 * len(GuSlot)).from_address(address)
    for slot, value in values.items():
        table[slot] = value
