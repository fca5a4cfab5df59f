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
``bf16``, ``f8*``,     ``ml_dtypes`` types
``f6*``, ``f4E2M1FN``  (one element per byte)
``complex<f32/f64>``   ``complex64/128``
=====================  =========================  ==============================
"""

from __future__ import annotations

import ctypes
import importlib
import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

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
    "f6E2M3FN": "float6_e2m3fn",
    "f6E3M2FN": "float6_e3m2fn",
    "f4E2M1FN": "float4_e2m1fn",
}

ML_DTYPES_TYPE_NAMES = frozenset(_ML_DTYPES_NAMES.values())
F8_NAMES = frozenset(name for name in _ML_DTYPES_NAMES if name.startswith("f8"))
SUB_BYTE_FLOAT_BITS = {"f6E2M3FN": 6, "f6E3M2FN": 6, "f4E2M1FN": 4}
"""The float types narrower than a byte, by width: LLVM holds each as an ``iN``, one per byte in
memory (as ``ml_dtypes`` does) but bit-packed in a vector."""
SMALL_FLOAT_NAMES = F8_NAMES | frozenset(SUB_BYTE_FLOAT_BITS)
"""The float types LLVM has no arithmetic for: f8, f6 and f4."""

# Per byte size: the struct format, numpy dtype and ctypes type of a value's raw bits.
_BITS_FORMAT = {1: "B", 2: "H", 4: "I", 8: "Q"}
_BITS_DTYPE = {size: np.dtype(f"uint{8 * size}") for size in _BITS_FORMAT}
_SIGNED_CTYPES = {1: ctypes.c_int8, 2: ctypes.c_int16, 4: ctypes.c_int32, 8: ctypes.c_int64}
_UNSIGNED_CTYPES = {1: ctypes.c_uint8, 2: ctypes.c_uint16, 4: ctypes.c_uint32, 8: ctypes.c_uint64}
# Floats that travel as themselves, not as their bits: (struct format, ctypes type).
_NATIVE_FLOATS = {"f32": ("f", ctypes.c_float), "f64": ("d", ctypes.c_double)}


@dataclass(frozen=True)
class ElementType:
    """What one MLIR element type means on the numpy side, and how one value of it travels.

    ``dtype`` is the dtype memkernel allocates and returns; ``accepted`` lists
    every dtype an argument may have (signless integers take both signs).
    ``int_range`` is the inclusive range a scalar argument may take. Every
    other way of writing a value of this type (its ``struct`` format, its
    LLVM type, its ctypes type) is derived here, in one place.
    """

    mlir: str
    dtype: np.dtype
    accepted: tuple[np.dtype, ...]
    kind: ScalarKind
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
        return self.kind == "float" and self.mlir not in _NATIVE_FLOATS

    @property
    def bits_dtype(self) -> np.dtype:
        """The unsigned integer dtype of the same size: how raw bits are read and written."""
        return _BITS_DTYPE[self.itemsize]

    @property
    def struct_format(self) -> str:
        """``struct`` format of one value: its bits for integers and packed floats."""
        if self.kind == "complex":
            return "ff" if self.itemsize == 8 else "dd"
        if self.mlir in _NATIVE_FLOATS:
            return _NATIVE_FLOATS[self.mlir][0]
        return _BITS_FORMAT[self.itemsize]

    @property
    def llvm_type(self) -> str:
        """The LLVM type a scalar of this type is passed as by the default calling convention."""
        if self.kind == "complex":
            part = "f32" if self.itemsize == 8 else "f64"
            return f"!llvm.struct<({part}, {part})>"
        if self.kind == "bool":
            return "i1"
        if self.mlir in ("f16", "bf16", *_NATIVE_FLOATS):
            return self.mlir
        return f"i{SUB_BYTE_FLOAT_BITS.get(self.mlir, 8 * self.itemsize)}"

    @property
    def ctype(self) -> Any:
        """The ctypes type of a scalar of this type, None where ctypes has none (f16, bf16, f8, complex)."""
        if self.kind == "bool":
            return ctypes.c_bool
        if self.kind == "int":
            signed = self.int_range is not None and self.int_range[0] < 0
            return (_SIGNED_CTYPES if signed else _UNSIGNED_CTYPES)[self.itemsize]
        if self.mlir in _NATIVE_FLOATS:
            return _NATIVE_FLOATS[self.mlir][1]
        return None


def _integer(width: int, signedness: str) -> ElementType:
    signed = np.dtype(f"int{width}")
    unsigned = np.dtype(f"uint{width}")
    if signedness == "signless":
        return ElementType(f"i{width}", signed, (signed, unsigned), "int",
                           (-(1 << (width - 1)), (1 << width) - 1))
    if signedness == "signed":
        return ElementType(f"si{width}", signed, (signed,), "int",
                           (-(1 << (width - 1)), (1 << (width - 1)) - 1))
    return ElementType(f"ui{width}", unsigned, (unsigned,), "int", (0, (1 << width) - 1))


def _native(name: str, dtype: np.dtype, kind: ScalarKind) -> ElementType:
    return ElementType(name, dtype, (dtype,), kind)


_BOOL = ElementType("i1", np.dtype(np.bool_), (np.dtype(np.bool_),), "bool", (-1, 1))
_INDEX = ElementType("index", np.dtype(np.int64), (np.dtype(np.int64),), "int",
                     (-(1 << 63), (1 << 63) - 1))
_FLOATS = {
    "f16": _native("f16", np.dtype(np.float16), "float"),
    "f32": _native("f32", np.dtype(np.float32), "float"),
    "f64": _native("f64", np.dtype(np.float64), "float"),
}
_COMPLEX = {
    "complex<f32>": _native("complex<f32>", np.dtype(np.complex64), "complex"),
    "complex<f64>": _native("complex<f64>", np.dtype(np.complex128), "complex"),
}


def ml_dtypes_dtype(mlir_name: str) -> np.dtype:
    """The ``ml_dtypes`` dtype of ``bf16`` or an f8, f6 or f4 type; raise if it is not installed
    (or too old to have it)."""
    try:
        module = importlib.import_module("ml_dtypes")
    except ImportError as exc:
        raise MissingDependencyError(
            f"element type {mlir_name} needs the optional package ml_dtypes: "
            "pip install 'memkernel[ml-dtypes]'"
        ) from exc
    attribute = _ML_DTYPES_NAMES[mlir_name]
    if not hasattr(module, attribute):
        raise MissingDependencyError(
            f"element type {mlir_name} needs ml_dtypes.{attribute}, which ml_dtypes {module.__version__} "
            "does not have: pip install -U ml_dtypes"
        )
    return np.dtype(getattr(module, attribute))


_INTEGER_NAME = re.compile(r"(s|u)?i(8|16|32|64)")
_SIGNEDNESS = {None: "signless", "s": "signed", "u": "unsigned"}


def element_named(name: str) -> ElementType | None:
    """The :class:`ElementType` of the MLIR scalar type spelled ``name`` (``i32``, ``ui8``, ``index``,
    ``f32``, ``complex<f64>``, ``bf16``, ...), or None if memkernel has none."""
    if name == "i1":
        return _BOOL
    if name == "index":
        return _INDEX
    integer = _INTEGER_NAME.fullmatch(name)
    if integer:
        return _integer(int(integer.group(2)), _SIGNEDNESS[integer.group(1)])
    if name in _FLOATS:
        return _FLOATS[name]
    if name in _COMPLEX:
        return _COMPLEX[name]
    if name in _ML_DTYPES_NAMES:
        return _native(name, ml_dtypes_dtype(name), "float")
    return None


def dtype_named(name: str) -> np.dtype:
    """The dtype whose ``.name`` is ``name``: numpy's, or ``ml_dtypes``' (``bfloat16``, ``float8_e4m3fn``);
    ValueError for none, MissingDependencyError for an ``ml_dtypes`` one without ``ml_dtypes``."""
    if name in ML_DTYPES_TYPE_NAMES:
        mlir = next(m for m, attribute in _ML_DTYPES_NAMES.items() if attribute == name)
        return ml_dtypes_dtype(mlir)
    try:
        return np.dtype(name)
    except TypeError:
        raise ValueError(f"no dtype is named {name!r}") from None


def dtype_expression(dtype: np.dtype) -> str:
    """How to write ``dtype`` in code: ``np.float32``, ``ml_dtypes.bfloat16``."""
    module = "ml_dtypes" if dtype.name in ML_DTYPES_TYPE_NAMES else "np"
    return f"{module}.{dtype.name}"


def describe_dtype(dtype: np.dtype) -> str:
    """A dtype's name as users write it, with its byte order if not native."""
    return dtype.name if dtype.isnative else f"{dtype.name} ({dtype.str}, non-native byte order)"
