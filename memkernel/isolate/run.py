"""An isolated kernel's calls, on the caller's side: check, copy into shared memory, call in the worker, copy back.

Every rule of a call runs in the caller first, as without isolation: the
binders check and convert each argument, the outputs ``out=`` leaves out are
allocated, the shape rules are checked, so every error is raised here, the
same error with the same message. The memory of the checked arrays is
copied once into the worker's segment, as the bytes each spans (so a
broadcast view costs its few bytes, not its elements), and the worker calls
the kernel on views of them, every output passed as ``out=``. When it
returns, each array the kernel may write
(:attr:`~memkernel.model.contract.BufferContract.needs_writeable`) and each
allocated output is copied back into the caller's array, elementwise, so a
view's elements are written and the elements between them are not; also when
the worker raised (a failed check of ``checked=True`` stopped the kernel after
its writes). A Ctrl-C during the copies is raised once they are done. A
returned memref that lies in the segment (it aliases an argument) becomes a
view of the caller's memory there; any other comes back as an array.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..call.allocation import allocator_for
from ..call.binders import Binder, ScalarBinder, binder_for, describe_value
from ..call.interrupts import HeldInterrupts
from ..call.plan import ArgumentCheck
from ..call.results import ExposedMemory
from ..call import scalars
from ..errors import AllocationError, KernelCrashed, KernelTimeout, ShapeError
from ..model.kernel_spec import KernelSpec
from ..options import KernelOptions
from ..model.contract import BufferContract
from . import process
from .definition import Definition, Results, Value
from .shared import Layout, Placed, Segment, page_aligned, reach


_SEGMENT_HINT = "Call with smaller arrays, or without isolate=True."
_SEGMENT_HINTS: dict[int | None, str] = {
    errno.EFBIG: "The file-size limit (ulimit -f) holds for shared memory too: raise it, or call with smaller arrays.",
    errno.EMFILE: "The process has no file descriptor left (ulimit -n): close some, or raise the limit.",
    errno.ENFILE: "The system has no file descriptor left: close some files.",
    errno.ENOMEM: "Not enough memory: call with smaller arrays, or without isolate=True.",
}
"""What to do when the segment cannot be had, by the errno of the reason."""

_tokens = itertools.count()
"""Names each IsolatedRun to the worker (never reused, unlike an id())."""


class IsolatedRun:
    """Runs one kernel's calls in the worker; built once per kernel, at its first call or ``compile()``,
    which compiles the kernel in the worker (raising its CompileError here)."""

    def __init__(self, spec: KernelSpec, options: KernelOptions, function: Callable[..., Any]) -> None:
        self._kernel = spec.name
        self._spec = spec
        self._binders: tuple[Binder, ...] = tuple(binder_for(c) for c in spec.contracts)
        self.allocator = allocator_for(spec, function)
        self._check = ArgumentCheck(spec.name, self._binders, spec.n_inputs, self.allocator, spec.shapes)
        self._written = tuple(isinstance(c, BufferContract) and c.needs_writeable for c in spec.contracts)
        self._definition = Definition.of(spec, options, function)
        self._token = f"{next(_tokens)}-{spec.name}"
        weakref.finalize(self, process.dropped.append, self._token)
        self._timeout = options.timeout
        with self._worker_lock("()"):
            self._define(self._worker())

    def __call__(self, args: tuple[Any, ...], given: tuple[Any, ...]) -> Any:
        """The kernel's return value for the bound inputs ``args`` and the outputs ``given`` (None: allocate)."""
        checked, outputs, fresh = self._checked(args, given)
        arrays = [i for i, (b, c) in enumerate(zip(self._binders, checked))
                  if not isinstance(b, ScalarBinder) and c.size]
        layout = Layout([checked[i] for i in arrays])
        started = time.monotonic()
        with self._worker_lock(f"({self._summary(args, checked)})"):
            waited = time.monotonic() - started
            worker = self._worker()
            values: list[Value] = [self._value(b, c) for b, c in zip(self._binders, checked)]
            segment = self._segment(worker, layout.size, args, checked)
            # A Ctrl-C during the copies waits for their end: the caller's arrays get all of the kernel's writes
            # or none. While the worker runs the call, it ends the call (the worker is killed).
            with HeldInterrupts() as interrupts:
                views = self._copy_in(segment, layout, arrays, values)
                interrupts.let_through()
                reply = self._request(worker, values, args, checked, waited)
                interrupts.holding = True
                # Whatever the worker replied, the kernel's writes reach the caller's arrays, as in process: a
                # failed check (checked=True) stopped the kernel after the writes before it.
                for i, view in views.items():
                    if self._written[i] or fresh[i]:
                        np.copyto(checked[i], view, casting="no")
                worker.needed(layout.size)  # until now: back-to-back long calls keep the segment
        returned = tuple(outputs) + self._results(self._reply(reply), layout)
        if not returned:
            return None
        return returned[0] if len(returned) == 1 else returned

    def _checked(self, args: tuple[Any, ...], given: tuple[Any, ...]) -> tuple[list[Any], tuple[Any, ...], list[bool]]:
        """Each argument checked and converted, the outputs allocated, the shape rules checked (the call plan's
        :class:`~memkernel.call.plan.ArgumentCheck`); and which outputs were allocated here."""
        _, checked, outputs = self._check(args, given)
        fresh = [False] * self._spec.n_inputs + [g is None for g in given]
        return checked, outputs, fresh

    def _segment(self, worker: process.Worker, size: int, args: tuple[Any, ...], checked: list[Any]) -> Segment:
        """The worker's segment, grown to ``size`` bytes if needed; AllocationError if it cannot be."""
        try:
            return worker.segment_for(size)
        except process.SegmentUnavailable as unavailable:
            error = unavailable.error
            hint = _SEGMENT_HINTS.get(getattr(error, "errno", None), _SEGMENT_HINT)
            raise AllocationError(
                f"{self._kernel}({self._summary(args, checked)}): an isolated call passes its arrays through shared "
                f"memory, and {unavailable.size / 2**20:.4g} MiB ({unavailable.size} bytes) of it could not be "
                f"{unavailable.where}: {error}. {hint}"
            ) from None

    @staticmethod
    def _copy_in(segment: Segment, layout: Layout, arrays: list[int], values: list[Value]) -> dict[int, np.ndarray]:
        """Copy the memory of the call's arrays into the segment (see :meth:`Layout.copy_into`) and say where
        they are in ``values``; returns each array's view of the segment, by argument index."""
        layout.copy_into(segment.map)
        views: dict[int, np.ndarray] = {}
        for i, placed in zip(arrays, layout.placed):
            views[i] = placed.view(segment.map, as_given=False)
            values[i] = ("array", placed)
        return views

    @staticmethod
    def _value(binder: Binder, checked: Any) -> Value:
        if isinstance(binder, ScalarBinder):
            return ("value", scalars.decode(checked, binder.contract.element))
        return ("value", checked if not checked.size else None)  # a non-empty array is placed in the segment

    @contextlib.contextmanager
    def _worker_lock(self, call: str) -> Iterator[None]:
        """The worker to this call (shown as ``call``) alone; with ``timeout=``, KernelTimeout if another
        isolated call holds it for that long (that call goes on: it is not this call's to end)."""
        lock = process.lock()
        if not lock.acquire(timeout=-1 if self._timeout is None else self._timeout):
            raise KernelTimeout(
                f"{self._kernel}{call} waited timeout={self._timeout:g} s for the worker "
                "process, which was running another isolated call all that time, and did not start. One worker "
                "runs the isolated calls of a process one at a time; raise timeout= to wait longer."
            )
        try:
            yield
        finally:
            lock.release()

    def _request(self, worker: process.Worker, values: list[Value], args: tuple[Any, ...],
                 checked: list[Any], waited: float) -> tuple[str, Any]:
        """The worker's reply to the call: ``("ok", Results)`` or ``("error", exception)``; KernelCrashed or
        KernelTimeout when it died or took too long."""
        # The budget is the call's: the ``waited`` seconds behind other calls are spent; starting a worker,
        # compiling the kernel in it and copying the arrays in are not.
        remaining = None if self._timeout is None else max(self._timeout - waited, 0.001)
        self._define(worker)
        try:
            reply = worker.request(("call", self._token, values, len(self._binders) - self._spec.n_inputs,
                                    worker.take_dropped()), timeout=remaining)
        except process.WorkerDied as died:
            raise self._crashed(died, self._summary(args, checked), "running the call") from None
        except process.WorkerTimedOut:
            raise KernelTimeout(
                f"{self._kernel}({self._summary(args, checked)}) ran longer than timeout={self._timeout:g} s; its "
                "worker process was killed and starts afresh at the next call. Raise timeout= if the kernel needs "
                "longer; the arrays it may write were left as they were before the call."
            ) from None
        return reply  # type: ignore[no-any-return]

    def _worker(self) -> process.Worker:
        """The running worker, started now if needed; KernelCrashed if it dies while starting."""
        try:
            return process.worker()
        except process.WorkerDied as died:
            raise self._crashed(died, "", "starting") from None

    def _define(self, worker: process.Worker) -> None:
        """Have the worker build and compile the kernel, unless it has since it started."""
        if self._token in worker.defined:
            return
        try:
            self._reply(worker.request(("define", self._token, self._definition)))
        except process.WorkerDied as died:
            raise self._crashed(died, "", "compiling the kernel") from None
        worker.defined.add(self._token)

    @staticmethod
    def _reply(reply: tuple[str, Any]) -> Any:
        status, value = reply
        if status == "error":
            raise value
        return value

    def _crashed(self, died: process.WorkerDied, summary: str, doing: str) -> KernelCrashed:
        how = f"was killed by {died.signal}" if died.signal else f"exited with status {died.status}"
        output = f" Its last lines on stderr:\n{died.output}" if died.output.strip() else ""
        return KernelCrashed(
            f"{self._kernel}({summary}): the worker process {how} while {doing}. Your process and arrays are "
            f"unharmed (arrays the kernel may write keep their values from before the call); the next call "
            f"starts a new worker.{output}",
            signal=died.signal, kernel=self._kernel, arguments=summary, output=died.output,
        )

    def _summary(self, args: tuple[Any, ...], checked: list[Any]) -> str:
        """The call's arguments as messages show them: ``a=float32[16], n=3``."""
        shown = []
        for i, (binder, value) in enumerate(zip(self._binders, checked)):
            if isinstance(binder, ScalarBinder):
                shown.append(f"{binder.contract.name}={args[i]!r}")
            else:
                shown.append(f"{binder.contract.name}={describe_value(value)}")
        return ", ".join(shown)

    @staticmethod
    def _results(results: Results, layout: Layout) -> tuple[Any, ...]:
        """The results in the caller: values as they came, aliases as views of the caller's arrays, arrays
        copied out of the worker's memory as views of one buffer (with their strides, sharing as they did)."""
        copied = page_aligned(results.data) if results.data else None
        decoded = []
        for kind, item in results.items:
            if kind == "value":
                decoded.append(item)
            elif kind == "copied":
                decoded.append(item.view(copied))
            else:
                decoded.append(IsolatedRun._alias(item, layout))
        return tuple(decoded)

    @staticmethod
    def _alias(placed: Placed, layout: Layout) -> np.ndarray:
        dtype = np.dtype(placed.scalar_type)
        low, high = reach(placed.shape, placed.strides, dtype.itemsize)
        found = layout.caller_address(placed.offset + low, high - low)
        if found is None:
            raise ShapeError("the kernel returned a memref reaching outside the memory of the call's arguments: "
                             "a view past an array's end. The kernel's result is wrong.")
        address, owner = found
        return np.asarray(ExposedMemory(owner, address - low, placed.shape, placed.strides, dtype.itemsize)).view(dtype)
