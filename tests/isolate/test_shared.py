"""The shared memory of isolated calls: a segment that cannot be had is an AllocationError naming the kernel."""

from __future__ import annotations

import contextlib
import os
import re
import resource
from collections.abc import Iterator

import numpy as np
import pytest

import memkernel.isolate.process as isolate_process
from memkernel import AllocationError, MemkernelError, mlir_kernel
from memkernel.isolate.shared import MIN_SEGMENT

from ..kernels import elementwise

ADD = elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="add")
FLOATS = MIN_SEGMENT // 4
"""As many float32 as fill the smallest segment: three arrays of them need a larger one."""


@pytest.fixture
def add():
    """An isolated add whose worker holds the smallest segment, so a call on FLOATS floats needs a new one."""
    kernel = mlir_kernel(ADD, isolate=True)(lambda in0, in1: None)
    segment = isolate_process.worker().segment
    if segment is not None and segment.size > MIN_SEGMENT:
        isolate_process.worker().kill()
    small = np.ones(16, np.float32)
    kernel(small, small)
    assert isolate_process.worker().segment.size == MIN_SEGMENT
    return kernel


@contextlib.contextmanager
def limited(limit: int, soft: int) -> Iterator[None]:
    """This process's soft ``limit`` (a ``resource.RLIMIT_*``) set to ``soft`` during the block."""
    before = resource.getrlimit(limit)
    resource.setrlimit(limit, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(limit, before)


def arrays(n: int = FLOATS) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(n, dtype=np.float32), np.linspace(-1, 1, n, dtype=np.float32)


def check_still_works(add) -> None:
    a, b = arrays()
    np.testing.assert_array_equal(add(a, b), a + b)


def test_a_segment_past_the_file_size_limit_is_an_allocation_error_naming_the_kernel_and_the_size(add):
    a, b = arrays()
    with limited(resource.RLIMIT_FSIZE, 2 * MIN_SEGMENT), pytest.raises(AllocationError) as caught:
        add(a, b)
    assert isinstance(caught.value, MemoryError) and isinstance(caught.value, MemkernelError)
    assert re.fullmatch(
        r"add\(in0=float32\[262144\], in1=float32\[262144\], out=float32\[262144\]\): an isolated call passes its "
        r"arrays through shared memory, and [\d.]+ MiB \((\d+) bytes\) of it could not be made in this process: "
        r"\[Errno 27\] File too large\. The file-size limit \(ulimit -f\) holds for shared memory too: raise it, "
        r"or call with smaller arrays\.", str(caught.value))
    assert int(re.search(r"\((\d+) bytes\)", str(caught.value))[1]) >= 3 * a.nbytes
    check_still_works(add)


def _fill_descriptors() -> list[int]:
    """Descriptors opened until none is left under the current limit."""
    opened = []
    try:
        while True:
            opened.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        return opened


def test_no_descriptor_left_for_the_segment_is_an_allocation_error(add):
    a, b = arrays()
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    with limited(resource.RLIMIT_NOFILE, highest + 8):
        opened = _fill_descriptors()
        try:
            with pytest.raises(AllocationError, match=r"^add\(in0=float32\[262144\], .*could not be made in this "
                               r"process: \[Errno 24\] Too many open files\. The process has no file descriptor "
                               r"left \(ulimit -n\)"):
                add(a, b)
        finally:
            for fd in opened:
                os.close(fd)
    check_still_works(add)


def _virtual_size(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmSize:"))
    return int(line.split()[1]) * 1024


def test_a_segment_the_worker_cannot_map_is_an_allocation_error(add):
    a, b = arrays()
    pid = isolate_process.worker().process.pid
    before = resource.prlimit(pid, resource.RLIMIT_AS)
    resource.prlimit(pid, resource.RLIMIT_AS, (_virtual_size(pid) + MIN_SEGMENT, before[1]))
    try:
        with pytest.raises(AllocationError, match=r"^add\(in0=float32\[262144\], .*could not be mapped in the "
                           r"worker: \[Errno 12\] Cannot allocate memory\. Not enough memory"):
            add(a, b)
    finally:
        resource.prlimit(pid, resource.RLIMIT_AS, before)
    check_still_works(add)


def test_a_segment_that_fits_the_file_size_limit_only_at_the_size_the_call_needs_is_made(add):
    a, b = arrays(FLOATS // 2)  # three arrays of 0.5 MiB: twice the current segment, 2 MiB, is past the limit
    with limited(resource.RLIMIT_FSIZE, 7 * MIN_SEGMENT // 4):
        np.testing.assert_array_equal(add(a, b), a + b)
