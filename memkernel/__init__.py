"""memkernel: call MLIR memref kernels from Python like numpy functions.

The public API is what ``__all__`` names, with :mod:`memkernel.testing`,
:mod:`memkernel.dask`, the command line and the pytest plugin; every other
module is internal. Importing this package loads neither the MLIR bindings nor
memkernel's compiler: they load when a kernel must be parsed or compiled.

>>> from memkernel import mlir_kernel
>>> @mlir_kernel(SOURCE)
... def matmul(a, b):
...     return (a.shape[0], b.shape[1])
"""

from .errors import (
    AllocationError,
    ArgumentError,
    CallbackError,
    CallDepthError,
    ChunkingError,
    CompileError,
    DTypeError,
    KernelAssertionError,
    KernelCrashed,
    KernelTimeout,
    MemkernelError,
    MissingDependencyError,
    OptionError,
    MLIRSyntaxError,
    ShapeError,
    SignatureError,
    ValueRangeError,
)
from .foreign import extern
from .isolate.shared_arrays import shared_asarray, shared_empty, shared_like
from .kernel import Kernel, mlir_kernel

__version__ = "0.1.0"

__all__ = [
    "AllocationError",
    "ArgumentError",
    "CallDepthError",
    "CallbackError",
    "ChunkingError",
    "CompileError",
    "DTypeError",
    "KernelAssertionError",
    "Kernel",
    "KernelCrashed",
    "KernelTimeout",
    "MLIRSyntaxError",
    "MemkernelError",
    "MissingDependencyError",
    "OptionError",
    "ShapeError",
    "SignatureError",
    "ValueRangeError",
    "__version__",
    "extern",
    "mlir_kernel",
    "shared_asarray",
    "shared_empty",
    "shared_like",
]
