"""A heap allocation of the kernel's that fails is an AllocationError on every call path, never a write
through NULL, which killed the process (SIGSEGV): every kernel here runs in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[2])

# out[0] = 7, then a scratch buffer of n floats, filled with 1 and read at i into out[1].
SCRATCH = """func.func @scratch(%n: index, %i: index, %out: memref<2xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %seven = arith.constant 7.0 : f32
  memref.store %seven, %out[%c0] : memref<2xf32>
  %m = memref.alloc(%n) : memref<?xf32>
  %one = arith.constant 1.0 : f32
  linalg.fill ins(%one : f32) outs(%m : memref<?xf32>)
  %v = memref.load %m[%i] : memref<?xf32>
  memref.store %v, %out[%c1] : memref<2xf32>
  memref.dealloc %m : memref<?xf32>
  return
}"""

# The same, returning what it read: a scalar result, called through the fast path's raw function.
SCRATCH_RESULT = """func.func @scratch(%n: index, %i: index) -> f32 {
  %m = memref.alloc(%n) : memref<?xf32>
  %one = arith.constant 1.0 : f32
  linalg.fill ins(%one : f32) outs(%m : memref<?xf32>)
  %v = memref.load %m[%i] : memref<?xf32>
  memref.dealloc %m : memref<?xf32>
  return %v : f32
}"""

ZEROS = """func.func @zeros(%n: index) -> tensor<?xi8> {
  %empty = tensor.empty(%n) : tensor<?xi8>
  %zero = arith.constant 0 : i8
  %filled = linalg.fill ins(%zero : i8) outs(%empty : tensor<?xi8>) -> tensor<?xi8>
  return %filled : tensor<?xi8>
}"""

HUGE = 2**60  # floats: 2**62 bytes, which no malloc gives
MESSAGE = ("scratch(): a memref.alloc in the kernel could not get 4611686018427387904 bytes (4.29e+09 GiB): malloc "
           "returned NULL. It stopped there: what it wrote before is in the arrays, and what it allocated before is "
           "not freed.")
TOO_BIG = ("scratch(): a memref.alloc in the kernel asked for 2**63 bytes or more (its dims times its element size, "
           "plus its alignment, overflow 64 bits, or a dim is negative).")

PRELUDE = """
import threading
import numpy as np
from memkernel import AllocationError, mlir_kernel
from tests.compile.test_allocations import HUGE, SCRATCH, SCRATCH_RESULT, ZEROS

def attempt(call):
    try:
        return call()
    except AllocationError as error:
        print("raised:", error)
"""


def _python(script: str, fast: bool = True) -> list[str]:
    """The lines ``script`` (after :data:`PRELUDE`) prints in a fresh interpreter, the fast path on or off."""
    environment = {**os.environ, "PYTHONPATH": REPO, "MEMKERNEL_CACHE_DIR": ""}
    environment.pop("MEMKERNEL_FAST_PATH", None)
    if not fast:
        environment["MEMKERNEL_FAST_PATH"] = "0"
    run = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script)], capture_output=True, text=True,
                         timeout=300, cwd=REPO, env=environment)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.splitlines()


CALLS = {
    "entry, allocating out": ("SCRATCH", "scratch(HUGE, 5)", "scratch(2, 1)"),
    "entry, given out=": ("SCRATCH", "scratch(HUGE, 5, out=given)", "scratch(2, 1, out=given)"),
    "raw fast path, scalar result": ("SCRATCH_RESULT", "scratch(HUGE, 5)", "[7.0, scratch(2, 1)]"),
}


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "checked path"])
def test_a_failed_allocation_is_an_allocation_error_and_the_next_call_works(fast: bool) -> None:
    script = "".join(f"""
        scratch = mlir_kernel({source}, cache=False)(lambda n, i: (2,))
        given = np.zeros(2, np.float32)
        attempt(lambda: {failing})
        print("given:", given.tolist())
        print("then:", [float(v) for v in {working}], scratch.invoker.last_path)
    """ for source, failing, working in CALLS.values())
    lines = _python(script, fast)
    for i, (call, (_, failing, _)) in enumerate(CALLS.items()):
        raised, given, then = lines[3 * i:3 * i + 3]
        assert raised.startswith("raised: " + MESSAGE), call
        written = [7.0, 0.0] if "out=" in failing else [0.0, 0.0]  # out[0] = 7 came before the allocation
        assert given == f"given: {written}", call
        assert then == f"then: [7.0, 1.0] {'fast' if fast else 'checked'}", call


def test_the_fast_and_checked_paths_raise_the_same_error() -> None:
    lines = _python("""
        scratch = mlir_kernel(SCRATCH, cache=False)(lambda n, i: (2,))
        attempt(lambda: scratch(HUGE, 5))
        print(scratch.invoker.fast is not None)
        attempt(lambda: scratch.invoker.plan.call((HUGE, 5), (None,)))
    """)
    assert lines[1] == "True"
    assert lines[0] == lines[2] and lines[0].startswith("raised: " + MESSAGE)


@pytest.mark.parametrize("n", [2**62 + 1, 2**61, -1], ids=["wraps to 4 bytes", "2**63 bytes", "negative"])
def test_a_size_of_2_to_the_63_bytes_or_more_is_an_allocation_error_before_malloc(n: int) -> None:
    # 2**62 + 1 floats: the lowering's product wrapped to 4 bytes, which malloc gave, and the kernel wrote past.
    lines = _python(f"""
        scratch = mlir_kernel(SCRATCH, cache=False)(lambda n, i: (2,))
        attempt(lambda: scratch({n}, 0))
        print(scratch(3, 2).tolist())
    """)
    assert lines == ["raised: " + TOO_BIG + " It stopped there: what it wrote before is in the arrays, and what it "
                     "allocated before is not freed.", "[7.0, 1.0]"]


def test_a_size_that_its_alignment_takes_past_2_to_the_63_bytes_is_an_allocation_error_before_malloc() -> None:
    # (2**61 - 1) floats are 2**63 - 4 bytes; the lowering asks malloc for 4096 more, which wrapped past 2**63.
    aligned = "%m = memref.alloc(%n) {alignment = 4096} : memref<?xf32>"
    lines = _python(f"""
        scratch = mlir_kernel(SCRATCH.replace("%m = memref.alloc(%n) : memref<?xf32>", {aligned!r}),
                              cache=False)(lambda n, i: (2,))
        attempt(lambda: scratch({2**61 - 1}, 0))
        print(scratch(3, 2).tolist())
    """)
    assert lines == ["raised: " + TOO_BIG + " It stopped there: what it wrote before is in the arrays, and what it "
                     "allocated before is not freed.", "[7.0, 1.0]"]


def test_an_empty_allocation_is_not_a_failure() -> None:
    lines = _python("""
        scratch = mlir_kernel(SCRATCH.replace("%v = memref.load %m[%i] : memref<?xf32>",
                                              "%v = memref.load %out[%i] : memref<2xf32>"), cache=False)(
            lambda n, i: (2,))
        print(scratch(0, 0).tolist())
    """)
    assert lines == ["[7.0, 7.0]"]


def test_an_allocation_bufferization_made_is_an_allocation_error_too() -> None:
    lines = _python("""
        zeros = mlir_kernel(ZEROS, cache=False)(lambda n: None)
        print(zeros(5).tolist())
        attempt(lambda: zeros(2**62))
    """)
    assert lines[0] == "[0, 0, 0, 0, 0]"
    assert re.match(r"raised: zeros\(\): a memref.alloc in the kernel could not get 46116860184273879\d\d bytes "
                    r"\(4.29e\+09 GiB\): malloc returned NULL", lines[1])  # 2**62 and the alignment's padding


def test_threads_raise_and_return_each_their_own_answer() -> None:
    lines = _python("""
        scratch = mlir_kernel(SCRATCH, cache=False)(lambda n, i: (2,))
        wrong = []

        def calls(failing):
            for _ in range(200):
                try:
                    out = scratch(HUGE if failing else 8, 3)
                except AllocationError:
                    if not failing:
                        wrong.append("raised")
                    continue
                if failing or out.tolist() != [7.0, 1.0]:
                    wrong.append(f"returned {out}")

        threads = [threading.Thread(target=calls, args=(i % 2 == 0,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(wrong, scratch.invoker.last_path)
    """)
    assert lines == ["[] fast"]
