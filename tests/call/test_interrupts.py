"""A Ctrl-C during a HeldInterrupts block that holds waits for the block's end; otherwise it is raised at once."""

from __future__ import annotations

import signal
import threading

import pytest

from memkernel.call.interrupts import HeldInterrupts


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
