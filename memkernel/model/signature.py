"""The model of a kernel's MLIR signature: small frozen value types.

:mod:`memkernel.analysis.types` reads MLIR types once into :class:`MemRefSpec`,
:class:`UnrankedSpec` and :class:`ScalarSpec`. Nothing downstream touches MLIR
type objects again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .dtypes import ElementType

@dataclass(frozen=True)
class Strided:
    """A ``strided<[...], offset: ...>`` layout; ``None`` marks a ``?`` entry."""

    strides: tuple[int | None, ...]
    offset: int | None


@dataclass(frozen=True)
class MemRefSpec:
    """A ranked ``memref``. ``layout`` is None for the identity (contiguous row-major) layout.

    ``tensor`` marks a ranked ``tensor`` of a tensor function: bufferization
    passes it as an identity-layout memref, and it is a value (never written,
    never aliased by a result).
    """

    mlir: str
    shape: tuple[int | None, ...]
    element: ElementType
    layout: Strided | None
    tensor: bool = False

    @property
    def rank(self) -> int:
        return len(self.shape)

    def same_pattern(self, other: MemRefSpec) -> bool:
        """Same rank, same static sizes and ``?`` at the same positions."""
        return self.shape == other.shape


@dataclass(frozen=True)
class UnrankedSpec:
    """A ``memref<*xT>`` (or, with ``tensor``, a ``tensor<*xT>``): any rank, always a contiguous buffer."""

    mlir: str
    element: ElementType
    tensor: bool = False


@dataclass(frozen=True)
class ScalarSpec:
    """A scalar passed or returned by value."""

    mlir: str
    element: ElementType


ArgSpec = Union[MemRefSpec, UnrankedSpec, ScalarSpec]


@dataclass(frozen=True)
class Signature:
    """The kernel function's arguments and results, in MLIR order."""

    name: str
    args: tuple[ArgSpec, ...]
    results: tuple[ArgSpec, ...]
