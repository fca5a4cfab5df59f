"""Shared memory for isolated calls: one segment per worker, and where each array of a call sits in it.

The caller's arrays are copied once into a ``memfd`` segment that both
processes map; the worker calls the kernel on views of it. A :class:`Layout`
keeps what matters to the kernel's binders and to aliasing exactly as in the
caller: each array keeps its shape, byte strides and its data pointer's
alignment (modulo a page), and arrays whose memory overlaps in the caller
(the same array passed twice, a view and its base) overlap the same way in
the segment.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any, NamedTuple

import numpy as np

from ..call.descriptors import reach
from ..fastpath.abi import LAYOUT, fast_path_supported

PAGE = mmap.PAGESIZE
MIN_SEGMENT = 1 << 20


def _interface_address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


_read_pointer = ctypes.c_void_p.from_address
_data_field: int | None = None
"""Where an ndarray holds its data pointer (see :func:`address`); 0 where that layout does not hold."""


def address(array: np.ndarray) -> int:
    """The address of ``array``'s first element (a view's offset included), read from numpy's C field where
    the fast path reads it (:mod:`memkernel.fastpath.abi`, checked against live arrays once): a fifth of the cost
    of ``__array_interface__``, which a call would pay for each array."""
    global _data_field
    if _data_field is None:
        _data_field = LAYOUT.array_data if fast_path_supported() else 0
    if _data_field and type(array) is np.ndarray:
        return _read_pointer(id(array) + _data_field).value or 0
    return _interface_address(array)


class Placed(NamedTuple):
    """An array as the worker rebuilds it: its first element's offset in the segment, shape, strides, and
    its dtype's scalar type (which pickles by reference, and gives back numpy's own dtype instance: the
    fast path knows a dtype by identity)."""

    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    scalar_type: type
    writeable: bool

    def view(self, buffer: Any, *, as_given: bool = True) -> np.ndarray:
        """This array in ``buffer``: a mapping of the segment, or the bytes results came back in.

        ``as_given``: read-only if the caller's array is (the caller copies into a writable view).
        """
        array = np.ndarray(self.shape, np.dtype(self.scalar_type), buffer=buffer, offset=self.offset,
                           strides=self.strides)
        if as_given and not self.writeable:
            array.flags.writeable = False
        return array


class _Region(NamedTuple):
    low: int
    high: int
    offset: int
    owner: int
    """The index of an array whose memory holds the region."""


class Layout:
    """Where one call's arrays go in the segment (``offsets[i]``: where array ``i``'s first element goes);
    overlapping arrays share a region. It holds no array: a repeated call reuses it (see
    :mod:`memkernel.isolate.run`)."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        addresses = [address(a) for a in arrays]
        spans = sorted([(at + low, at + high, i) for i, (a, at) in enumerate(zip(arrays, addresses))
                        for low, high in (reach(a.shape, a.strides, a.itemsize),)])
        self.offsets = addresses  # each replaced below
        self.regions: list[_Region] = []
        cursor = 0
        k = 0
        while k < len(spans):
            low, high, first = spans[k]
            members = [first]
            k += 1
            while k < len(spans) and spans[k][0] < high:
                high = max(high, spans[k][1])
                members.append(spans[k][2])
                k += 1
            start = -(-cursor // PAGE) * PAGE + low % PAGE
            self.regions.append(_Region(low, high, start, first))
            for i in members:
                self.offsets[i] = start + addresses[i] - low
            cursor = start + high - low
        self.size = cursor
        self._copies = [(region.offset, region.low, region.high - region.low) for region in self.regions]

    def placed(self, arrays: list[np.ndarray]) -> list[Placed]:
        """Each of ``arrays`` (the ones laid out) as the other process rebuilds it."""
        return [Placed(offset, a.shape, a.strides, a.dtype.type, a.flags.writeable)
                for offset, a in zip(self.offsets, arrays)]

    def copy_into(self, start: int) -> None:
        """Copy every region's bytes from the caller's memory to its place in the segment mapped at ``start``:
        one ``memmove`` per region, gaps between a view's elements included, so a broadcast view of 2**40
        elements copies its few bytes, not 2**40 elements."""
        memmove = ctypes.memmove
        for offset, low, size in self._copies:
            memmove(start + offset, low, size)

    def caller_address(self, offset: int, nbytes: int, arrays: list[np.ndarray]) -> tuple[int, np.ndarray] | None:
        """The caller's address of ``nbytes`` at segment ``offset`` and the one of ``arrays`` (the ones laid out)
        that owns it; None if no region holds them."""
        for region in self.regions:
            if region.offset <= offset and offset + nbytes <= region.offset + region.high - region.low:
                return region.low + offset - region.offset, arrays[region.owner]
        return None


def copy_back(array: np.ndarray, segment: Segment, offset: int) -> None:
    """Copy into ``array`` the elements of its copy at ``offset`` in ``segment``: its elements only (a view's
    gaps are left alone), in one ``memmove`` when they are all its bytes (a contiguous array)."""
    if array.flags.c_contiguous or array.flags.f_contiguous:
        ctypes.memmove(address(array), segment.address + offset, array.nbytes)
    else:
        np.copyto(array, np.ndarray(array.shape, array.dtype, buffer=segment.map, offset=offset,
                                    strides=array.strides), casting="no")


def page_aligned(data: bytes) -> np.ndarray:
    """A copy of ``data`` starting at a page boundary, so that a Layout's alignments hold in it."""
    block = np.empty(len(data) + PAGE, np.uint8)
    start = -block.ctypes.data % PAGE
    aligned = block[start:start + len(data)]
    aligned[:] = np.frombuffer(data, np.uint8)
    return aligned


class Segment:
    """A ``memfd`` mapped into this process, to be mapped by the worker too."""

    def __init__(self, size: int) -> None:
        """A segment of at least ``size`` bytes; OSError if it cannot be made (a file-size limit, no descriptor
        left, no memory), with nothing left open."""
        self.size = max(MIN_SEGMENT, -(-size // PAGE) * PAGE)
        self.fd = os.memfd_create("memkernel-isolate", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.size)
            self.map = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        self.address = address(np.frombuffer(self.map, np.uint8))

    def close(self) -> None:
        """Unmap and close (views of it must be gone); closing twice does nothing."""
        if self.fd < 0:
            return
        os.close(self.fd)
        self.fd = -1
        try:
            self.map.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with it
            pass
