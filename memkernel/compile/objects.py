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


# -- loading a compiled object without MLIR: LLVM's ORC JIT through its C API ----------

_P = ctypes.c_void_p


@functools.lru_cache(maxsize=None)
def _llvm() -> ctypes.CDLL:
    """libLLVM, the very library the MLIR bindings loaded (found by its soname)."""
    library = ctypes.CDLL("libLLVM.so")
    for name in ("LLVMInitializeX86TargetInfo", "LLVMInitializeX86Target", "LLVMInitializeX86TargetMC",
                 "LLVMInitializeX86AsmPrinter"):
        getattr(library, name)()
    signatures = {
        "LLVMOrcCreateLLJIT": ([ctypes.POINTER(_P), _P], _P),
        "LLVMOrcLLJITGetMainJITDylib": ([_P], _P),
        "LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess": ([ctypes.POINTER(_P), ctypes.c_char, _P, _P], _P),
        "LLVMOrcCreateDynamicLibrarySearchGeneratorForPath": (
            [ctypes.POINTER(_P), ctypes.c_char_p, ctypes.c_char, _P, _P], _P),
        "LLVMOrcJITDylibAddGenerator": ([_P, _P], None),
        "LLVMCreateMemoryBufferWithMemoryRangeCopy": ([ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p], _P),
        "LLVMOrcLLJITAddObjectFile": ([_P, _P, _P], _P),
        "LLVMOrcLLJITLookup": ([_P, ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p], _P),
        "LLVMGetErrorMessage": ([_P], _P),
        "LLVMDisposeErrorMessage": ([_P], None),
        "LLVMGetHostCPUName": ([], _P),
        "LLVMGetHostCPUFeatures": ([], _P),
        "LLVMDisposeMessage": ([_P], None),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = restype
    return library


def _message(pointer: int, dispose: str) -> str:
    text = ctypes.string_at(pointer).decode(errors="replace")
    getattr(_llvm(), dispose)(pointer)
    return text


@functools.lru_cache(maxsize=None)
def host_cpu() -> str:
    """The host CPU's name and features as LLVM sees them: compiled code is specific to them."""
    llvm = _llvm()
    return _message(llvm.LLVMGetHostCPUName(), "LLVMDisposeMessage") + ";" + _message(
        llvm.LLVMGetHostCPUFeatures(), "LLVMDisposeMessage")


class ObjectLoadError(Exception):
    """LLVM refused to load or link a cached object."""


def _check(error: int | None) -> None:
    if error:
        raise ObjectLoadError(_message(error, "LLVMDisposeErrorMessage"))


class LoadedObject:
    """A relocatable object linked into its own LLJIT instance, against the process and ``libraries``.

    The instance lives as long as this object; its code is never unmapped while
    a kernel can still call it.
    """

    def __init__(self, code: bytes, libraries: tuple[str, ...]) -> None:
        llvm = _llvm()
        self._jit = _P()
        _check(llvm.LLVMOrcCreateLLJIT(ctypes.byref(self._jit), None))
        dylib = llvm.LLVMOrcLLJITGetMainJITDylib(self._jit)
        generator = _P()
        _check(llvm.LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(ctypes.byref(generator), b"\0", None, None))
        llvm.LLVMOrcJITDylibAddGenerator(dylib, generator)
        for path in libraries:
            generator = _P()
            _check(llvm.LLVMOrcCreateDynamicLibrarySearchGeneratorForPath(
                ctypes.byref(generator), path.encode(), b"\0", None, None))
            llvm.LLVMOrcJITDylibAddGenerator(dylib, generator)
        buffer = llvm.LLVMCreateMemoryBufferWithMemoryRangeCopy(code, len(code), b"memkernel")
        _check(llvm.LLVMOrcLLJITAddObjectFile(self._jit, dylib, buffer))

    def symbol(self, name: str) -> int:
        """Address of ``name``; ObjectLoadError if it is missing or does not link."""
        address = ctypes.c_uint64()
        _check(_llvm().LLVMOrcLLJITLookup(self._jit, ctypes.byref(address), name.encode()))
        return address.value
