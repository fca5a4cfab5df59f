"""What crosses to the worker as pickles: a kernel's definition, and the results that come back.

A :class:`Definition` is what :func:`~memkernel.mlir_kernel` was given, minus
what only the caller needs: the worker's kernel is built from the same
source, function, pipeline and options (its compiled code comes from the disk
cache when a process compiled it before), and a stand-in Python function with
the same signature (parameter names, defaults, dim annotations); the shape
function itself is never sent, since every output crosses as ``out=``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import inspect
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..model.kernel_spec import KernelSpec
from ..options import KernelOptions
from .shared import Layout, Placed

Result = tuple[str, Any]
"""One result: ``("value", v)`` as it is, ``("alias", (number, Placed))`` in a segment the worker maps (see
:mod:`memkernel.isolate.request`), or ``("copied", Placed)`` in the :class:`Results` bytes."""


class Results(NamedTuple):
    """A call's results as they cross: each item, and the bytes of the arrays copied out of the worker's memory.

    Arrays the kernel returned in its own memory cross as the bytes they span,
    laid out by a :class:`~memkernel.isolate.shared.Layout`: each keeps its strides,
    and results that share a buffer in the worker share one in the caller.
    """

    items: list[Result]
    data: bytes


@dataclass(frozen=True)
class Definition:
    """How the worker builds a kernel: the kernel's options (every one of them, so none is forgotten), made
    to run in process with output capture off, and its Python signature."""

    options: KernelOptions
    signature: inspect.Signature

    @classmethod
    def of(cls, spec: KernelSpec, options: KernelOptions, function: Callable[..., Any]) -> Definition:
        """The definition of kernel ``spec``, made with ``options`` from the Python ``function``."""
        options = dataclasses.replace(options, name=spec.name, callbacks={}, capture_output=False, isolate=False,
                                      timeout=None)
        return cls(options, inspect.signature(function))

    def stand_in(self) -> Callable[..., None]:
        """A Python function with the kernel's signature, which shapes no output (every output crosses as
        ``out=``)."""

        def stand_in(*args: Any, **kwargs: Any) -> None:
            return None

        stand_in.__signature__ = self.signature  # type: ignore[attr-defined]
        stand_in.__name__ = stand_in.__qualname__ = self.options.name or "kernel"
        return stand_in


def encode_results(results: tuple[Any, ...], segments: dict[int, tuple[int, int]]) -> Results:
    """The worker's results as they cross: arrays that lie in one of the ``segments`` (their address and size by
    number) by number and place, other arrays as the bytes they span."""
    items: list[Result] = []
    copied: list[np.ndarray] = []
    for result in results:
        if isinstance(result, np.ndarray) and result.size:
            address = int(result.__array_interface__["data"][0])
            alias: Result | None = None
            for number, (base, size) in segments.items():
                if base <= address < base + size:
                    alias = ("alias", (number, Placed(address - base, result.shape, result.strides,
                                                        result.dtype.type, True)))
                    break
            if alias is not None:
                items.append(alias)
            else:
                items.append(("copied", len(copied)))
                copied.append(result)
        else:
            items.append(("value", result))
    layout = Layout(copied)
    data = bytearray(layout.size)
    for region in layout.regions:
        data[region.offset:region.offset + region.high - region.low] = ctypes.string_at(region.low,
                                                                                        region.high - region.low)
    placed = layout.placed(copied)
    items = [("copied", placed[item]) if kind == "copied" else (kind, item) for kind, item in items]
    return Results(items, bytes(data))
