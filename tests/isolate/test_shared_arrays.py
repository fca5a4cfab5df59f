"""memkernel.shared_empty: arrays the isolate worker maps, which an isolated call reads and writes in place."""

from __future__ import annotations

import gc
import os
import resource
import signal
import threading
import time
import warnings

import numpy as np
import pytest

import memkernel.isolate.process as isolate_process
from memkernel import (AllocationError, ArgumentError, KernelCrashed, KernelTimeout, mlir_kernel, shared_asarray,
                       shared_empty, shared_like)

from ..kernels import elementwise
from ..threads import run_together
from .test_isolate import FIRST_AND_SUM, SPIN

ADD = elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="add")

WRITE_THEN_CRASH = """
func.func @write_then_crash(%y: memref<?xf32>, %address: i64) {
  %c0 = arith.constant 0 : index
  %v = arith.constant 7.0 : f32
  memref.store %v, %y[%c0] : memref<?xf32>
  %p = llvm.inttoptr %address : i64 to !llvm.ptr
  llvm.store %v, %p : f32, !llvm.ptr
  return
}"""

SPIN_ON = SPIN.replace("@spin(%n: i64)", "@spin_on(%x: memref<?xf32>, %n: i64)")
"""SPIN, with an array argument."""


@pytest.fixture(scope="module")
def add():
    return mlir_kernel(ADD, isolate=True)(lambda in0, in1: None).compile()


@pytest.fixture(scope="module")
def add_here():
    return mlir_kernel(ADD)(lambda in0, in1: None).compile()


def shared_mappings(pid: int | str = "self") -> int:
    """How many mappings of shared array segments process ``pid`` has."""
    with open(f"/proc/{pid}/maps") as maps:
        return sum("memkernel-shared" in line for line in maps)


# -- the arrays ------------------------------------------------------------------------


@pytest.mark.parametrize("shape, dtype", [((3, 4), np.float32), (5, np.int64), ((), np.complex128),
                                          ((0, 7), np.uint8)])
def test_shared_empty_is_a_zeroed_c_contiguous_array_of_the_shape_and_dtype(shape, dtype):
    array = shared_empty(shape, dtype)
    assert type(array) is np.ndarray and array.dtype == dtype and array.shape == np.empty(shape).shape
    assert array.flags.c_contiguous and array.flags.writeable and array.flags.aligned
    assert not array.any()


def test_shared_like_and_shared_asarray_take_the_shape_dtype_and_values():
    source = np.arange(12, dtype=np.int16).reshape(3, 4).T
    like = shared_like(source)
    copy = shared_asarray(source, np.float64)
    assert like.shape == (4, 3) and like.dtype == np.int16 and not like.any()
    np.testing.assert_array_equal(copy, source.astype(np.float64))
    assert copy.dtype == np.float64 and copy.flags.c_contiguous


@pytest.mark.parametrize("shape, dtype, message", [
    ((2, -1), np.float32, r"shared_empty\(\): shape must not have a negative dimension; got \(2, -1\)"),
    ("abc", np.float32, r"shared_empty\(\): shape must be an int or a sequence of ints; got 'abc'"),
    (3, object, r"shared_empty\(\): dtype object holds Python objects, which cannot be shared"),
    (3, "nonsense", r"shared_empty\(\): dtype 'nonsense' is not a numpy dtype"),
])
def test_a_bad_shape_or_dtype_is_an_argument_error_saying_which(shape, dtype, message):
    with pytest.raises(ArgumentError, match=message) as caught:
        shared_empty(shape, dtype)
    assert isinstance(caught.value, (TypeError, ValueError))


def test_shared_memory_past_the_file_size_limit_is_an_allocation_error_saying_why():
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, before[1]))
    try:
        with pytest.raises(AllocationError, match=r"^shared_empty\(\(1048576,\), float64\): 8388608 bytes of "
                           r"shared memory could not be had: \[Errno 27\] File too large\.") as caught:
            shared_empty(1 << 20, np.float64)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
    assert isinstance(caught.value, MemoryError)


def test_the_memory_is_unmapped_once_no_view_of_it_is_left():
    before = shared_mappings()
    array = shared_empty(1000, np.float32)
    view = array[::3]
    del array
    gc.collect()
    assert shared_mappings() == before + 1  # the view holds it
    del view
    gc.collect()
    assert shared_mappings() == before


# -- isolated calls on them ------------------------------------------------------------


def test_an_isolated_call_on_shared_arrays_needs_no_call_segment(add):
    isolate_process.worker().kill()
    a, b = shared_asarray(np.arange(1 << 20, dtype=np.float32)), shared_asarray(np.ones(1 << 20, np.float32))
    out = shared_empty(1 << 20, np.float32)
    add(a, b, out=out)
    np.testing.assert_array_equal(out, np.arange(1 << 20, dtype=np.float32) + 1)
    assert isolate_process.worker().segment is None  # nothing was copied: no segment to copy into


def test_a_kernel_writes_a_shared_array_in_place_so_a_crash_leaves_its_writes():
    crash = mlir_kernel(WRITE_THEN_CRASH, isolate=True)(lambda y, address: None)
    plain, shared = np.zeros(4, np.float32), shared_empty(4, np.float32)
    for y in (plain, shared):
        with pytest.raises(KernelCrashed):
            crash(y, 0)
    np.testing.assert_array_equal(plain, [0, 0, 0, 0])  # copied: the crashed call's writes never came back
    np.testing.assert_array_equal(shared, [7, 0, 0, 0])  # in place: the store before the crash is there


@pytest.mark.parametrize("view", ["step", "reversed", "offset", "transposed back"])
def test_views_of_shared_arrays_compute_as_in_process(add, add_here, view):
    def made(array: np.ndarray) -> np.ndarray:
        return {"step": array[::3], "reversed": array[::-1][:20], "offset": array[5:25],
                "transposed back": array.reshape(6, 10).T.reshape(-1)[:20]}[view]

    base = np.arange(60, dtype=np.float32)
    shared_base, plain_base = shared_asarray(base), base.copy()
    expected = add_here(made(plain_base), made(plain_base)[::-1])
    got = add(made(shared_base), made(shared_base)[::-1])
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shift", [0, 1, -1, 3])
def test_a_shared_out_overlapping_a_shared_input_computes_as_numpy_does(add, shift):
    base = np.arange(40, dtype=np.float32)
    shared_base = shared_asarray(base)
    a, out = slice(10, 30), slice(10 + shift, 30 + shift)
    np.add(base[a].copy(), 1, out=base[out])
    add(shared_base[a], np.ones(20, np.float32), out=shared_base[out])
    np.testing.assert_array_equal(shared_base, base)


def test_shared_and_plain_arrays_mix_in_one_call(add):
    a = shared_asarray(np.arange(16, dtype=np.float32))
    b = np.linspace(0, 1, 16, dtype=np.float32)
    out = np.zeros(16, np.float32)
    add(a, b, out=out)
    np.testing.assert_array_equal(out, np.arange(16, dtype=np.float32) + b)


def test_a_returned_memref_aliasing_a_shared_argument_is_a_view_of_it():
    first_and_sum = mlir_kernel(FIRST_AND_SUM, isolate=True)(lambda a: None)
    a = shared_asarray(np.arange(5, dtype=np.float32))
    same, total, fresh = first_and_sum(a)
    assert np.shares_memory(same, a) and total == 10
    np.testing.assert_array_equal(fresh, [10, 10, 10])


def test_threads_calling_at_once_on_shared_arrays_each_get_their_answer(add):
    errors = []

    def work(k: int) -> None:
        a = shared_asarray(np.full(64, k, np.float32))
        out = shared_empty(64, np.float32)
        for i in range(50):
            add(a, np.full(64, i, np.float32), out=out)
            if not np.array_equal(out, np.full(64, k + i, np.float32)):
                errors.append((k, i, out.copy()))

    run_together(work, range(4))
    assert not errors


def test_ctrl_c_ends_a_call_on_shared_arrays_and_the_next_call_maps_them_again(add):
    spin = mlir_kernel(SPIN_ON, isolate=True)(lambda x, n: None)
    x = shared_empty(16, np.float32)
    a, out = shared_asarray(np.arange(16, dtype=np.float32)), shared_empty(16, np.float32)
    add(a, a, out=out)
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        spin(x, 1)
    timer.join()
    add(a, a, out=out)
    np.testing.assert_array_equal(out, 2 * np.arange(16, dtype=np.float32))


def test_a_worker_killed_during_a_call_on_shared_arrays_is_a_crash_with_the_signal(add):
    spin = mlir_kernel(SPIN_ON, isolate=True)(lambda x, n: None)
    x = shared_empty(16, np.float32)
    spin_started = isolate_process.worker()
    killer = threading.Timer(0.5, lambda: os.kill(spin_started.process.pid, signal.SIGKILL))
    killer.start()
    with pytest.raises(KernelCrashed) as caught:
        spin(x, 1)
    killer.join()
    assert caught.value.signal == "SIGKILL"
    a = shared_asarray(np.arange(16, dtype=np.float32))
    np.testing.assert_array_equal(add(a, x), np.arange(16, dtype=np.float32))


def test_a_shared_array_dropped_during_a_call_lives_until_the_call_ends_then_the_worker_unmaps_it(add):
    spin = mlir_kernel(SPIN_ON, isolate=True, timeout=1)(lambda x, n: None)
    a = shared_asarray(np.ones(16, np.float32))
    add(a, a)
    gc.collect()
    before = shared_mappings()
    outcome = []

    def call_on_a_temporary() -> None:
        try:
            spin(shared_empty(1 << 16, np.float32), 1)  # the call holds the only reference
        except KernelTimeout as exc:
            outcome.append(str(exc))  # not the exception: its traceback holds the call's arguments

    thread = threading.Thread(target=call_on_a_temporary)
    thread.start()
    thread.join()
    gc.collect()
    assert len(outcome) == 1 and shared_mappings() == before
    add(a, a)  # a new worker: the timeout killed the last
    b = shared_asarray(np.ones(16, np.float32))
    add(a, b)
    worker_pid = isolate_process.worker().process.pid
    mapped = shared_mappings(worker_pid)
    del b
    gc.collect()
    add(a, a)  # tells the worker that b's segment is gone
    assert shared_mappings(worker_pid) == mapped - 1


def test_a_forked_child_shares_the_memory_and_calls_on_it_with_a_worker_of_its_own(add):
    a = shared_asarray(np.arange(8, dtype=np.float32))
    out = shared_empty(8, np.float32)
    add(a, a, out=out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a process with threads: the point here
        pid = os.fork()
    if pid == 0:
        try:
            add(a, np.ones(8, np.float32), out=out)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    np.testing.assert_array_equal(out, np.arange(8, dtype=np.float32) + 1)  # the child's write, shared
    add(a, a, out=out)
    np.testing.assert_array_equal(out, 2 * np.arange(8, dtype=np.float32))


def test_a_shared_segment_the_worker_cannot_map_is_an_allocation_error(add):
    a = shared_asarray(np.arange(16, dtype=np.float32))
    add(a, a)
    worker = isolate_process.worker()
    before = resource.prlimit(worker.process.pid, resource.RLIMIT_AS)
    with open(f"/proc/{worker.process.pid}/status") as status:
        size = int(next(line for line in status if line.startswith("VmSize:")).split()[1]) * 1024
    resource.prlimit(worker.process.pid, resource.RLIMIT_AS, (size + (1 << 20), before[1]))
    big = shared_empty(1 << 22, np.float32)  # 16 MiB: past the worker's limit
    try:
        with pytest.raises(AllocationError, match=r"^add\(in0=float32\[4194304\], .*16 MiB \(16777216 bytes\) of it "
                           r"could not be mapped in the worker: \[Errno 12\] Cannot allocate memory\."):
            add(big, big)
    finally:
        resource.prlimit(worker.process.pid, resource.RLIMIT_AS, before)
    np.testing.assert_array_equal(add(big[:16], a), a)


def test_many_calls_on_shared_arrays_keep_one_mapping_each_in_the_worker(add):
    a, out = shared_asarray(np.ones(256, np.float32)), shared_empty(256, np.float32)
    add(a, a, out=out)
    pid = isolate_process.worker().process.pid
    mapped = shared_mappings(pid)
    started = time.monotonic()
    while time.monotonic() - started < 0.2:
        add(a, a, out=out)
    assert shared_mappings(pid) == mapped
