"""Per-argument binders: the checked path's side of each argument's contract.

A binder is built once per kernel argument from its
:class:`~memkernel.model.contract.BufferContract` or
:class:`~memkernel.model.contract.ScalarContract`. A call runs it in two
steps: :meth:`Binder.check` converts the Python value once (a sequence to an
array, a number to its bits) and checks it against the contract, or raises the
error that explains what is wrong; :meth:`Binder.pack` turns the checked value
into the raw descriptor fields the call frame packs, choosing zero-copy or a
copy. Copies and copy-backs go through the :class:`CallState` so that the same
view passed twice stays one buffer.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ArgumentError, DTypeError, ShapeError, ValueRangeError
from ..model.contract import BufferContract, Contract, ScalarContract
from ..model.dtypes import ElementType, describe_dtype, dtype_expression
from . import descriptors, dlpack, scalars
from .allocation import allocation_error
from .dlpack import NUMPY, Library, library_of, speaks_dlpack
from .descriptors import contiguous_strides, data_pointer, element_strides, is_array, plain_array

_ADDRESS_MASK = (1 << 64) - 1


@dataclass
class CallState:
    """What one call keeps alive and must copy back once the kernel returns.

    ``buffers`` maps each memref argument's allocated pointer to the array passed,
    so that a returned memref aliasing an argument is recognised.
    """

    keep: list[Any] = field(default_factory=list)
    buffers: dict[int, np.ndarray] = field(default_factory=dict)
    copies: dict[tuple[Any, ...], np.ndarray] = field(default_factory=dict)
    copy_back: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def copy_of(self, array: np.ndarray, make_copy: Any, write_back: bool) -> np.ndarray:
        """One temporary per distinct view of memory, copied back after the call if it may be written."""
        key = (data_pointer(array), array.shape, array.strides, array.dtype.str)
        temp = self.copies.get(key)
        if temp is None:
            temp = make_copy(array)
            self.copies[key] = temp
        if write_back and array.flags.writeable:
            self.copy_back[key] = (array, temp)
        return temp

    def finish(self) -> None:
        for original, temp in self.copy_back.values():
            np.copyto(original, temp, casting="no")


def describe_value(value: Any) -> str:
    """What was given, as in ``float64[3, 5]`` (an ndarray subclass as its C fields say)."""
    if is_array(value):
        value = plain_array(value)
        return f"{describe_dtype(value.dtype)}[{', '.join(str(d) for d in value.shape)}]"
    if isinstance(value, np.generic):
        return f"{value.dtype.name} scalar {value!r}"
    if isinstance(value, (bool, int, float, complex)):
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__


def _carries_its_dtype(value: Any) -> bool:
    """Whether ``value`` is typed memory (an element type of its own), not Python numbers."""
    if isinstance(value, (list, tuple, bool, int, float, complex, np.generic)):
        return False
    if hasattr(value, "__array_interface__") or hasattr(value, "__array_struct__") or hasattr(value, "__array__"):
        return True
    try:
        memoryview(value)
    except TypeError:
        return False
    return True


def _convertible(source: np.dtype, element: ElementType) -> bool:
    """Whether a value of a Python sequence or scalar converts without changing meaning."""
    kinds = {"bool": "b", "int": "biu", "float": "biuf", "complex": "biufc"}[element.kind]
    return source.kind in kinds


class Binder:
    """Checks and converts one argument against its contract."""

    contract: Contract

    @property
    def struct_format(self) -> str:
        """``struct`` format of the values :meth:`pack` returns."""
        raise NotImplementedError

    def check(self, value: Any, state: CallState, imported: tuple[np.ndarray, Library] | None = None) -> Any:
        """``value`` converted once and checked; raise the error that explains it if wrong. ``imported``:
        ``value``, an array of another library, as :func:`import_arrays` read it."""
        raise NotImplementedError

    def pack(self, checked: Any, state: CallState) -> tuple[Any, ...]:
        """The raw values to pack for a value :meth:`check` returned."""
        raise NotImplementedError


class ScalarBinder(Binder):
    contract: ScalarContract

    def __init__(self, contract: ScalarContract) -> None:
        self.contract = contract

    @property
    def struct_format(self) -> str:
        return self.contract.element.struct_format

    def check(self, value: Any, state: CallState, imported: tuple[np.ndarray, Library] | None = None
              ) -> tuple[Any, ...]:
        try:
            return scalars.encode(value, self.contract.element)
        except scalars.ScalarValueError as exc:
            error = ArgumentError if exc.is_type_error else ValueRangeError
            raise error(f"{self.contract.where()}: {exc}") from None

    def pack(self, checked: tuple[Any, ...], state: CallState) -> tuple[Any, ...]:
        return checked


class _BufferBinder(Binder):
    """Shared by ranked and unranked memrefs: array checks, coercion of inputs, copies."""

    contract: BufferContract

    def __init__(self, contract: BufferContract) -> None:
        self.contract = contract
        self.element = contract.element
        self.name = contract.name

    def _where(self) -> str:
        return self.contract.where()

    def check(self, value: Any, state: CallState, imported: tuple[np.ndarray, Library] | None = None) -> np.ndarray:
        contract = self.contract
        masked = sys.modules.get("numpy.ma")  # np.ma itself imports numpy.ma (17 ms) at a process's first check
        if masked is not None and isinstance(value, masked.MaskedArray):
            raise ArgumentError(
                f"{self._where()}; got a masked array {describe_value(value)}. A kernel does not see masks: "
                f"pass {self.name}.filled(fill_value) or np.ma.getdata({self.name})."
            )
        library = NUMPY
        if is_array(value):
            # Every later check and the descriptor read the C fields, never a subclass's properties.
            array = plain_array(value)
        elif speaks_dlpack(value):
            # A torch tensor, a JAX array: its memory as an ndarray, checked from here on as numpy's are.
            array, library = imported or self.imported(value, state)
        elif contract.needs_writeable:
            why = "an output" if contract.is_output else "an argument the kernel may write"
            raise ArgumentError(
                f"{self._where()}; got {describe_value(value)}. It is {why}, so pass a writable "
                f"numpy array of dtype {self.element.dtype.name}."
            )
        else:
            array = self._coerce(value)
            state.keep.append(array)
        if not array.dtype.isnative:
            raise ArgumentError(
                f"{self._where()}; got {describe_value(array)}. Pass "
                f"{self.name}.astype({dtype_expression(self.element.dtype)}) to get native byte order."
            )
        if array.dtype not in contract.dtypes:
            raise DTypeError(
                f"{self._where()} ({contract.expectation()}); got {self._described(array, library)}. "
                f"Pass {library.astype(self.name, self.element.dtype)}{self._shape_fix(array)}."
            )
        if not array.flags.writeable and contract.needs_writeable:
            where = "as out=" if contract.is_output else "for an argument the kernel may write"
            if library is not NUMPY:
                raise ArgumentError(f"{self._where()}; got a read-only {self._described(array, library)} {where}: "
                                    f"{dlpack.read_only_reason(value, library, self.name)}.")
            raise ArgumentError(
                f"{self._where()}; got a read-only array {describe_value(array)} {where}. "
                f"Pass a writable array, e.g. {self.name}.copy()."
            )
        self._check_shape(array)
        return array

    def asked(self, value: Any) -> tuple[Library, bool, Any]:
        """Ask ``value``, an array of another library, what must be known before its memory is read (see
        :func:`memkernel.call.dlpack.ask`): its library, whether it is read only, and what holds its memory."""
        library = library_of(value)
        return (library, *dlpack.ask(value, self._where(), self.name, library))

    def imported(self, value: Any, state: CallState, asked: tuple[Library, bool, Any] | None = None
                 ) -> tuple[np.ndarray, Library]:
        """``value``, an array of another library, as an ndarray of its memory that the call keeps alive."""
        library, read_only, holder = asked or self.asked(value)
        array = dlpack.imported(value, self._where(), self.name, library, read_only)
        state.keep += [array, holder]
        return array, library

    @staticmethod
    def _described(array: np.ndarray, library: Library) -> str:
        """``float64[3]``, or ``torch.Tensor float64[3]`` for another library's array."""
        shown = describe_value(array)
        return shown if library is NUMPY else f"{library.described} {shown}"

    def _shape_fix(self, array: np.ndarray) -> str:
        return ""

    def _check_shape(self, array: np.ndarray) -> None:
        pass

    def _coerce(self, value: Any) -> np.ndarray:
        """An array of the element's dtype holding ``value``'s values exactly; refuse rather than change one."""
        try:
            natural = np.asarray(value)
        except (ValueError, TypeError, MemoryError, OverflowError, RecursionError) as exc:
            raise ArgumentError(
                f"{self._where()}; got {describe_value(value)}, which numpy cannot make an array of "
                f"({type(exc).__name__}: {exc}). Pass a numpy array of dtype {self.element.dtype.name}."
            ) from None
        if _carries_its_dtype(value):
            # Typed memory (array.array, memoryview, objects with __array__) is held to an ndarray's rule.
            return natural
        if natural.dtype == object or not _convertible(natural.dtype, self.element):
            raise ArgumentError(
                f"{self._where()}; got {describe_value(value)}, which does not convert to "
                f"{self.element.dtype.name} without changing its values. Pass a numpy array of "
                f"dtype {self.element.dtype.name}."
            )
        if self.element.kind in ("float", "complex"):
            with np.errstate(over="ignore", invalid="ignore"):
                converted = natural.astype(self.element.dtype)
                back = converted.astype(natural.dtype)
            if np.any(np.isfinite(natural) & ~np.isfinite(converted)):
                raise ValueRangeError(
                    f"{self._where()}; got {describe_value(value)} with values that overflow "
                    f"{self.element.mlir}."
                )
            changed = (back != natural) & ~(np.isnan(natural) & np.isnan(back))
            if np.any(changed):
                first = natural[changed].flat[0].item()
                raise ValueRangeError(
                    f"{self._where()}; got {describe_value(value)} whose value {first!r} is not exactly a "
                    f"{self.element.dtype.name}. Round it explicitly: np.asarray({self.name}, "
                    f"{dtype_expression(self.element.dtype)})."
                )
            return converted
        if natural.dtype.kind not in "iu" or self.element.kind != "int":
            return natural.astype(self.element.dtype)
        # Integers: the first accepted dtype that holds every value (a signless type takes either sign).
        for dtype in self.element.accepted:
            converted = natural.astype(dtype)
            if np.array_equal(converted, natural):
                return converted
        raise ValueRangeError(
            f"{self._where()}; got {describe_value(value)} with values out of range for "
            f"{self.element.mlir}."
        )

    def _contiguous(self, array: np.ndarray, state: CallState) -> np.ndarray:
        if descriptors.is_direct_contiguous(array):
            return array
        return self._copy(array, state, descriptors.contiguous_copy, "a C-contiguous copy",
                          "Pass a smaller or C-contiguous array, or give the memref a strided layout "
                          f"(strided<[{', '.join(['?'] * array.ndim)}], offset: ?>), which reads views in place.")

    def _copy(self, array: np.ndarray, state: CallState, make_copy: Callable[[np.ndarray], np.ndarray],
              copy: str, fix: str) -> np.ndarray:
        """The call's copy of ``array`` (see :meth:`CallState.copy_of`), which the kernel reads instead of a
        view it cannot use in place; AllocationError naming the argument, the view and the ``copy`` it needs
        when memory for that copy cannot be had (a broadcast view of 2**40 elements), and saying ``fix``."""
        try:
            return state.copy_of(array, make_copy, self.contract.needs_writeable)
        except MemoryError:
            raise allocation_error(
                f"{self._where()}; got {describe_value(array)} with byte strides {array.strides}, which the kernel "
                f"cannot use in place: it needs {copy}", array.shape, array.dtype, fix) from None


class MemRefBinder(_BufferBinder):
    @property
    def struct_format(self) -> str:
        return descriptors.ranked_format(self.contract.rank or 0)

    def _shape_fix(self, array: np.ndarray) -> str:
        contract = self.contract
        fits = array.ndim == contract.rank and all(array.shape[i] == d for i, d in contract.static_dims)
        return "" if fits else f" with shape {contract.shape_text()}"

    def __init__(self, contract: BufferContract) -> None:
        super().__init__(contract)
        self._rank = contract.rank
        self._static_dims = contract.static_dims  # computed once: a call reads them for every array

    def _check_shape(self, array: np.ndarray) -> None:
        contract = self.contract
        if array.ndim != self._rank:
            raise ArgumentError(
                f"{self._where()} ({contract.expectation()}); got {describe_value(array)}. "
                f"Pass an array of shape {contract.shape_text()}."
            )
        for i, want in self._static_dims:
            if array.shape[i] != want:
                raise ShapeError(
                    f"{self._where()} ({contract.expectation()}); got {describe_value(array)}: "
                    f"dim {i} is {array.shape[i]}, not {want}. Pass an array of shape {contract.shape_text()}."
                )

    def pack(self, array: np.ndarray, state: CallState) -> tuple[Any, ...]:
        contract = self.contract
        if contract.needs_contiguous:
            array = self._contiguous(array, state)
            pointer = data_pointer(array)
            state.buffers[pointer] = array
            return (pointer, pointer, 0, *array.shape, *contiguous_strides(array.shape))
        strides = self._layout_strides(array)
        if strides is None:
            array = self._copy(array, state, self._realizing_copy, "a copy with the layout's strides",
                               "Pass a smaller array, or one whose strides fit the layout.")
            strides = self._layout_strides(array)
            assert strides is not None
        pointer = data_pointer(array)
        offset = contract.layout_offset
        aligned = (pointer - offset * array.itemsize) & _ADDRESS_MASK
        state.buffers[aligned] = array
        return (aligned, aligned, offset, *array.shape, *strides)

    def _layout_strides(self, array: np.ndarray) -> tuple[int, ...] | None:
        """The descriptor strides if the array's memory fits the layout as it is, else None."""
        if array.size == 0:
            return self.contract.descriptor_strides(array.shape, (0,) * array.ndim)
        if not array.flags.aligned:
            return None
        actual = element_strides(array)
        if actual is None:
            return None
        return self.contract.descriptor_strides(array.shape, actual)

    def _realizing_copy(self, array: np.ndarray) -> np.ndarray:
        for order in ("C", "F"):
            copy = np.array(array, order=order, copy=True)
            if self._layout_strides(copy) is not None:
                return copy
        raise ArgumentError(
            f"{self._where()}; got {describe_value(array)}, and no C- or Fortran-ordered copy of "
            f"that shape has the layout's static strides. Pass an array whose strides match."
        )


class UnrankedBinder(_BufferBinder):
    @property
    def struct_format(self) -> str:
        return descriptors.UNRANKED_FORMAT

    def pack(self, array: np.ndarray, state: CallState) -> tuple[Any, ...]:
        array = self._contiguous(array, state)
        pointer = data_pointer(array)
        state.buffers[pointer] = array
        fields = (pointer, pointer, 0, *array.shape, *contiguous_strides(array.shape))
        ranked = descriptors.ranked_struct(array.ndim)
        buffer = ctypes.create_string_buffer(ranked.size)
        ranked.pack_into(buffer, 0, *fields)
        state.keep.append(buffer)
        return (array.ndim, ctypes.addressof(buffer))


def import_arrays(binders: Sequence[Binder], values: Sequence[Any], state: CallState
                  ) -> dict[int, tuple[np.ndarray, Library]]:
    """The arrays of other libraries among ``values`` (``binders``' arguments; None for an output to allocate),
    by position, each read as an ndarray of its memory.

    Everything that may run Python code, which could resize or free an argument's memory, comes before any
    torch tensor is read: each argument's device and torch flags are asked first, then other libraries' arrays
    are read (their ``__dlpack__`` is Python code), torch tensors last, through torch's C export. numpy arrays
    cannot be resized while the call holds them.
    """
    asked = []
    for i, (binder, value) in enumerate(zip(binders, values)):
        if isinstance(binder, _BufferBinder) and speaks_dlpack(value):
            asked.append((i, binder, value, binder.asked(value)))
    asked.sort(key=lambda entry: entry[3][0].name == "torch")
    return {i: binder.imported(value, state, answers) for i, binder, value, answers in asked}


def binder_for(contract: Contract) -> Binder:
    """The checked path's binder of one argument."""
    if isinstance(contract, ScalarContract):
        return ScalarBinder(contract)
    if contract.rank is None:
        return UnrankedBinder(contract)
    return MemRefBinder(contract)
