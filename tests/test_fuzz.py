"""Fuzzing the public API: kernels of varied signatures, called with every kind of right and wrong input.

Every call runs in a worker process (``tests/fuzz/worker.py``), so a crash is a
reported failure naming the call, never a dead test run. Each call must equal
numpy's answer or raise a MemkernelError that names an argument; no signal, no
hang, no write outside the arrays passed, no change to an input the kernel does
not write. The default profile runs a few hundred calls; for a long run:
``python -m pytest tests/test_fuzz.py --hypothesis-profile=memkernel-fuzz-long``.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .fuzz.calls import ArrayArg, CallCase, KernelCase, OverlapOut

REPO = Path(__file__).resolve().parents[1]
CALL_TIMEOUT = 120.0


class Worker:
    """The fuzz worker process: started on first use, restarted after it dies."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen([sys.executable, "-m", "tests.fuzz.worker"], cwd=REPO,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            env={**os.environ, "PYTHONPATH": str(REPO)})
        return self.process

    def run(self, case: KernelCase, call: CallCase) -> list[str]:
        process = self.start()
        assert process.stdin is not None and process.stdout is not None
        request = pickle.dumps((case, call))
        try:
            process.stdin.write(struct.pack("<Q", len(request)) + request)
            process.stdin.flush()
            header = process.stdout.read(8)
        except BrokenPipeError:
            header = b""
        if len(header) < 8:
            return [self._death(process)]
        return pickle.loads(process.stdout.read(struct.unpack("<Q", header)[0]))

    def _death(self, process: subprocess.Popen[bytes]) -> str:
        try:
            code = process.wait(timeout=CALL_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        assert process.stderr is not None
        tail = process.stderr.read().decode(errors="replace")[-2000:]
        self.process = None
        what = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return f"the worker died ({what}):\n{tail}"

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def worker():
    running = Worker()
    yield running
    running.close()


ELEMENTS = {"binary": ["f32", "f64", "i32"], "matmul": ["f32", "f64"], "reduce": ["f32", "f64", "i32"],
            "loop": ["f32", "f64"], "two": ["f32", "i32"], "scalars": ["f32"]}
DTYPES = {"f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64"}
VIEWS = ["plain", "plain", "plain", "step", "negative", "transposed", "offset", "list", "liar"]
WRONG_DTYPES = ["float64", "float32", "int64", "int32", "uint8", "bool", "complex64"]


@st.composite
def kernels(draw: st.DrawFn) -> KernelCase:
    kind = draw(st.sampled_from(list(ELEMENTS)))
    element = draw(st.sampled_from(ELEMENTS[kind]))
    if kind == "binary":
        rank = draw(st.integers(1, 2))
        static = tuple(draw(st.sampled_from([None, None, 3])) for _ in range(rank))
        return KernelCase(kind, element, rank, static, draw(st.booleans()))
    return KernelCase(kind, element, strided=kind == "matmul" and draw(st.booleans()))


@st.composite
def arrays(draw: st.DrawFn, dtype: str, shape: tuple[int, ...], writable: bool = False) -> ArrayArg:
    """An array argument: mostly right, sometimes with a wrong dtype, rank, dim, view or flag."""
    if draw(st.integers(0, 9)) == 0:
        dtype = draw(st.sampled_from(WRONG_DTYPES))
    if shape and draw(st.integers(0, 6)) == 0:
        dim = draw(st.integers(0, len(shape) - 1))
        shape = shape[:dim] + (draw(st.integers(0, 7)),) + shape[dim + 1:]
    if draw(st.integers(0, 14)) == 0:
        shape = shape[:-1] if shape else (2,)
    view = draw(st.sampled_from(VIEWS if not writable else VIEWS[:-2] + ["list"]))
    return ArrayArg(dtype, shape, view if shape else "plain", readonly=draw(st.integers(0, 9)) == 0,
                    fill=draw(st.sampled_from(["small", "small", "nan"])))


SCALARS = [0, 1, -1, 127, 128, 255, 256, -129, 2**31 - 1, 2**31, -2**31, 2**40, -2**70, 1.5, float("nan"),
           float("inf"), 3.4e38, 1e39, True, None, "1", [1]]


@st.composite
def calls(draw: st.DrawFn, case: KernelCase) -> CallCase:
    dtype = DTYPES[case.element]
    n = draw(st.integers(0, 6))
    if case.kind == "binary":
        shape = tuple(3 if s is not None else draw(st.integers(0, 5)) for s in case.static)
        out = draw(st.one_of(st.none(), arrays(dtype, shape, writable=True),
                             st.builds(OverlapOut, st.integers(0, 1), st.integers(-3, 3))))
        return CallCase((draw(arrays(dtype, shape)), draw(arrays(dtype, shape))), out)
    if case.kind == "matmul":
        m, k = draw(st.integers(0, 5)), draw(st.integers(0, 5))
        out = draw(st.one_of(st.none(), arrays(dtype, (m, n), writable=True)))
        return CallCase((draw(arrays(dtype, (m, k))), draw(arrays(dtype, (k, n)))), out)
    if case.kind == "reduce":
        out = draw(st.one_of(st.none(), arrays(dtype, (), writable=True)))
        return CallCase((draw(arrays(dtype, (n,))),), out)
    if case.kind == "loop":
        scale = draw(st.one_of(st.sampled_from(SCALARS), st.floats(width=32)))
        return CallCase((draw(arrays(dtype, (n,))), scale, draw(arrays(dtype, (n,), writable=True))))
    if case.kind == "two":
        return CallCase((draw(arrays(dtype, (n,))), draw(arrays(dtype, (n,)))))
    scalar = st.one_of(st.sampled_from(SCALARS), st.integers(-2**40, 2**40))
    return CallCase((draw(scalar), draw(scalar), draw(st.one_of(st.sampled_from(SCALARS), st.floats()))))


@st.composite
def batches(draw: st.DrawFn) -> tuple[KernelCase, list[CallCase]]:
    case = draw(kernels())
    return case, draw(st.lists(calls(case), min_size=1, max_size=8))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=batches())
def test_every_call_is_numpys_answer_or_a_named_error(worker: Worker, batch: tuple[KernelCase, list[Any]]):
    case, drawn = batch
    for call in drawn:
        problems = worker.run(case, call)
        assert not problems, f"{case.source()}\ncalled with {call}:\n" + "\n".join(problems)
