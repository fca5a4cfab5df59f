"""Python functions bound to the kernel's private ``func.func`` declarations.

``mlir_kernel(source, callbacks={"log_row": fn})`` binds ``func.func private
@log_row(...)``. The declaration gets a C interface, so the kernel calls
``_mlir_ciface_log_row`` with a pointer to each memref's descriptor and
scalars by value; memkernel defines that symbol as a ctypes callback which
hands ``fn`` numpy arrays for the memrefs and Python numbers for the scalars,
and returns its scalar result to the kernel.

Each memref reaches ``fn`` as an array of its own, a copy of the kernel's memory:
``fn`` may keep it and read it after the call, when the kernel may have freed or
reused that memory. When ``fn`` returns (or raises), the elements it changed are
written back into the kernel's memory, so its writes reach the kernel as if it had
written the memref itself, and the elements it did not change are not touched
(a read-only ``memref.global`` passed to a callback that only reads it stays
untouched). A callback that writes its array after it has returned writes only
its own copy.

A scalar result is checked like a scalar argument: an integer out of its type's
range or a value that is not a number is an error (``ValueRangeError``,
``CallbackError``) naming the kernel, the callback and the value, never a
truncated number.

The kernel cannot be unwound from Python, so an exception raised by ``fn`` (or a
result it cannot take) is kept (the callback returns zero to the kernel, which
runs on) and re-raised from the kernel call once the kernel returns, from the
call whose callback raised it. A serial kernel runs its callbacks on the calling
thread, so each call keeps its errors apart from other threads' calls. A
``parallel=True`` kernel may run them on the async runtime's worker threads, so
its calls take a lock: they run one at a time, and an error belongs to the one
call running (a callback of a parallel kernel must not call that same kernel).
"""

from __future__ import annotations

import ctypes
import reprlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..errors import CallbackError, SignatureError, ValueRangeError
from .results import descriptor_array, read_descriptor
from .scalars import ScalarValueError, encode
from ..model.signature import ArgSpec, MemRefSpec, ScalarSpec, Signature, UnrankedSpec
from .. import forking

T = TypeVar("T")


def _ctype(spec: ArgSpec, where: str) -> Any:
    if isinstance(spec, (MemRefSpec, UnrankedSpec)):
        if getattr(spec, "tensor", False):
            raise SignatureError(f"{where} is {spec.mlir}: callbacks take memrefs, not tensors.")
        return ctypes.c_void_p
    ctype = spec.element.ctype
    if ctype is None:
        raise SignatureError(
            f"{where} is {spec.mlir}: callback scalars must be integers, index, i1, f32 or f64."
        )
    return ctype


def _kernel_memory(spec: MemRefSpec | UnrankedSpec, pointer: int) -> np.ndarray:
    """A numpy view of the memref whose descriptor is at ``pointer``: valid only during the callback."""
    if isinstance(spec, UnrankedSpec):
        rank = ctypes.c_int64.from_address(pointer).value
        pointer = ctypes.c_void_p.from_address(pointer + 8).value or 0
    else:
        rank = spec.rank
    return descriptor_array(read_descriptor(pointer, rank), spec.element.dtype, None)


class _LentCopy:
    """The callback's own copy of one memref, and how its changes go back to the kernel's memory."""

    def __init__(self, memory: np.ndarray) -> None:
        self.memory = memory
        self.before = np.array(memory)
        self.array = self.before.copy()

    def write_back(self, where: str) -> None:
        """Write the elements the callback changed (compared bit for bit) into the kernel's memory.

        CallbackError, naming ``where``, if the callback changed the array's shape, strides or dtype.
        """
        after, before = self.array, self.before
        if (after.shape, after.strides, after.dtype) != (before.shape, before.strides, before.dtype):
            raise CallbackError(
                f"{where} was given {before.dtype}{list(before.shape)} and changed it in place to "
                f"{after.dtype}{list(after.shape)} (strides {after.strides}); its changes cannot go back "
                "to the kernel's memref. Write into the array, and reshape or view a new one instead."
            )
        differs = after.reshape(-1).view(np.uint8) != before.reshape(-1).view(np.uint8)
        if differs.any():
            changed = differs.reshape(-1, before.itemsize).any(axis=1).reshape(before.shape)
            np.copyto(self.memory, after, where=changed)


class PendingErrors:
    """Exceptions raised by a kernel's callbacks, each raised from the kernel call that ran the callback.

    ``parallel`` says whether the kernel may run its callbacks on other threads
    than the calling one (the async runtime of ``parallel=True``); then its calls
    run one at a time. The call path uses :meth:`run`; the callbacks, :meth:`add`.
    """

    def __init__(self, *, parallel: bool = True) -> None:
        self._parallel = parallel
        self._lock = forking.lock() if parallel else None
        self._local = threading.local()
        self._shared: list[BaseException] = []

    def run(self, call: Callable[[], T]) -> T:
        """Run one kernel call, then raise the first error a callback raised during it, if any."""
        if self._lock is not None:
            with self._lock:
                self._shared = []
                returned = call()
                errors, self._shared = self._shared, []
        else:
            outer = getattr(self._local, "errors", None)
            errors = self._local.errors = []
            try:
                returned = call()
            finally:
                self._local.errors = outer
            if not errors and self._shared:  # a callback that ran on a thread with no call of its own
                errors, self._shared = self._shared, []
        if errors:
            raise errors[0]
        return returned

    def add(self, error: BaseException) -> None:
        """Keep ``error`` for the call running on this thread (or, off the calling threads, the kernel)."""
        errors = getattr(self._local, "errors", None)
        if self._parallel or errors is None:
            errors = self._shared
        errors.append(error)  # atomic under the GIL, which every callback holds


@dataclass
class BoundCallback:
    """One declaration bound to a Python function: its C-callable address and what keeps it alive."""

    symbol: str
    function: Any

    @property
    def address(self) -> int:
        return ctypes.cast(self.function, ctypes.c_void_p).value or 0


def _result_error(kernel: str, name: str, spec: ScalarSpec, value: Any,
                  error: ScalarValueError) -> Exception:
    message = (
        f"{kernel}(): callback @{name} returned {reprlib.repr(value)} for its {spec.mlir} result "
        f"({error}). Return a value that fits {spec.mlir} from the function bound to @{name}."
    )
    return CallbackError(message) if error.is_type_error else ValueRangeError(message)


def _bind(kernel: str, name: str, signature: Signature, python: Callable[..., Any],
          pending: PendingErrors) -> BoundCallback:
    where = f"callback @{name}"
    argtypes = [_ctype(spec, f"{where} argument #{i}") for i, spec in enumerate(signature.args)]
    if len(signature.results) > 1 or any(not isinstance(r, ScalarSpec) for r in signature.results):
        raise SignatureError(f"{where} must return nothing or one scalar.")
    result = signature.results[0] if signature.results else None
    restype = None if result is None else _ctype(result, f"{where} result")
    specs = signature.args

    def result_value(returned: Any) -> Any:
        assert isinstance(result, ScalarSpec)
        if type(returned) is float and result.element.mlir == "f64":  # the common case, and always fits
            return returned
        try:
            return encode(returned, result.element)[0]
        except ScalarValueError as error:
            raise _result_error(kernel, name, result, returned, error) from None

    def trampoline(*raw: Any) -> Any:
        try:
            copies = {i: _LentCopy(_kernel_memory(spec, raw[i])) for i, spec in enumerate(specs)
                      if isinstance(spec, (MemRefSpec, UnrankedSpec))}
            values = [copies[i].array if i in copies else value for i, value in enumerate(raw)]
            try:
                returned = python(*values)
            finally:
                for i, copy in copies.items():
                    copy.write_back(f"{kernel}(): callback @{name} argument #{i}")
            return None if result is None else result_value(returned)
        except BaseException as exc:  # the kernel cannot unwind: keep it for the caller
            pending.add(exc)
            return None if restype is None else restype().value

    return BoundCallback(f"_mlir_ciface_{name}", ctypes.CFUNCTYPE(restype, *argtypes)(trampoline))


def bind_callbacks(declared: Mapping[str, Callable[[], Signature]], callbacks: Mapping[str, Callable[..., Any]],
                   pending: PendingErrors, *, kernel: str) -> dict[str, BoundCallback]:
    """Bind each named declaration; SignatureError for a name that is not declared.

    ``declared`` maps each ``func.func`` declaration of the source to what reads its signature: only
    those bound to callbacks are read (see :func:`memkernel.compile.decoration.declarations`).
    ``kernel`` is the kernel's name, for the messages of errors raised at a call.
    """
    bound = {}
    for name, python in callbacks.items():
        if name not in declared:
            listed = ", ".join(f"@{n}" for n in declared) or "none"
            raise SignatureError(
                f"callbacks: no func.func private @{name} declaration in the MLIR source to bind "
                f"(declarations: {listed})."
            )
        if not callable(python):
            raise SignatureError(f"callbacks: @{name} is bound to {python!r}, which is not callable.")
        bound[name] = _bind(kernel, name, declared[name](), python, pending)
    return bound
