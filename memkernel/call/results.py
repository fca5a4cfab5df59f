"""A kernel's results: the LLVM struct they come back in, and the numpy values they become.

One scalar result is stored as its own type; a memref, a complex scalar or
several results come back as an LLVM struct, each field at its natural
alignment (descriptors are structs of 8-byte words). Scalars become numpy
scalars. A returned memref becomes an array that owns its memory; its
descriptor's allocated pointer says where the buffer came from:

- the allocated pointer of an argument of the call: the result aliases that
  argument, and becomes a view of the caller's array, never freed here (a
  tensor result, being a value, is copied instead);
- ``0xdeadbeef``, which ``memref.get_global`` stores there: module memory,
  copied into a new array, never freed;
- anything else: a heap buffer from the kernel's ``memref.alloc`` (``malloc``).
  The array adopts it zero-copy and ``free``\\ s it when the last numpy reference
  goes. Several results with one allocated pointer share one owner and free it once.

An unranked result's ranked descriptor was copied to the heap by the kernel's
return; it is read and freed at once.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import AllocationError, ShapeError
from ..model.signature import ArgSpec, MemRefSpec, ScalarSpec, UnrankedSpec
from . import scalars
from .descriptors import UNRANKED_FORMAT, align, ranked_format, ranked_struct, reach

GLOBAL_MEMORY = 0xDEADBEEF

_libc = ctypes.CDLL(None)
_free = _libc.free
_free.argtypes = [ctypes.c_void_p]
_free.restype = None


class HeapBuffer:
    """Owns one ``malloc`` allocation of the kernel's and frees it when collected."""

    def __init__(self, allocated: int) -> None:
        self.allocated = allocated

    def __del__(self) -> None:
        _free(self.allocated)


class ExposedMemory:
    """Exposes memory to numpy through ``__array_interface__`` while holding its owner."""

    def __init__(self, owner: object, data: int, shape: tuple[int, ...], strides: tuple[int, ...],
                 itemsize: int) -> None:
        self.owner = owner
        self.__array_interface__ = {
            "version": 3,
            "typestr": f"|V{itemsize}",
            "data": (data, False),
            "shape": shape,
            "strides": strides,
        }


def read_descriptor(address: int, rank: int) -> tuple[int, ...]:
    """The fields of the rank-``rank`` descriptor stored at ``address``."""
    layout = ranked_struct(rank)
    return layout.unpack(ctypes.string_at(address, layout.size))


def descriptor_array(fields: tuple[int, ...], dtype: np.dtype, owner: object) -> np.ndarray:
    """A numpy view of the memory a ranked descriptor's ``fields`` describe, keeping ``owner`` alive."""
    rank = (len(fields) - 3) // 2
    shape = tuple(fields[3:3 + rank])
    strides = tuple(s * dtype.itemsize for s in fields[3 + rank:])
    data = fields[1] + fields[2] * dtype.itemsize
    try:
        exposed = np.asarray(ExposedMemory(owner, data, shape, strides, dtype.itemsize))
    except ValueError as exc:  # more bytes than an array can span: the kernel's size arithmetic wrapped
        raise AllocationError(
            f"the kernel returned a memref of shape {shape} with {dtype.name} elements, more memory than any "
            f"array can span ({exc}); its sizes overflowed, or it allocated less than that shape needs. Its "
            "buffer is freed.") from None
    return exposed.view(dtype)


class ResultAdopter:
    """Turns one call's returned descriptors into arrays; shares owners between results of the call."""

    def __init__(self, call_buffers: dict[int, np.ndarray], kernel: str) -> None:
        self.call_buffers = call_buffers
        self.kernel = kernel
        self.owners: dict[int, object] = {}

    def array(self, spec: MemRefSpec | UnrankedSpec, fields: tuple[int, ...]) -> np.ndarray:
        """The array for a ranked descriptor's ``fields`` (allocated, aligned, offset, sizes..., strides...)."""
        dtype = spec.element.dtype
        allocated = fields[0]
        if allocated == 0:
            return self._unallocated(spec, fields)
        if allocated == GLOBAL_MEMORY:
            return np.array(descriptor_array(fields, dtype, None))
        owner: object | None = self.call_buffers.get(allocated)
        if owner is not None:
            self._check_within(spec, fields, owner)
        if owner is not None and spec.tensor:
            # A tensor result is a value: never a view of an input.
            return np.array(descriptor_array(fields, dtype, owner))
        if owner is None:
            owner = self.owners.get(allocated)
            if owner is None:
                owner = self.owners[allocated] = HeapBuffer(allocated)
        return descriptor_array(fields, dtype, owner)

    def _check_within(self, spec: MemRefSpec | UnrankedSpec, fields: tuple[int, ...], argument: Any) -> None:
        """ShapeError unless a result aliasing an argument lies within that argument's memory."""
        rank = (len(fields) - 3) // 2
        shape, strides = fields[3:3 + rank], fields[3 + rank:]
        if 0 in shape:
            return
        itemsize = spec.element.itemsize
        data = fields[1] + fields[2] * itemsize
        low, high = (data + bound for bound in reach(shape, tuple(s * itemsize for s in strides), itemsize))
        start, end = np.lib.array_utils.byte_bounds(argument)
        if low < start or high > end:
            raise ShapeError(
                f"{self.kernel}(): the kernel returned a {spec.mlir} of shape {tuple(shape)} over the memory of an "
                f"argument, reaching {start - low if low < start else high - end} bytes outside it: a view past an "
                "array's end would read and write memory that is not the array's. The kernel's result is wrong."
            )

    def _unallocated(self, spec: MemRefSpec | UnrankedSpec, fields: tuple[int, ...]) -> np.ndarray:
        """A result with no buffer: fine when empty, else its ``memref.alloc`` failed (malloc gave NULL)."""
        rank = (len(fields) - 3) // 2
        shape = tuple(fields[3:3 + rank])
        if 0 in shape:
            return np.zeros(shape, spec.element.dtype)
        size = float(np.prod([float(d) for d in shape])) * spec.element.itemsize
        raise AllocationError(
            f"{self.kernel}(): the kernel returned a {spec.mlir} of shape {shape} with no memory behind it: "
            f"its memref.alloc of {size / 2**30:.3g} GiB failed (malloc returned NULL)."
        )

    def unranked(self, spec: UnrankedSpec, rank: int, descriptor: int) -> np.ndarray:
        """The array for an unranked result; frees the heap copy of its ranked descriptor."""
        fields = read_descriptor(descriptor, rank)
        _free(descriptor)
        return self.array(spec, fields)


def descriptor_format(spec: MemRefSpec | UnrankedSpec) -> str:
    """``struct`` format of a returned descriptor: ``{rank, pointer}`` or a ranked descriptor."""
    return UNRANKED_FORMAT if isinstance(spec, UnrankedSpec) else ranked_format(spec.rank)

def _field(spec: ArgSpec) -> tuple[str, int, int]:
    """``struct`` format, size and alignment of one result inside the results struct."""
    if isinstance(spec, ScalarSpec):
        return spec.element.struct_format, spec.element.itemsize, spec.element.alignment
    fmt = descriptor_format(spec)
    return fmt, struct.calcsize("<" + fmt), 8


class ResultReader:
    """Decodes a kernel's results from the bytes it stored."""

    def __init__(self, results: Sequence[ArgSpec], kernel: str = "") -> None:
        self.results = tuple(results)
        self.kernel = kernel
        fmt, offset, widest = "<", 0, 1
        self._widths = []
        for result in self.results:
            field_format, size, alignment = _field(result)
            padded = align(offset, alignment)
            fmt += "x" * (padded - offset) + field_format
            offset = padded + size
            widest = max(widest, alignment)
            self._widths.append(len(struct.unpack("<" + field_format, bytes(size))))
        self._struct = struct.Struct(fmt)
        self.size = max(align(offset, widest), 8)
        self.has_memrefs = any(not isinstance(r, ScalarSpec) for r in self.results)

    @property
    def is_struct(self) -> bool:
        """Whether the results come back through a struct pointer: not a single plain scalar."""
        if len(self.results) != 1:
            return bool(self.results)
        only = self.results[0]
        return not isinstance(only, ScalarSpec) or only.element.kind == "complex"

    def read(self, buffer: Any, offset: int = 0, call_buffers: dict[int, np.ndarray] | None = None
             ) -> tuple[Any, ...]:
        """The results, read from ``buffer`` at ``offset``.

        ``call_buffers`` maps the allocated pointer of every memref argument of the
        call to its array, so that a result aliasing an argument becomes a view of it.
        """
        raw = self._struct.unpack_from(buffer, offset)
        adopter = ResultAdopter(call_buffers or {}, self.kernel) if self.has_memrefs else None
        decoded: list[Any] = []
        position = 0
        for result, width in zip(self.results, self._widths):
            values = raw[position:position + width]
            position += width
            if isinstance(result, ScalarSpec):
                decoded.append(scalars.decode(values, result.element))
            elif isinstance(result, UnrankedSpec):
                assert adopter is not None
                decoded.append(adopter.unranked(result, values[0], values[1]))
            else:
                assert adopter is not None
                decoded.append(adopter.array(result, values))
        return tuple(decoded)
