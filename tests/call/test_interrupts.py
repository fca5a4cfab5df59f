"""A Ctrl-C during a HeldInterrupts block that holds waits for the block's end; otherwise it is raised at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from memkernel.call.interrupts import HeldInterrupts

from ..kernels import elementwise


def test_a_ctrl_c_while_holding_is_raised_when_the_block_ends():
    done = []
    with pytest.raises(KeyboardInterrupt), HeldInterrupts():
        signal.raise_signal(signal.SIGINT)
        done.append("after the signal")
    assert done == ["after the signal"]


def test_a_ctrl_c_while_not_holding_is_raised_at_once():
    done = []
    with pytest.raises(KeyboardInterrupt), HeldInterrupts(holding=False):
        signal.raise_signal(signal.SIGINT)
        done.append("after the signal")
    assert done == []


def test_let_through_raises_the_ctrl_c_held_so_far():
    done = []
    with pytest.raises(KeyboardInterrupt), HeldInterrupts() as interrupts:
        signal.raise_signal(signal.SIGINT)
        done.append("held")
        interrupts.let_through()
        done.append("after let_through")
    assert done == ["held"]


def test_the_held_signal_goes_to_the_callers_own_handler_which_is_then_restored():
    received = []

    def handler(signum, frame):
        received.append(signum)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        with HeldInterrupts():
            signal.raise_signal(signal.SIGINT)
            assert received == []
        assert received == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_ignored_sigint_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with HeldInterrupts():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_block_in_another_thread_installs_nothing():
    seen = []

    def block() -> None:
        with HeldInterrupts():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=block)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


def test_a_nested_block_passes_its_ctrl_c_to_the_outer_one_which_holds_it_to_its_end():
    done = []
    with pytest.raises(KeyboardInterrupt), HeldInterrupts():
        with HeldInterrupts():
            signal.raise_signal(signal.SIGINT)
        done.append("after the inner block")
    assert done == ["after the inner block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


REPEATED_CTRL_C = """
import os, random, signal, sys, threading, time
import numpy as np
from memkernel import mlir_kernel
add = mlir_kernel(open(sys.argv[1]).read(), name="add")(lambda a, b: None)
armed = [False]
def handler(signum, frame):
    if armed[0]:
        armed[0] = False
        raise KeyboardInterrupt
signal.signal(signal.SIGINT, handler)
def ping():
    while True:
        time.sleep(random.uniform(0.0005, 0.05))
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
threading.Thread(target=ping, daemon=True).start()
x = np.arange(8, dtype=np.float32)
done, started = 0, time.time()
while time.time() - started < 4:
    try:
        armed[0] = True
        result = add(x, x)
        armed[0] = False
        assert np.array_equal(result, x + x)
        done += 1
    except KeyboardInterrupt:
        armed[0] = False
print("ok")
"""


def test_repeated_ctrl_c_during_a_first_call_never_crashes_the_process(tmp_path):
    """A KeyboardInterrupt inside the first import of the MLIR bindings' native modules left them half made, and
    freeing its traceback crashed the process (SIGSEGV in 2 of 3 runs before the fix)."""
    source = tmp_path / "add.mlir"
    source.write_text(elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="add"))
    for run in range(2):
        done = subprocess.run([sys.executable, "-c", REPEATED_CTRL_C, str(source)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "MEMKERNEL_CACHE_DIR": str(tmp_path / f"cache{run}")})
        assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr[-2000:]
