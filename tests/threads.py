"""Running one function on several threads at once, as the tests of thread safety do."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any


def run_together(target: Callable[[Any], object], arguments: Iterable[Any]) -> None:
    """Call ``target(argument)`` for each of ``arguments``, each on a thread of its own, every thread started
    before any is joined; returns when all have ended."""
    threads = [threading.Thread(target=target, args=(argument,)) for argument in arguments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
