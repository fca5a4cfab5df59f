"""An idle process gives back the shared memory of its large isolated calls beyond release.KEEP_MAPPED."""

from __future__ import annotations

import os

import numpy as np
import pytest

import memkernel.isolate.process as isolate_process
from memkernel import mlir_kernel
from memkernel.isolate import release

from ..kernels import elementwise
from ..processes import wait_for

ADD = elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="add")
KEEP = 4 << 20
LARGE = 2 * KEEP // 4
"""float32 elements per array of a large call: its three arrays need more than KEEP bytes."""


@pytest.fixture
def add(monkeypatch):
    monkeypatch.setattr(release, "KEEP_MAPPED", KEEP)
    monkeypatch.setattr(release, "RELEASE_AFTER", 0.3)
    kernel = mlir_kernel(ADD, isolate=True)(lambda in0, in1: None)
    small = np.ones(16, np.float32)
    kernel(small, small)
    return kernel


def segment_resident(pid: int) -> int:
    """The bytes of isolate segments that process ``pid`` maps and has in memory (from ``/proc/PID/smaps``)."""
    total, in_segment = 0, False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's first line: address range, ..., path
                in_segment = "memfd:memkernel-isolate" in line
            elif in_segment and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def large_call(add) -> None:
    a, b = np.arange(LARGE, dtype=np.float32), np.ones(LARGE, np.float32)
    np.testing.assert_array_equal(add(a, b), a + b)


def test_an_idle_process_keeps_at_most_keep_mapped_of_a_large_calls_shared_memory(add, monkeypatch):
    monkeypatch.setattr(release, "RELEASE_AFTER", 30.0)  # long enough to see the memory in use, however slow
    large_call(add)
    worker = isolate_process.worker()
    pids = (os.getpid(), worker.process.pid)
    assert all(segment_resident(pid) > KEEP for pid in pids)
    monkeypatch.setattr(release, "RELEASE_AFTER", 0.3)
    large_call(add)
    assert wait_for(lambda: all(segment_resident(pid) <= KEEP for pid in pids))
    assert worker.segment.size <= KEEP
    large_call(add)  # and the next large call gets a large segment again


def test_large_calls_in_a_row_keep_their_segment(add, monkeypatch):
    monkeypatch.setattr(release, "RELEASE_AFTER", 30.0)
    large_call(add)
    segment = isolate_process.worker().segment
    large_call(add)
    assert isolate_process.worker().segment is segment


def test_small_calls_do_not_keep_a_large_segment(add):
    large_call(add)
    small = np.ones(16, np.float32)
    worker = isolate_process.worker()

    def shrunk_while_calling() -> bool:
        np.testing.assert_array_equal(add(small, small), small + small)
        return worker.segment.size <= KEEP

    assert wait_for(shrunk_while_calling)
