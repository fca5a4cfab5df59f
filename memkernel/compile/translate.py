"""LLVM IR from the LLVM dialect, for users who want to read what their kernel becomes.

The bindings do not expose MLIR's LLVM IR translation, and loading a second
copy of MLIR's C API next to them would mix two MLIR instances. The
``mlir-translate`` tool of the runtime libraries' package does it in a process
of its own.
"""

from __future__ import annotations

import os
import subprocess

from ..load import libraries
from ..errors import CompileError, MissingDependencyError


def _tool() -> str:
    for directory in libraries.search_directories():
        candidate = os.path.join(os.path.dirname(directory), "bin", "mlir-translate")
        if os.access(candidate, os.X_OK):
            return candidate
    raise MissingDependencyError(
        "LLVM IR translation needs the mlir-translate tool: pip install 'memkernel[runtime]'"
    )


def to_llvm_ir(llvm_dialect: str) -> str:
    """The LLVM IR of a module in the LLVM dialect (its text)."""
    done = subprocess.run([_tool(), "--mlir-to-llvmir"], input=llvm_dialect, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise CompileError(f"mlir-translate --mlir-to-llvmir failed:\n{done.stderr.strip()}")
    return done.stdout
