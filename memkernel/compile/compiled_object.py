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
    kernel_calls: tuple[str, ...]
    """The externals the kernel's own functions call or take the address of, not only memkernel's support code
    (the guard calls ``puts`` only on its way to ``abort``): the ones that tell whether the kernel may print."""
    guarded: bool = False
    initializers: bool = False
