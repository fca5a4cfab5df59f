"""Arrays in memory the isolate worker maps: an isolated call on them copies nothing.

:func:`shared_empty` (and :func:`shared_like`, :func:`shared_asarray`) returns
a plain ``ndarray`` whose memory is a ``memfd`` of its own, mapped in this
process. The registry here knows every such segment by address range: for any
array argument of an isolated call, :func:`find` says, from the array's data
pointer and the bytes its strides reach (numpy's C fields, never a subclass's
attributes), whether its memory lies in one segment (a view of it however
made, a slice, a transpose, a broadcast); the call then sends the segment's
number, the offset and the strides instead of copying. The worker maps a
segment once, the first time a call needs it, from its descriptor.

Lifetime: every array of a segment, views included, refers to one buffer
object; when the last is gone, the segment leaves the registry and only then
is unmapped here (so no later array at the same address is taken for it),
and its number joins :data:`released`, for the worker to unmap at the next
isolated call. Each segment holds one file descriptor until then. A forked
child keeps the mappings, shared with the parent.
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import math
import mmap
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ..errors import AllocationError, ArgumentError

PAGE = mmap.PAGESIZE


class SharedSegment:
    """One ``memfd`` mapped here: its number, descriptor (which the worker maps), address, size, the mapping,
    and whether an array still uses it."""

    def __init__(self, number: int, fd: int, size: int, mapping: mmap.mmap, address: int) -> None:
        self.number = number
        self.fd = fd
        self.size = size
        self.map = mapping
        self.address = address
        self.alive = True
        self.sent = False
        """Whether a worker was given it to map (only then does its release concern a worker)."""


class _Table(NamedTuple):
    starts: list[int]
    segments: list[SharedSegment]


_table = _Table([], [])
"""The live segments by start address, replaced whole (never changed in place) so that a lookup reads one
consistent table without a lock."""
_writing = threading.Lock()
_numbers = itertools.count(1)

released: list[int] = []
"""The numbers of segments a worker mapped that no array uses any more, for the worker to unmap (appended from
any thread)."""


def _release(segment: SharedSegment) -> None:
    """The last array of ``segment`` is going: out of the registry first, then unmapped (no lock: this runs
    wherever the last reference went, possibly inside a registry update)."""
    segment.alive = False
    if segment.sent:
        released.append(segment.number)
    segment.map.close()
    os.close(segment.fd)


def _new_segment(nbytes: int) -> tuple[SharedSegment, Any]:
    """A mapped segment of at least ``nbytes`` and the object that exports its memory to numpy."""
    size = max(PAGE, -(-nbytes // PAGE) * PAGE)
    fd = os.memfd_create("memkernel-shared", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise
    probe = ctypes.c_char.from_buffer(mapping)
    address = ctypes.addressof(probe)
    del probe  # no export left: the mapping can be closed when the last array goes
    memory: Any = type("SharedMemory", (ctypes.c_char * size,), {})  # a class of its own: weakly referable
    exporter = memory.from_address(address)
    segment = SharedSegment(next(_numbers), fd, size, mapping, address)
    weakref.finalize(exporter, _release, segment).atexit = False  # arrays may outlive the finalizers at exit
    return segment, exporter


def _register(segment: SharedSegment) -> None:
    global _table
    with _writing:
        live = [s for s in _table.segments if s.alive] + [segment]
        live.sort(key=lambda s: s.address)
        _table = _Table([s.address for s in live], live)


def find(address: int, low: int, high: int) -> SharedSegment | None:
    """The live segment holding the bytes ``[address + low, address + high)``, else None."""
    table = _table
    if not table.starts:
        return None
    i = bisect.bisect_right(table.starts, address + low) - 1
    if i < 0:
        return None
    segment = table.segments[i]
    if segment.alive and address + high <= segment.address + segment.size:
        return segment
    return None


def any_live() -> bool:
    """Whether any shared segment may be live (a cheap test before looking arrays up)."""
    return bool(_table.starts)


def _shape_of(shape: int | Sequence[int]) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    try:
        dims = tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        raise ArgumentError(f"shared_empty(): shape must be an int or a sequence of ints; got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ArgumentError(f"shared_empty(): shape must not have a negative dimension; got {dims}")
    return dims


def shared_empty(shape: int | Sequence[int], dtype: DTypeLike = float) -> np.ndarray:
    """A new C-contiguous array of ``shape`` and ``dtype``, zero-filled, in shared memory the isolate worker maps.

    Use it like ``np.empty`` for the arrays of ``isolate=True`` calls: an isolated
    call reads and writes such an array (and any view of it) where it is,
    instead of copying it into the worker's memory and back. The memory is
    its own ``memfd`` (at least a page), returned to the system when no
    array refers to it any more. Unlike ``np.empty``, it starts zeroed, and
    it is shared with a child this process forks.

    Raises ArgumentError for a bad shape or dtype, AllocationError when the
    memory cannot be had (no memory, no file descriptor left, ``ulimit -f``).
    """
    dims = _shape_of(shape)
    try:
        dtype = np.dtype(dtype)
    except TypeError as exc:
        raise ArgumentError(f"shared_empty(): dtype {dtype!r} is not a numpy dtype: {exc}") from None
    if dtype.hasobject:
        raise ArgumentError(f"shared_empty(): dtype {dtype} holds Python objects, which cannot be shared")
    nbytes = math.prod(dims) * dtype.itemsize
    try:
        segment, exporter = _new_segment(nbytes)
    except (OSError, ValueError, OverflowError) as exc:
        raise AllocationError(
            f"shared_empty({dims}, {dtype.name}): {nbytes} bytes of shared memory could not be had: {exc}. "
            "Free some memory or file descriptors (ulimit -n), raise ulimit -f, or use a smaller array."
        ) from None
    _register(segment)
    return np.frombuffer(exporter, dtype, math.prod(dims)).reshape(dims)


def shared_like(array: ArrayLike, dtype: DTypeLike | None = None) -> np.ndarray:
    """A zero-filled shared array (see :func:`shared_empty`) of ``array``'s shape and of its dtype or ``dtype``."""
    source = np.asarray(array)
    return shared_empty(source.shape, source.dtype if dtype is None else dtype)


def shared_asarray(array: ArrayLike, dtype: DTypeLike | None = None) -> np.ndarray:
    """A shared copy (see :func:`shared_empty`) of ``array``, C-contiguous, of its dtype or ``dtype``."""
    source = np.asarray(array, dtype=dtype)
    copy = shared_empty(source.shape, source.dtype)
    np.copyto(copy, source, casting="no")
    return copy


def _forget_in_child() -> None:
    global _writing
    released.clear()  # the parent's worker unmaps the parent's; the child's worker has mapped none
    for segment in _table.segments:
        segment.sent = False
    _writing = threading.Lock()  # another thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_forget_in_child)
