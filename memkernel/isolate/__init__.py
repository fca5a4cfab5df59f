"""Isolated calls: a kernel's calls run in a worker process, so a crash cannot take the caller down.

``mlir_kernel(source, isolate=True)`` (or ``MEMKERNEL_ISOLATE=1`` in the
environment, for every kernel that does not say ``isolate=False``) runs each
call in a worker process:

- The caller checks the arguments and allocates the outputs exactly as
  without isolation, so every error is the same one, raised in the caller.
- A call crosses as a few packed words in a control block both processes map,
  woken by eventfds (see :mod:`memkernel.isolate.control`,
  :mod:`memkernel.isolate.request`); a loop's repeated calls are checked once.
- Arrays made by :func:`~memkernel.shared_empty` (and their views) are in
  memory the worker maps: the kernel works on them in place, nothing is
  copied (see :mod:`memkernel.isolate.shared_arrays`).
- Other arrays cross through shared memory (a ``memfd`` both processes map): each
  is copied in once, and what the kernel may write is copied back into the
  caller's arrays, views and strided ``out=`` included (see
  :mod:`memkernel.isolate.run`); returned memrefs come back as arrays. A
  large segment is shrunk once calls stop needing it (see
  :mod:`memkernel.isolate.release`).
- A crash of the kernel (SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE, or the
  worker exiting) raises :class:`~memkernel.errors.KernelCrashed` with the
  signal, the call and the worker's last lines on stderr; ``timeout=``
  seconds bounds a call, after which the worker is killed and
  :class:`~memkernel.errors.KernelTimeout` raised. Either way the next call
  starts a new worker.
- What the kernel prints reaches ``sys.stdout``/``sys.stderr`` after the call,
  including what it printed just before crashing.
- Kernels with ``callbacks=`` cannot be isolated: ``isolate=True`` with
  callbacks is a SignatureError at decoration, and ``MEMKERNEL_ISOLATE=1``
  leaves them in process. (Running the callback in the caller would need a
  round trip per callback call and the kernel's memory mapped in the caller.)

One worker serves the whole process, one call at a time. It is a fresh
Python process: the first isolated call pays its start (about a second, the
import of the MLIR bindings), and each kernel compiles once in it, or loads
from the disk cache, and is dropped there once its Kernel is gone here.

The kernel works on copies, except for shared arrays: what other threads of
the caller write into copied arguments during the call is not seen, and
addresses (a kernel that returns a pointer) are the worker's. The in-process machinery is not used:
``kernel.invoker.plan`` and ``.fast`` are None and ``.last_path`` stays None.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from ..call.invoker import Invoker
from ..errors import OptionError, SignatureError
from ..model.kernel_spec import KernelSpec
from ..options import KernelOptions


ENVIRONMENT = "MEMKERNEL_ISOLATE"
"""The environment variable that isolates every kernel that does not say ``isolate=False``."""


def enabled() -> bool:
    """Whether ``MEMKERNEL_ISOLATE`` asks for isolated calls (``1``, ``true``, ``yes`` or ``on``).

    Read when a kernel builds its call (its first call or ``compile()``), not at every call.
    """
    return os.environ.get(ENVIRONMENT, "").strip().lower() in ("1", "true", "yes", "on")


def check_options(kernel: str, isolate: bool | None, timeout: float | None,
                  callbacks: Mapping[str, Callable[..., Any]] | None) -> None:
    """Refuse, at decoration, ``isolate``/``timeout`` values that cannot work."""
    if isolate not in (None, True, False):
        raise OptionError(f"{kernel}(): isolate must be True, False or None (follow ${ENVIRONMENT}); got {isolate!r}")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise OptionError(f"{kernel}(): timeout must be a positive number of seconds or None; got {timeout!r}")
        if isolate is False or callbacks:
            raise OptionError(f"{kernel}(): timeout= needs an isolated call (a worker process to kill), which "
                             "isolate=False and callbacks= rule out; drop timeout=, or them.")
    if isolate and callbacks:
        raise SignatureError(
            f"{kernel}(): isolate=True cannot run a kernel with callbacks=: the callbacks are Python functions "
            "of this process and the kernel would run in another. Drop isolate=True, or the callbacks."
        )


def wanted(isolate: bool | None, callbacks: Mapping[str, Any], timeout: float | None = None) -> bool:
    """Whether a kernel's calls run in the worker: ``isolate``, else when a ``timeout`` asks for it or the
    environment says so (never with callbacks)."""
    if isolate is None:
        return (timeout is not None or enabled()) and not callbacks
    return isolate


def invoker(spec: KernelSpec, options: KernelOptions, function: Callable[..., Any]) -> Invoker:
    """Kernel ``spec``'s call (made with ``options`` from the Python ``function``), running in the worker:
    the usual binding of arguments and ``out=``, then :class:`~memkernel.isolate.run.IsolatedRun`. Nothing is
    compiled in this process."""
    from .run import IsolatedRun  # the worker's machinery (sockets, subprocesses) loads with the first such call

    run = IsolatedRun(spec, options, function)
    return Invoker.running(spec, run.allocator, run)
