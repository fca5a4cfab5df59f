"""The model as JSON: what decoration read (:class:`~memkernel.model.kernel_spec.KernelIR`) round-trips
through the disk cache and to the workers, so a cached kernel is decorated without reading its IR.

:func:`encode` turns a value of the model (its frozen dataclasses, tuples,
frozensets, ints, strings, None) into JSON-ready data, and :func:`decode` back
into equal values; an element type travels by its MLIR name. :func:`digest` is
a deterministic hash of a value, for cache keys. Anything else, or data that
does not decode to the model, raises :class:`CodecError`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np

from .contract import BufferContract, ScalarContract
from .dtypes import ElementType, dtype_named, element_named
from .foreign import ForeignSymbol
from .kernel_spec import KernelIR
from .shapes import AffineBound, Bound, Dim, ShapeRules, Tie
from .signature import MemRefSpec, ScalarSpec, Signature, Strided, UnrankedSpec
from .views import Reach, Size, Split, View

_TYPES: dict[str, type] = {cls.__name__: cls for cls in (
    KernelIR, Signature, MemRefSpec, UnrankedSpec, ScalarSpec, Strided, Tie, Bound, AffineBound, Dim,
    ShapeRules, BufferContract, ScalarContract, View, Size, Split, Reach, ForeignSymbol)}


class CodecError(ValueError):
    """Data that is not an encoded value of the model."""


def encode(value: Any) -> Any:
    """``value`` as JSON-ready data (see the module docstring)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, ElementType):
        return {"element": value.mlir}
    if isinstance(value, np.dtype):
        return {"dtype": value.name}
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, frozenset):
        return {"frozenset": sorted((encode(v) for v in value), key=json.dumps)}
    if isinstance(value, dict):
        return {"dict": [[encode(k), encode(v)] for k, v in sorted(value.items())]}
    if dataclasses.is_dataclass(value) and type(value).__name__ in _TYPES:
        return {"type": type(value).__name__,
                "fields": {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    raise CodecError(f"{type(value).__name__} {value!r} is not a value of the kernel model")


def decode(data: Any) -> Any:
    """The value :func:`encode` made ``data`` from; CodecError if ``data`` is not such."""
    if data is None or isinstance(data, (bool, int, str)):
        return data
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict) or len(data) not in (1, 2):
        raise CodecError(f"not an encoded model value: {data!r}")
    if "element" in data:
        element = element_named(data["element"])
        if element is None:
            raise CodecError(f"unknown element type {data['element']!r}")
        return element
    if "dtype" in data:
        try:
            return dtype_named(data["dtype"])
        except ValueError as exc:
            raise CodecError(str(exc)) from None
    if "tuple" in data:
        return tuple(decode(v) for v in data["tuple"])
    if "frozenset" in data:
        return frozenset(decode(v) for v in data["frozenset"])
    if "dict" in data:
        return {decode(k): decode(v) for k, v in data["dict"]}
    cls = _TYPES.get(data.get("type", ""))
    fields = data.get("fields")
    if cls is None or not isinstance(fields, dict):
        raise CodecError(f"not an encoded model value: {data!r}")
    try:
        return cls(**{name: decode(value) for name, value in fields.items()})
    except TypeError as exc:
        raise CodecError(f"{cls.__name__} does not take {sorted(fields)}: {exc}") from None


def dumps(value: Any) -> str:
    """``value`` encoded as compact, deterministic JSON text."""
    return json.dumps(encode(value), sort_keys=True, separators=(",", ":"))


def loads(text: str | bytes) -> Any:
    """The value :func:`dumps` wrote; CodecError for anything else."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CodecError(f"not JSON: {exc}") from None
    return decode(data)


def digest(value: Any) -> str:
    """A SHA-256 of ``value``'s encoding: equal values, equal digests, in every process."""
    return hashlib.sha256(dumps(value).encode()).hexdigest()
