"""What crosses to the worker: a kernel's definition, the call's values, the results that come back.

A :class:`Definition` is what :func:`~memkernel.mlir_kernel` was given, minus
what only the caller needs: the worker's kernel is built from the same
source, function, pipeline and options (its compiled code comes from the disk
cache when a process compiled it before), and a stand-in Python function with
the same signature (parameter names, defaults, dim annotations); the shape
function itself is never sent, since every output crosses as ``out=``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .shared import Placed

if TYPE_CHECKING:
    from ..kernel import Kernel

Value = tuple[str, Any]
"""One argument of a call: ``("array", Placed)`` in the segment, or ``("value", v)`` sent as it is."""

Result = tuple[Any, ...]
"""One result: ``("value", v)``, or ``("alias", offset, shape, strides, dtype)`` for an array in the segment."""


@dataclass(frozen=True)
class Definition:
    """How the worker builds a kernel."""

    source: str
    name: str
    pipeline: str | None
    opt_level: int
    shared_libs: tuple[str, ...]
    cache: bool
    parallel: bool
    signature: inspect.Signature

    @classmethod
    def of(cls, kernel: Kernel) -> Definition:
        options = kernel.options
        return cls(options.source, kernel.spec.name, options.pipeline, options.opt_level,
                   tuple(str(lib) for lib in options.shared_libs), options.cache, options.parallel,
                   inspect.signature(kernel._function))

    def build(self) -> Kernel:
        """The kernel, in process (never isolated again), its output capture off: the caller echoes the worker's output."""
        from ..kernel import Kernel

        def stand_in(*args: Any, **kwargs: Any) -> None:
            return None

        stand_in.__signature__ = self.signature  # type: ignore[attr-defined]
        stand_in.__name__ = stand_in.__qualname__ = self.name
        return Kernel(stand_in, self.source, name=self.name, pipeline=self.pipeline, opt_level=self.opt_level,
                      shared_libs=self.shared_libs, cache=self.cache, capture_output=False,
                      parallel=self.parallel, isolate=False)


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
