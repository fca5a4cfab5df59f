"""LLVM's process-wide state that compiling sets: its command-line options, and the runtime libraries an
ExecutionEngine must not own."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable, Sequence

from ..load.objects import StringRef, libllvm

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
    llvm = libllvm()
    arguments = [b"memkernel", *(option.encode() for option in options)]
    argv = (ctypes.c_char_p * len(arguments))(*arguments)
    if not hasattr(llvm, _PARSE_COMMAND_LINE):  # another LLVM: options parse, unknown ones are ignored
        llvm.LLVMParseCommandLineOptions(len(arguments), argv, None)
        return True
    parse = getattr(llvm, _PARSE_COMMAND_LINE)
    parse.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), StringRef, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p,
                      ctypes.c_bool]
    parse.restype = ctypes.c_bool
    llvm._ZN4llvm4errsEv.restype = ctypes.c_void_p  # llvm::errs(): errors are written there and returned, not exit(1)
    return bool(parse(len(arguments), argv, StringRef(b"", 0), llvm._ZN4llvm4errsEv(), None, None, False))


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
