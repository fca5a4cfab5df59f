"""Decoration reads a kernel no cache holds in the compile worker: the caller imports no MLIR, and every error is
the one a read in process raises."""

from __future__ import annotations

import pytest

from memkernel import CompileError, MLIRSyntaxError, MemkernelError, SignatureError, mlir_kernel

from ..kernels import elementwise
from ..processes import run_python

ADD = elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="add")


def test_a_kernel_read_and_compiled_in_the_worker_leaves_mlir_out_of_the_caller(tmp_path):
    out = run_python(f"""
        import sys
        import numpy as np
        from memkernel import mlir_kernel

        add = mlir_kernel({ADD!r})(lambda a, b: None)
        x = np.arange(5, dtype=np.float32)
        print(np.array_equal(add(x, x + 1), x + (x + 1)), add.spec.name, [p for p in add.__signature__.parameters])
        print(sorted(m for m in sys.modules if m == "mlir" or m.startswith("mlir.")))
    """, MEMKERNEL_CACHE_DIR=str(tmp_path))
    assert out.splitlines() == ["True add ['a', 'b', 'out']", "[]"]


BAD = [
    ("func.func @k(%a: memref<?xf32>) { return", MLIRSyntaxError),
    ("func.func @k(%a: !llvm.ptr) { return }", SignatureError),
    (elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="k"), CompileError),  # with pipeline="not-a-pass"
]


@pytest.mark.parametrize("source, error", BAD)
def test_an_error_of_a_read_in_the_worker_is_the_error_and_message_of_a_read_in_process(source, error, monkeypatch):
    options = {"cache": True, "pipeline": "not-a-pass"} if error is CompileError else {"cache": True}

    def raised() -> MemkernelError:
        with pytest.raises(error) as caught:
            mlir_kernel(source, name="k", **options)(lambda a: None)
        return caught.value

    in_worker = raised()
    monkeypatch.setenv("MEMKERNEL_COMPILE_WORKER", "0")
    in_process = raised()
    assert type(in_worker) is type(in_process) and str(in_worker) == str(in_process)


AT = """func.func @at(%x: memref<?xf32>, %i: index, %o: memref<f32>) {
  %v = memref.load %x[%i] : memref<?xf32>
  memref.store %v, %o[] : memref<f32>
  return
}"""


def test_checked_left_to_the_environment_is_the_callers_not_the_workers(tmp_path):
    # $MEMKERNEL_CHECKED set here after the compile worker started (without it): the kernel is read and compiled
    # with runtime checks, which stop a load past the end.
    out = run_python(f"""
        import os
        import numpy as np
        from memkernel import KernelAssertionError, mlir_kernel
        import memkernel.compile.worker as compile_worker

        compile_worker.start(())
        os.environ["MEMKERNEL_CHECKED"] = "1"
        at = mlir_kernel({AT!r})(lambda x, i: None)
        x = np.arange(4, dtype=np.float32)
        print(at(x, 2))
        try:
            at(x, 1000)
        except KernelAssertionError as exc:
            print("out-of-bounds access" in str(exc))
    """, MEMKERNEL_CACHE_DIR=str(tmp_path), MEMKERNEL_CHECKED=None)
    assert out.split() == ["2.0", "True"]
