"""What kernels print reaches sys.stdout/sys.stderr, in order; MLIR's IR at each stage can be read."""

from __future__ import annotations

import numpy as np
import pytest

import memkernel.stdio
from memkernel import mlir_kernel

from .kernels import elementwise

SHOW = """
func.func private @printMemrefF32(memref<*xf32>) attributes {llvm.emit_c_interface}
func.func @show(%x: memref<?xf32>, %s: f32) {
  %u = memref.cast %x : memref<?xf32> to memref<*xf32>
  call @printMemrefF32(%u) : (memref<*xf32>) -> ()
  vector.print %s : f32
  return
}"""


def show_kernel(**options):
    return mlir_kernel(SHOW, name="show", shared_libs=["mlir_runner_utils"], **options)(lambda x, s: None)


def test_printed_output_reaches_capsys_in_order(capsys):
    show = show_kernel()
    print("before")
    show(np.array([1.0, 2.0, 3.0], np.float32), 2.5)
    print("after")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "before" and lines[-1] == "after"
    assert "[1,  2,  3]" in out and "2.5" in lines[-2]


def test_capture_output_false_leaves_the_c_streams_alone(capfd):
    show = show_kernel(capture_output=False)
    show(np.array([4.0], np.float32), 1.5)
    assert "[4]" in capfd.readouterr().out


def test_a_kernel_that_cannot_print_is_never_captured(monkeypatch, capsys):
    def refuse(call):
        raise AssertionError("captured a kernel that cannot print")

    monkeypatch.setattr(memkernel.stdio, "captured", refuse)
    kernel = mlir_kernel(elementwise("math.sin", "memref<?xf64>", "f64", 1, n_inputs=1), name="k",
                         cache=False)(lambda a: None)
    np.testing.assert_allclose(kernel(np.linspace(0, 1, 5)), np.sin(np.linspace(0, 1, 5)))


def test_capture_output_true_captures_even_in_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(memkernel.stdio, "python_streams_are_the_c_streams", lambda: True)
    show = show_kernel(capture_output=True)
    show(np.array([7.0], np.float32), 0.5)
    assert "[7]" in capsys.readouterr().out


def test_memref_kernel_stages():
    kernel = mlir_kernel(elementwise("arith.addf", "memref<?xf32>", "f32", 1), name="k")(lambda a, b: None)
    assert "linalg.generic" in kernel.ir("input") and "llvm.emit_c_interface" in kernel.ir("input")
    assert kernel.ir("bufferized") == kernel.ir("input")
    loops = kernel.ir("loops")
    assert "linalg" not in loops and "cf.cond_br" in loops
    llvm = kernel.ir("llvm")
    assert "llvm.func @k(" in llvm and "func.func" not in llvm


def test_tensor_kernel_stages_show_bufferization():
    kernel = mlir_kernel("""func.func @twice(%a: tensor<?xf32>) -> tensor<?xf32> {
  %r = arith.addf %a, %a : tensor<?xf32>
  return %r : tensor<?xf32>
}""")(lambda a: None)
    assert "tensor<?xf32>" in kernel.ir("input")
    bufferized = kernel.ir("bufferized")
    assert "tensor<" not in bufferized and "memref.alloc" in bufferized


def test_llvm_ir_is_the_translated_module():
    kernel = mlir_kernel(elementwise("arith.mulf", "memref<?xf64>", "f64", 1), name="k")(lambda a, b: None)
    text = kernel.llvm_ir()
    assert "define void @k(" in text and "fmul" in text


def test_unknown_stage_is_a_value_error():
    kernel = mlir_kernel(elementwise("arith.addf", "memref<?xf32>", "f32", 1), name="k")(lambda a, b: None)
    with pytest.raises(ValueError, match="stage must be one of 'input', 'bufferized', 'vectorized', 'loops', 'llvm'"):
        kernel.ir("machine")


def test_custom_pipeline_has_input_and_llvm_stages_only():
    pipeline = ("func.func(convert-linalg-to-loops),expand-strided-metadata,lower-affine,convert-scf-to-cf,"
                "convert-arith-to-llvm,finalize-memref-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,"
                "reconcile-unrealized-casts")
    kernel = mlir_kernel(elementwise("arith.addf", "memref<?xf32>", "f32", 1), name="k",
                         pipeline=pipeline)(lambda a, b: None)
    assert "llvm.func @k(" in kernel.ir("llvm")
    with pytest.raises(ValueError, match="a custom pipeline has the stages 'input' and 'llvm'"):
        kernel.ir("loops")
