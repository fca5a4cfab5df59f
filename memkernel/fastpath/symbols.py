"""What compiled code and the Python call path agree on: the fast path's symbols, and which path a call took.

:class:`FastSymbols` is the part of a generated fast path (see
:mod:`memkernel.compile.fast_path`) that the process binding it needs: kept in
the disk cache with the object code, so a cached kernel binds its fast path
without generating it again. :class:`CallPath` is the marker a call leaves in
its kernel's path cell, the compiled entry's included.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FastSymbols:
    """The fast path's function and constants table symbols, the dtype objects the table must hold, and
    the compiled entry's symbol (None when the kernel has none)."""

    function: str
    consts: str
    dtypes: tuple[np.dtype, ...]
    entry: str | None = None


class CallPath(enum.IntEnum):
    """Which path a call took, as written into the kernel's path cell (0 before any call)."""

    FAST = 1
    """The compiled fast path (or the compiled entry) ran the kernel."""
    CHECKED = 2
    """The checked Python path (:class:`~memkernel.call.plan.CallPlan`) ran it."""


def runner_name(name: str) -> str:
    """The symbol of the fast path's call of kernel ``name`` (see :func:`memkernel.compile.guard.runner`)."""
    return f"__memkernel_run_{name}"
