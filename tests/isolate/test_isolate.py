"""isolate=True: calls run in a worker process; a crash or a hang is an exception, never the caller's death."""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import memkernel.isolate
import memkernel.isolate.control
import memkernel.isolate.process
from memkernel import (ArgumentError, CompileError, DTypeError, KernelAssertionError, KernelCrashed, KernelTimeout,
                       MemkernelError, ShapeError, SignatureError, mlir_kernel)

from ..kernels import FILL, MISSING_GLOBAL, WAIT_FOR_FLAG, elementwise, total
from ..processes import REPO, run_python

POKE = """
func.func @poke(%address: i64, %value: f32) {
  %p = llvm.inttoptr %address : i64 to !llvm.ptr
  llvm.store %value, %p : f32, !llvm.ptr
  return
}"""

SHOW_THEN_POKE = """
func.func private @printMemrefF32(memref<*xf32>) attributes {llvm.emit_c_interface}
func.func @show_then_poke(%x: memref<?xf32>, %address: i64) {
  %u = memref.cast %x : memref<?xf32> to memref<*xf32>
  call @printMemrefF32(%u) : (memref<*xf32>) -> ()
  %v = arith.constant 1.0 : f32
  %p = llvm.inttoptr %address : i64 to !llvm.ptr
  llvm.store %v, %p : f32, !llvm.ptr
  return
}"""

SPIN = """
func.func @spin(%n: i64) -> i64 {
  %r = scf.while (%i = %n) : (i64) -> i64 {
    %go = arith.cmpi sge, %i, %n : i64
    scf.condition(%go) %i : i64
  } do {
  ^bb0(%i: i64):
    scf.yield %i : i64
  }
  return %r : i64
}"""

ADD = elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="add")

SCALE_STRIDED = """
func.func @scale(%x: memref<?xf32, strided<[?], offset: ?>>, %k: f32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32, strided<[?], offset: ?>>
  scf.for %i = %c0 to %n step %c1 {
    %v = memref.load %x[%i] : memref<?xf32, strided<[?], offset: ?>>
    %w = arith.mulf %v, %k : f32
    memref.store %w, %x[%i] : memref<?xf32, strided<[?], offset: ?>>
  }
  return
}"""

DOUBLE_2D = elementwise("arith.addf", "memref<?x?xf64>", "f64", 2, n_inputs=1, name="double").replace(
    "arith.addf %x0 :", "arith.addf %x0, %x0 :")

FIRST_AND_SUM = """
func.func @first_and_sum(%a: memref<?xf32>) -> (memref<?xf32>, f32, memref<3xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %a, %c0 : memref<?xf32>
  %zero = arith.constant 0.0 : f32
  %s = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> f32 {
    %v = memref.load %a[%i] : memref<?xf32>
    %t = arith.addf %acc, %v : f32
    scf.yield %t : f32
  }
  %fresh = memref.alloc() : memref<3xf32>
  linalg.fill ins(%s : f32) outs(%fresh : memref<3xf32>)
  return %a, %s, %fresh : memref<?xf32>, f32, memref<3xf32>
}"""

STATIC_ADD = elementwise("arith.addf", "memref<4xf32>", "f32", 1, name="add4")


def poke_kernel(**options):
    return mlir_kernel(POKE, **options)(lambda address, value: None)


def add_kernel(**options):
    return mlir_kernel(ADD, **options)(lambda in0, in1: None)


@pytest.fixture
def floats():
    return np.arange(16, dtype=np.float32), np.linspace(-1, 1, 16, dtype=np.float32)


# -- crashes ---------------------------------------------------------------------------


def test_null_pointer_store_raises_kernel_crashed_and_the_next_call_works(floats):
    poke = poke_kernel(isolate=True)
    with pytest.raises(KernelCrashed) as caught:
        poke(0, 1.5)
    error = caught.value
    assert isinstance(error, MemkernelError) and isinstance(error, RuntimeError)
    assert error.signal == "SIGSEGV" and error.kernel == "poke"
    assert error.arguments == "address=0, value=1.5"
    assert str(error).startswith("poke(address=0, value=1.5): the worker process was killed by SIGSEGV while "
                                 "running the call. Your process and arrays are unharmed")
    a, b = floats
    np.testing.assert_array_equal(add_kernel(isolate=True)(a, b), a + b)
    with pytest.raises(KernelCrashed, match="SIGSEGV"):  # and again: every crash restarts the worker
        poke(8, 0.0)


def test_kernel_crashed_survives_pickling_with_its_fields():
    error = KernelCrashed("k(): crashed", signal="SIGBUS", kernel="k", arguments="a=float32[2]", output="last line")
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.signal, again.kernel, again.arguments, again.output) == (
        "k(): crashed", "SIGBUS", "k", "a=float32[2]", "last line")


def test_what_a_kernel_printed_before_crashing_reaches_stdout(capsys):
    show = mlir_kernel(SHOW_THEN_POKE, shared_libs=["mlir_runner_utils"], isolate=True)(lambda x, address: None)
    print("before")
    with pytest.raises(KernelCrashed, match="SIGSEGV"):
        show(np.array([1.0, 2.0, 3.0], np.float32), 0)
    out = capsys.readouterr().out
    assert out.startswith("before\n")
    assert "[1,  2,  3]" in out


def test_what_an_isolated_kernel_prints_comes_in_order_with_python_prints(capsys):
    source = SHOW_THEN_POKE.replace("llvm.store %v, %p : f32, !llvm.ptr\n", "")
    show = mlir_kernel(source, shared_libs=["mlir_runner_utils"], isolate=True)(lambda x, address: None)
    print("before")
    show(np.array([4.0, 5.0], np.float32), 0)
    print("after")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "before" and lines[-1] == "after"
    assert "[4,  5]" in lines[-2]


def test_only_calls_of_a_kernel_that_may_print_look_for_what_the_worker_printed(monkeypatch, capsys):
    """A kernel that calls nothing that writes to the C streams skips the look (two system calls) at each
    call that returns; a printing kernel's repeated calls each show their output, in order."""
    echoes = []
    echo = memkernel.isolate.process.Worker._echo
    monkeypatch.setattr(memkernel.isolate.process.Worker, "_echo", lambda worker: (echoes.append(1), echo(worker))[1])
    add = mlir_kernel(ADD, isolate=True)(lambda a, b: None)
    a, out = np.arange(4, dtype=np.float32), np.empty(4, np.float32)
    add(a, a, out=out)
    echoes.clear()
    for _ in range(3):
        add(a, a, out=out)
    np.testing.assert_array_equal(out, a + a)
    assert echoes == []
    source = SHOW_THEN_POKE.replace("llvm.store %v, %p : f32, !llvm.ptr\n", "")
    show = mlir_kernel(source, shared_libs=["mlir_runner_utils"], isolate=True)(lambda x, address: None)
    x = np.array([6.0, 7.0], np.float32)
    show(x, 0)
    capsys.readouterr()
    echoes.clear()
    for i in range(3):
        print(f"call {i}")
        show(x, 0)
    assert len(echoes) == 3
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("call", "[6"))]
    assert lines == ["call 0", "[6,  7]", "call 1", "[6,  7]", "call 2", "[6,  7]"]


GIVE_UP = """
llvm.mlir.global internal constant @message("kernel lost its way\\00") {addr_space = 0 : i32}
llvm.func @perror(!llvm.ptr)
llvm.func @abort()
llvm.func @exit(i32)
func.func @give_up(%status: i32) {
  %p = llvm.mlir.addressof @message : !llvm.ptr
  llvm.call @perror(%p) : (!llvm.ptr) -> ()
  %zero = arith.constant 0 : i32
  %exits = arith.cmpi ne, %status, %zero : i32
  scf.if %exits {
    llvm.call @exit(%status) : (i32) -> ()
  }
  llvm.call @abort() : () -> ()
  return
}"""


def test_an_abort_carries_the_signal_and_what_the_kernel_wrote_on_stderr(capsys):
    give_up = mlir_kernel(GIVE_UP, isolate=True)(lambda status: None)
    with pytest.raises(KernelCrashed) as caught:
        give_up(0)
    assert caught.value.signal == "SIGABRT"
    assert "kernel lost its way" in caught.value.output
    assert str(caught.value).endswith(caught.value.output)
    assert "kernel lost its way" in capsys.readouterr().err


def test_a_kernel_that_exits_the_worker_is_a_crash_with_its_status():
    give_up = mlir_kernel(GIVE_UP, isolate=True)(lambda status: None)
    with pytest.raises(KernelCrashed, match=r"give_up\(status=3\): the worker process exited with status 3 "
                                             r"while running the call") as caught:
        give_up(3)
    assert caught.value.signal is None


def test_a_forked_child_gets_a_worker_of_its_own(floats):
    add = add_kernel(isolate=True)
    a, b = floats
    add(a, b)
    parent_worker = memkernel.isolate.process.worker()
    pid = os.fork()
    if pid == 0:
        try:
            ok = np.array_equal(add(a, b), a + b) and memkernel.isolate.process.worker() is not parent_worker
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent_worker.alive()
    np.testing.assert_array_equal(add(b, b), b + b)


def test_a_forked_child_does_not_hold_the_parents_worker_open(floats):
    add_kernel(isolate=True)(*floats)
    parent_worker = memkernel.isolate.process.worker()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a process with threads: the point here
        pid = os.fork()
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    try:
        parent_worker.close()  # its end of the channel closed: the worker ends by itself, unless a child holds it
        assert parent_worker.process.returncode == 0
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_worker_that_cannot_start_is_a_kernel_crashed(monkeypatch, floats):
    add = add_kernel(isolate=True)
    memkernel.isolate.process.worker().kill()
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(KernelCrashed, match=r"^add\(\): the worker process exited with status 1 while starting"):
        add(*floats)
    monkeypatch.undo()
    np.testing.assert_array_equal(add(*floats), floats[0] + floats[1])


def test_the_worker_drops_the_kernels_the_caller_dropped(floats):
    a, b = floats
    add_kernel(isolate=True)(a, b)
    worker = memkernel.isolate.process.worker()
    held = worker.request(("hello",))[1]
    kernels = [add_kernel(isolate=True).compile() for _ in range(3)]
    assert worker.request(("hello",))[1] == held + 3
    del kernels
    gc.collect()
    add_kernel(isolate=True)(a, b)  # the next call tells the worker
    assert worker.request(("hello",))[1] <= held + 1


# -- hangs ------------------------------------------------------------------------------


def test_timeout_ends_a_hanging_call_and_the_next_call_works(floats):
    spin = mlir_kernel(SPIN, isolate=True, timeout=0.5)(lambda n: None)
    started = time.perf_counter()
    with pytest.raises(KernelTimeout) as caught:
        spin(3)
    assert time.perf_counter() - started < 5
    assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, MemkernelError)
    assert str(caught.value).startswith("spin(n=3) ran longer than timeout=0.5 s")
    a, b = floats
    np.testing.assert_array_equal(add_kernel(isolate=True, timeout=5)(a, b), a + b)


# A terminal's Ctrl-C reaches the process; signal.raise_signal in another thread reaches that thread only, which
# interrupts no wait of the calling thread.
INTERRUPTS = {"process": lambda: os.kill(os.getpid(), signal.SIGINT),
              "another thread": lambda: signal.raise_signal(signal.SIGINT)}


@pytest.mark.parametrize("interrupt", INTERRUPTS.values(), ids=INTERRUPTS.keys())
def test_ctrl_c_ends_a_hanging_isolated_call_and_the_next_call_works(floats, interrupt):
    spin = mlir_kernel(SPIN, isolate=True)(lambda n: None)
    add = add_kernel(isolate=True)
    timer = threading.Timer(0.5, interrupt)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        spin(1)
    timer.join()
    a, b = floats
    np.testing.assert_array_equal(add(a, b), a + b)


# -- what the kernel writes -----------------------------------------------------------


def test_timeout_alone_isolates_the_call():
    spin = mlir_kernel(SPIN, timeout=2.0)(lambda n: None)
    with pytest.raises(KernelTimeout):
        spin(1)


def test_an_isolated_kernel_that_forks_keeps_its_answers_in_step():
    forking = mlir_kernel("""
        llvm.func @fork() -> i32
        func.func @f(%x: i64, %fork: i1) -> i64 {
          scf.if %fork {
            %pid = llvm.call @fork() : () -> i32
          }
          return %x : i64
        }""", isolate=True, timeout=30)(lambda x, fork: None)
    assert [forking(1, True), forking(2, False), forking(3, False)] == [1, 2, 3]


def test_the_isolate_worker_outlives_the_thread_that_started_it():
    """A worker started by a thread that then ends must not die in the middle of another thread's call."""
    spin = mlir_kernel(WAIT_FOR_FLAG, isolate=True, cache=False)(lambda flag, limit: None)
    flag = np.zeros(1, np.int32)
    with memkernel.isolate.process.lock():  # this test's own worker, started by the thread below
        if memkernel.isolate.process._worker is not None:
            memkernel.isolate.process._worker.close()
        memkernel.isolate.process._worker = None
    go = threading.Event()

    def start_then_end() -> None:
        spin(flag, 1)
        go.wait()

    starter = threading.Thread(target=start_then_end)
    starter.start()
    while not spin.compiled:
        time.sleep(0.01)
    outcome: list[object] = []
    caller = threading.Thread(target=lambda: outcome.append(spin(flag, 200_000_000)))
    caller.start()
    time.sleep(0.5)
    go.set()  # the starting thread ends while the other call runs in the worker
    starter.join()
    caller.join(timeout=120)
    assert outcome == [200_000_000]


@pytest.mark.parametrize("isolate", [True, False])
def test_the_writes_before_a_failed_check_reach_the_callers_array(isolate):
    fill = mlir_kernel(FILL, checked=True, isolate=isolate)(lambda y, n: None)
    whole = np.zeros(8, np.float32)
    with pytest.raises(KernelAssertionError, match="out-of-bounds"):
        fill(whole[::2], 6)  # a copy in process; stores 0 to 3, then stops at the check of the store to 4
    np.testing.assert_array_equal(whole, np.tile(np.array([1, 0], np.float32), 4))


FILL_TWO = """func.func @fill_two(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %one = arith.constant 1.0 : f32
  scf.for %i = %c0 to %n step %c1 {
    memref.store %one, %x[%i] : memref<?xf32>
    memref.store %one, %y[%i] : memref<?xf32>
  }
  return
}"""


@pytest.mark.parametrize("isolate", [True, False])
def test_a_ctrl_c_during_the_copy_back_is_raised_once_every_array_is_written(monkeypatch, isolate):
    fill_two = mlir_kernel(FILL_TWO, isolate=isolate)(lambda x, y: None)
    whole_x, whole_y = np.zeros(8, np.float32), np.zeros(8, np.float32)
    fill_two(np.zeros(4, np.float32), np.zeros(4, np.float32))  # compiled, and the worker started
    copyto = np.copyto

    def ctrl_c_after_the_first_copy_back(destination, source, **options):
        copyto(destination, source, **options)
        if np.shares_memory(destination, whole_x) or np.shares_memory(destination, whole_y):
            monkeypatch.setattr(np, "copyto", copyto)
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(np, "copyto", ctrl_c_after_the_first_copy_back)
    with pytest.raises(KeyboardInterrupt):
        fill_two(whole_x[::2], whole_y[::2])  # step views: copies in process, copied back either way
    expected = np.tile(np.array([1, 0], np.float32), 4)
    np.testing.assert_array_equal(whole_x, expected)
    np.testing.assert_array_equal(whole_y, expected)


@pytest.mark.parametrize("isolate", [True, False])
def test_non_contiguous_out_gets_the_elements_and_nothing_between(floats, isolate):
    a, b = floats
    out = np.full(32, -7.0, np.float32)
    returned = add_kernel(isolate=isolate)(a, b, out=out[::2])
    expected = np.full(32, -7.0, np.float32)
    expected[::2] = a + b
    np.testing.assert_array_equal(out, expected)
    assert returned.base is out


@pytest.mark.parametrize("isolate", [True, False])
def test_a_written_strided_input_changes_in_the_callers_view(isolate):
    scale = mlir_kernel(SCALE_STRIDED, isolate=isolate)(lambda x, k: None)
    data = np.arange(30, dtype=np.float32)
    expected = data.copy()
    expected[1::3] *= 2.5
    scale(data[1::3], 2.5)
    np.testing.assert_array_equal(data, expected)


@pytest.mark.parametrize("isolate", [True, False])
def test_in_place_kernel_on_a_transposed_view_writes_back(isolate):
    double = mlir_kernel(DOUBLE_2D, isolate=isolate)(lambda in0, out: None)
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    expected = base.copy()
    expected[:, 1:5] *= 2
    view = base[:, 1:5].T
    double(view.copy(), view)
    np.testing.assert_array_equal(base, expected)


def test_a_read_only_input_view_is_read_in_the_worker_and_stays_read_only(floats):
    a, b = floats
    frozen = np.repeat(a, 2)
    frozen.flags.writeable = False
    out = add_kernel(isolate=True)(frozen[::2], b)
    np.testing.assert_array_equal(out, a + b)
    assert not frozen.flags.writeable


FIRST = """
func.func @first(%x: memref<?xf32, strided<[?], offset: ?>>) -> f32 {
  %c0 = arith.constant 0 : index
  %v = memref.load %x[%c0] : memref<?xf32, strided<[?], offset: ?>>
  return %v : f32
}"""

HUGE = 2**46
"""Elements of a broadcast float32 view: a copy of them (256 TiB) is more than a 47-bit address space holds."""


def test_a_broadcast_view_crosses_to_the_worker_as_the_bytes_it_spans():
    """Copied element by element, a stride-0 view of 2**46 elements took hours before the call started."""
    printed = run_python(f"""
        import numpy as np
        from memkernel import mlir_kernel
        first = mlir_kernel({FIRST!r}, isolate=True)(lambda x: None)
        print(first(np.broadcast_to(np.float32(2.5), ({HUGE},))))
        """, timeout=60)
    assert printed == "2.5\n"


def test_a_view_too_big_to_copy_in_the_worker_is_an_allocation_error_naming_it():
    printed = run_python(f"""
        import numpy as np
        from memkernel import AllocationError, mlir_kernel
        total = mlir_kernel({total()!r}, isolate=True)(lambda x: None)
        try:
            total(np.broadcast_to(np.float32(1), ({HUGE},)))
        except AllocationError as exc:
            print(exc)
        """, timeout=60)
    assert printed.startswith(f"total(): argument 'x' expects memref<?xf32>; got float32[{HUGE}] with byte strides "
                              f"(0,), which the kernel cannot use in place: it needs a C-contiguous copy of shape "
                              f"({HUGE},) and dtype float32")


def test_a_worker_started_from_the_checkout_imports_the_checkouts_memkernel(tmp_path):
    """The worker's program takes the caller's folder off its path; when that is the folder holding this
    memkernel, another memkernel later on the path must not be the one the worker imports."""
    other = tmp_path / "memkernel"
    other.mkdir()
    (other / "__init__.py").write_text("raise ImportError('another memkernel')\n")
    printed = run_python(f"""
        import numpy as np
        from memkernel import mlir_kernel
        add = mlir_kernel({ADD!r}, isolate=True)(lambda in0, in1: None)
        print(add(np.ones(2, np.float32), np.ones(2, np.float32)))
        """, PYTHONPATH=os.pathsep.join([REPO, str(tmp_path)]))
    assert printed == "[2. 2.]\n"


@pytest.mark.parametrize("isolate", [True, False])
def test_the_same_array_as_input_and_output_is_one_buffer(floats, isolate):
    a = floats[0].copy()
    add_kernel(isolate=isolate)(a, a, out=a)
    np.testing.assert_array_equal(a, 2 * floats[0])


def test_isolated_results_equal_in_process_results_and_alias_the_same_arrays():
    calls = {isolate: mlir_kernel(FIRST_AND_SUM, isolate=isolate)(lambda a: None) for isolate in (True, False)}
    for isolate, kernel in calls.items():
        a = np.arange(5, dtype=np.float32)
        first, total, fresh = kernel(a)
        assert np.shares_memory(first, a), isolate
        first[0] = 42.0
        assert a[0] == 42.0
        assert type(total) is np.float32 and total == 10.0
        np.testing.assert_array_equal(fresh, np.full(3, 10.0, np.float32))
        assert not np.shares_memory(fresh, a)


SHARED_RESULTS = """
func.func @strided_pair(%n: index) -> (memref<?xf64>, memref<?xf64, strided<[2]>>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = memref.alloc(%n) : memref<?xf64>
  scf.for %i = %c0 to %n step %c1 {
    %ii = arith.index_cast %i : index to i64
    %f = arith.sitofp %ii : i64 to f64
    memref.store %f, %m[%i] : memref<?xf64>
  }
  %two = arith.constant 2 : index
  %k = arith.divui %n, %two : index
  %s = memref.subview %m[0] [%k] [2] : memref<?xf64> to memref<?xf64, strided<[2]>>
  return %m, %s : memref<?xf64>, memref<?xf64, strided<[2]>>
}"""


def test_results_in_the_kernels_memory_keep_their_strides_and_their_sharing():
    calls = {isolate: mlir_kernel(SHARED_RESULTS, isolate=isolate)(lambda n: None) for isolate in (True, False)}
    for isolate, kernel in calls.items():
        whole, evens = kernel(8)
        np.testing.assert_array_equal(whole, np.arange(8.0))
        np.testing.assert_array_equal(evens, np.arange(0.0, 8.0, 2))
        assert evens.strides == (16,), isolate
        whole[2] = -1.0
        assert evens[1] == -1.0, isolate


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_allocated_outputs_match_numpy(n):
    a = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    out = add_kernel(isolate=True)(a, a[::-1])
    np.testing.assert_array_equal(out, a + a[::-1])


COPY = """
func.func @copy(%a: memref<?xT>, %o: memref<?xT>) {
  memref.copy %a, %o : memref<?xT> to memref<?xT>
  return
}"""


@pytest.mark.parametrize("element, dtype", [
    ("f64", np.float64), ("i8", np.uint8), ("complex<f32>", np.complex64), ("i1", np.bool_),
    ("bf16", pytest.importorskip("ml_dtypes").bfloat16),
])
def test_every_element_type_crosses_unchanged(element, dtype):
    source = COPY.replace("T>", f"{element}>")
    isolated, in_process = (mlir_kernel(source, isolate=isolate)(lambda a: None) for isolate in (True, False))
    a = (np.arange(10) % 3).astype(dtype)
    out = isolated(a)
    assert out.dtype == in_process(a).dtype
    np.testing.assert_array_equal(out.view(np.uint8), a.view(np.uint8))


# -- errors are the caller's ------------------------------------------------------------


def message_of(call):
    with pytest.raises(MemkernelError) as caught:
        call()
    return type(caught.value), str(caught.value)


@pytest.mark.parametrize("make, arguments, error", [
    (add_kernel, lambda: (np.ones(4), np.ones(4, np.float32)), DTypeError),
    (add_kernel, lambda: (np.ones(4, np.float32),), ArgumentError),
    (lambda **o: mlir_kernel(STATIC_ADD, **o)(lambda in0, in1: None),
     lambda: (np.ones(5, np.float32), np.ones(5, np.float32)), ShapeError),
    (add_kernel, lambda: (np.ones(3, np.float32), np.ones(4, np.float32)), ShapeError),
])
def test_errors_are_raised_as_without_isolation(make, arguments, error):
    isolated = message_of(lambda: make(isolate=True)(*arguments()))
    in_process = message_of(lambda: make(isolate=False)(*arguments()))
    assert isolated == in_process and isolated[0] is error


def test_a_compile_error_in_the_worker_is_raised_in_the_caller():
    kernels = [mlir_kernel(MISSING_GLOBAL, isolate=isolate, cache=False)(lambda: None) for isolate in (True, False)]
    isolated, in_process = (message_of(kernel) for kernel in kernels)
    assert isolated[0] is in_process[0] is CompileError
    assert "Symbols not found: [ missing_table ]" in isolated[1]


@pytest.mark.parametrize("isolate", [True, False])
def test_an_input_that_partly_overlaps_the_output_computes_as_numpy_does(isolate):
    """Overlapping arrays overlap the same way in the worker's memory, so the call plan sees what the caller has."""
    a = np.arange(20, dtype=np.float32)
    expected = a.copy()
    np.add(expected[:16], expected[:16], out=expected[2:18])
    add_kernel(isolate=isolate)(a[:16], a[:16], out=a[2:18])
    np.testing.assert_array_equal(a, expected)


# -- switching it on ----------------------------------------------------------------------


def test_memkernel_isolate_1_isolates_a_kernel_that_did_not_ask(monkeypatch):
    monkeypatch.setenv("MEMKERNEL_ISOLATE", "1")
    assert memkernel.isolate.enabled()
    with pytest.raises(KernelCrashed, match="SIGSEGV"):
        poke_kernel()(0, 1.0)


def test_isolate_false_stays_in_process_under_memkernel_isolate_1(monkeypatch, floats):
    monkeypatch.setenv("MEMKERNEL_ISOLATE", "1")
    add = add_kernel(isolate=False)
    a, b = floats
    np.testing.assert_array_equal(add(a, b), a + b)
    assert add.invoker.plan is not None and add.invoker.last_path in ("fast", "checked")


@pytest.mark.parametrize("value, on", [("", False), ("0", False), ("1", True), ("true", True), ("on", True)])
def test_enabled_reads_memkernel_isolate(monkeypatch, value, on):
    monkeypatch.setenv("MEMKERNEL_ISOLATE", value)
    assert memkernel.isolate.enabled() is on


NOTE = """
func.func private @note(i64)
func.func @k(%n: i64) {
  call @note(%n) : (i64) -> ()
  return
}"""


def test_memkernel_isolate_1_leaves_a_kernel_with_callbacks_in_process(monkeypatch):
    monkeypatch.setenv("MEMKERNEL_ISOLATE", "1")
    noted = []
    kernel = mlir_kernel(NOTE, callbacks={"note": noted.append})(lambda n: None)
    kernel(7)
    assert noted == [7]
    assert kernel.invoker.plan is not None


def test_isolate_true_with_callbacks_is_refused_at_decoration():
    source = NOTE
    with pytest.raises(SignatureError, match=r"k\(\): isolate=True cannot run a kernel with callbacks="):
        mlir_kernel(source, callbacks={"note": print}, isolate=True)(lambda n: None)


@pytest.mark.parametrize("options, match", [
    ({"isolate": False, "timeout": 1.0}, "timeout= needs an isolated call"),
    ({"isolate": True, "timeout": 0}, "timeout must be a positive number of seconds"),
    ({"isolate": True, "timeout": "1"}, "timeout must be a positive number of seconds"),
])
def test_bad_timeouts_are_refused_at_decoration(options, match):
    with pytest.raises(memkernel.OptionError, match=match):
        add_kernel(**options)


def test_the_worker_is_another_process():
    add = add_kernel(isolate=True)
    add(np.ones(2, np.float32), np.ones(2, np.float32))
    worker = memkernel.isolate.process.worker()
    assert worker.process.pid != os.getpid() and worker.alive()


def test_timeout_bounds_the_wait_behind_another_isolated_call_which_goes_on(floats):
    spin = mlir_kernel(SPIN, isolate=True, timeout=3)(lambda n: None)
    add = add_kernel(isolate=True, timeout=0.3)
    a, b = floats
    add(a, b)  # compiled in the worker before the wait is timed
    outcome: list[BaseException] = []

    def hang() -> None:
        try:
            spin(3)
        except KernelTimeout as exc:
            outcome.append(exc)

    runner = threading.Thread(target=hang)
    runner.start()
    time.sleep(0.5)  # the spin holds the worker now
    started = time.perf_counter()
    with pytest.raises(KernelTimeout) as caught:
        add(a, b)
    waited = time.perf_counter() - started
    assert 0.25 < waited < 2
    assert str(caught.value).startswith(
        "add(in0=float32[16], in1=float32[16], out=float32[16]) waited timeout=0.3 s for the worker process, which was "
        "running another isolated call all that time, and did not start.")
    fresh = add_kernel(isolate=True, timeout=0.3)  # its first call also waits to compile in the worker
    started = time.perf_counter()
    with pytest.raises(KernelTimeout, match=r"^add\(\) waited timeout=0.3 s for the worker process"):
        fresh(a, b)
    assert time.perf_counter() - started < 2
    runner.join()
    assert len(outcome) == 1 and str(outcome[0]).startswith("spin(n=3) ran longer than timeout=3 s")
    np.testing.assert_array_equal(add(a, b), a + b)
    np.testing.assert_array_equal(fresh(a, b), a + b)


def test_a_restarted_worker_does_not_spend_the_next_calls_timeout():
    spin = mlir_kernel(SPIN, isolate=True, timeout=0.3)(lambda n: None)
    add = add_kernel(isolate=True, timeout=0.5)
    a = np.ones(2_000_000, np.float32)
    np.testing.assert_array_equal(add(a, a), a + a)
    with pytest.raises(KernelTimeout):
        spin(3)
    for _ in range(3):  # each restart of the worker (about a second) comes before the call's budget
        np.testing.assert_array_equal(add(a, a), a + a)


# -- a loop's calls ---------------------------------------------------------------------


def _read_only(arrays):
    arrays[2].flags.writeable = False


def _reshaped(arrays):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # numpy 2.5 deprecates it; the same object changes
        arrays[0].shape = (4, 4)


def _shorter(arrays):
    arrays[1] = arrays[1][:8]


@pytest.mark.parametrize("change, error", [(_read_only, ArgumentError), (_reshaped, ArgumentError),
                                           (_shorter, ShapeError)])
def test_a_call_that_repeats_the_last_one_is_checked_again_once_an_argument_changed(change, error):
    add = add_kernel(isolate=True)
    arrays = [np.arange(16, dtype=np.float32), np.ones(16, np.float32), np.zeros(16, np.float32)]
    for _ in range(3):
        add(arrays[0], arrays[1], out=arrays[2])
    change(arrays)
    with pytest.raises(error) as caught:
        add(arrays[0], arrays[1], out=arrays[2])
    in_process = add_kernel()
    with pytest.raises(error) as expected:
        in_process(arrays[0], arrays[1], out=arrays[2])
    assert str(caught.value) == str(expected.value)


def test_a_call_that_repeats_the_last_one_with_new_values_computes_them(floats):
    add = add_kernel(isolate=True)
    a, b = floats
    out = np.zeros(16, np.float32)
    for k in range(3):
        a[:] = k
        add(a, b, out=out)
        np.testing.assert_array_equal(out, k + b)


def test_a_scalar_of_another_type_in_a_repeated_call_is_checked_again():
    scale = mlir_kernel(SCALE_STRIDED, isolate=True)(lambda x, k: None)
    x = np.ones(4, np.float32)
    scale(x, 2.0)
    scale(x, 2.0)
    with pytest.raises(ArgumentError, match="expects a real number for f32, got str"):
        scale(x, "2")
    np.testing.assert_array_equal(x, [4, 4, 4, 4])


FILLED = """
func.func @filled(%n: index, %v: f32) -> memref<?xf32> {
  %m = memref.alloc(%n) : memref<?xf32>
  linalg.fill ins(%v : f32) outs(%m : memref<?xf32>)
  return %m : memref<?xf32>
}"""


@pytest.mark.parametrize("n", [4, 1 << 20])  # its pickle fits the control block, or crosses on the socket
def test_a_returned_array_comes_back_whole_however_large(n):
    filled = mlir_kernel(FILLED, isolate=True)(lambda n, v: None)
    np.testing.assert_array_equal(filled(n, 2.5), np.full(n, 2.5, np.float32))


def test_a_call_too_large_for_the_control_block_crosses_on_the_socket(monkeypatch, floats):
    add = add_kernel(isolate=True)
    a, b = floats
    monkeypatch.setattr(memkernel.isolate.control, "REQUEST_ROOM", 16)
    np.testing.assert_array_equal(add(a, b), a + b)
    np.testing.assert_array_equal(add(a[::2], b[1::2]), a[::2] + b[1::2])


def test_a_worker_killed_while_idle_is_replaced_at_the_next_call(floats):
    add = add_kernel(isolate=True)
    a, b = floats
    add(a, b)
    worker = memkernel.isolate.process.worker()
    os.kill(worker.process.pid, signal.SIGKILL)
    worker.process.wait()
    np.testing.assert_array_equal(add(a, b), a + b)
    assert memkernel.isolate.process.worker() is not worker


def test_a_worker_killed_before_the_call_while_it_lets_go_of_dropped_kernels_is_a_crash(floats, monkeypatch):
    add = add_kernel(isolate=True)
    a, b = floats
    dropped = add_kernel(isolate=True, cache=False)
    dropped(a, b)
    del dropped
    gc.collect()  # the next call first tells the worker to let go of it
    forget = memkernel.isolate.process.Worker.forget_dropped

    def killed_first(worker: memkernel.isolate.process.Worker) -> None:
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.wait()
        forget(worker)

    monkeypatch.setattr(memkernel.isolate.process.Worker, "forget_dropped", killed_first)
    with pytest.raises(KernelCrashed, match="killed by SIGKILL while letting go of dropped kernels") as caught:
        add(a, b)
    assert caught.value.signal == "SIGKILL"
    monkeypatch.undo()
    np.testing.assert_array_equal(add(a, b), a + b)


def test_a_ctrl_c_another_thread_raises_ends_an_isolated_call_in_a_fresh_interpreter():
    # As a script has it (pytest's own threads can wake the wait): the wait must end by itself to run the handler.
    out = run_python(f"""
        import signal, threading
        import numpy as np
        from memkernel import mlir_kernel
        spin = mlir_kernel({SPIN!r}, isolate=True)(lambda n: None)
        add = mlir_kernel({ADD!r}, isolate=True)(lambda a, b: None)
        a = np.arange(4, dtype=np.float32)
        add(a, a)  # the worker runs: the Ctrl-C comes while the call waits for it
        threading.Timer(0.5, lambda: signal.raise_signal(signal.SIGINT)).start()
        try:
            spin(1)
        except KeyboardInterrupt:
            print("interrupted", add(a, a).tolist())
    """, timeout=60)
    assert out.split("\n")[0] == "interrupted [0.0, 2.0, 4.0, 6.0]"


# y[0] = 1 / s: the sign of a zero s decides the sign of the infinity.
RECIPROCAL = """
func.func @reciprocal(%s: f32, %y: memref<1xf32>) {
  %c0 = arith.constant 0 : index
  %one = arith.constant 1.0 : f32
  %r = arith.divf %one, %s : f32
  memref.store %r, %y[%c0] : memref<1xf32>
  return
}"""


def test_a_call_that_differs_from_the_last_only_in_the_sign_of_a_zero_is_not_taken_for_a_repeat():
    reciprocal = mlir_kernel(RECIPROCAL, isolate=True)(lambda s, y: None)
    y = np.zeros(1, np.float32)
    with np.errstate(divide="ignore"):
        for s in (0.0, -0.0, 0.0):
            reciprocal(s, y)
            np.testing.assert_array_equal(y, np.float32(1) / np.float32(s))


def test_calls_shorter_and_longer_than_the_spin_alternate_with_numpys_answers():
    # Each side busy-waits a while for the other before it sleeps (memkernel.isolate.control): a call of 16 floats
    # is answered within the caller's spin, one of 2**21 floats after it, when the caller polls.
    @mlir_kernel(ADD, isolate=True)
    def add(a, b) -> "N": ...

    rng = np.random.default_rng(5)
    for n in (16, 2**21, 16, 16, 2**21, 3):
        a = rng.standard_normal(n, dtype=np.float32)
        b = rng.standard_normal(n, dtype=np.float32)
        np.testing.assert_array_equal(add(a, b), a + b)


def test_a_process_allowed_one_cpu_calls_without_spinning():
    # Spinning on one CPU would only delay the other side: neither side spins there, and the calls are the same.
    out = run_python(f"""
        import os
        os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})
        import numpy as np
        from memkernel import mlir_kernel
        from memkernel.isolate import control

        @mlir_kernel({ADD!r}, isolate=True)
        def add(a, b) -> "N": ...

        a = np.arange(100, dtype=np.float32)
        for k in range(50):
            assert (add(a, a + k) == a + (a + k)).all()
        print(control.SPIN_SECONDS)
    """)
    assert float(out) == 0.0


@pytest.mark.parametrize("element, value, expected", [
    ("f32", np.float32(1.5), 1.5), ("f64", 0.1, 0.1), ("i64", -(2**63), -(2**63)), ("i8", -5, -5), ("i1", True, True),
])
def test_the_worker_decodes_a_scalar_as_the_compiled_entry_takes_it(element, value, expected):
    # A Python int, bool or float: the entry runs the call; a numpy scalar would send each call to the checked path.
    from memkernel.call import scalars
    from memkernel.isolate.request import _as_given
    from memkernel.model.dtypes import element_named

    element_type = element_named(element)
    decoded = _as_given(scalars.decode(scalars.encode(value, element_type), element_type), element_type)
    assert type(decoded) is type(expected) and decoded == expected


PUT = """func.func @put(%s: f32, %o: memref<1xf32>) {
  %c0 = arith.constant 0 : index
  memref.store %s, %o[%c0] : memref<1xf32>
  return
}"""


def test_an_f32_nan_reaches_the_kernel_as_in_process():
    # Narrowing a NaN from a Python float may change its payload: a NaN stays a numpy scalar, which both paths
    # take the same way (a signalling NaN comes out quiet in either).
    isolated, here = (mlir_kernel(PUT, isolate=isolate)(lambda s: None) for isolate in (True, False))
    for bits in (0x7FC00001, 0xFFC12345, 0x7F800001):  # quiet NaNs with payloads, a signalling NaN
        value = np.array([bits], np.uint32).view(np.float32)[0]
        assert isolated(value).view(np.uint32)[0] == here(value).view(np.uint32)[0]
    assert here(np.array([0x7FC00001], np.uint32).view(np.float32)[0]).view(np.uint32)[0] == 0x7FC00001


def test_a_timeout_under_a_millisecond_holds():
    # poll() counts whole milliseconds: the last one before the deadline is waited for by spinning. A sum of 4e6
    # floats, one add after the other, takes milliseconds on any machine. (A reply already there when the caller
    # looks is taken, even past the deadline: the caller may have been descheduled meanwhile.)
    @mlir_kernel(total(), name="total", isolate=True, timeout=0.0002)
    def slow_sum(x): ...

    with pytest.raises(KernelTimeout, match=r"ran longer than timeout=0\.0002 s"):
        slow_sum(np.ones(4_000_000, np.float32))
