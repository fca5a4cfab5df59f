"""Foreign functions a kernel calls, as plain data: :class:`ForeignSymbol`.

A kernel made by :func:`memkernel.extern` calls code another toolchain
compiled. Its module declares the foreign function under a name of its own
(the kernel itself has the foreign function's name), and each process that
links the kernel's object defines that name as the address of the library's
symbol (see :mod:`memkernel.load.foreign`).
"""

from __future__ import annotations

from dataclasses import dataclass

CONVENTIONS = ("ciface", "expanded")
"""MLIR's two memref calling conventions: ``_mlir_ciface_<name>`` with descriptors by pointer, and
``func-to-llvm``'s expanded one, each memref as (allocated, aligned, offset, sizes..., strides...)."""

DECLARED_PREFIX = "__memkernel_extern_"
"""What the kernel's module calls foreign function ``f``: ``@__memkernel_extern_f``."""

EXTERN_ATTRIBUTE = "memkernel.extern"
"""The attribute of the declaration ``@__memkernel_extern_f``: ``[library, symbol]``."""

READ_ONLY_ATTRIBUTE = "memkernel.read_only"
"""The argument attribute that marks a memref argument of a declaration as one the function never writes."""


@dataclass(frozen=True)
class ForeignSymbol:
    """``linked``, a symbol the kernel's object calls, is ``symbol`` of ``library`` (a shared object or a
    relocatable object file, by absolute path)."""

    linked: str
    library: str
    symbol: str
