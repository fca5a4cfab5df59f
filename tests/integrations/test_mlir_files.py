"""The MLIR test files of tests/mlir: run through memkernel's pytest plugin, checked with filecheck,
and printing what upstream's mlir-opt | mlir-runner prints for them."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import mlir.ir
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MLIR_FILES = ROOT / "tests" / "mlir"
TOOLS = Path(mlir.ir.__file__).parent / "bin"
RUNTIME = Path(mlir.ir.__file__).parent / "lib"


def plugin_arguments() -> list[str]:
    """``-p memkernel.pytest_plugin`` unless an installed memkernel already registers the plugin."""
    registered = any(e.value == "memkernel.pytest_plugin" for e in importlib.metadata.entry_points(group="pytest11"))
    return [] if registered else ["-p", "memkernel.pytest_plugin"]


def run_pytest(*arguments: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_arguments(), *arguments]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=600)


def test_every_mlir_file_is_collected_once_per_run_line_and_passes_its_checks() -> None:
    run = run_pytest("-v", f"--memkernel-mlir={MLIR_FILES}", str(MLIR_FILES))
    assert run.returncode == 0, run.stdout + run.stderr
    passed = sorted(re.findall(r"(\S+\.mlir::\S+) PASSED", run.stdout))
    assert passed == [
        "tests/mlir/async_values.mlir::main",
        "tests/mlir/matrix_intrinsic.mlir::main",
        "tests/mlir/memref_sequence.mlir::main",
        "tests/mlir/printed_memref.mlir::main",
        "tests/mlir/printed_vectors.mlir::main",
        "tests/mlir/scalar_results.mlir::big",
        "tests/mlir/scalar_results.mlir::half_of_five",
        "tests/mlir/scalar_results.mlir::sum_to_ten",
        "tests/mlir/sparse_scale.mlir::entry",
        "tests/mlir/transform_schedule.mlir::main",
        "tests/mlir/unpack_dynamic_inner_tile.mlir::main",
    ]


def _upstream(path: Path, passes: list[str], entry: str, result: str, runtimes: tuple[str, ...] = (),
              runner_options: tuple[str, ...] = ()) -> str:
    lowered = subprocess.run([str(TOOLS / "mlir-opt"), str(path), *passes], capture_output=True, text=True,
                             check=True).stdout
    libraries = ",".join(str(RUNTIME / f"lib{name}.so") for name in ("mlir_c_runner_utils", "mlir_runner_utils",
                                                                      *runtimes))
    return subprocess.run([str(TOOLS / "mlir-runner"), "-e", entry, f"-entry-point-result={result}",
                           f"-shared-libs={libraries}", *runner_options], input=lowered, capture_output=True, text=True,
                          check=True).stdout


def _memkernel_run(path: Path, entry: str, result: str) -> str:
    return subprocess.run([sys.executable, "-m", "memkernel.cli", "run", str(path), "-e", entry,
                           f"-entry-point-result={result}"], capture_output=True, text=True, check=True,
                          env={**os.environ, "MEMKERNEL_CACHE_DIR": ""}).stdout


def _without_addresses(text: str) -> str:
    return re.sub(r"base@ = 0x[0-9a-f]+", "base@ = ADDRESS", text)


_TO_LLVM = ["--convert-linalg-to-loops", "--convert-scf-to-cf", "--expand-strided-metadata",
            "--finalize-memref-to-llvm", "--convert-arith-to-llvm", "--convert-func-to-llvm",
            "--convert-cf-to-llvm", "--reconcile-unrealized-casts"]


def test_memkernel_run_prints_what_mlir_runner_prints_for_a_printed_memref() -> None:
    path = MLIR_FILES / "printed_memref.mlir"
    expected = _upstream(path, _TO_LLVM, "main", "void")
    assert "[[4,   5]" in expected
    assert _without_addresses(_memkernel_run(path, "main", "void")) == _without_addresses(expected)


def test_memkernel_run_prints_a_scalar_result_as_mlir_runner_does() -> None:
    path = MLIR_FILES / "scalar_results.mlir"
    for entry, result in (("half_of_five", "f32"), ("sum_to_ten", "i32"), ("big", "i64")):
        assert _memkernel_run(path, entry, result) == _upstream(path, _TO_LLVM, entry, result)


# What upstream's mlir/test/Integration/Dialect/Memref/print-memref.mlir prints, cut to its complex memrefs.
PRINTED_COMPLEX = """
func.func private @printMemrefC32(%ptr : tensor<*xcomplex<f32>>) attributes { llvm.emit_c_interface }
func.func private @printMemrefC64(%ptr : tensor<*xcomplex<f64>>) attributes { llvm.emit_c_interface }
func.func @entry() {
  %c32 = arith.constant dense<(1.000000e+01,5.000000e+00)> : tensor<3x3xcomplex<f32>>
  %c64 = arith.constant dense<(2.000000e+01,5.000000e+00)> : tensor<3x3xcomplex<f64>>
  %1 = tensor.cast %c32 : tensor<3x3xcomplex<f32>> to tensor<*xcomplex<f32>>
  %2 = tensor.cast %c64 : tensor<3x3xcomplex<f64>> to tensor<*xcomplex<f64>>
  call @printMemrefC32(%1) : (tensor<*xcomplex<f32>>) -> ()
  call @printMemrefC64(%2) : (tensor<*xcomplex<f64>>) -> ()
  return
}
"""


def test_memkernel_run_prints_complex_memrefs_as_mlir_runner_does(tmp_path: Path) -> None:
    path = tmp_path / "print-complex.mlir"
    path.write_text(PRINTED_COMPLEX)
    passes = ["--one-shot-bufferize=bufferize-function-boundaries", "--canonicalize", "--finalize-memref-to-llvm",
              "--convert-func-to-llvm", "--reconcile-unrealized-casts"]
    expected = _upstream(path, passes, "entry", "void")
    assert "(10,5)" in expected and "(20,5)" in expected
    assert _without_addresses(_memkernel_run(path, "entry", "void")) == _without_addresses(expected)


def test_memkernel_run_prints_what_the_sparsifier_and_mlir_runner_print_for_a_sparse_kernel() -> None:
    path = MLIR_FILES / "sparse_scale.mlir"
    expected = _upstream(path, ["--sparsifier=enable-runtime-library=true"], "entry", "void")
    assert "( 2, 2, 2, 4, 6, 8, 2, 10, 2, 2, 12, 2, 14, 2, 2, 16 )" in expected
    assert _memkernel_run(path, "entry", "void") == expected


_ASYNC_PASSES = ["--pass-pipeline=builtin.module(async-to-async-runtime,func.func(async-runtime-ref-counting,"
                 "async-runtime-ref-counting-opt),convert-async-to-llvm,func.func(convert-arith-to-llvm),"
                 "convert-vector-to-llvm,finalize-memref-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,"
                 "reconcile-unrealized-casts)"]


def test_memkernel_run_prints_what_mlir_runner_prints_for_async_values() -> None:
    path = MLIR_FILES / "async_values.mlir"
    expected = _upstream(path, _ASYNC_PASSES, "main", "void", ("mlir_async_runtime",), ("-O0",))  # as its RUN line
    assert "123.456" in expected and "[0.5]" in expected
    assert _without_addresses(_memkernel_run(path, "main", "void")) == _without_addresses(expected)


def test_memkernel_run_prints_the_unpacked_tensor_of_a_dynamic_inner_tile() -> None:
    printed = _memkernel_run(MLIR_FILES / "unpack_dynamic_inner_tile.mlir", "main", "void")
    rows = re.findall(r"\[([\d, ]+)\]", printed.split("data =", 1)[1])
    unpacked = np.array([[int(v) for v in row.split(",")] for row in rows])
    packed = np.arange(1, 22).reshape(3, 7).T  # the file's 1x3x8x1 constant, its padding row dropped
    np.testing.assert_array_equal(unpacked, packed)
