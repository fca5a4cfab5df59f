"""What each argument of a kernel accepts: one contract per argument, read by both call paths.

The checked Python path (:mod:`memkernel.call.binders`) and the compiled fast
path (:mod:`memkernel.compile.fast_path`) enforce the same rules. Each rule's
*parameters* (which dtypes, which rank, which static dims and strides, which
flags, which range) are decided here, once, from the signature and the write
analysis; the two paths only apply them, one in Python and one in machine
code. The rules that must be written twice (Python and LLVM dialect) are held
equal by the equivalence test in ``tests/fastpath/test_equivalence.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from .dtypes import ElementType
from .signature import ArgSpec, MemRefSpec, ScalarSpec, UnrankedSpec


def _shape_text(shape: tuple[int | None, ...]) -> str:
    inner = ", ".join("*" if d is None else str(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


@dataclass(frozen=True)
class BufferContract:
    """A memref (or tensor) argument: the arrays it takes and how their memory must be laid out.

    ``name`` is how messages call the argument (a parameter name, ``out`` or
    ``out[i]``); ``index`` its position among the MLIR arguments.
    """

    kernel: str
    name: str
    index: int
    spec: MemRefSpec | UnrankedSpec
    is_output: bool
    may_write: bool

    @property
    def element(self) -> ElementType:
        return self.spec.element

    @property
    def dtypes(self) -> tuple[np.dtype, ...]:
        """The exact dtypes an array may have."""
        return self.spec.element.accepted

    @property
    def rank(self) -> int | None:
        """The rank an array must have; None for an unranked memref (any rank)."""
        return self.spec.rank if isinstance(self.spec, MemRefSpec) else None

    @property
    def static_dims(self) -> tuple[tuple[int, int], ...]:
        """``(dim, size)`` for every dim whose size the type fixes."""
        if not isinstance(self.spec, MemRefSpec):
            return ()
        return tuple((i, d) for i, d in enumerate(self.spec.shape) if d is not None)

    @property
    def needs_writeable(self) -> bool:
        """The kernel may write the array: it must be a writable ndarray (no sequence, no read-only array)."""
        return self.may_write or self.is_output

    @property
    def needs_contiguous(self) -> bool:
        """The compiled code assumes a contiguous row-major buffer (identity layout, unranked)."""
        return not isinstance(self.spec, MemRefSpec) or self.spec.layout is None

    @property
    def layout_strides(self) -> tuple[int | None, ...] | None:
        """A strided layout's strides (None for a ``?`` entry); None for the identity layout."""
        if isinstance(self.spec, MemRefSpec) and self.spec.layout is not None:
            return self.spec.layout.strides
        return None

    @property
    def layout_offset(self) -> int:
        """A strided layout's static offset in elements (0 when dynamic or identity)."""
        if isinstance(self.spec, MemRefSpec) and self.spec.layout is not None:
            return self.spec.layout.offset or 0
        return 0

    def descriptor_strides(self, shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
        """The strided layout's descriptor strides for an array of ``shape`` and element ``strides``;
        None if a static stride differs (a size-1 dim takes any stride, and so does every dim of an
        empty array: no element is ever addressed)."""
        assert self.layout_strides is not None
        empty = 0 in shape
        out = []
        for want, have, size in zip(self.layout_strides, strides, shape):
            if want is None:
                out.append(have)
            elif want == have or size <= 1 or empty:
                out.append(want)
            else:
                return None
        return tuple(out)

    def where(self) -> str:
        """The start of every message about this argument."""
        return f"{self.kernel}(): argument '{self.name}' expects {self.spec.mlir}"

    def expectation(self) -> str:
        """What an array must be, in words: ``float32, 2-d, dim 1 == 4``."""
        parts = [" or ".join(d.name for d in self.dtypes)]
        if self.rank is None:
            return parts[0] + ", any rank"
        parts.append(f"{self.rank}-d")
        parts += [f"dim {i} == {d}" for i, d in self.static_dims]
        return ", ".join(parts)

    def shape_text(self) -> str:
        """The shape pattern as a tuple, ``*`` for a ``?`` dim: ``(*, 4)``."""
        assert isinstance(self.spec, MemRefSpec)
        return _shape_text(self.spec.shape)


@dataclass(frozen=True)
class ScalarContract:
    """A scalar argument: the Python and numpy numbers it takes and its range."""

    kernel: str
    name: str
    index: int
    spec: ScalarSpec

    @property
    def element(self) -> ElementType:
        return self.spec.element

    @property
    def int_range(self) -> tuple[int, int] | None:
        """The inclusive range of an integer (or ``i1``) argument."""
        return self.spec.element.int_range

    def where(self) -> str:
        return f"{self.kernel}(): argument '{self.name}' expects {self.spec.mlir}"


Contract = Union[BufferContract, ScalarContract]


def contract_for(kernel: str, name: str, index: int, spec: ArgSpec, *, is_output: bool,
                 may_write: bool) -> Contract:
    """The contract of MLIR argument ``index`` of ``kernel``, called ``name`` in messages."""
    if isinstance(spec, ScalarSpec):
        return ScalarContract(kernel, name, index, spec)
    return BufferContract(kernel, name, index, spec, is_output=is_output, may_write=may_write)
