"""Native symbol lookups the MLIR Python bindings do not expose.

``ExecutionEngine.raw_lookup`` only finds packed wrappers (``_mlir_<name>``).
memkernel also needs the plain symbols of the fast path and its constants
table, which the MLIR C API function ``mlirExecutionEngineLookup`` returns; it
is called here through ctypes on the bindings' own C API library.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os

from mlir.execution_engine import ExecutionEngine


class _StringRef(ctypes.Structure):
    _fields_ = [("data", ctypes.c_char_p), ("length", ctypes.c_size_t)]


@functools.lru_cache(maxsize=None)
def _capi() -> ctypes.CDLL:
    spec = importlib.util.find_spec("mlir._mlir_libs")
    assert spec is not None and spec.submodule_search_locations
    folder = next(iter(spec.submodule_search_locations))
    library = ctypes.CDLL(os.path.join(folder, "libMLIRPythonCAPI.so"))
    library.mlirExecutionEngineLookup.restype = ctypes.c_void_p
    library.mlirExecutionEngineLookup.argtypes = [ctypes.c_void_p, _StringRef]
    return library


def _engine_pointer(engine: ExecutionEngine) -> int:
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    capsule = engine._CAPIPtr
    return get_pointer(capsule, b"mlir.execution_engine.ExecutionEngine._CAPIPtr") or 0


def engine_symbol(engine: ExecutionEngine, name: str) -> int:
    """Address of symbol ``name`` in the engine's compiled module, 0 if absent."""
    encoded = name.encode()
    return _capi().mlirExecutionEngineLookup(_engine_pointer(engine), _StringRef(encoded, len(encoded))) or 0
