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

import mmap
import os
from dataclasses import dataclass

import numpy as np

PAGE = mmap.PAGESIZE
MIN_SEGMENT = 1 << 20


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def reach(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """The bytes ``[low, high)`` a non-empty array's elements occupy, relative to its first element."""
    low = high = 0
    for size, stride in zip(shape, strides):
        step = (size - 1) * stride
        if step < 0:
            low += step
        else:
            high += step
    return low, high + itemsize


def extent(array: np.ndarray) -> tuple[int, int]:
    """The addresses ``[low, high)`` of the bytes a non-empty array's elements occupy."""
    low, high = reach(array.shape, array.strides, array.itemsize)
    address = _address(array)
    return address + low, address + high


@dataclass(frozen=True)
class Placed:
    """An array as the worker rebuilds it: its first element's offset in the segment, shape, strides, dtype."""

    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype
    writeable: bool

    def view(self, buffer: mmap.mmap) -> np.ndarray:
        """This array in a mapping of the segment."""
        array = np.ndarray(self.shape, self.dtype, buffer=buffer, offset=self.offset, strides=self.strides)
        if not self.writeable:
            array.flags.writeable = False
        return array


@dataclass(frozen=True)
class _Region:
    low: int
    high: int
    offset: int
    owner: np.ndarray


class Layout:
    """Where one call's arrays go in the segment; overlapping arrays share a region."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        spans = sorted((*extent(a), i) for i, a in enumerate(arrays))
        self.placed: list[Placed] = [None] * len(arrays)  # type: ignore[list-item]
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
            self.regions.append(_Region(low, high, start, arrays[first]))
            for i in members:
                a = arrays[i]
                self.placed[i] = Placed(start + _address(a) - low, a.shape, a.strides, a.dtype, a.flags.writeable)
            cursor = start + high - low
        self.size = cursor

    def caller_address(self, offset: int, nbytes: int) -> tuple[int, np.ndarray] | None:
        """The caller's address of ``nbytes`` at segment ``offset``, and the array that owns it; None if no region holds them."""
        for region in self.regions:
            if region.offset <= offset and offset + nbytes <= region.offset + region.high - region.low:
                return region.low + offset - region.offset, region.owner
        return None


class Segment:
    """A ``memfd`` mapped into this process, to be mapped by the worker too."""

    def __init__(self, size: int) -> None:
        self.size = max(MIN_SEGMENT, -(-size // PAGE) * PAGE)
        self.fd = os.memfd_create("memkernel-isolate", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size)

    def close(self) -> None:
        """Unmap and close (views of it must be gone)."""
        os.close(self.fd)
        try:
            self.map.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with it
            pass
