"""An XLA FFI handler for a kernel, written against XLA's C API with ctypes: what ``jax.ffi.ffi_call`` calls.

XLA calls a handler registered with ``jax.ffi.register_ffi_target`` as
``XLA_FFI_Error *handler(XLA_FFI_CallFrame *frame)`` (``xla/ffi/api/c_api.h``,
API version 0.1 and later; the structs below copy its layouts). The frame holds
the operand and result buffers XLA allocated (dense, row-major: data pointer and
dims); :class:`Handler` wraps them as numpy arrays in place, with no copy, and
runs the kernel on them: the results it allocates are the op's result buffers
(zero-filled first, as memkernel's allocated outputs are), a parameter the
kernel writes is copied into its result buffer and written there, scalar
results are stored into 0-d buffers. Scalars known at trace time do not travel
through XLA: they are kept here under a number, which the op passes as a 0-d
``int32`` operand, and reach the kernel as the Python values the caller gave.
Whatever the kernel raises is returned to XLA as an error whose message is the
exception's, which JAX raises as ``JaxRuntimeError`` from the jitted call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import forking
from ..model.contract import BufferContract
from .op_plan import OpPlan, as_tuple

_EXECUTE = 3
"""``XLA_FFI_ExecutionStage_EXECUTE``: the other stages (instantiate, prepare, initialize) have nothing to do."""
_METADATA = 1
"""``XLA_FFI_Extension_Metadata``: XLA asks the handler which API version it was written for."""
_API_VERSION = (0, 1)
_INTERNAL = 13
"""``XLA_FFI_Error_Code_INTERNAL``."""
_ERROR_CREATE_OFFSET = 48
"""Where ``XLA_FFI_Api`` holds ``XLA_FFI_Error_Create``: after struct_size, extension_start, the 24-byte
``XLA_FFI_Api_Version`` and internal_api."""


class _Extension(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int), ("next", ctypes.c_void_p)]


class _ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("major", ctypes.c_int), ("minor", ctypes.c_int)]


class _Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", _ApiVersion), ("traits", ctypes.c_uint32),
                ("state_type_id", ctypes.c_int64)]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("base", _Extension), ("metadata", ctypes.POINTER(_Metadata))]


class _Buffer(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("dtype", ctypes.c_int),
                ("data", ctypes.c_void_p), ("rank", ctypes.c_int64), ("dims", ctypes.POINTER(ctypes.c_int64))]


class _Buffers(ctypes.Structure):
    """``XLA_FFI_Args`` and ``XLA_FFI_Rets``, which share a layout; ``XLA_FFI_Attrs`` starts alike."""

    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("size", ctypes.c_int64),
                ("types", ctypes.c_void_p), ("items", ctypes.POINTER(ctypes.POINTER(_Buffer)))]


class _CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(_Extension)),
                ("api", ctypes.c_void_p), ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int), ("args", _Buffers),
                ("rets", _Buffers), ("attrs", _Buffers), ("future", ctypes.c_void_p)]


class _ErrorCreateArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("message", ctypes.c_char_p), ("errc", ctypes.c_int)]


_ERROR_CREATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_ErrorCreateArgs))
_HANDLER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_CallFrame))


class _Memory:
    """XLA's buffer as numpy reads memory it does not own (the array keeps this object, not the buffer)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, address: int, shape: tuple[int, ...], itemsize: int) -> None:
        self.__array_interface__ = {"data": (address, False), "shape": shape, "typestr": f"|V{itemsize}",
                                    "version": 3}


def _array(buffer: _Buffer, dtype: np.dtype) -> np.ndarray:
    """The numpy array over XLA's buffer, in place (any dtype, ml_dtypes' included, through a void view)."""
    dims = buffer.dims
    shape = tuple([dims[k] for k in range(buffer.rank)])
    if not buffer.data or 0 in shape:
        return np.zeros(shape, dtype)
    return np.asarray(_Memory(buffer.data, shape, dtype.itemsize)).view(dtype)


class Constants:
    """The trace-time scalars of a kernel's calls, each set kept once under a number (a jitted program
    reuses its number at every run), with the parameters that travel as operands instead and their dtypes."""

    def __init__(self) -> None:
        self._numbers: dict[tuple[Any, ...], int] = {}
        self._calls: list[tuple[tuple[Any, ...], tuple[tuple[int, np.dtype], ...]]] = []
        self._lock = forking.lock()

    def number(self, values: Sequence[Any], operands: Sequence[tuple[int, np.dtype]]) -> int:
        """The number of a call whose parameters are ``values``, but for ``operands`` (position, dtype)."""
        positions = {k for k, _ in operands}
        kept = tuple(None if k in positions else v for k, v in enumerate(values))
        key = (tuple(operands), tuple((type(v).__qualname__, repr(v)) for v in kept))
        with self._lock:
            number = self._numbers.get(key)
            if number is None:
                number = self._numbers[key] = len(self._calls)
                self._calls.append((kept, tuple(operands)))
            return number

    def call(self, number: int) -> tuple[tuple[Any, ...], tuple[tuple[int, np.dtype], ...]]:
        """The kept parameters (None where an operand goes) and the operands (position, dtype) of call
        ``number``."""
        return self._calls[number]


class Handler:
    """The FFI handler of one kernel: ``function`` (a ctypes function pointer) is what
    ``jax.ffi.register_ffi_target`` registers, wrapped in a capsule; it lives as long as this object."""

    def __init__(self, kernel: Callable[..., Any], plan: OpPlan, constants: Constants) -> None:
        self.kernel, self.plan, self.constants = kernel, plan, constants
        inputs = plan.inputs
        self.buffers = {k for k, c in enumerate(inputs) if isinstance(c, BufferContract)}
        self.written = [k for k, c in enumerate(inputs) if isinstance(c, BufferContract) and c.may_write]
        self.n_outputs = plan.spec.n_outputs
        self.function = _HANDLER(self._call)

    def _call(self, frame_pointer: Any) -> int | None:
        frame = frame_pointer.contents
        extension = frame.extension_start
        if extension and extension.contents.type == _METADATA:
            metadata = ctypes.cast(extension, ctypes.POINTER(_MetadataExtension)).contents.metadata.contents
            metadata.api_version.major, metadata.api_version.minor = _API_VERSION
            metadata.traits = 0
            return None
        if frame.stage != _EXECUTE:
            return None
        try:
            self._execute(frame)
        except BaseException as exc:  # XLA must get every failure as its error, never a silent success
            create = _ERROR_CREATE(ctypes.cast(frame.api + _ERROR_CREATE_OFFSET, ctypes.POINTER(ctypes.c_void_p))[0])
            message = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")
            return create(ctypes.byref(_ErrorCreateArgs(ctypes.sizeof(_ErrorCreateArgs), None, message, _INTERNAL)))
        return None

    def _execute(self, frame: _CallFrame) -> None:
        args, rets = frame.args.items, frame.rets.items
        kept, operands = self.constants.call(ctypes.c_int32.from_address(args[0].contents.data).value)
        values = list(kept)
        for position, (k, dtype) in enumerate(operands, start=1):
            array = _array(args[position].contents, dtype)
            values[k] = array if k in self.buffers else array[()]
        returned = self.plan.returned
        results = [_array(rets[j].contents, r.dtype) for j, r in enumerate(returned)]
        for j, k in enumerate(self.written, start=len(returned)):
            copy = _array(rets[j].contents, values[k].dtype)
            np.copyto(copy, values[k])
            values[k] = copy
        outputs = results[:self.n_outputs]
        for output in outputs:
            output.fill(0)
        out = None if not outputs else outputs[0] if len(outputs) == 1 else tuple(outputs)
        given = as_tuple(self.kernel(*values, out=out) if outputs else self.kernel(*values), len(returned))
        for target, value in zip(results[self.n_outputs:], given[self.n_outputs:]):
            target[...] = value
