"""When the shared memory of large isolated calls is given back: an idle process keeps at most KEEP_MAPPED of it.

Between calls the segment stays mapped in both processes with its pages in
memory, so that the next call's copies do not fault them in again: touching
fresh pages costs about ten times a copy of them (0.5-0.7 s for 600 MB here,
against 0.06 s). A segment larger than :data:`KEEP_MAPPED` is kept that way
only while calls need it: :data:`RELEASE_AFTER` seconds after the last call
that needed more, a timer thread replaces it, in both processes, by one of
:data:`KEEP_MAPPED` bytes with no page in memory, which frees the big one.
Calls that need less do not keep it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

KEEP_MAPPED = 64 << 20
"""The largest segment kept once no call needs more (its pages stay in memory between calls)."""

RELEASE_AFTER = 2.0
"""Seconds after the last call that needed more than KEEP_MAPPED at which the segment is shrunk to it."""

_timer: threading.Timer | None = None


def later(release: Callable[[], None]) -> None:
    """Run ``release`` RELEASE_AFTER seconds from now, on a thread of its own, instead of when last asked.

    Called under the isolated calls' lock; ``release`` takes that lock and
    must check again that no call needed the memory since (it may have waited
    for that call).
    """
    global _timer
    if _timer is not None:
        _timer.cancel()
    _timer = threading.Timer(RELEASE_AFTER, release)
    _timer.name = "memkernel-isolate-release"
    _timer.daemon = True
    _timer.start()


def _forget_in_child() -> None:
    global _timer
    _timer = None  # the parent's, whose thread the child does not have


os.register_at_fork(after_in_child=_forget_in_child)
