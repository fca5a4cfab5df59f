"""The call side of a kernel's guard (see :mod:`memkernel.compile.assertions`): the frame a guarded call
passes, the thread key the guard keeps it under, and the source line a failed assertion's message names.

A guarded call enters ``__memkernel_guarded(frame, entry, args)``: ``frame`` is
:data:`FRAME_SIZE` bytes the caller owns, a ``jmp_buf`` then, at
:data:`MESSAGE_OFFSET`, the address of the failed assertion's message.
"""

from __future__ import annotations

import ctypes
import functools
import re

GUARD = "__memkernel_guarded"
KEY = "__memkernel_assert_key"
FRAME_SIZE = 512
"""Bytes of the caller's frame: a jmp_buf (200 bytes on x86-64 glibc), then the failed message's address."""
MESSAGE_OFFSET = FRAME_SIZE - 8

LOCATION = re.compile(r'loc\("[^"]*":(\d+):(\d+)\)')


@functools.lru_cache(maxsize=None)
def thread_key() -> int:
    """The process's pthread key under which each thread's innermost guard frame is kept."""
    key = ctypes.c_uint()
    if ctypes.CDLL(None).pthread_key_create(ctypes.byref(key), None) != 0:
        raise OSError("pthread_key_create failed")
    return key.value


def fill_key(address: int) -> None:
    """Write the process's key into a loaded module's ``__memkernel_assert_key``."""
    ctypes.c_uint.from_address(address).value = thread_key()


def location_line(message: str, source: str) -> str:
    """The source line a message's ``Location: loc("-":L:C)`` or ``Location: line L`` points at, or ""."""
    found = LOCATION.search(message) or re.search(r"Location: line (\d+), column (\d+)", message)
    if not found:
        return ""
    lines = source.splitlines()
    line = int(found[1])
    return lines[line - 1].strip() if 1 <= line <= len(lines) else ""


_LOCATED = re.compile(r"(.*)\nLocation: line \d+, column \d+", re.S)


def as_written(message: str) -> str:
    """A failed assertion's message without the location :func:`memkernel.compile.assertions.located` appended: the ``cf.assert``'s own
    (a message whose last line was written in that form, ``Location: line L, column C``, loses it too)."""
    found = _LOCATED.fullmatch(message)
    return found[1] if found and "Location:" not in found[1] else message
