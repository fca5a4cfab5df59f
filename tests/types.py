"""The MLIR element types the tests cover, and the numpy dtype memkernel must map each to."""

from __future__ import annotations

import ml_dtypes
import numpy as np

FLOATS = {
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f8E4M3FN": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "f8E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "f8E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "f8E4M3B11FNUZ": np.dtype(ml_dtypes.float8_e4m3b11fnuz),
    "f8E4M3": np.dtype(ml_dtypes.float8_e4m3),
    "f8E3M4": np.dtype(ml_dtypes.float8_e3m4),
    "f8E8M0FNU": np.dtype(ml_dtypes.float8_e8m0fnu),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
}
SIGNLESS = {f"i{w}": np.dtype(f"int{w}") for w in (8, 16, 32, 64)}
SIGNED = {f"si{w}": np.dtype(f"int{w}") for w in (8, 16, 32, 64)}
UNSIGNED = {f"ui{w}": np.dtype(f"uint{w}") for w in (8, 16, 32, 64)}
INTEGERS = {**SIGNLESS, **SIGNED, **UNSIGNED, "index": np.dtype(np.int64)}
COMPLEX = {"complex<f32>": np.dtype(np.complex64), "complex<f64>": np.dtype(np.complex128)}
ALL_TYPES = {**FLOATS, "i1": np.dtype(np.bool_), **INTEGERS, **COMPLEX}
