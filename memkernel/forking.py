"""What a forked child does with its parent's pipes and locks, which other threads of the parent may have held.

``fork()`` copies only the thread that called it. A lock another thread held
at that moment (a buffered file's, while that thread read from it; a kernel's
while it compiled) stays held in the child forever, so the child must neither
take it nor wait for it:

- :func:`close_descriptor` closes a buffered file's descriptor through its raw
  file, which the buffered file's lock does not guard; the buffered file then
  counts as closed, and neither its ``close()`` nor its collection takes the lock.
- :func:`lock`, :func:`rlock` and :func:`condition` make a lock or condition
  that is free again in a forked child. Every lock and condition of the package
  that a call can hold is made by them (``memkernel/isolate`` keeps its own).
- :func:`reset_in_child` registers what puts back the state that such a lock
  guards (an owner, a count of waiters, a redirected descriptor): it runs in a
  forked child after the locks are freed, on the child's one thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable
from typing import IO, Any, TypeVar

_Reset = TypeVar("_Reset", bound=Callable[[], object])

_locks: weakref.WeakSet[Any] = weakref.WeakSet()
_resets: list[Callable[[], object]] = []
_semaphores: weakref.WeakKeyDictionary[threading.Semaphore, int] = weakref.WeakKeyDictionary()


def close_descriptor(file: IO[bytes]) -> None:
    """Close ``file``'s descriptor without taking the lock of its buffer (what it buffers is dropped)."""
    raw = getattr(file, "raw", file)
    with contextlib.suppress(OSError, ValueError):
        raw.close()


def lock() -> threading.Lock:
    """A ``threading.Lock`` that a forked child finds released, whoever held it in the parent.

    For a lock held across a long wait (a compile), which a child would
    otherwise wait for forever; what it guards must be whole between statements.
    """
    made = threading.Lock()
    _locks.add(made)
    return made


def rlock() -> threading.RLock:
    """A ``threading.RLock`` that a forked child finds released, whoever held it in the parent (see :func:`lock`)."""
    made = threading.RLock()
    _locks.add(made)
    return made


def condition(of: threading.Lock | threading.RLock | None = None) -> threading.Condition:
    """A ``threading.Condition`` (on ``of``, else on a new re-entrant lock) that a forked child finds released
    and with no waiters, whoever held or waited on it in the parent (see :func:`lock`)."""
    made = threading.Condition(of)
    _locks.add(made)
    return made


def semaphore(value: int) -> threading.Semaphore:
    """A ``threading.Semaphore`` that a forked child finds with all ``value`` slots free, whoever held them in the
    parent (the threads that took them are not in the child; see :func:`lock`)."""
    made = threading.Semaphore(value)
    _semaphores[made] = value
    return made


def reset_in_child(reset: _Reset) -> _Reset:
    """Run ``reset`` in every forked child, after the locks of :func:`lock` are freed; returns it (a decorator).

    For the state those locks guard, which a parent thread may have left half
    way (an owner that is not in the child, a descriptor pointed elsewhere).
    """
    _resets.append(reset)
    return reset


def _release_in_child() -> None:
    for each in list(_locks):
        each._at_fork_reinit()  # what threading and logging do to their own locks in a child (CPython 3.9+)
    for made, value in list(_semaphores.items()):
        made._cond._at_fork_reinit()  # type: ignore[attr-defined]  # CPython's Semaphore: a Condition and a count
        made._value = value  # type: ignore[attr-defined]
    for reset in _resets:
        reset()


os.register_at_fork(after_in_child=_release_in_child)
