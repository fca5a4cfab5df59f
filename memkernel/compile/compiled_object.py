"""What the compile worker sends back for a kernel it compiled: :class:`ObjectCode` (which the caller unpickles
without importing the compiler)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ObjectCode:
    """What the compile worker makes of a kernel: its relocatable object, whether it holds the fast
    path, the functions it calls that it does not define (the process that links it finds them),
    whether its failed assertions and allocations return to a guard, and whether it has global constructors or
    destructors (see :mod:`memkernel.compile.initializers`)."""

    code: bytes
    fast: bool
    externals: tuple[str, ...]
    guarded: bool = False
    initializers: bool = False
