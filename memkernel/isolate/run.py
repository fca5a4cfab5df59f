"""An isolated kernel's calls, on the caller's side: check, copy into shared memory, call in the worker, copy back.

Arrays in a shared array's segment (:mod:`memkernel.isolate.shared_arrays`)
are not copied: the request names their segment, offset and strides. A call
that repeats its kernel's last one reuses its checks, layout and request
(see :class:`_Repeat`).

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
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..call.allocation import allocator_for
from ..call.binders import Binder, ScalarBinder, binder_for, describe_value
from ..call.descriptors import reach
from ..call.interrupts import HeldInterrupts
from ..call.plan import ArgumentCheck
from ..call.results import ExposedMemory
from ..errors import AllocationError, KernelCrashed, KernelTimeout, ShapeError
from ..model.kernel_spec import KernelSpec
from ..options import KernelOptions
from ..model.contract import BufferContract
from . import control, process, shared_arrays
from .definition import Definition, Results
from .request import CALL_SEGMENT, NOWHERE, READ_ONLY, Encoder
from .shared import Layout, Placed, Segment, address, copy_back, page_aligned
from .shared_arrays import SharedSegment


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


class _Prepared(NamedTuple):
    """A call made ready before it takes the worker: its checked arguments and outputs, which outputs were
    allocated, which arrays are copied (and where, ``layout``) and which lie in shared arrays' segments, and its
    packed request."""

    checked: list[Any]
    outputs: tuple[Any, ...]
    fresh: list[bool]
    copied: list[int]
    shared: dict[int, tuple[SharedSegment, int]]
    layout: Layout
    request: bytes
    backs: list[tuple[int, int]]
    """The copied arrays the kernel may write (written parameters, outputs allocated here), with their offsets:
    what is copied back."""


class _Repeat(NamedTuple):
    """A call's preparation without its arrays, and the key of its arguments: a call whose arguments have the
    same key (each array an exact ndarray of the same address, shape, strides, dtype and writability; each
    scalar an int, float or bool of the same type and value; every output given) passes and fails the same
    checks and is laid out and packed the same way, so a loop's calls are checked once. The arrays themselves
    are not kept (their memory would be)."""

    key: list[Any]
    scalars: dict[int, Any]
    copied: list[int]
    shared: dict[int, tuple[SharedSegment, int]]
    layout: Layout
    request: bytes
    backs: list[tuple[int, int]]


_FLOAT_BITS = struct.Struct("<d")


def _key(values: tuple[Any, ...]) -> list[Any] | None:
    """What a call's checks, layout and request depend on (see :class:`_Repeat`); None when a value is of a kind
    whose checks are not that simple (a list, a subclass, a numpy scalar)."""
    key: list[Any] = []
    for value in values:
        kind = type(value)
        if kind is np.ndarray:
            key.append((address(value), value.shape, value.strides, value.dtype, value.flags.writeable))
        elif kind is float:
            key.append((kind, _FLOAT_BITS.pack(value)))  # by its bits: -0.0 == 0.0, yet 1 / -0.0 is -inf
        elif kind is int or kind is bool:
            key.append((kind, value))
        else:
            return None
    return key


_NO_BLOCK = contextlib.nullcontext()
"""In place of a HeldInterrupts block where nothing needs holding (reusable: it holds no state)."""


class _Held(NamedTuple):
    """The worker's lock, held, and how long the call waited for it."""

    lock: threading.Lock
    waited: float

    def release(self) -> None:
        self.lock.release()


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
        self._buffers = tuple(i for i, c in enumerate(spec.contracts) if isinstance(c, BufferContract))
        self._scalars = frozenset(i for i, c in enumerate(spec.contracts) if not isinstance(c, BufferContract))
        self._dtype_index = {i: {dtype: k for k, dtype in enumerate(c.dtypes)}
                             for i, c in enumerate(spec.contracts) if isinstance(c, BufferContract)}
        self._encoder = Encoder(spec.contracts)
        self._repeatable = not spec.signature.results
        self._none_fresh = [False] * len(spec.contracts)
        self._last: _Repeat | None = None
        self._definition = Definition.of(spec, options, function)
        self._token = next(_tokens)
        weakref.finalize(self, process.dropped.append, self._token)
        self._timeout = options.timeout
        self._quiet = False
        """Whether the compiled kernel writes nothing to the C streams (as the worker said when it built it): its
        calls that return need no look at what the worker printed."""
        lock = self._lock_worker(lambda: "()")
        try:
            self._define(self._worker())
        finally:
            lock.release()

    def __call__(self, args: tuple[Any, ...], given: tuple[Any, ...]) -> Any:
        """The kernel's return value for the bound inputs ``args`` and the outputs ``given`` (None: allocate)."""
        prepared = self._repeated(args, given) or self._prepare(args, given)
        checked = prepared.checked
        lock = self._lock_worker(lambda: f"({self._summary(args, checked)})")
        try:
            worker = self._worker()
            self._define(worker)
            self._forget_dropped(worker, args, checked)
            self._map_shared(worker, prepared.shared, args, checked)
            if not prepared.layout.size:  # nothing to copy, nothing to copy back: every array is shared (or empty)
                reply = self._request(worker, prepared.request, args, checked, lock.waited)
            else:
                segment = self._segment(worker, prepared.layout.size, args, checked)
                reply = self._copying_call(worker, segment, prepared, args, lock.waited)
        finally:
            lock.release()
        returned = tuple(prepared.outputs) + (self._results(self._reply(reply), prepared) if reply else ())
        if not returned:
            return None
        return returned[0] if len(returned) == 1 else returned

    def _prepare(self, args: tuple[Any, ...], given: tuple[Any, ...]) -> _Prepared:
        """Check the call, place its arrays and pack its request; remember how, for a call that repeats it."""
        checked, outputs, fresh = self._checked(args, given)
        copied, shared = self._placement(checked)
        layout = Layout([checked[i] for i in copied])
        places = {i: (s.number, offset) for i, (s, offset) in shared.items()}
        for i, offset in zip(copied, layout.offsets):
            places[i] = (CALL_SEGMENT, offset)
        request = self._pack(checked, places)
        backs = [(i, offset) for i, offset in zip(copied, layout.offsets) if self._written[i] or fresh[i]]
        if self._repeatable and all(g is not None for g in given):
            key = _key(args + given)
            if key is not None:
                scalars = {i: checked[i] for i in self._scalars}
                self._last = _Repeat(key, scalars, copied, shared, layout, request, backs)
        return _Prepared(checked, outputs, fresh, copied, shared, layout, request, backs)

    def _repeated(self, args: tuple[Any, ...], given: tuple[Any, ...]) -> _Prepared | None:
        """The last call's preparation if this call repeats it (see :class:`_Repeat`), else None."""
        last = self._last
        if last is None:
            return None
        values = args + given
        if _key(values) != last.key:
            return None
        for segment, _ in last.shared.values():
            if not segment.alive:
                return None
        checked = list(values)
        for i, encoded in last.scalars.items():
            checked[i] = encoded
        return _Prepared(checked, given, self._none_fresh, last.copied, last.shared, last.layout, last.request,
                         last.backs)

    def _copying_call(self, worker: process.Worker, segment: Segment, prepared: _Prepared, args: tuple[Any, ...],
                      waited: float) -> tuple[str, Any] | None:
        """The call, its copied arrays copied into the call's segment and what the kernel may write copied back."""
        layout, checked, backs = prepared.layout, prepared.checked, prepared.backs
        # A Ctrl-C during the copies back waits for their end: the caller's arrays get all of the kernel's writes
        # or none. While the worker runs the call, it ends the call (the worker is killed). One copy back is one
        # call into C, which no signal handler interrupts: it needs no holding (and its two handler swaps).
        held = HeldInterrupts(holding=False) if len(backs) > 1 else None
        with held or _NO_BLOCK:
            layout.copy_into(segment.address)
            reply = self._request(worker, prepared.request, args, checked, waited)
            if held is not None:
                held.holding = True
            # Whatever the worker replied, the kernel's writes reach the caller's arrays, as in process: a
            # failed check (checked=True) stopped the kernel after the writes before it.
            for i, offset in backs:
                copy_back(checked[i], segment, offset)
            worker.needed(layout.size)  # until now: back-to-back long calls keep the segment
        return reply

    def _placement(self, checked: list[Any]) -> tuple[list[int], dict[int, tuple[SharedSegment, int]]]:
        """Which non-empty arrays of the call are copied into the call's segment, and which lie in a shared
        array's segment (found by the bytes they reach from their data pointer), with their offset there."""
        copied = []
        shared: dict[int, tuple[SharedSegment, int]] = {}
        look = shared_arrays.any_live()
        for i in self._buffers:
            array = checked[i]
            if not array.size:
                continue
            if look:
                at = address(array)
                low, high = reach(array.shape, array.strides, array.itemsize)
                found = shared_arrays.find(at, low, high)
                if found is not None:
                    shared[i] = (found, at - found.address)
                    continue
            copied.append(i)
        return copied, shared

    def _forget_dropped(self, worker: process.Worker, args: tuple[Any, ...], checked: list[Any]) -> None:
        """Have the worker let go of what this process dropped; KernelCrashed if it dies meanwhile."""
        try:
            worker.forget_dropped()
        except process.WorkerDied as died:
            raise self._crashed(died, self._summary(args, checked), "letting go of dropped kernels") from None

    def _map_shared(self, worker: process.Worker, shared: dict[int, tuple[SharedSegment, int]],
                    args: tuple[Any, ...], checked: list[Any]) -> None:
        """Have the worker map the segments of the call's shared arrays; AllocationError if it cannot."""
        for segment, _ in shared.values():
            try:
                worker.map_shared(segment)
            except process.SegmentUnavailable as unavailable:
                raise self._unavailable(unavailable, args, checked) from None
            except process.WorkerDied as died:
                raise self._crashed(died, self._summary(args, checked), "mapping a shared array") from None

    def _pack(self, checked: list[Any], places: dict[int, tuple[int, int]]) -> bytes:
        """The call's request (see :mod:`memkernel.isolate.request`)."""
        values: list[Any] = [self._token]
        ranks = []
        for i, value in enumerate(checked):
            if i in self._scalars:
                values += value
                continue
            where, offset = places.get(i, (NOWHERE, 0))
            kind = self._dtype_index[i][value.dtype] | (0 if value.flags.writeable else READ_ONLY)
            values += (where, offset, kind, value.ndim, *value.shape, *value.strides)
            ranks.append(value.ndim)
        return self._encoder.struct_for(tuple(ranks)).pack(*values)

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
            raise self._unavailable(unavailable, args, checked) from None
        except process.WorkerDied as died:
            raise self._crashed(died, self._summary(args, checked), "mapping the call's segment") from None

    def _unavailable(self, unavailable: process.SegmentUnavailable, args: tuple[Any, ...],
                     checked: list[Any]) -> AllocationError:
        error = unavailable.error
        hint = _SEGMENT_HINTS.get(getattr(error, "errno", 0) or 0, _SEGMENT_HINT)
        return AllocationError(
            f"{self._kernel}({self._summary(args, checked)}): an isolated call passes its arrays through shared "
            f"memory, and {unavailable.size / 2**20:.4g} MiB ({unavailable.size} bytes) of it could not be "
            f"{unavailable.where}: {error}. {hint}"
        )

    def _lock_worker(self, call: Callable[[], str]) -> _Held:
        """The worker to this call (shown as ``call()``) alone; with ``timeout=``, KernelTimeout if another
        isolated call holds it for that long (that call goes on: it is not this call's to end)."""
        lock = process.lock()
        if lock.acquire(blocking=False):
            return _Held(lock, 0.0)
        started = time.monotonic()
        if not lock.acquire(timeout=-1 if self._timeout is None else self._timeout):
            raise self._waited_too_long(call)
        return _Held(lock, time.monotonic() - started)

    def _waited_too_long(self, call: Callable[[], str]) -> KernelTimeout:
        return KernelTimeout(
            f"{self._kernel}{call()} waited timeout={self._timeout:g} s for the worker "
            "process, which was running another isolated call all that time, and did not start. One worker "
            "runs the isolated calls of a process one at a time; raise timeout= to wait longer."
        )

    def _request(self, worker: process.Worker, request: bytes, args: tuple[Any, ...],
                 checked: list[Any], waited: float) -> tuple[str, Any] | None:
        """The worker's reply to the call packed in ``request``: None when it has
        nothing to send back, else ``("ok", Results)`` or ``("error", exception)``; KernelCrashed or
        KernelTimeout when it died or took too long."""
        # The budget is the call's: the ``waited`` seconds behind other calls are spent; starting a worker,
        # compiling the kernel in it and copying the arrays in are not.
        remaining = None if self._timeout is None else self._timeout - waited
        if remaining is not None and remaining <= 0:
            raise self._waited_too_long(lambda: f"({self._summary(args, checked)})")
        try:
            reply = worker.call(request, timeout=remaining, quiet=self._quiet)
        except process.WorkerDied as died:
            raise self._crashed(died, self._summary(args, checked), "running the call") from None
        except process.WorkerTimedOut as timed_out:
            what = ("its worker process was killed and starts afresh at the next call" if timed_out.took is None else
                    f"it took {timed_out.took:.3g} s in the worker, whose reply came while this process was not "
                    "running, and was dropped")
            raise KernelTimeout(
                f"{self._kernel}({self._summary(args, checked)}) ran longer than timeout={self._timeout:g} s; {what}. "
                "Raise timeout= if the kernel needs longer; the arrays it may write were left as they were before "
                "the call."
            ) from None
        return reply

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
            self._quiet = not self._reply(worker.request(("define", self._token, self._definition)))
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
    def _results(results: Results, prepared: _Prepared) -> tuple[Any, ...]:
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
                number, placed = item
                decoded.append(IsolatedRun._alias(number, placed, prepared))
        return tuple(decoded)

    @staticmethod
    def _alias(number: int, placed: Placed, prepared: _Prepared) -> np.ndarray:
        """A returned memref in segment ``number`` as a view of the caller's memory."""
        dtype = np.dtype(placed.scalar_type)
        low, high = reach(placed.shape, placed.strides, dtype.itemsize)
        found: tuple[int, np.ndarray] | None = None
        checked = prepared.checked
        if number == CALL_SEGMENT:
            found = prepared.layout.caller_address(placed.offset + low, high - low,
                                                   [checked[i] for i in prepared.copied])
        else:
            for i, (segment, _) in prepared.shared.items():
                if segment.number == number and placed.offset + high <= segment.size:
                    found = (segment.address + placed.offset + low, checked[i])
                    break
        if found is None:
            raise ShapeError("the kernel returned a memref reaching outside the memory of the call's arguments: "
                             "a view past an array's end. The kernel's result is wrong.")
        address, owner = found
        return np.asarray(ExposedMemory(owner, address - low, placed.shape, placed.strides, dtype.itemsize)).view(dtype)
