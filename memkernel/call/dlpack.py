"""Arrays of other libraries as arguments: anything with ``__dlpack__`` (torch tensors, JAX arrays), zero-copy.

A binder takes such an argument through DLPack with :func:`imported`: the
device is asked first (``__dlpack_device__``, the CPU only), then numpy reads
the capsule (``np.from_dlpack``), and the ndarray it gives, a view of the
library's memory, is checked exactly as a numpy argument is (dtype, rank, dims,
layout, overlap, writability). ``bf16``, which numpy's DLPack reader does not
know, is read from the capsule here (:func:`_bfloat16_view`).

What comes back is given the caller's type by :func:`returned_as`: when every
array argument of a call is a torch tensor, the allocated outputs and the
returned memrefs become torch tensors sharing their memory (``torch.from_dlpack``);
when every one is a JAX array, they become JAX arrays, copied (``jnp.asarray``:
a JAX array never aliases memory numpy may write). Mixed arguments, and other
DLPack libraries, give numpy arrays.

Nothing here imports torch or JAX: a tensor exists only where its library was
imported, so :data:`sys.modules` tells which library made an argument. Only a
type's own attributes are asked (``type(x).__dlpack__``), never an instance's.
"""

from __future__ import annotations

import ctypes
import importlib
import operator
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..model.dtypes import dtype_expression, ml_dtypes_dtype
from .descriptors import is_array

_CPU = 1
_DEVICES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm",
            11: "ROCm host", 12: "extension device", 13: "CUDA managed", 14: "oneAPI", 15: "WebGPU",
            16: "Hexagon", 17: "MAIA", 18: "Trainium"}
"""DLPack's ``DLDeviceType`` codes, named."""


@dataclass(frozen=True)
class Library:
    """Which library an array argument comes from, for messages and for what a call returns."""

    name: str
    """``"numpy"``, ``"torch"``, ``"jax"``, or ``"other"`` (another ``__dlpack__`` type, or a non-array)."""
    described: str
    """How a message names its arrays: ``torch.Tensor``, ``jax.Array``, a type's qualified name."""

    def astype(self, argument: str, dtype: np.dtype) -> str:
        """The code that converts ``argument`` to ``dtype`` in this library."""
        if self.name == "torch":
            return f"{argument}.to(torch.{dtype.name})"
        if self.name == "jax":
            return f"{argument}.astype(jnp.{dtype.name})"
        return f"{argument}.astype({dtype_expression(dtype)})"

    def to_cpu(self, argument: str) -> str:
        """The code that brings ``argument`` to the CPU."""
        if self.name == "torch":
            return f"{argument}.cpu()"
        if self.name == "jax":
            return f"jax.device_put({argument}, jax.devices('cpu')[0])"
        return f"a copy of {argument} in CPU memory"


NUMPY = Library("numpy", "numpy array")
TORCH = Library("torch", "torch.Tensor")


def _family(value: Any) -> str:
    """``"numpy"``, ``"torch"``, ``"jax"`` or ``"other"``: which library made ``value``, by its type (a library
    not imported made none)."""
    kind = type(value)
    if kind is np.ndarray or issubclass(kind, np.ndarray):
        return "numpy"
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(kind, torch.Tensor):
        return "torch"
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(getattr(jax, "Array", None), type) and issubclass(kind, jax.Array):
        return "jax"
    return "other"


def library_of(value: Any) -> Library:
    """The library ``value``, an argument with ``__dlpack__``, comes from."""
    family = _family(value)
    if family == "torch":
        return TORCH
    if family == "jax":
        return Library("jax", "jax.Array")
    kind = type(value)
    return Library(family, f"{kind.__module__}.{kind.__qualname__}")


def speaks_dlpack(value: Any) -> bool:
    """Whether ``value`` is an array of another library: not an ndarray, and its type has ``__dlpack__``."""
    return not is_array(value) and callable(getattr(type(value), "__dlpack__", None))


def _device(value: Any, where: str, library: Library) -> tuple[int, int]:
    """``value``'s DLPack device, as its type's ``__dlpack_device__`` gives it; ArgumentError if that fails."""
    method = getattr(type(value), "__dlpack_device__", None)
    try:
        if method is None:
            raise TypeError("its type has __dlpack__ but no __dlpack_device__")
        device = method(value)
        if type(device) is not tuple or len(device) != 2:
            raise TypeError(f"__dlpack_device__() returned {device!r}, not a (device type, device id) tuple")
        return operator.index(device[0]), operator.index(device[1])
    except Exception as exc:
        if library.name == "jax" and _deleted(value):
            raise ArgumentError(
                f"{where}; got a jax.Array that was deleted (by .delete(), or donated to a jitted function): its "
                "memory is freed. Pass an array that is alive."
            ) from None
        raise ArgumentError(
            f"{where}; got a {library.described} whose device memkernel cannot read ({type(exc).__name__}: "
            f"{exc}). Pass a numpy array, or an array whose __dlpack_device__ follows the DLPack protocol."
        ) from None


def _deleted(value: Any) -> bool:
    """Whether ``value``, a JAX array, was deleted, as its type's ``is_deleted`` says; False where it cannot say."""
    try:
        return type(value).is_deleted(value) is True
    except Exception:  # a jax.Array subclass without it, or one that raises
        return False


def ask(value: Any, where: str, argument: str, library: Library) -> tuple[bool, Any]:
    """What must be asked of ``value`` before its memory is read: its device (ArgumentError naming it when it is
    not the CPU) and, for a torch tensor, what DLPack does not say (ArgumentError for one that requires grad, has
    its negative or conjugate bit set, or has no memory: a fake or meta tensor). Returns whether the memory must
    be read-only (an inference tensor outside inference mode, which torch forbids writing) and what the call must
    hold to keep the memory alive: a torch tensor's storage (see :func:`_torch_storage`), else None.

    ``where`` starts each message (the kernel and the argument, see
    :meth:`~memkernel.model.contract.BufferContract.where`); ``argument`` names it in the fix. Asking may run
    Python code (a ``__dlpack_device__``, a torch ``__torch_function__`` mode), so a call asks every argument
    before it reads any (see :func:`memkernel.call.binders.import_arrays`).
    """
    device_type, device_id = _device(value, where, library)
    if device_type != _CPU:
        device = _DEVICES.get(device_type, f"DLPack device type {device_type}")
        raise ArgumentError(
            f"{where}; got a {library.described} on device {device}:{device_id}. memkernel's kernels run on "
            f"the CPU: pass {library.to_cpu(argument)}."
        )
    if library.name != "torch":
        return False, None
    refusal = _torch_refusal(value, argument)
    if refusal is not None:
        raise ArgumentError(f"{where}; got a torch.Tensor {refusal}")
    return _torch_inference_tensor(value), _torch_storage(value, where)


def _torch_storage(value: Any, where: str) -> Any:
    """A torch tensor's storage, which the call holds: the export of a tensor holds the tensor, not its memory,
    which Python code the call runs later (a callback, an argument's ``__array__``) may free with ``set_()``.

    ArgumentError for a tensor with no memory to read: a FakeTensor (``FakeTensorMode``), whose DLPack device is
    the CPU but whose storage is on the meta device with a null data pointer. Asked with ``__torch_function__``
    off, of torch's own base class, so a subclass cannot answer for its storage.
    """
    torch = sys.modules["torch"]
    base = torch._C.TensorBase
    try:
        with torch._C.DisableTorchFunction():
            storage = base.untyped_storage(value)
            device = storage.device.type
            sizes, strides = base.size(value), base.stride(value)
            reach = 0 if 0 in sizes else (base.storage_offset(value) + 1
                                          + sum((n - 1) * s for n, s in zip(sizes, strides))) * base.element_size(value)
            data, size = (storage.data_ptr(), storage.nbytes()) if device == "cpu" else (0, 0)
    except Exception as exc:  # a tensor subclass without storage
        raise ArgumentError(f"{where}; got a torch.Tensor without storage ({type(exc).__name__}: {exc}), so "
                            "there is no memory for a kernel to read. Pass a tensor with its data on the CPU."
                            ) from None
    if device != "cpu" or (data == 0 and reach > 0):
        kind = " (a fake tensor of FakeTensorMode, or a meta tensor)" if device == "meta" else ""
        raise ArgumentError(f"{where}; got a torch.Tensor whose storage is on device {device} with data pointer "
                            f"{data:#x}{kind}: it has no memory for a kernel to read or write. Pass a real tensor "
                            "on the CPU.")
    if reach > size:
        raise ArgumentError(f"{where}; got a torch.Tensor whose storage holds {size} bytes, fewer than the "
                            f"{reach} its view reaches (the storage was resized under it). Pass a tensor whose "
                            "storage holds its elements.")
    return storage


class _Exported:
    """A DLPack capsule already made, for ``np.from_dlpack`` to read."""

    def __init__(self, capsule: object) -> None:
        self.capsule = capsule

    def __dlpack__(self, **kwargs: Any) -> object:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_CPU, 0)


def _torch_export(value: Any) -> Any:
    """What ``np.from_dlpack`` reads a torch tensor from: torch's C export of it, which runs no Python code
    (``Tensor.__dlpack__`` consults ``__torch_function__`` modes); the tensor itself where torch has none."""
    export = getattr(sys.modules["torch"]._C, "_to_dlpack_versioned", None)
    return value if export is None else _Exported(export(value))


def imported(value: Any, where: str, argument: str, library: Library, read_only: bool = False) -> np.ndarray:
    """``value``'s memory as an ndarray, zero-copy, through DLPack: read-only where the library exports it so,
    or ``read_only`` (what :func:`ask`, which must come first, said).

    Raises ArgumentError saying why for a ``__dlpack__`` that fails or returns what is not a DLPack capsule of
    CPU memory.
    """
    exporter = value
    try:
        if library.name == "torch":
            exporter = _torch_export(value)
        array = np.from_dlpack(exporter)
    except Exception as exc:  # anything a __dlpack__ raises, or what numpy says of what it returned
        error = exc
    else:
        if read_only:
            array.flags.writeable = False
        return array
    view = _bfloat16_view(exporter)
    if view is not None:
        if read_only:
            view.flags.writeable = False
        return view
    detail = f"{type(error).__name__}: {error}"
    raise ArgumentError(
        f"{where}; got a {library.described} whose memory memkernel cannot read through DLPack ({detail}). "
        "Pass a numpy array, or an array whose __dlpack__ follows the DLPack protocol."
    ) from None


def _torch_refusal(value: Any, argument: str) -> str | None:
    """Why a torch tensor cannot be shared as its memory (the end of a message), or None.

    torch's ``__dlpack__`` refuses a tensor that requires grad or has its conjugate bit, but exports one whose
    negative bit is set (``z.conj().imag``) as the memory, whose values are the negation of the tensor's. Asked of
    torch's own base class, which no subclass overrides.
    """
    base = sys.modules["torch"]._C.TensorBase
    if base.requires_grad.__get__(value):
        return (f"that requires grad: a kernel is not differentiated by autograd, so torch does not share it. "
                f"Pass {argument}.detach().")
    if base.is_conj(value):
        return f"with its conjugate bit set, whose memory holds the unconjugated values. Pass {argument}.resolve_conj()."
    if base.is_neg(value):
        return f"with its negative bit set, whose memory holds the negated values. Pass {argument}.resolve_neg()."
    return None


def _torch_inference_tensor(value: Any) -> bool:
    """Whether ``value`` is an inference tensor while inference mode is off: torch forbids writing it then."""
    torch = sys.modules["torch"]
    return bool(torch._C.TensorBase.is_inference(value)) and not torch.is_inference_mode_enabled()


def read_only_reason(value: Any, library: Library, argument: str) -> str:
    """Why ``value``, an array of ``library``, came through DLPack read-only, and what to pass instead."""
    if library.name == "torch" and _torch_inference_tensor(value):
        return ("it is an inference tensor, which torch forbids writing outside torch.inference_mode(). "
                f"Pass {argument}.clone(), or call the kernel inside inference mode")
    if library.name == "jax":
        return ("JAX arrays are immutable (their DLPack export is read-only), so a kernel cannot write one. "
                "Leave it out for a new jax.Array, or pass a numpy array or a torch tensor")
    return (f"its library exports a {library.described} read-only through DLPack, so a kernel cannot write "
            "it. Pass a writable array")


# -- bf16: numpy's DLPack reader knows no bfloat16 ---------------------------------------------

_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.argtypes, _capsule_valid.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.argtypes, _capsule_pointer.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p

_BFLOAT = 4
"""``kDLBfloat``, DLPack's code of bfloat16."""
_READ_ONLY = 1
"""``DLPACK_FLAG_BITMASK_READ_ONLY``."""


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


class _CapsuleMemory:
    """Exposes a DLPack capsule's tensor to numpy while holding the capsule, whose destructor releases it."""

    def __init__(self, capsule: object, tensor: _DLTensor, shape: tuple[int, ...], strides: tuple[int, ...],
                 read_only: bool) -> None:
        self.capsule = capsule
        self.__array_interface__ = {"version": 3, "typestr": "<u2", "shape": shape, "strides": strides,
                                    "data": ((tensor.data or 0) + tensor.byte_offset, read_only)}


def _capsule(value: Any) -> tuple[object, int, bool] | None:
    """``value``'s DLPack capsule, the address of its DLTensor and whether it is read-only: a versioned
    capsule's flags say; a legacy one's (a producer without DLPack 1.0) has none, and only JAX's is read-only."""
    method = type(value).__dlpack__
    try:
        capsule = method(value, max_version=(1, 0))
    except TypeError:
        capsule = None
    except Exception:
        return None
    if type(capsule).__name__ == "PyCapsule" and _capsule_valid(capsule, b"dltensor_versioned"):
        managed = _capsule_pointer(capsule, b"dltensor_versioned")
        flags = ctypes.c_uint64.from_address(managed + 24).value  # after version, manager_ctx, deleter
        return capsule, managed + 32, bool(flags & _READ_ONLY)
    try:
        capsule = method(value)
    except Exception:
        return None
    if type(capsule).__name__ == "PyCapsule" and _capsule_valid(capsule, b"dltensor"):
        return capsule, _capsule_pointer(capsule, b"dltensor"), _family(value) == "jax"  # DLManagedTensor starts with it
    return None


def _bfloat16_view(value: Any) -> np.ndarray | None:
    """A bf16 CPU tensor's memory as an ``ml_dtypes.bfloat16`` ndarray, read from its DLPack capsule; None when
    ``value`` exports anything else (or ml_dtypes is missing), leaving the error to numpy's reader."""
    exported = _capsule(value)
    if exported is None:
        return None
    capsule, address, read_only = exported
    tensor = _DLTensor.from_address(address)
    if (tensor.device_type, tensor.code, tensor.bits, tensor.lanes) != (_CPU, _BFLOAT, 16, 1) \
            or not 0 <= tensor.ndim <= 64 or (tensor.ndim and not tensor.shape):
        return None
    try:
        dtype = ml_dtypes_dtype("bf16")
    except ImportError:
        return None
    rank = tensor.ndim
    shape = tuple((ctypes.c_int64 * rank).from_address(tensor.shape)) if rank else ()
    if tensor.strides:
        strides = tuple(2 * s for s in (ctypes.c_int64 * rank).from_address(tensor.strides))
    else:
        strides = tuple(2 * int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(rank))
    try:
        bits = np.asarray(_CapsuleMemory(capsule, tensor, shape, strides, read_only))
    except ValueError:  # sizes numpy refuses: a capsule that lies
        return None
    return bits.view(dtype)


# -- what a call returns -------------------------------------------------------------------------------


def callers_library(values: Any) -> str | None:
    """``"torch"`` or ``"jax"`` when every one of ``values`` (a call's array arguments) is an array of that
    library; None otherwise (numpy arrays, other libraries', sequences, or a mix)."""
    found = None
    for value in values:
        if value is None:
            continue
        family = _family(value)
        if family not in ("torch", "jax") or found not in (None, family):
            return None
        found = family
    return found


def returned_as(library: str, returned: Any) -> Any:
    """``returned`` (what a call returns: None, a value, or a tuple of them) with each ndarray in it made an
    array of ``library``: a torch tensor sharing its memory, or a JAX array holding a copy."""
    if type(returned) is tuple:
        return tuple(returned_as(library, r) for r in returned)
    if type(returned) is not np.ndarray:
        return returned
    if library == "torch":
        torch = sys.modules["torch"]
        if returned.dtype.type.__module__ != "ml_dtypes":
            return torch.from_dlpack(returned)
        same = getattr(torch, returned.dtype.name, None)  # torch.bfloat16, torch.float8_e4m3fn: same bits
        if not isinstance(same, torch.dtype):
            return returned
        bits = returned.view(np.dtype(f"u{returned.itemsize}"))
        return torch.from_dlpack(bits).view(same)
    return importlib.import_module("jax.numpy").asarray(returned)
