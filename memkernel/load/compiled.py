"""A compiled kernel loaded into this process: :class:`CompiledFunction`, made by :func:`load_function` from
an :class:`~memkernel.load.entry.Entry` (a disk cache entry, or what the compile worker made)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import guard, tasks
from ..fastpath.symbols import FastSymbols
from .entry import Entry
from .initializers import Construction
from .objects import LoadedObject


@dataclass
class CompiledFunction:
    """A compiled kernel: what owns the code, and its entry points.

    ``owner`` is the :class:`~memkernel.load.objects.LoadedObject` that keeps the code mapped.
    ``address`` is ``_mlir__mlir_ciface_<name>(void** args)``: ``args[i]`` points at
    argument ``i`` (a memref argument is a pointer to its descriptor).
    ``fast_address`` and ``consts_address`` are the fast path's function and
    constants table (see :mod:`memkernel.fastpath`), 0 when it has none.
    ``fast`` names the fast path's symbols (None when it has none).
    ``entry`` is what the disk cache stores (the object code and its libraries), None when it is not kept.
    ``may_print`` tells whether it calls functions that may write to the C streams.
    ``guard_address`` is its ``__memkernel_guarded`` (see :mod:`memkernel.load.guard`),
    0 when it has no assertion.
    ``construction`` runs its global constructors, once, before its first call, and has its
    destructors run at release (see :mod:`memkernel.load.initializers`); None when it has none.
    """

    owner: LoadedObject
    address: int
    fast_address: int
    consts_address: int
    fast: FastSymbols | None
    entry: Entry | None
    may_print: bool
    guard_address: int = 0
    construction: Construction | None = None


def load_function(entry: Entry, name: str, symbols: Mapping[str, int] | None = None) -> CompiledFunction:
    """Kernel ``name`` from ``entry``'s object code, linked here.

    ``symbols`` defines names the object calls (callbacks' ``_mlir_ciface_<name>``).
    An object that links the async runtime (a parallel kernel's) starts its tasks through
    :mod:`memkernel.load.tasks`, which counts them, and its code is freed only once none runs.
    Raises ObjectLoadError if LLVM cannot load or link it.
    """
    runtime = tasks.async_runtime(entry.libraries)
    if runtime is None:
        loaded = LoadedObject(entry.code, entry.libraries, symbols)
    else:
        counted = {**(symbols or {}), **tasks.symbols(runtime)}
        loaded = LoadedObject(entry.code, entry.libraries, counted, busy=tasks.running)
    return bind_function(loaded, entry, name)


def bind_function(loaded: Any, entry: Entry, name: str) -> CompiledFunction:
    """Kernel ``name`` of code already loaded (``loaded`` has ``symbol(name)`` and ``at_release(function)``, as a
    :class:`~memkernel.load.objects.LoadedObject` and a built artifact's shared object have), as ``entry`` says."""
    address = loaded.symbol(f"_mlir__mlir_ciface_{name}")
    guard_address = 0
    if entry.guarded:
        guard_address = loaded.symbol(guard.GUARD)
        guard.fill_key(loaded.symbol(guard.KEY))
    construction = Construction(loaded, guard_address) if entry.initializers else None
    if entry.fast is None:
        return CompiledFunction(loaded, address, 0, 0, None, entry, entry.may_print, guard_address, construction)
    return CompiledFunction(loaded, address, loaded.symbol(entry.fast.function), loaded.symbol(entry.fast.consts),
                            entry.fast, entry, entry.may_print, guard_address, construction)
