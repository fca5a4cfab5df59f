"""A dim of a kernel's argument, or of a view of one: what every shape rule names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dim:
    """Dim ``dim`` of MLIR argument ``arg``; past the arguments (``arg >= n``), of view ``arg - n``
    (see :mod:`memkernel.model.views`)."""

    arg: int
    dim: int
