"""Python functions bound to the kernel's private ``func.func`` declarations.

``mlir_kernel(source, callbacks={"log_row": fn})`` binds ``func.func private
@log_row(...)``. The declaration gets a C interface, so the kernel calls
``_mlir_ciface_log_row`` with a pointer to each memref's descriptor and
scalars by value; memkernel defines that symbol as a ctypes callback which
hands ``fn`` numpy views of the memrefs (valid only during the call) and
Python numbers, and returns its scalar result to the kernel.

The kernel cannot be unwound from Python, so an exception raised by ``fn`` is
kept (the callback returns zero to the kernel, which runs on) and re-raised
from the kernel call once the kernel returns.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SignatureError
from .results import descriptor_array, read_descriptor
from ..spec.signature import ArgSpec, MemRefSpec, ScalarSpec, Signature, UnrankedSpec, read_signature
from ..spec.source import ParsedSource

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


def _view(spec: MemRefSpec | UnrankedSpec, pointer: int) -> np.ndarray:
    """A numpy view of the memref whose descriptor is at ``pointer``."""
    if isinstance(spec, UnrankedSpec):
        rank = ctypes.c_int64.from_address(pointer).value
        pointer = ctypes.c_void_p.from_address(pointer + 8).value or 0
    else:
        rank = spec.rank
    return descriptor_array(read_descriptor(pointer, rank), spec.element.dtype, None)


class PendingErrors:
    """Exceptions raised by a kernel's callbacks, kept until its call returns.

    Callbacks may run on the async runtime's worker threads (``parallel=True``), so
    the errors are kept for the kernel, not per thread: if two Python threads call
    the same kernel at once, an error may surface in the other thread's call, but
    it is never lost.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []

    def add(self, error: BaseException) -> None:
        with self._lock:
            self._errors.append(error)

    def raise_first(self) -> None:
        """Raise the first error kept (and forget the others), if any."""
        if self._errors:
            with self._lock:
                errors, self._errors = self._errors, []
            if errors:
                raise errors[0]


@dataclass
class BoundCallback:
    """One declaration bound to a Python function: its C-callable address and what keeps it alive."""

    symbol: str
    function: Any

    @property
    def address(self) -> int:
        return ctypes.cast(self.function, ctypes.c_void_p).value or 0


def _bind(name: str, signature: Signature, python: Callable[..., Any], pending: PendingErrors) -> BoundCallback:
    where = f"callback @{name}"
    argtypes = [_ctype(spec, f"{where} argument #{i}") for i, spec in enumerate(signature.args)]
    if len(signature.results) > 1 or any(not isinstance(r, ScalarSpec) for r in signature.results):
        raise SignatureError(f"{where} must return nothing or one scalar.")
    restype = _ctype(signature.results[0], f"{where} result") if signature.results else None
    specs = signature.args

    def trampoline(*raw: Any) -> Any:
        try:
            values = [_view(spec, value) if isinstance(spec, (MemRefSpec, UnrankedSpec)) else value
                      for spec, value in zip(specs, raw)]
            returned = python(*values)
            return None if restype is None else restype(returned).value
        except BaseException as exc:  # the kernel cannot unwind: keep it for the caller
            pending.add(exc)
            return None if restype is None else restype().value

    return BoundCallback(f"_mlir_ciface_{name}", ctypes.CFUNCTYPE(restype, *argtypes)(trampoline))


def declarations(parsed: ParsedSource) -> dict[str, Signature]:
    """Every ``func.func`` declaration (no body) of the source, by name."""
    found = {}
    for func in parsed.functions():
        if len(func.regions[0].blocks) == 0:
            signature = read_signature(func.operation)
            found[signature.name] = signature
    return found


def bind_callbacks(parsed: ParsedSource, callbacks: Mapping[str, Callable[..., Any]],
                   pending: PendingErrors) -> dict[str, BoundCallback]:
    """Bind each named declaration; SignatureError for a name that is not declared."""
    declared = declarations(parsed)
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
        bound[name] = _bind(name, declared[name], python, pending)
    return bound
