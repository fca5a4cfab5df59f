"""Scalar results: the LLVM struct they come back in, and their numpy values.

One result is stored as its own type; several come back as an LLVM struct,
each field at its natural alignment.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from . import scalars
from .signature import ScalarSpec


def _align(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


class ResultReader:
    """Decodes a kernel's scalar results from the bytes it stored."""

    def __init__(self, results: Sequence[ScalarSpec]) -> None:
        self.results = tuple(results)
        fmt, offset, widest = "<", 0, 1
        for result in self.results:
            element = result.element
            padded = _align(offset, element.alignment)
            fmt += "x" * (padded - offset) + element.struct_format
            offset = padded + element.itemsize
            widest = max(widest, element.alignment)
        self._struct = struct.Struct(fmt)
        self.size = max(_align(offset, widest), 8)
        self._widths = tuple(2 if r.element.kind == "complex" else 1 for r in self.results)

    @property
    def is_struct(self) -> bool:
        """Whether the results come back through a struct pointer (several, or a complex one)."""
        return len(self.results) > 1 or (len(self.results) == 1 and self.results[0].element.kind == "complex")

    def read(self, buffer: Any, offset: int = 0) -> tuple[Any, ...]:
        """The results as numpy scalars, read from ``buffer`` at ``offset``."""
        raw = self._struct.unpack_from(buffer, offset)
        decoded = []
        position = 0
        for result, width in zip(self.results, self._widths):
            decoded.append(scalars.decode(raw[position:position + width], result.element))
            position += width
        return tuple(decoded)
