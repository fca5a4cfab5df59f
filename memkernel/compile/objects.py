"""Native code the MLIR Python bindings do not reach: objects linked without MLIR, LLVM's options.

:class:`LoadedObject` links a kernel's object file (from the compile worker or
the disk cache) into its own LLJIT through LLVM's ORC C API, with the
callbacks' symbols defined, and frees that JIT when it is collected; its
:meth:`~LoadedObject.symbol` finds the kernel's entry points, the fast path
and its constants table. :func:`parse_llvm_options` sets LLVM's command-line
options. :func:`engine_libraries` keeps an ExecutionEngine from tearing down a
runtime library other kernels share when it is freed.
"""

from __future__ import annotations

import ctypes
import functools
import os
import weakref
from collections.abc import Iterable, Mapping, Sequence

import mlir.ir  # noqa: F401  (loads libLLVM.so, which _llvm() then finds by its soname)


class _StringRef(ctypes.Structure):
    _fields_ = [("data", ctypes.c_char_p), ("length", ctypes.c_size_t)]


# -- loading a compiled object without MLIR: LLVM's ORC JIT through its C API ----------

_P = ctypes.c_void_p


class _SymbolFlags(ctypes.Structure):
    _fields_ = [("generic", ctypes.c_uint8), ("target", ctypes.c_uint8)]


class _EvaluatedSymbol(ctypes.Structure):
    _fields_ = [("address", ctypes.c_uint64), ("flags", _SymbolFlags)]


class _SymbolMapPair(ctypes.Structure):
    _fields_ = [("name", _P), ("symbol", _EvaluatedSymbol)]


_EXPORTED_CALLABLE = _SymbolFlags(1 | 4)  # LLVMJITSymbolGenericFlagsExported | LLVMJITSymbolGenericFlagsCallable


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
        "LLVMOrcLLJITMangleAndIntern": ([_P, ctypes.c_char_p], _P),
        "LLVMOrcAbsoluteSymbols": ([ctypes.POINTER(_SymbolMapPair), ctypes.c_size_t], _P),
        "LLVMOrcJITDylibDefine": ([_P, _P], _P),
        "LLVMOrcDisposeMaterializationUnit": ([_P], None),
        "LLVMParseCommandLineOptions": ([ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.c_char_p], None),
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

    ``symbols`` maps names the object refers to (the ``_mlir_ciface_<name>``
    of Python callbacks) to the addresses they resolve to, ahead of the process
    and the libraries.

    The JIT, and with it the object's code, lives as long as this object: it is
    freed (``LLVMOrcDisposeLLJIT``) when this object is collected, so whoever
    calls the code must hold this object. It is not freed at interpreter exit.
    Raises ObjectLoadError if LLVM cannot create the JIT or load the object.
    """

    def __init__(self, code: bytes, libraries: tuple[str, ...], symbols: Mapping[str, int] | None = None) -> None:
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
        if symbols:
            self._define(dylib, symbols)
        buffer = llvm.LLVMCreateMemoryBufferWithMemoryRangeCopy(code, len(code), b"memkernel")
        _check(llvm.LLVMOrcLLJITAddObjectFile(self._jit, dylib, buffer))

    def _define(self, dylib: int, symbols: Mapping[str, int]) -> None:
        """Define ``symbols`` (name to address: functions the object calls) in ``dylib``, before the object."""
        llvm = _llvm()
        pairs = (_SymbolMapPair * len(symbols))(*(
            _SymbolMapPair(llvm.LLVMOrcLLJITMangleAndIntern(self._jit, name.encode()),
                           _EvaluatedSymbol(address, _EXPORTED_CALLABLE))
            for name, address in symbols.items()))
        unit = llvm.LLVMOrcAbsoluteSymbols(pairs, len(symbols))  # takes the interned names
        error = llvm.LLVMOrcJITDylibDefine(dylib, unit)
        if error:  # the unit is still ours
            llvm.LLVMOrcDisposeMaterializationUnit(unit)
        _check(error)

    def symbol(self, name: str) -> int:
        """Address of ``name``; ObjectLoadError if it is missing or does not link."""
        address = ctypes.c_uint64()
        _check(_llvm().LLVMOrcLLJITLookup(self._jit, ctypes.byref(address), name.encode()))
        return address.value


_PARSE_COMMAND_LINE = ("_ZN4llvm2cl23ParseCommandLineOptionsEiPKPKcNS_9StringRefEPNS_11raw_ostreamEPNS_3vfs10"
                       "FileSystemES2_b")
"""``llvm::cl::ParseCommandLineOptions`` of LLVM 22, which reports whether the options parsed; the C API's
``LLVMParseCommandLineOptions`` ignores unknown options without a word."""


def parse_llvm_options(options: Sequence[str]) -> bool:
    """Set LLVM's command-line options (``-enable-matrix``...) for this process, for good.

    They are process-global, and LLVM parses them once: call this at most once
    per process, before any compilation. Returns False, LLVM's reason written
    on stderr, if LLVM does not know an option or its value.
    """
    llvm = _llvm()
    arguments = [b"memkernel", *(option.encode() for option in options)]
    argv = (ctypes.c_char_p * len(arguments))(*arguments)
    if not hasattr(llvm, _PARSE_COMMAND_LINE):  # another LLVM: options parse, unknown ones are ignored
        llvm.LLVMParseCommandLineOptions(len(arguments), argv, None)
        return True
    parse = getattr(llvm, _PARSE_COMMAND_LINE)
    parse.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), _StringRef, _P, _P, ctypes.c_char_p,
                      ctypes.c_bool]
    parse.restype = ctypes.c_bool
    llvm._ZN4llvm4errsEv.restype = _P  # llvm::errs(): errors are written there and returned, not exit(1)
    return bool(parse(len(arguments), argv, _StringRef(b"", 0), llvm._ZN4llvm4errsEv(), None, None, False))


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
