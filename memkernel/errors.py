"""The exceptions memkernel raises.

Every error is a :class:`MemkernelError`. Each also derives from the builtin
exception a numpy user would expect in its place (``TypeError`` for a wrong
argument, ``ValueError`` for a wrong shape), so existing ``except`` clauses keep
working.
"""

from __future__ import annotations


class MemkernelError(Exception):
    """Base class of every error memkernel raises."""


class MLIRSyntaxError(MemkernelError, ValueError):
    """The MLIR source does not parse or verify.

    The message holds each diagnostic with its ``line:column`` and the source
    line it points at.
    """


class SignatureError(MemkernelError, TypeError):
    """The kernel function cannot be called from Python as written.

    Raised when the kernel is decorated: the function is missing, an argument or
    result type is not supported, or the Python signature does not fit the MLIR one.
    """


class CompileError(MemkernelError, RuntimeError):
    """Lowering or JIT compilation failed; the message holds MLIR's diagnostics."""


class ArgumentError(MemkernelError, TypeError):
    """A call passed the wrong arguments: their number, names, dtypes or ranks."""


class DTypeError(ArgumentError):
    """An array argument's dtype is not one its memref's element type takes (a ``float64`` tensor for
    ``memref<?xf32>``)."""


class ShapeError(MemkernelError, ValueError):
    """A static dimension does not match, or an output shape cannot be derived."""


class ValueRangeError(MemkernelError, ValueError):
    """A value does not fit its MLIR type: an integer out of range, a float that overflows."""


class MissingDependencyError(MemkernelError, ImportError):
    """An optional dependency that this kernel needs is not installed."""


class CallbackError(MemkernelError, TypeError):
    """A Python callback bound with ``callbacks=`` broke its declaration's contract.

    It returned a value its declared result type cannot take, or changed the
    shape or dtype of a memref's array in place.
    """


class AllocationError(MemkernelError, MemoryError):
    """Memory for an output or a returned buffer could not be had: the message says which and how much."""


class CallDepthError(MemkernelError, RecursionError):
    """A kernel was called with too little of Python's recursion limit left to make the call."""


class ChunkingError(MemkernelError, TypeError):
    """:func:`memkernel.dask.apply` cannot split this kernel's work into chunks (see :mod:`memkernel.dask`)."""


class KernelCrashed(MemkernelError, RuntimeError):
    """An isolated call's worker process died: the kernel crashed (``isolate=True``, see :mod:`memkernel.isolate`).

    ``signal`` is the signal's name (``"SIGSEGV"``) or None when the worker
    exited; ``kernel`` the kernel's name; ``arguments`` a summary of what the
    call passed; ``output`` the last lines the worker wrote to its stderr. The
    worker is restarted at the next call; the caller's arrays are left as they
    were before the call.
    """

    def __init__(self, message: str, *, signal: str | None = None, kernel: str = "", arguments: str = "",
                 output: str = "") -> None:
        super().__init__(message)
        self.signal = signal
        self.kernel = kernel
        self.arguments = arguments
        self.output = output

    def __reduce__(self) -> tuple[type, tuple[str], dict[str, object]]:
        return type(self), (str(self),), dict(self.__dict__)


class KernelTimeout(MemkernelError, TimeoutError):
    """An isolated call ran longer than its ``timeout=``: the worker was killed, and is restarted at the next call."""


class KernelAssertionError(MemkernelError, AssertionError):
    """A ``cf.assert`` in the kernel failed: the user's own, or a runtime check of ``checked=True``.

    The kernel stopped at the failed check; what it had written before is in the
    arrays. The message is the assertion's, with the source line it points at;
    ``assertion`` is the assertion's message alone, as the ``cf.assert`` gives it
    (what MLIR's own lowering prints before it aborts).
    """

    def __init__(self, message: str, *, assertion: str = "") -> None:
        super().__init__(message)
        self.assertion = assertion

    def __reduce__(self) -> tuple[type, tuple[str], dict[str, object]]:
        return type(self), (str(self),), dict(self.__dict__)


class OptionError(MemkernelError, ValueError, TypeError):
    """An option of :func:`~memkernel.mlir_kernel` or of a kernel's method has a wrong type or value."""
