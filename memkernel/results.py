"""A kernel's results: the LLVM struct they come back in, and their numpy values.

One scalar result is stored as its own type; a memref, a complex scalar or
several results come back as an LLVM struct, each field at its natural
alignment (descriptors are structs of 8-byte words). Scalars become numpy
scalars; memrefs become arrays (see :mod:`memkernel.returned`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import scalars
from .descriptors import align
from .returned import ResultAdopter, descriptor_format
from .signature import ArgSpec, ScalarSpec, UnrankedSpec


def _field(spec: ArgSpec) -> tuple[str, int, int]:
    """``struct`` format, size and alignment of one result inside the results struct."""
    if isinstance(spec, ScalarSpec):
        return spec.element.struct_format, spec.element.itemsize, spec.element.alignment
    fmt = descriptor_format(spec)
    return fmt, struct.calcsize("<" + fmt), 8


class ResultReader:
    """Decodes a kernel's results from the bytes it stored."""

    def __init__(self, results: Sequence[ArgSpec]) -> None:
        self.results = tuple(results)
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
        adopter = ResultAdopter(call_buffers or {}) if self.has_memrefs else None
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
