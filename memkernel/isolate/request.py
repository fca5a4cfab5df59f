"""A call's arguments as they cross to the worker: a few packed words, no pickle.

Both ends know the kernel's contracts, so a request holds only what changes
from call to call: the kernel's token, then for each argument in order

- an array: where its memory is (``0``: the call's segment, ``-1``: nowhere,
  an empty array; ``n > 0``: shared segment ``n``, see
  :mod:`memkernel.isolate.shared_arrays`), the byte offset of its first
  element there, which of the contract's dtypes it has (plus
  :data:`READ_ONLY`), its rank, shape and byte strides;
- a scalar: the raw values its binder checked, packed with the element's
  ``struct`` format.

:class:`Encoder` (the caller's, one per kernel) packs them with a ``struct``
made once per set of ranks; :class:`Decoder` (the worker's) rebuilds the
arguments as views of the memory they name.
"""

from __future__ import annotations

import mmap
import struct
from typing import Any

import numpy as np

from ..call import scalars
from ..model.contract import Contract, ScalarContract
from ..model.dtypes import ElementType

TOKEN = struct.Struct("<q")
ARRAY_HEAD = struct.Struct("<qqqq")
"""segment, offset, dtype index | READ_ONLY, rank."""

READ_ONLY = 1 << 8
CALL_SEGMENT = 0
NOWHERE = -1


class Encoder:
    """Packs one kernel's calls (see the module's docstring)."""

    def __init__(self, contracts: tuple[Contract, ...]) -> None:
        self._scalar_formats = tuple(c.element.struct_format if isinstance(c, ScalarContract) else None
                                     for c in contracts)
        self._structs: dict[tuple[int, ...], struct.Struct] = {}

    def struct_for(self, ranks: tuple[int, ...]) -> struct.Struct:
        """The packing of a call whose arrays have ``ranks`` (in argument order)."""
        packing = self._structs.get(ranks)
        if packing is None:
            pieces = ["<q"]
            arrays = iter(ranks)
            for scalar in self._scalar_formats:
                if scalar is not None:
                    pieces.append(scalar)
                else:
                    pieces.append(f"{4 + 2 * next(arrays)}q")
            packing = self._structs[ranks] = struct.Struct("".join(pieces))
        return packing


class Decoder:
    """Rebuilds one kernel's arguments from a request, in the worker."""

    def __init__(self, contracts: tuple[Contract, ...]) -> None:
        self._arguments: tuple[tuple[struct.Struct | None, Any], ...] = tuple(
            (struct.Struct("<" + c.element.struct_format), c.element) if isinstance(c, ScalarContract)
            else (None, tuple(c.dtypes)) for c in contracts)

    def decode(self, data: Any, at: int, segments: dict[int, mmap.mmap]) -> list[Any]:
        """The arguments packed in ``data`` from ``at`` on (after the token), as views of ``segments``."""
        arguments: list[Any] = []
        for scalar, about in self._arguments:
            if scalar is not None:
                raw = scalar.unpack_from(data, at)
                at += scalar.size
                arguments.append(_as_given(scalars.decode(raw, about), about))
                continue
            segment, offset, kind, rank = ARRAY_HEAD.unpack_from(data, at)
            at += ARRAY_HEAD.size
            dims = struct.unpack_from(f"<{2 * rank}q", data, at)
            at += 16 * rank
            dtype = about[kind & 0xFF]
            if segment == NOWHERE:
                array = np.empty(dims[:rank], dtype)
            else:
                array = np.ndarray(dims[:rank], dtype, buffer=segments[segment], offset=offset, strides=dims[rank:])
                if kind & READ_ONLY:
                    array.flags.writeable = False
            arguments.append(array)
        return arguments


def _as_given(value: np.generic, element: ElementType) -> Any:
    """A decoded scalar as the compiled entry takes it, where that is exact: an int or a bool as Python's, an f64 or
    an f32 as a Python float (an f32 widens exactly), NaNs aside (narrowing a NaN back may change its payload).
    Anything else stays a numpy scalar, which the entry declines and the checked path passes bit for bit."""
    if element.kind in ("int", "bool"):
        return value.item()
    if element.mlir in ("f32", "f64") and not np.isnan(value):
        return float(value)
    return value
