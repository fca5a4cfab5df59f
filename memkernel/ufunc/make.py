"""A real ``numpy.ufunc`` around a compiled gufunc loop, made through numpy's C API.

:func:`make_ufunc` calls ``PyUFunc_FromFuncAndDataAndSignature`` from numpy's
``_UFUNC_API`` capsule, as a C extension would, with one loop: the compiled
``__memkernel_gufunc_<name>`` (see :mod:`memkernel.compile.gufunc_loop`) for
the operands' exact dtypes. numpy does the rest: broadcasting of the batch
dims, ``out=``, ``axes=``, casting and its errors, ``__array_ufunc__``
dispatch. The arrays numpy keeps pointers into (the loop table, the type
numbers, the name and doc) and the loaded code live in the ufunc's
``__dict__``, so they last as long as the ufunc.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from ..errors import AllocationError
from ..fastpath.abi import capsule_entry
from ..load.guard import SIZE_OFFSET, failure_error
from . import constants
from .constants import STATUS_OFFSET, Status
from .layout import GufuncLayout

_FROM_FUNC_AND_DATA_AND_SIGNATURE = 31
"""``PyUFunc_API[31]`` is ``PyUFunc_FromFuncAndDataAndSignature`` (numpy/__ufunc_api.h, numpy 1.x and 2.x)."""
_UFUNC_TYPE = 0
"""``PyUFunc_API[0]`` is ``&PyUFunc_Type``."""

_MAKE = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                          ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                          ctypes.c_char_p)
_PY_UFUNC_NONE = -1
"""``PyUFunc_None``: no identity (a gufunc has none)."""


def ufunc_api(index: int) -> int:
    """Entry ``index`` of numpy's ufunc C API table, read from its ``_UFUNC_API`` capsule."""
    try:
        from numpy._core import umath
    except ImportError:  # numpy 1.x
        from numpy.core import umath  # type: ignore[no-redef]
    return capsule_entry(umath._UFUNC_API, index)


def raiser(layout: GufuncLayout, source: str) -> Callable[[int], NoReturn]:
    """What the loop calls, holding the GIL, with the guard frame of a range that stopped: raises its error."""
    kernel = layout.kernel

    def failed(frame: int) -> NoReturn:
        status = ctypes.c_int64.from_address(frame + STATUS_OFFSET).value
        if status == Status.NO_MEMORY:
            size = ctypes.c_int64.from_address(frame + SIZE_OFFSET).value
            raise AllocationError(f"{kernel}.gufunc(): could not get {size} bytes to copy a non-contiguous core "
                                  "into the contiguous memory the kernel reads: malloc returned NULL.")
        raise failure_error(kernel, source, frame)

    return failed


def make_ufunc(layout: GufuncLayout, loop: int, consts: int, owner: Any, source: str, doc: str) -> np.ufunc:
    """The gufunc of ``layout`` whose loop is compiled at ``loop``, its constants table at ``consts``.

    ``owner`` keeps the code mapped; the ufunc holds it (and what numpy points into) for its life.
    """
    if ufunc_api(_UFUNC_TYPE) != id(np.ufunc):
        raise RuntimeError("numpy's _UFUNC_API capsule does not hold np.ufunc where memkernel expects it")
    failed = raiser(layout, source)
    constants.fill(consts, failed)
    functions = (ctypes.c_void_p * 1)(loop)
    data = (ctypes.c_void_p * 1)(None)
    types = ctypes.create_string_buffer(layout.type_numbers, len(layout.args))
    name = layout.kernel.encode()
    text = doc.encode()
    signature = layout.signature.encode()
    make = _MAKE(ufunc_api(_FROM_FUNC_AND_DATA_AND_SIGNATURE))
    made = make(functions, data, types, 1, layout.n_inputs, layout.n_outputs, _PY_UFUNC_NONE, name, text, 0,
                signature)
    made.__dict__["_memkernel_keep"] = (functions, data, types, name, text, signature, owner, failed)
    return made
