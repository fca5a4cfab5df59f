"""Where CPython and numpy keep the fields the compiled fast path reads.

The fast path (see :mod:`memkernel.compile.fast_path`) reads numpy arrays,
tuples, floats and ints directly in machine code. The offsets in :class:`Layout`
are those of CPython 3.10-3.13 (standard, GIL builds) and numpy's
``PyArrayObject_fields``; the compiled entry also allocates outputs with
``PyArray_Zeros`` from numpy's C API table (:func:`numpy_api`). They are
checked against live objects at the first compile of a kernel in the process
(:func:`fast_path_supported`, once per process); if any check fails the fast path is switched off and every call takes
the checked Python path, which gives the same answers. ``MEMKERNEL_FAST_PATH=0``
in the environment switches it off too (:func:`fast_path_enabled`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from dataclasses import dataclass

import numpy as np

FAST_PATH_VARIABLE = "MEMKERNEL_FAST_PATH"


@dataclass(frozen=True)
class Layout:
    """Byte offsets and flag bits of the objects the fast path reads (x86-64, 8-byte words).

    Ints have no offset here: the fast path checks their ``ob_type`` and reads
    them with ``PyLong_AsLongLongAndOverflow``, never ``PyLongObject``'s digits;
    a bool is compared with ``Py_True`` by address.
    """

    # PyObject (Include/object.h): ob_refcnt, then ob_type; every object starts so.
    ob_type: int = 8
    # PyTupleObject (Include/cpython/tupleobject.h): PyObject_VAR_HEAD (refcnt, type, ob_size), ob_item[].
    tuple_size: int = 16
    tuple_items: int = 24
    # PyFloatObject (Include/cpython/floatobject.h): PyObject_HEAD, then double ob_fval.
    float_value: int = 16
    # PyArrayObject_fields (numpy/ndarraytypes.h): PyObject_HEAD, then char *data, int nd,
    # npy_intp *dimensions, npy_intp *strides, PyObject *base, PyArray_Descr *descr, int flags.
    array_data: int = 16
    array_nd: int = 24
    array_dims: int = 32
    array_strides: int = 40
    array_descr: int = 56
    array_flags: int = 64
    # NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_ALIGNED, NPY_ARRAY_WRITEABLE (numpy/ndarraytypes.h).
    c_contiguous: int = 0x1
    aligned: int = 0x100
    writeable: int = 0x400


LAYOUT = Layout()


def _word(address: int) -> int:
    return ctypes.c_int64.from_address(address).value


def _int32(address: int) -> int:
    return ctypes.c_int32.from_address(address).value


def _runs_with_the_gil() -> bool:
    return sys.implementation.name == "cpython" and getattr(sys, "_is_gil_enabled", lambda: True)() is not False


def _object_fields_hold() -> bool:
    """``ob_type``, the tuple items and the float value, read inside a tuple and a float."""
    items = (1.5, 2.5)
    return (_word(id(items) + LAYOUT.ob_type) == id(tuple)
            and _word(id(items) + LAYOUT.tuple_size) == len(items)
            and _word(id(items) + LAYOUT.tuple_items + 8) == id(items[1])
            and ctypes.c_double.from_address(id(items[1]) + LAYOUT.float_value).value == 2.5)


def _array_fields_hold(array: np.ndarray) -> bool:
    """The array's fields; the shape and strides pointers are followed only once the others hold."""
    at = id(array)
    direct = (_word(at + LAYOUT.ob_type) == id(np.ndarray)
              and _word(at + LAYOUT.array_data) == array.ctypes.data
              and _int32(at + LAYOUT.array_nd) == array.ndim
              and _word(at + LAYOUT.array_descr) == id(array.dtype)
              and _int32(at + LAYOUT.array_flags) == array.flags.num)
    if not direct:
        return False
    dims, strides = _word(at + LAYOUT.array_dims), _word(at + LAYOUT.array_strides)
    return (0 not in (dims, strides)
            and [_word(dims + 8 * i) for i in range(array.ndim)] == list(array.shape)
            and [_word(strides + 8 * i) for i in range(array.ndim)] == list(array.strides))


def _flag_bits_hold(arrays: list[np.ndarray]) -> bool:
    """Each flag bit is set exactly on the arrays numpy says have that property."""
    return all(
        bool(array.flags.num & bit) == wanted
        for array in arrays
        for bit, wanted in [(LAYOUT.c_contiguous, array.flags.c_contiguous),
                            (LAYOUT.aligned, array.flags.aligned),
                            (LAYOUT.writeable, array.flags.writeable)]
    )


def _sample_arrays() -> list[np.ndarray]:
    """Arrays that differ in each property the fast path checks: contiguity, alignment, writability."""
    view = np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2]
    fortran = np.zeros((2, 3), order="F")
    read_only = np.zeros((2, 3))
    read_only.flags.writeable = False
    misaligned = np.frombuffer(bytearray(17), dtype=np.float64, offset=1)
    return [view, fortran, read_only, misaligned, np.zeros((2, 3))[1:]]


def _layout_holds() -> bool:
    """Check every offset and flag bit of :data:`LAYOUT` against live objects.

    Reads only inside the objects, and follows the shape and strides pointers
    only once every other array field has matched, so a wrong layout gives
    False rather than a crash.
    """
    if not _runs_with_the_gil():
        return False
    arrays = _sample_arrays()
    return (_object_fields_hold() and all(_array_fields_hold(a) for a in arrays) and _flag_bits_hold(arrays)
            and _numpy_zeros_holds())


@functools.lru_cache(maxsize=None)
def fast_path_supported() -> bool:
    """Whether the running interpreter and numpy have the layout the fast path assumes.

    Checked once per process, at the first call (the first compile of a kernel).
    """
    try:
        return _layout_holds()
    except (ValueError, OverflowError, AttributeError, ImportError):
        return False


def fast_path_enabled() -> bool:
    """Whether kernels compiled now get a fast path.

    False when ``MEMKERNEL_FAST_PATH`` is ``"0"`` (read at each call, that is
    at each compile), else :func:`fast_path_supported`.
    """
    if os.environ.get(FAST_PATH_VARIABLE) == "0":
        return False
    return fast_path_supported()


NUMPY_ARRAY_TYPE = 2
"""``PyArray_API[2]`` is ``&PyArray_Type`` (numpy/__multiarray_api.h), the same in numpy 1.x and 2.x."""
NUMPY_ZEROS = 183
"""``PyArray_API[183]`` is ``PyArray_Zeros(int nd, npy_intp const *dims, PyArray_Descr *descr, int fortran)``,
which steals a reference to ``descr``."""


def numpy_api(index: int) -> int:
    """Entry ``index`` of numpy's C API table, read from its ``_ARRAY_API`` capsule as C extensions read it."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    return capsule_entry(multiarray._ARRAY_API, index)


def capsule_entry(capsule: object, index: int) -> int:
    """Entry ``index`` of the function table a numpy C API ``capsule`` holds (``_ARRAY_API``, ``_UFUNC_API``)."""
    name = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
    pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    table = pointer(capsule, name(capsule))
    return _word(table + 8 * index)


def _numpy_zeros_holds() -> bool:
    """The API table's ``PyArray_Type`` is ``np.ndarray``, and its ``PyArray_Zeros`` makes a zeroed array."""
    if numpy_api(NUMPY_ARRAY_TYPE) != id(np.ndarray):
        return False
    zeros = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p,
                             ctypes.c_int)(numpy_api(NUMPY_ZEROS))
    dtype = np.dtype(np.float32)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(dtype))  # the reference PyArray_Zeros steals
    made = zeros(2, (ctypes.c_int64 * 2)(2, 3), id(dtype), 0)
    return (type(made) is np.ndarray and made.shape == (2, 3) and made.dtype is dtype
            and made.flags.c_contiguous and not made.any())


def c_function(name: str) -> int:
    """Address of a CPython C API function."""
    return ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value or 0


def has_c_function(name: str) -> bool:
    """Whether the interpreter exports C API function ``name`` (``PyObject_Vectorcall`` is inline on 3.10)."""
    return hasattr(ctypes.pythonapi, name)
