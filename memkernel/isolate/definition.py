"""What crosses to the worker: a kernel's definition, the call's values, the results that come back.

A :class:`Definition` is what :func:`~memkernel.mlir_kernel` was given, minus
what only the caller needs: the worker's kernel is built from the same
source, function, pipeline and options (its compiled code comes from the disk
cache when a process compiled it before), and a stand-in Python function with
the same signature (parameter names, defaults, dim annotations); the shape
function itself is never sent, since every output crosses as ``out=``.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .shared import Placed

if TYPE_CHECKING:
    from ..kernel import Kernel, KernelOptions

Value = tuple[str, Any]
"""One argument of a call: ``("array", Placed)`` in the segment, or ``("value", v)`` sent as it is."""

Result = tuple[Any, ...]
"""One result: ``("value", v)``, or ``("alias", offset, shape, strides, dtype)`` for an array in the segment."""


@dataclass(frozen=True)
class Definition:
    """How the worker builds a kernel: the kernel's options (every one of them, so none is forgotten), made
    to run in process with output capture off, and its Python signature."""

    options: KernelOptions
    signature: inspect.Signature

    @classmethod
    def of(cls, kernel: Kernel) -> Definition:
        options = dataclasses.replace(kernel.options, name=kernel.spec.name, callbacks={}, capture_output=False,
                                      isolate=False, timeout=None)
        return cls(options, inspect.signature(kernel.function))

    def build(self) -> Kernel:
        """The kernel, in process (the caller echoes what the worker prints, so no capture there)."""

        def stand_in(*args: Any, **kwargs: Any) -> None:
            return None

        stand_in.__signature__ = self.signature  # type: ignore[attr-defined]
        stand_in.__name__ = stand_in.__qualname__ = self.options.name or "kernel"
        return self.options.decorator()(stand_in)


def encode_results(results: tuple[Any, ...], base: int, size: int) -> list[Result]:
    """The worker's results as they cross: arrays that lie in the segment (``[base, base + size)``) by place."""
    encoded: list[Result] = []
    for result in results:
        if isinstance(result, np.ndarray) and result.size and size:
            address = int(result.__array_interface__["data"][0])
            if base <= address < base + size:
                encoded.append(("alias", address - base, result.shape, result.strides, result.dtype))
                continue
        encoded.append(("value", result))
    return encoded
