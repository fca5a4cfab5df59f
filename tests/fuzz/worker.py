"""The fuzz test's worker: runs calls sent on stdin, answers on stdout; a crash here is a finding.

Protocol: each request and answer is a pickle preceded by its length (8 bytes,
little-endian). A request is ``(KernelCase, CallCase)``; the answer is the list
of problems :func:`tests.fuzz.calls.judge` found.
"""

from __future__ import annotations

import pickle
import struct
import sys

import memkernel
from memkernel import mlir_kernel

from .calls import CallCase, KernelCase, judge

_kernels: dict[KernelCase, memkernel.Kernel] = {}


def kernel_for(case: KernelCase) -> memkernel.Kernel:
    if case not in _kernels:
        _kernels[case] = mlir_kernel(case.source(), name="k")(case.python_function())
    return _kernels[case]


def serve() -> None:
    """Answer requests until stdin closes."""
    read, write = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = read.read(8)
        if len(header) < 8:
            return
        case, call = pickle.loads(read.read(struct.unpack("<Q", header)[0]))
        assert isinstance(case, KernelCase) and isinstance(call, CallCase)
        try:
            problems = judge(case, call, kernel_for(case), memkernel)
        except memkernel.MemkernelError as exc:  # the kernel itself was refused at decoration
            problems = [f"decoration failed: {exc}"]
        answer = pickle.dumps(problems)
        write.write(struct.pack("<Q", len(answer)) + answer)
        write.flush()


if __name__ == "__main__":
    serve()
