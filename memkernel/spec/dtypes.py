"""Which numpy dtype each MLIR element type maps to.

The mapping goes by dtype kind and size, never by platform C type names:
``i32`` is four bytes whatever ``long`` means on the host.

=====================  =========================  ==============================
MLIR                   allocated / returned       also accepted for memrefs
=====================  =========================  ==============================
``i1``                 ``bool``
``i8`` .. ``i64``      ``int8`` .. ``int64``      ``uint8`` .. ``uint64``
``si8`` .. ``si64``    ``int8`` .. ``int64``
``ui8`` .. ``ui64``    ``uint8`` .. ``uint64``
``index``              ``int64``
``f16/f32/f64``        ``float16/32/64``
``bf16``, ``f8*``      ``ml_dtypes`` types
``complex<f32/f64>``   ``complex64/128``
=====================  =========================  ==============================
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Literal

import numpy as np
from mlir import ir

from ..errors import MissingDependencyError

ScalarKind = Literal["bool", "int", "float", "complex"]

# MLIR float type name -> ml_dtypes attribute.
_ML_DTYPES_NAMES = {
    "bf16": "bfloat16",
    "f8E4M3FN": "float8_e4m3fn",
    "f8E5M2": "float8_e5m2",
    "f8E4M3FNUZ": "float8_e4m3fnuz",
    "f8E5M2FNUZ": "float8_e5m2fnuz",
    "f8E4M3B11FNUZ": "float8_e4m3b11fnuz",
    "f8E4M3": "float8_e4m3",
    "f8E3M4": "float8_e3m4",
    "f8E8M0FNU": "float8_e8m0fnu",
}

ML_DTYPES_TYPE_NAMES = frozenset(_ML_DTYPES_NAMES.values())
F8_NAMES = frozenset(name for name in _ML_DTYPES_NAMES if name.startswith("f8"))

_UNSIGNED_BITS_FORMAT = {1: "B", 2: "H", 4: "I", 8: "Q"}


@dataclass(frozen=True)
class ElementType:
    """What one MLIR element type means on the numpy side.

    ``dtype`` is the dtype memkernel allocates and returns; ``accepted`` lists
    every dtype an argument may have (signless integers take both signs).
    ``int_range`` is the inclusive range a scalar argument may take.
    ``struct_format`` packs one value's bits for the ``struct`` module.
    """

    mlir: str
    dtype: np.dtype
    accepted: tuple[np.dtype, ...]
    kind: ScalarKind
    struct_format: str
    int_range: tuple[int, int] | None = None

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def alignment(self) -> int:
        """ABI alignment of the value inside an LLVM struct (x86-64)."""
        return self.itemsize // 2 if self.kind == "complex" else self.itemsize

    @property
    def bits_are_packed(self) -> bool:
        """True when a scalar travels as raw integer bits (f16, bf16, f8)."""
        return self.kind == "float" and self.struct_format not in ("f", "d")

    def accepts(self, dtype: np.dtype) -> bool:
        return dtype in self.accepted


def _integer(width: int, signedness: str) -> ElementType:
    nbytes = width // 8
    signed = np.dtype(f"int{width}")
    unsigned = np.dtype(f"uint{width}")
    fmt = _UNSIGNED_BITS_FORMAT[nbytes]
    prefix = {"signless": "i", "signed": "si", "unsigned": "ui"}[signedness]
    if signedness == "signless":
        return ElementType(f"i{width}", signed, (signed, unsigned), "int", fmt,
                           (-(1 << (width - 1)), (1 << width) - 1))
    if signedness == "signed":
        return ElementType(f"si{width}", signed, (signed,), "int", fmt,
                           (-(1 << (width - 1)), (1 << (width - 1)) - 1))
    return ElementType(f"{prefix}{width}", unsigned, (unsigned,), "int", fmt, (0, (1 << width) - 1))


def _native(name: str, dtype: np.dtype, kind: ScalarKind, fmt: str) -> ElementType:
    return ElementType(name, dtype, (dtype,), kind, fmt)


_BOOL = ElementType("i1", np.dtype(np.bool_), (np.dtype(np.bool_),), "bool", "B", (-1, 1))
_INDEX = ElementType("index", np.dtype(np.int64), (np.dtype(np.int64),), "int", "Q",
                     (-(1 << 63), (1 << 63) - 1))
_FLOATS = {
    "f16": _native("f16", np.dtype(np.float16), "float", "H"),
    "f32": _native("f32", np.dtype(np.float32), "float", "f"),
    "f64": _native("f64", np.dtype(np.float64), "float", "d"),
}
_COMPLEX = {
    "complex<f32>": _native("complex<f32>", np.dtype(np.complex64), "complex", "ff"),
    "complex<f64>": _native("complex<f64>", np.dtype(np.complex128), "complex", "dd"),
}


def ml_dtypes_dtype(mlir_name: str) -> np.dtype:
    """The ``ml_dtypes`` dtype of ``bf16`` or an f8 type; raise if it is not installed."""
    try:
        module = importlib.import_module("ml_dtypes")
    except ImportError as exc:
        raise MissingDependencyError(
            f"element type {mlir_name} needs the optional package ml_dtypes: "
            "pip install 'memkernel[ml-dtypes]'"
        ) from exc
    return np.dtype(getattr(module, _ML_DTYPES_NAMES[mlir_name]))


def element_type(t: ir.Type) -> ElementType | None:
    """The :class:`ElementType` of an MLIR scalar type, or None if memkernel has none."""
    name = str(t)
    if isinstance(t, ir.IntegerType):
        width = t.width
        if width == 1 and t.is_signless:
            return _BOOL
        if width not in (8, 16, 32, 64):
            return None
        if t.is_signless:
            return _integer(width, "signless")
        return _integer(width, "signed" if t.is_signed else "unsigned")
    if isinstance(t, ir.IndexType):
        return _INDEX
    if name in _FLOATS:
        return _FLOATS[name]
    if name in _COMPLEX:
        return _COMPLEX[name]
    if name in _ML_DTYPES_NAMES:
        dtype = ml_dtypes_dtype(name)
        return _native(name, dtype, "float", _UNSIGNED_BITS_FORMAT[dtype.itemsize])
    return None


def dtype_expression(dtype: np.dtype) -> str:
    """How to write ``dtype`` in code: ``np.float32``, ``ml_dtypes.bfloat16``."""
    module = "ml_dtypes" if dtype.name in ML_DTYPES_TYPE_NAMES else "np"
    return f"{module}.{dtype.name}"


def describe_dtype(dtype: np.dtype) -> str:
    """A dtype's name as users write it, with its byte order if not native."""
    return dtype.name if dtype.isnative else f"{dtype.name} ({dtype.str}, non-native byte order)"
