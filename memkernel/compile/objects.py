"""Native code the MLIR Python bindings do not reach: symbol lookups, and objects linked without MLIR.

``ExecutionEngine.raw_lookup`` only finds packed wrappers (``_mlir_<name>``).
memkernel also needs the plain symbols of the fast path and its constants
table, which the MLIR C API function ``mlirExecutionEngineLookup`` returns; it
is called here through ctypes on the bindings' own C API library.

:class:`LoadedObject` links a cached object file into its own LLJIT through
LLVM's ORC C API, and frees that JIT when it is collected.
:func:`engine_libraries` keeps an ExecutionEngine from tearing down a runtime
library other kernels share when it is freed.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import weakref
from collections.abc import Iterable

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
        "LLVMOrcDisposeLLJIT": ([_P], _P),
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


def _dispose(jit: ctypes.c_void_p) -> None:
    error = _llvm().LLVMOrcDisposeLLJIT(jit)
    if error:  # the session's teardown failed; nothing more can be freed or reported from a finalizer
        _message(error, "LLVMDisposeErrorMessage")


class LoadedObject:
    """A relocatable object linked into its own LLJIT instance, against the process and ``libraries``.

    The JIT, and with it the object's code, lives as long as this object: it is
    freed (``LLVMOrcDisposeLLJIT``) when this object is collected, so whoever
    calls the code must hold this object. It is not freed at interpreter exit.
    Raises ObjectLoadError if LLVM cannot create the JIT or load the object.
    """

    def __init__(self, code: bytes, libraries: tuple[str, ...]) -> None:
        llvm = _llvm()
        self._jit = _P()
        _check(llvm.LLVMOrcCreateLLJIT(ctypes.byref(self._jit), None))
        self._release = weakref.finalize(self, _dispose, self._jit)
        self._release.atexit = False
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


# -- libraries an ExecutionEngine must not own ------------------------------------------

_ENGINE_HOOKS = ("__mlir_execution_engine_init", "__mlir_execution_engine_destroy")
_process_wide: dict[str, ctypes.CDLL] = {}


def _has_engine_hooks(path: str) -> bool:
    try:
        library = ctypes.CDLL(path)
    except OSError:
        return False
    return all(hasattr(library, hook) for hook in _ENGINE_HOOKS)


def engine_libraries(paths: Iterable[str]) -> list[str]:
    """The libraries of ``paths`` to give an ExecutionEngine's ``shared_libs``.

    An ExecutionEngine calls ``__mlir_execution_engine_destroy`` of each such
    library when it is freed. The async runtime's (``libmlir_async_runtime``,
    which ``parallel=True`` kernels call) destroys the one thread pool every
    parallel kernel in the process shares and leaves a null pointer behind: the
    next parallel kernel to run dereferences it (SIGSEGV). So a library with
    those hooks is instead loaded once into the process's global symbol scope,
    for good, where the engine's JIT finds its symbols, and is left out of the
    list; the engine then has no destroy hook to run.
    """
    kept = []
    for path in paths:
        if path in _process_wide or _has_engine_hooks(path):
            if path not in _process_wide:
                _process_wide[path] = ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
        else:
            kept.append(path)
    return kept
