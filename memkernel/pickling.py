"""How a :class:`~memkernel.kernel.Kernel` pickles: like a function, never with its compiled code.

A kernel decorated at a module's top level (a script's ``__main__`` included,
or a class body) pickles *by reference*, as a function does: its module and
qualified name, checked when pickling to resolve to the kernel itself. The
process that unpickles it imports the module and finds the same kernel there,
compiled at most once per process: ``multiprocessing`` and
``concurrent.futures.ProcessPoolExecutor`` need nothing more.

Any other kernel (a lambda, one made inside a function) pickles *by value*:
what :func:`~memkernel.mlir_kernel` was given (its
:class:`~memkernel.options.KernelOptions`) and its shape function. The
function object is handed to the pickler, which decides how to carry it:
plain :mod:`pickle` carries a function it finds by module and name
(``kernel = mlir_kernel(source)(shape_function)`` with ``shape_function``
defined at top level), cloudpickle (which Dask uses) also lambdas and
closures. Callbacks pickle when their
callables do. The unpickled kernel is decorated afresh and compiles at its
first call, or loads the code from the disk cache (``$MEMKERNEL_CACHE_DIR``)
when a process on that machine compiled it before. A process that unpickles
the same kernel again gets the kernel it rebuilt the first time.

:meth:`Kernel.reduce_by_value <memkernel.kernel.Kernel.reduce_by_value>` is the by-value form on its own, for carriers that
must not depend on the receiving process having the kernel's module: a
kernel of a notebook or of a script's ``__main__`` sent to a remote Dask
worker (see :mod:`memkernel.dask`).
"""

from __future__ import annotations

import sys
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from . import forking

KEEP_REBUILT = 32
"""How many kernels unpickled by value a process keeps for the next unpickling of the same kernel."""

_lock = forking.lock()
_tokens: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_rebuilt: OrderedDict[str, Any] = OrderedDict()


def resolves_by_name(kernel: Any) -> bool:
    """Whether ``kernel.__module__`` + ``kernel.__qualname__`` names ``kernel`` itself in this process."""
    qualname = getattr(kernel, "__qualname__", "")
    module = sys.modules.get(getattr(kernel, "__module__", None) or "")
    if module is None or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        return False
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            return False
    return found is kernel


def token_of(kernel: Any) -> str:
    """The token that names ``kernel`` when it is pickled by value (random, kept while the kernel lives),
    so that a process unpickling the same kernel again (a Dask worker receives it with every task) reuses
    the kernel it rebuilt the first time (see :func:`rebuilt`)."""
    import uuid  # only when a kernel is pickled by value

    with _lock:
        return _tokens.setdefault(kernel, uuid.uuid4().hex)


def rebuilt(token: str, make: Callable[[], Any]) -> Any:
    """The kernel rebuilt before for ``token``, or ``make()``. The :data:`KEEP_REBUILT` most recently used
    are kept."""
    with _lock:
        kernel = _rebuilt.get(token)
        if kernel is not None:
            _rebuilt.move_to_end(token)
            return kernel
    kernel = make()
    with _lock:
        kernel = _rebuilt.setdefault(token, kernel)
        _tokens.setdefault(kernel, token)
        while len(_rebuilt) > KEEP_REBUILT:
            _rebuilt.popitem(last=False)
    return kernel
