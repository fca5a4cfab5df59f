"""The async runtime's tasks: counted, so a parallel kernel's code outlives them, and kept on their own
thread when a task starts more, so nested parallel kernels never wait for a pool that waits for them."""

from __future__ import annotations

import pytest

from tests.processes import run_python

PARALLEL_EXP = """
    import sys, threading
    import numpy as np
    sys.path.append("tests")
    from kernels import elementwise
    from memkernel import mlir_kernel
    inner = mlir_kernel(elementwise("math.exp", "memref<?x?xf64>", "f64", 2, n_inputs=1, name="inner_exp"),
                        parallel=True)(lambda x: None)
    x = np.linspace(-1, 1, 3000 * 7).reshape(3000, 7)
"""

CALLING_BACK = """
    func.func private @cb()
    func.func @outer(%x: memref<?xf64>) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %n = memref.dim %x, %c0 : memref<?xf64>
      scf.parallel (%i) = (%c0) to (%n) step (%c1) {
        func.call @cb() : () -> ()
        scf.reduce
      }
      return
    }
"""


@pytest.mark.parametrize("callers", ["every thread", "the pool's threads only"])
def test_a_parallel_kernel_called_from_a_parallel_kernels_callback_runs_to_the_end(callers, tmp_path):
    """Each pool thread, inside the outer kernel's task, called the inner kernel and blocked waiting for
    tasks queued behind it on the same pool: the call hung for good."""
    skip = "if threading.current_thread() is threading.main_thread(): return" if callers != "every thread" else ""
    out = run_python(PARALLEL_EXP + f"""
    results = []
    def cb():
        {skip}
        results.append(np.allclose(inner(x), np.exp(x), rtol=1e-14))
    outer = mlir_kernel('''{CALLING_BACK.rstrip()}''', parallel=True, callbacks={{"cb": cb}})(lambda x: None)
    outer(np.ones(5000))
    print(len(results), all(results))
    """, timeout=120, MEMKERNEL_CACHE_DIR=str(tmp_path))
    count, right = out.split()
    assert right == "True" and int(count) >= (5000 if callers == "every thread" else 1)


def test_a_parallel_kernel_compiled_after_another_records_the_async_runtime_it_links(tmp_path):
    """The first parallel kernel's load put the async runtime into the process's global scope, so the next
    kernel's entry left it out: a fresh process could not link that entry from the disk cache, and
    compiled it again (with "JIT session error: Symbols not found" on stderr)."""
    run_python(PARALLEL_EXP + """
    inner(x)
    second = mlir_kernel(elementwise("math.exp", "memref<?xf64>", "f64", 1, n_inputs=1, name="second_exp"),
                         parallel=True)(lambda x: None)
    second(np.ones(5000))
    """, MEMKERNEL_CACHE_DIR=str(tmp_path))
    out = run_python("""
    import sys
    import numpy as np
    sys.path.append("tests")
    from kernels import elementwise
    from memkernel import mlir_kernel
    import memkernel.compile.build
    memkernel.compile.build.compile_function = None  # from the disk cache only
    second = mlir_kernel(elementwise("math.exp", "memref<?xf64>", "f64", 1, n_inputs=1, name="second_exp"),
                         parallel=True)(lambda x: None)
    x = np.linspace(-1, 1, 5000)
    print(np.allclose(second(x), np.exp(x), rtol=1e-14))
    """, MEMKERNEL_CACHE_DIR=str(tmp_path))
    assert out.split() == ["True"]
