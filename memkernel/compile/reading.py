"""Decoration's reading of a kernel's IR, done by the compile worker: the decorating process imports no MLIR.

When no cache holds a kernel's IR, decoration must parse and analyse its
source. Done here, that imports the MLIR bindings (80-100 ms) into a process
that then only links and calls the compiled code; done in the compile worker
(the compile server, when one runs, has them imported already), it costs a
request, and a parse that aborts in MLIR ends the worker, never the caller.
The worker returns the :class:`~memkernel.model.kernel_spec.KernelIR` as the
disk cache stores it (:mod:`memkernel.model.codec`), and raises the same
errors a read in process raises (MLIRSyntaxError, SignatureError, CompileError)
(see :func:`memkernel.compile.requests.kernel_ir_data`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Sequence

from ..model import codec
from ..model.kernel_spec import KernelIR
from ..options import KernelOptions
from . import requests, worker


def require_bindings() -> None:
    """ImportError, as importing them would raise it, when the MLIR bindings cannot be found here: a worker
    runs this interpreter, so it could not import them either (looked up, not imported)."""
    try:
        found = importlib.util.find_spec("mlir") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ModuleNotFoundError("No module named 'mlir'", name="mlir")


def read_kernel_ir(options: KernelOptions, requested: str | None, parameters: Sequence[str]) -> KernelIR:
    """The IR of kernel ``requested`` of ``options.source``, read by the compile worker (see
    :func:`memkernel.compile.decoration.read_kernel` for the arguments and errors). ``checked=`` left to the
    environment is settled here: the worker's environment may differ."""
    settled = dataclasses.replace(options, checked=options.checked_wanted)
    data = worker.run(options.llvm_options, f"reading the source of @{requested or 'the kernel'}",
                      requests.kernel_ir_data, settled, requested, tuple(parameters))
    kernel_ir = codec.loads(data)
    assert isinstance(kernel_ir, KernelIR)
    return kernel_ir
