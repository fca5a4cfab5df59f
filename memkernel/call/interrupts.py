"""Ctrl-C held back while a call copies the kernel's writes into the caller's arrays, then raised.

Python raises a KeyboardInterrupt between two bytecodes of the main thread,
where it runs the SIGINT handler. One raised between two copy-backs would
leave the first array written and the next one not. While a
:class:`HeldInterrupts` block is ``holding``, its handler only notes the
signal; otherwise it passes the signal on at once. When the block ends, the
previous handler is back and gets the noted signal (the default one raises
KeyboardInterrupt).

Only the main thread runs signal handlers, so no KeyboardInterrupt is raised
in another thread: a block there installs nothing. A SIGINT handler that is
not a Python function (``SIG_IGN``, ``SIG_DFL``, one set from C) is left alone.
"""

from __future__ import annotations

import _signal  # signal's own functions wrap each handler in an enum lookup that raises: ~5 µs a call
import signal
import threading
from types import FrameType, TracebackType
from typing import Any


class HeldInterrupts:
    """A block during which a SIGINT waits for the block's end while ``holding`` is true.

    ``holding`` may be switched inside the block; setting it to True is an
    attribute store, during which Python runs no handler, so it is the safe
    first statement of a ``finally``. :meth:`let_through` turns holding off and
    passes on a signal noted so far.
    """

    __slots__ = ("_noted", "_previous", "holding")

    def __init__(self, *, holding: bool = True) -> None:
        self.holding = holding
        self._previous: Any = None
        self._noted: tuple[int, FrameType | None] | None = None

    def __enter__(self) -> HeldInterrupts:
        if threading.current_thread() is threading.main_thread():
            previous = _signal.getsignal(signal.SIGINT)
            if callable(previous):
                try:
                    _signal.signal(signal.SIGINT, self._handle)
                except ValueError:  # not the main interpreter, whose main thread alone runs handlers
                    return self
                self._previous = previous
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.holding:
            self._previous(signum, frame)
        elif self._noted is None:
            self._noted = (signum, frame)

    def let_through(self) -> None:
        """Pass on signals from now on, and the one noted so far, if any (which raises KeyboardInterrupt)."""
        self.holding = False
        noted, self._noted = self._noted, None
        if noted is not None:
            self._previous(*noted)

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        previous, self._previous = self._previous, None
        if previous is None:
            return
        _signal.signal(signal.SIGINT, previous)
        noted, self._noted = self._noted, None
        if noted is not None:
            previous(*noted)
