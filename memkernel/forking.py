"""What a forked child does with its parent's pipes and locks, which other threads of the parent may have held.

``fork()`` copies only the thread that called it. A lock another thread held
at that moment (a buffered file's, while that thread read from it; a kernel's
while it compiled) stays held in the child forever, so the child must neither
take it nor wait for it:

- :func:`close_descriptor` closes a buffered file's descriptor through its raw
  file, which the buffered file's lock does not guard; the buffered file then
  counts as closed, and neither its ``close()`` nor its collection takes the lock.
- :func:`lock` makes a lock that is free again in a forked child.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import IO, Any

_locks: weakref.WeakSet[Any] = weakref.WeakSet()


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


def _release_in_child() -> None:
    for each in list(_locks):
        each._at_fork_reinit()  # what threading and logging do to their own locks in a child (CPython 3.9+)


os.register_at_fork(after_in_child=_release_in_child)
