"""The call side of a kernel's guard (see :mod:`memkernel.compile.guard`): the frame a guarded call passes,
the thread key the guard keeps it under, and the error a failure it returned is (the failed assertion's
message and source line, or the allocation's size).

A guarded call enters ``__memkernel_guarded(frame, entry, args)``: ``frame`` is
:data:`FRAME_SIZE` bytes the caller owns, a ``jmp_buf`` then, at
:data:`MESSAGE_OFFSET`, the address of the failed assertion's message.
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable
from typing import NoReturn

from ..errors import AllocationError, KernelAssertionError, MemkernelError

GUARD = "__memkernel_guarded"
KEY = "__memkernel_assert_key"
FRAME_SIZE = 512
"""Bytes of the caller's frame: a jmp_buf (200 bytes on x86-64 glibc), then the failure's slots."""
SIZE_OFFSET = FRAME_SIZE - 16
"""Where a failed allocation's size in bytes is stored."""
MESSAGE_OFFSET = FRAME_SIZE - 8
"""Where a failed assertion's message is stored (NULL for a failed allocation)."""

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


def allocation_failure(kernel: str, size: int, where: str = "the kernel") -> str:
    """The AllocationError's message for a kernel whose allocation of ``size`` bytes in ``where`` failed
    (0: one of 2**63 bytes or more, which the compiler's size check stopped)."""
    if size == 0:
        failed = ("asked for 2**63 bytes or more (its dims times its element size, plus its alignment, overflow "
                  "64 bits, or a dim is negative)")
    else:
        hint = " (a size this large comes from a negative dim or a product of dims that overflows)" \
            if size >= 1 << 63 else ""
        failed = f"could not get {size} bytes ({size / 2**30:.3g} GiB){hint}: malloc returned NULL"
    return (f"{kernel}(): a memref.alloc in {where} {failed}. It stopped there: what it wrote before is in the "
            "arrays, and what it allocated before is not freed.")


def failure_error(kernel: str, source: str, frame: int, where: str = "the kernel") -> MemkernelError:
    """What a call of ``kernel`` whose guard at ``frame`` returned 1 raises: a KernelAssertionError with the
    assertion's message and the line of ``source`` it points at, or an AllocationError with the size.
    ``where`` says what ran: the kernel, or the module's global constructors."""
    message = ctypes.c_char_p.from_address(frame + MESSAGE_OFFSET).value
    if message is not None:
        text = message.decode(errors="replace")
        line = location_line(text, source)
        return KernelAssertionError(
            f"{kernel}(): {where} stopped at a failed assertion:\n{text}" + (f"\n    {line}" if line else ""),
            assertion=as_written(text))
    size = ctypes.c_uint64.from_address(frame + SIZE_OFFSET).value
    return AllocationError(allocation_failure(kernel, size, where))


def raiser(kernel: str, source: str) -> Callable[[int], NoReturn]:
    """What the fast path calls with its guard frame's address when ``kernel`` unwound to it: raises the
    :func:`failure_error` the checked path raises."""

    def failed(frame: int) -> NoReturn:
        raise failure_error(kernel, source, frame)

    return failed
