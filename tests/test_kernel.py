"""The Kernel object: binding, signature display, compilation, pipelines and libraries."""

from __future__ import annotations

import inspect
import re
import threading
import time

import numpy as np
import pytest

import memkernel.compile.build
import memkernel.compile.worker as compile_worker
import memkernel.kernel
from memkernel import ArgumentError, Kernel, SignatureError, mlir_kernel

from .forks import exit_code_of_child
from .kernels import MATMUL, axpy, elementwise
from .threads import run_together

AXPY = axpy()


@pytest.fixture(scope="module")
def matmul():
    @mlir_kernel(MATMUL)
    def matmul(a, b):
        """Multiply two matrices."""
        return (a.shape[0], b.shape[1])

    return matmul


@pytest.fixture(scope="module")
def axpy():
    @mlir_kernel(AXPY)
    def axpy(alpha, x, y=None): ...

    return axpy


def test_matmul_matches_numpy(matmul):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 3), np.float32), rng.standard_normal((3, 5), np.float32)
    np.testing.assert_allclose(matmul(a, b), a @ b, rtol=1e-5)


def test_signature_shows_each_parameter_with_its_memref_type(matmul):
    assert str(inspect.signature(matmul)) == (
        "(a: memref<?x?xf32>, b: memref<?x?xf32>, *, out: None | memref<?x?xf32> = None) -> memref<?x?xf32>"
    )


def test_repr_and_help_show_the_call_signature(matmul, capsys):
    assert repr(matmul) == f"<memkernel.Kernel matmul{inspect.signature(matmul)}>"
    help(matmul)
    # Python 3.13's help() puts each parameter of a long signature on its own line: compare unwrapped.
    shown = " ".join(capsys.readouterr().out.split()).replace("( ", "(").replace(" )", ")")
    assert f"matmul{inspect.signature(matmul)}" in shown
    assert "Multiply two matrices." in shown


def test_kernel_keeps_the_python_functions_name_and_doc(matmul):
    assert isinstance(matmul, Kernel)
    assert matmul.__name__ == "matmul"
    assert matmul.__doc__ == "Multiply two matrices."


def test_arguments_by_keyword(axpy):
    x, y = np.arange(4.0), np.ones(4)
    np.testing.assert_array_equal(axpy(y=y, x=x, alpha=2.0), 2.0 * x + y)


def test_parameter_default_is_used_when_argument_is_left_out():
    @mlir_kernel(AXPY)
    def axpy(alpha, x, y=np.full(3, 10.0)): ...

    np.testing.assert_array_equal(axpy(0.5, np.arange(3.0)), 0.5 * np.arange(3.0) + 10.0)


def test_in_place_style_writes_into_the_passed_buffers():
    @mlir_kernel(AXPY)
    def axpy(alpha, x, y, out): ...

    x, y, out = np.arange(5.0), np.ones(5), np.zeros(5)
    assert axpy(3.0, x, y, out) is None
    np.testing.assert_array_equal(out, 3.0 * x + y)


def test_name_picks_one_function_of_several_and_globals_are_usable():
    source = """
memref.global "private" constant @table : memref<4xf32> = dense<[1.0, 2.0, 3.0, 4.0]>
func.func @other(%x: f32) -> f32 { return %x : f32 }
func.func @scaled(%x: memref<4xf32>, %y: memref<4xf32>) {
  %t = memref.get_global @table : memref<4xf32>
  linalg.mul ins(%x, %t : memref<4xf32>, memref<4xf32>) outs(%y : memref<4xf32>)
  return
}"""

    @mlir_kernel(source, name="scaled")
    def by_table(x): ...

    x = np.full(4, 2.0, np.float32)
    np.testing.assert_array_equal(by_table(x), x * np.array([1, 2, 3, 4], np.float32))


def test_compile_runs_once_for_concurrent_first_calls(monkeypatch):
    calls = []
    real = memkernel.compile.build.compile_function

    def counting(*args, **kwargs):
        calls.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(memkernel.compile.build, "compile_function", counting)
    kernel = mlir_kernel(elementwise("arith.addf", "memref<?xf32>", "f32", 1), name="k", cache=False)(
        lambda a, b: None)
    x = np.arange(100, dtype=np.float32)
    barrier = threading.Barrier(4)
    results = [None] * 4

    def first_call(i):
        barrier.wait()
        results[i] = kernel(x, x)

    run_together(first_call, range(4))
    assert len(calls) == 1
    for r in results:
        np.testing.assert_array_equal(r, x + x)


def test_a_forked_child_compiles_a_kernel_another_thread_was_compiling_at_the_fork():
    kernel = mlir_kernel(elementwise("arith.addf", "memref<?xf32>", "f32", 1), name="k", cache=False)(
        lambda a, b: None)
    busy = threading.Thread(target=compile_worker.run, args=((), "sleeping", time.sleep, 3))
    busy.start()
    while not compile_worker.worker(()).busy():
        time.sleep(0.01)
    compiling = threading.Thread(target=kernel.compile)  # waits for the worker, holding the kernel's lock
    compiling.start()
    while not kernel._lock.locked():
        time.sleep(0.01)
    x = np.arange(100, dtype=np.float32)
    try:
        assert exit_code_of_child(lambda: np.array_equal(kernel(x, x), x + x), timeout=60) == 0
    finally:
        busy.join()
        compiling.join()
    np.testing.assert_array_equal(kernel(x, x), x + x)


def test_compile_forces_compilation_and_returns_the_kernel(monkeypatch):
    kernel = mlir_kernel(elementwise("arith.mulf", "memref<?xf32>", "f32", 1), name="k", cache=False)(
        lambda a, b: None)
    assert kernel.compile() is kernel
    monkeypatch.setattr(memkernel.compile.build, "compile_function", None)  # a second compile would fail
    np.testing.assert_array_equal(kernel(np.full(3, 2.0, np.float32), np.full(3, 3.0, np.float32)), 6.0)


def test_calls_from_many_threads_give_each_its_own_answer():
    kernel = mlir_kernel(elementwise("arith.addf", "memref<?xf64>", "f64", 1), name="k")(lambda a, b: None)
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(200):
            n = int(rng.integers(1, 50))
            a, b = rng.standard_normal(n), rng.standard_normal(n)
            if not np.array_equal(kernel(a, b), a + b):
                errors.append(seed)

    run_together(worker, range(4))
    assert errors == []


@pytest.mark.parametrize("opt_level", [0, 1, 2, 3])
def test_every_opt_level_computes_the_same_answer(opt_level):
    kernel = mlir_kernel(MATMUL, name="matmul", opt_level=opt_level)(lambda a, b: (a.shape[0], b.shape[1]))
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(kernel(a, b), a @ b)


@pytest.mark.parametrize("opt_level", [-1, 4, "3"])
def test_invalid_opt_level_is_refused(opt_level):
    with pytest.raises(memkernel.OptionError, match=re.escape("mlir_kernel(): opt_level must be 0, 1, 2 or 3")):
        mlir_kernel(MATMUL, opt_level=opt_level)(lambda a, b: None)


def test_custom_pipeline_is_used_instead_of_the_default():
    pipeline = (
        "func.func(convert-linalg-to-loops),expand-strided-metadata,lower-affine,convert-scf-to-cf,"
        "convert-arith-to-llvm,finalize-memref-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,"
        "reconcile-unrealized-casts"
    )

    @mlir_kernel(MATMUL, pipeline=pipeline)
    def matmul(a, b):
        return (a.shape[0], b.shape[1])

    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(matmul(a, a.T), a @ a.T)


def test_memref_copy_between_strided_layouts_links_the_runtime_library():
    source = """
func.func @copy(%a: memref<?x?xf32, strided<[?, ?], offset: ?>>, %b: memref<?x?xf32, strided<[?, ?], offset: ?>>) {
  memref.copy %a, %b : memref<?x?xf32, strided<[?, ?], offset: ?>> to memref<?x?xf32, strided<[?, ?], offset: ?>>
  return
}"""

    @mlir_kernel(source)
    def copy(a, b): ...

    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    b = np.zeros((5, 4), np.float32)
    copy(a[::2, ::-2], b.T[1::2, :3])
    expected = np.zeros((5, 4), np.float32)
    expected.T[1::2, :3] = a[::2, ::-2]
    np.testing.assert_array_equal(b, expected)


def test_shared_libs_by_name_gives_the_kernel_its_functions(capfd):
    source = """
func.func private @printF64(f64)
func.func private @printNewline()
func.func @show(%x: f64) {
  call @printF64(%x) : (f64) -> ()
  call @printNewline() : () -> ()
  return
}"""

    @mlir_kernel(source, shared_libs=["mlir_c_runner_utils"])
    def show(x): ...

    show(2.5)
    assert capfd.readouterr().out == "2.5\n"


MATH = {
    "math.tanh": np.tanh,
    "math.exp": np.exp,
    "math.sqrt": np.sqrt,
    "math.erf": None,
    "math.atan": np.arctan,
    "math.log1p": np.log1p,
}


@pytest.mark.parametrize("op", [op for op, ref in MATH.items() if ref is not None])
def test_math_ops_lower_through_llvm_or_libm(op):
    kernel = mlir_kernel(elementwise(op, "memref<?xf64>", "f64", 1, n_inputs=1), name="k")(lambda a: None)
    x = np.linspace(0.1, 3.0, 17)
    np.testing.assert_allclose(kernel(x), MATH[op](x), rtol=1e-12)


def test_math_erf_lowers_through_libm():
    import math

    kernel = mlir_kernel(elementwise("math.erf", "memref<?xf64>", "f64", 1, n_inputs=1), name="k")(lambda a: None)
    x = np.linspace(-2.0, 2.0, 9)
    np.testing.assert_allclose(kernel(x), [math.erf(v) for v in x], rtol=1e-12)


def test_complex_ops_lower_to_standard_arithmetic():
    kernel = mlir_kernel(elementwise("complex.div", "memref<?xcomplex<f64>>", "complex<f64>", 1), name="k")(
        lambda a, b: None)
    a = np.array([1 + 2j, -3 + 0.5j, 4j])
    b = np.array([2 - 1j, 0.25 + 0.25j, -1 + 1j])
    np.testing.assert_allclose(kernel(a, b), a / b, rtol=1e-12)


def test_affine_and_vector_kernels_lower():
    source = """
func.func @twice(%a: memref<16xf32>, %b: memref<16xf32>) {
  %pad = arith.constant 0.0 : f32
  affine.for %i = 0 to 16 step 8 {
    %v = vector.transfer_read %a[%i], %pad {in_bounds = [true]} : memref<16xf32>, vector<8xf32>
    %w = arith.addf %v, %v : vector<8xf32>
    vector.transfer_write %w, %b[%i] {in_bounds = [true]} : vector<8xf32>, memref<16xf32>
  }
  return
}"""

    @mlir_kernel(source)
    def twice(a): ...

    a = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(twice(a), 2 * a)


def test_argument_error_is_a_type_error_showing_the_call_signature(matmul):
    with pytest.raises(ArgumentError) as info:
        matmul(np.ones((2, 2), np.float32))
    assert isinstance(info.value, TypeError)
    assert str(info.value).startswith("matmul(a: memref<?x?xf32>, b: memref<?x?xf32>, *, out:")
    assert "missing argument 'b'" in str(info.value)


def test_a_lambda_takes_the_sources_only_function():
    kernel = mlir_kernel(elementwise("arith.subf", "memref<?xf64>", "f64", 1, name="minus"))(lambda a, b: None)
    np.testing.assert_array_equal(kernel(np.arange(3.0), np.ones(3)), np.arange(3.0) - 1)


def test_a_lambda_with_several_functions_must_be_named():
    source = MATMUL + AXPY
    with pytest.raises(SignatureError, match=r"a lambda has no name to pick a function by "
                                             r"\(defined: @matmul, @axpy\); pass name="):
        mlir_kernel(source)(lambda a, b: None)


def test_a_source_that_is_not_text_is_an_option_error():
    with pytest.raises(memkernel.OptionError, match=re.escape("mlir_kernel(): the MLIR source must be a str, got bytes")):
        mlir_kernel(b"func.func @k() { return }")(lambda: None)
