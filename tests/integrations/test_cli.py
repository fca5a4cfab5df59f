"""The ``memkernel`` command line, run as a subprocess (``python -m memkernel ...``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

KERNELS = """
func.func @matmul(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %c: memref<?x?xf32>) {
  linalg.matmul ins(%a, %b : memref<?x?xf32>, memref<?x?xf32>) outs(%c : memref<?x?xf32>)
  return
}

func.func @axpy(%alpha: f64, %in: memref<?xf64>, %y: memref<?xf64>) -> index {
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                  iterator_types = ["parallel"]}
      ins(%in : memref<?xf64>) outs(%y : memref<?xf64>) {
  ^bb0(%a: f64, %o: f64):
    %m = arith.mulf %alpha, %a : f64
    %s = arith.addf %m, %o : f64
    linalg.yield %s : f64
  }
  %c0 = arith.constant 0 : index
  %n = memref.dim %y, %c0 : memref<?xf64>
  return %n : index
}

func.func @split(%0: memref<4xi32>, %lo: memref<4xi32>, %hi: memref<4xi32>) -> i32 {
  %k = arith.constant 2 : i32
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                  iterator_types = ["parallel"]}
      ins(%0 : memref<4xi32>) outs(%lo, %hi : memref<4xi32>, memref<4xi32>) {
  ^bb0(%x: i32, %l: i32, %h: i32):
    %q = arith.divsi %x, %k : i32
    %r = arith.remsi %x, %k : i32
    linalg.yield %q, %r : i32, i32
  }
  return %k : i32
}

func.func @add(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
  %c = arith.addf %a, %b : tensor<?xf32>
  return %c : tensor<?xf32>
}
"""

ODD = """
func.func private @declared(%x: f32)
func.func @vec(%v: vector<4xf32>) {
  return
}
func.func @flags(%f: memref<?xi1>, %out: memref<?xi1>) {
  memref.copy %f, %out : memref<?xi1> to memref<?xi1>
  return
}
"""

NAMED_LIKE_GENERATED = """
func.func @copy(%arg1: memref<?xf32>, %0: memref<?xf32>) {
  linalg.copy ins(%arg1 : memref<?xf32>) outs(%0 : memref<?xf32>)
  return
}
"""

NAMED_LIKE_A_RESULT = """
func.func @fill(%result0: memref<4xf32>) -> f32 {
  %one = arith.constant 1.0 : f32
  linalg.fill ins(%one : f32) outs(%result0 : memref<4xf32>)
  %two = arith.constant 2.0 : f32
  return %two : f32
}
"""

DOUBLE = """
func.func @double(%a: memref<?xf32>, %c: memref<?xf32>) {
  linalg.add ins(%a, %a : memref<?xf32>, memref<?xf32>) outs(%c : memref<?xf32>)
  return
}
"""


def forged_npy(shape: tuple[int, ...], data: bytes) -> bytes:
    """A version 1.0 ``.npy`` file of float32 whose header claims ``shape`` and whose data is ``data``."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (128 - 10 - len(header) - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data


RNG = np.random.default_rng(0)
A = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal((3, 5)).astype(np.float32)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A directory with the kernels and some .npy files; the disk cache of the subprocesses is in it."""
    root = tmp_path_factory.mktemp("cli")
    (root / "kernels.mlir").write_text(KERNELS)
    (root / "bad.mlir").write_text("func.func @f(%a: memref<?xf32>) {\n  retur\n}\n")
    np.save(root / "a.npy", A)
    np.save(root / "b.npy", B)
    np.save(root / "a64.npy", A.astype(np.float64))
    np.save(root / "b_wide.npy", np.ones((5, 5), np.float32))
    np.save(root / "x.npy", np.arange(6.0))
    np.save(root / "y.npy", np.ones(6))
    np.save(root / "ints.npy", np.array([7, -3, 0, 10], np.int32))
    np.save(root / "x32.npy", np.arange(5, dtype=np.float32))
    np.savez(root / "arrays.npz", a=A)
    (root / "odd.mlir").write_text(ODD)
    (root / "forged.npy").write_bytes(forged_npy((2**40,), bytes(16)))
    return root


def memkernel(work: Path, *args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MEMKERNEL_CACHE_DIR=str(work / "cache"), **environ)
    return subprocess.run([sys.executable, "-m", "memkernel", *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=120)


def test_no_arguments_runs_the_demo(work):
    done = memkernel(work)
    assert done.returncode == 0, done.stderr
    assert "matches numpy (a @ b + bias): OK" in done.stdout


@pytest.mark.parametrize("command, expected", [
    ([], ["usage: memkernel", "info", "call", "bench", "--traceback", "outputs the call allocates"]),
    (["info"], ["usage: memkernel info", "FILE.mlir"]),
    (["call"], ["usage: memkernel call", "--arg NAME=PATH.npy", "--scalar NAME=VALUE", "--out DIR", "--pipeline",
                "example:"]),
    (["bench"], ["usage: memkernel bench", "--shape NAME=NxM", "--repeat N", "--pipeline", "GFLOP/s"]),
])
def test_help_of_each_command(work, command, expected):
    done = memkernel(work, *command, "--help")
    assert done.returncode == 0 and done.stderr == ""
    for text in expected:
        assert text in done.stdout


def test_info_shows_each_function_its_call_forms_types_ties_and_writes(work):
    done = memkernel(work, "info", "kernels.mlir")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("kernels.mlir: 4 function(s).")
    assert "  call:  matmul(a, b, c)\n     or: c = matmul(a, b)" in out
    assert re.search(r"\n  a +memref<\?x\?xf32> +float32 +\(d0, d1\) +reads +dim 0 = c dim 0; dim 1 = b dim 0\n", out)
    assert re.search(r"\n  c +memref<\?x\?xf32> +float32 +\(d0, d2\) +writes +dim 0 = a dim 0; dim 1 = b dim 1\n", out)
    assert "  call:  axpy(alpha, in_, y)\n     or: y, result0 = axpy(alpha, in_)" in out
    assert re.search(r"\n  alpha +f64 +float64 +scalar +scalar\n", out)
    assert re.search(r"\n  result0 +index +int64 +returns\n", out)
    assert "  call:  split(arg0, lo, hi)\n     or: lo, hi, result0 = split(arg0)" in out
    assert re.search(r"\n  arg0 +memref<4xi32> +int32 +\(4,\) +reads", out)
    assert "  call:  add(a, b)\n     or: result0 = add(a, b)" in out


def test_info_tells_which_functions_cannot_be_called_and_renames_out(work):
    done = memkernel(work, "info", "odd.mlir")
    assert done.returncode == 0, done.stderr
    assert "odd.mlir: 2 function(s)." in done.stdout and "@declared" not in done.stdout
    assert "@vec\n  cannot be called from Python: @vec argument #0 has type vector<4xf32>" in done.stdout
    assert "  call:  flags(f, out_)\n     or: out_ = flags(f)" in done.stdout


def test_call_summarises_bool_arrays_by_their_count_of_true(work, tmp_path):
    np.save(tmp_path / "f.npy", np.array([True, False, True]))
    (tmp_path / "flags.mlir").write_text(ODD.split("\n", 2)[2])  # without the declaration: nothing to bind
    done = memkernel(work, "call", str(tmp_path / "flags.mlir"), "flags", "--arg", f"f={tmp_path / 'f.npy'}",
                     "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out_.npy"), [True, False, True])
    assert done.stdout == f"out_: bool (3,) 2 true -> {tmp_path / 'out_.npy'}\n"


def test_call_allocates_the_trailing_output_and_writes_it(work, tmp_path):
    done = memkernel(work, "call", "kernels.mlir", "matmul", "--arg", "a=a.npy", "--arg", "b=b.npy",
                     "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    c = np.load(tmp_path / "c.npy")
    np.testing.assert_allclose(c, A @ B, rtol=1e-5, atol=1e-5)
    assert c.dtype == np.float32
    assert done.stdout == f"c: float32 (4, 5) min {c.min():.6g} max {c.max():.6g} -> {tmp_path / 'c.npy'}\n"


def test_call_with_the_fast_pipeline(work, tmp_path):
    done = memkernel(work, "call", "kernels.mlir", "@matmul", "--arg", "a=a.npy", "--arg", "b=b.npy",
                     "--out", str(tmp_path), "--pipeline", "fast")
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(np.load(tmp_path / "c.npy"), A @ B, rtol=1e-5, atol=1e-5)


def test_call_saves_arguments_written_in_place_and_results(work, tmp_path):
    done = memkernel(work, "call", "kernels.mlir", "axpy", "--scalar", "alpha=2.5", "--arg", "in=x.npy",
                     "--arg", "y=y.npy", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), 2.5 * np.arange(6.0) + 1)
    result = np.load(tmp_path / "result0.npy")
    assert result.dtype == np.int64 and result.shape == () and result == 6
    np.testing.assert_array_equal(np.load(work / "y.npy"), np.ones(6))  # the input file is untouched
    assert done.stdout.splitlines()[1] == f"result0: int64 () = 6 -> {tmp_path / 'result0.npy'}"


def test_call_allocates_several_outputs(work, tmp_path):
    done = memkernel(work, "call", "kernels.mlir", "split", "--arg", "arg0=ints.npy", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    x = np.array([7, -3, 0, 10], np.int32)
    quotient, remainder = np.trunc(x / 2).astype(np.int32), np.fmod(x, 2).astype(np.int32)
    np.testing.assert_array_equal(np.load(tmp_path / "lo.npy"), quotient)
    np.testing.assert_array_equal(np.load(tmp_path / "hi.npy"), remainder)
    assert np.load(tmp_path / "result0.npy") == 2
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == ["lo", "hi", "result0"]


def test_call_of_a_tensor_function_saves_its_result(work, tmp_path):
    done = memkernel(work, "call", "kernels.mlir", "add", "--arg", "a=x32.npy", "--arg", "b=x32.npy",
                     "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "result0.npy"), 2 * np.arange(5, dtype=np.float32))
    assert not (tmp_path / "a.npy").exists()  # a tensor argument is never written


def _error(done: subprocess.CompletedProcess[str]) -> str:
    """The error line; checks the exit status and that no traceback was printed."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("memkernel: error: ")
    return first


@pytest.mark.parametrize("args, message", [
    (["info", "missing.mlir"], "cannot read missing.mlir: No such file or directory"),
    (["call", "kernels.mlir", "nope", "--arg", "a=a.npy"],
     "kernels.mlir defines no func.func @nope with a body; it defines: matmul, axpy, split, add"),
    (["call", "kernels.mlir", "matmul", "--arg", "a=a64.npy", "--arg", "b=b.npy"],
     "matmul(): argument 'a' expects memref<?x?xf32> (float32, 2-d); got float64[4, 3]. Pass a.astype(np.float32)."),
    (["call", "kernels.mlir", "matmul", "--arg", "a=a.npy", "--arg", "b=b_wide.npy"],
     "matmul(): a has 3 elements on dim 1 but b has 5 on dim 0; @matmul's linalg.matmul needs them equal."),
    (["call", "kernels.mlir", "matmul", "--arg", "q=a.npy"],
     "@matmul has no argument 'q'; its arguments: a (memref<?x?xf32>), b (memref<?x?xf32>), c (memref<?x?xf32>)"),
    (["call", "kernels.mlir", "matmul", "--arg", "b=b.npy"],
     "@matmul argument 'a' (memref<?x?xf32>) is not given; pass it with --arg a=PATH.npy."),
    (["call", "kernels.mlir", "axpy", "--arg", "in_=x.npy", "--arg", "y=y.npy"],
     "@axpy argument 'alpha' (f64) is not given; pass it with --scalar alpha=VALUE."),
    (["call", "kernels.mlir", "axpy", "--scalar", "alpha=two", "--arg", "in_=x.npy", "--arg", "y=y.npy"],
     "--scalar alpha=two: @axpy argument 'alpha' is f64, which takes a number"),
    (["call", "kernels.mlir", "axpy", "--scalar", "alpha=1e400", "--arg", "in_=x.npy", "--arg", "y=y.npy"],
     "--scalar alpha=1e400: the value overflows a double"),
    (["call", "kernels.mlir", "axpy", "--arg", "alpha=x.npy", "--arg", "in_=x.npy", "--arg", "y=y.npy"],
     "--arg alpha: @axpy argument 'alpha' is a scalar; pass --scalar alpha=VALUE"),
    (["call", "kernels.mlir", "matmul", "--scalar", "a=1", "--arg", "b=b.npy"],
     "--scalar a: @matmul argument 'a' is memref<?x?xf32>, not a scalar"),
    (["call", "kernels.mlir", "matmul", "--arg", "a=arrays.npz", "--arg", "b=b.npy"],
     "--arg a=arrays.npz: an .npz archive; pass one .npy file (numpy.save) per argument"),
    (["call", "kernels.mlir", "matmul", "--arg", "a=kernels.mlir", "--arg", "b=b.npy"],
     "--arg a=kernels.mlir: not a .npy file; pass one .npy file (numpy.save) per argument"),
    (["call", "kernels.mlir", "matmul", "--arg", "a=none.npy", "--arg", "b=b.npy"],
     "--arg a=none.npy: cannot load it: No such file or directory"),
    (["call", "kernels.mlir", "matmul", "--arg", "a"], "--arg expects NAME=PATH.npy, got 'a'"),
    (["call", "kernels.mlir", "matmul", "--arg", "a=a.npy", "--arg", "%a=b.npy"], "--arg a is given twice"),
    (["call", "kernels.mlir", "axpy", "--arg", "alpha=a.npy", "--scalar", "alpha=1"],
     "alpha is given both as --arg and as --scalar"),
    (["call", "kernels.mlir", "matmul", "--arg", "a=a.npy", "--arg", "b=b.npy", "--out", "kernels.mlir/sub"],
     "cannot create --out kernels.mlir/sub: Not a directory"),
    (["call", "kernels.mlir", "matmul", "--arg", "a=a.npy", "--arg", "b=b.npy", "--pipeline", "bogus"],
     "pipeline= does not parse as a pass pipeline or name a preset ('default', 'fast')"),
    (["call", "kernels.mlir", "matmul", "--arg", "a=a.npy", "--arg", "b=b.npy", "--lib", "nolib"],
     "shared library 'nolib' not found."),
    (["bench", "kernels.mlir", "matmul", "--shape", "a=3xq", "--shape", "b=3x3"],
     "--shape a=3xq: a shape is sizes separated by x, e.g. 512x256"),
    (["bench", "kernels.mlir", "matmul", "--shape", "b=3x3"],
     "@matmul argument 'a' (memref<?x?xf32>) is not given; pass it with --shape a=NxM."),
    (["bench", "kernels.mlir", "matmul", "--shape", "a=3x4", "--shape", "b=5x6"],
     "matmul(): a has 4 elements on dim 1 but b has 5 on dim 0; @matmul's linalg.matmul needs them equal."),
    (["bench", "kernels.mlir", "matmul", "--shape", "a=3x4x5", "--shape", "b=4x5"],
     "matmul(): argument 'a' expects memref<?x?xf32> (float32, 2-d); got float32[3, 4, 5]."),
    (["bench", "kernels.mlir", "axpy", "--shape", "alpha=3", "--shape", "in_=3", "--shape", "y=3"],
     "--shape alpha: @axpy argument 'alpha' is a scalar; pass --scalar alpha=VALUE"),
    (["call", "kernels.mlir", "matmul", "--arg", "a=forged.npy", "--arg", "b=b.npy"],
     "--arg a=forged.npy: its header says float32[1099511627776] (4,398,046,511,104 bytes of data), but the file "
     "holds 16 bytes after it"),
    (["bench", "kernels.mlir", "matmul", "--shape", "a=9223372036854775807x3", "--shape", "b=3x3"],
     "--shape a=9223372036854775807x3: numpy cannot make a float32 array of that shape"),
    (["bench", "kernels.mlir", "matmul", "--shape", "a=9223372036854775807x0", "--shape", "b=0x3"],
     "--shape a=9223372036854775807x0: numpy cannot make a float32 array of that shape"),
    (["bench", "kernels.mlir", "matmul", "--shape", "a=9223372036854775808x3", "--shape", "b=3x3"],
     "--shape a=9223372036854775808x3: a size is at most 9223372036854775807"),
])
def test_bad_input_is_one_error_line_and_status_1(work, args, message):
    first = _error(memkernel(work, *args))
    assert message in first, first


def test_a_syntax_error_shows_mlir_s_diagnostic_after_the_error_line(work):
    done = memkernel(work, "info", "bad.mlir")
    assert _error(done) == "memkernel: error: the MLIR source does not parse or verify:"
    assert "2:3: error: custom op 'retur' is unknown" in done.stderr


def test_call_refuses_to_overwrite_an_input_file(work):
    done = memkernel(work, "call", "kernels.mlir", "axpy", "--scalar", "alpha=2", "--arg", "in_=x.npy",
                     "--arg", "y=y.npy")
    assert "would overwrite the input --arg y=y.npy; pass another --out DIR" in _error(done)
    np.testing.assert_array_equal(np.load(work / "y.npy"), np.ones(6))


def test_an_argument_that_is_a_fifo_is_refused_without_waiting_for_a_writer(work, tmp_path):
    (tmp_path / "double.mlir").write_text(DOUBLE)
    os.mkfifo(tmp_path / "in.npy")
    done = memkernel(work, "call", str(tmp_path / "double.mlir"), "double", "--arg", f"a={tmp_path / 'in.npy'}",
                     "--out", str(tmp_path / "out"))
    assert f"--arg a={tmp_path / 'in.npy'}: not a regular file" in _error(done)


def test_call_refuses_an_output_file_hard_linked_to_an_input(work, tmp_path):
    (tmp_path / "double.mlir").write_text(DOUBLE)
    np.save(tmp_path / "in.npy", np.arange(4, dtype=np.float32))
    (tmp_path / "out").mkdir()
    os.link(tmp_path / "in.npy", tmp_path / "out" / "c.npy")
    done = memkernel(work, "call", str(tmp_path / "double.mlir"), "double", "--arg", f"a={tmp_path / 'in.npy'}",
                     "--out", str(tmp_path / "out"))
    assert f"would overwrite the input --arg a={tmp_path / 'in.npy'} ({tmp_path / 'out' / 'c.npy'} is a link to" \
        in _error(done)
    np.testing.assert_array_equal(np.load(tmp_path / "in.npy"), np.arange(4, dtype=np.float32))


def test_call_refuses_an_output_file_that_is_the_mlir_file(work, tmp_path):
    (tmp_path / "double.mlir").write_text(DOUBLE)
    np.save(tmp_path / "in.npy", np.arange(4, dtype=np.float32))
    os.link(tmp_path / "double.mlir", tmp_path / "c.npy")
    done = memkernel(work, "call", str(tmp_path / "double.mlir"), "double", "--arg", f"a={tmp_path / 'in.npy'}",
                     "--out", str(tmp_path))
    assert f"would overwrite the input {tmp_path / 'double.mlir'}" in _error(done)
    assert (tmp_path / "double.mlir").read_text() == DOUBLE


def test_call_replaces_a_link_in_the_output_folder_instead_of_writing_through_it(work, tmp_path):
    (tmp_path / "double.mlir").write_text(DOUBLE)
    np.save(tmp_path / "in.npy", np.arange(4, dtype=np.float32))
    np.save(tmp_path / "kept.npy", np.full(4, 7, np.float32))
    (tmp_path / "out").mkdir()
    os.link(tmp_path / "kept.npy", tmp_path / "out" / "c.npy")
    done = memkernel(work, "call", str(tmp_path / "double.mlir"), "double", "--arg", f"a={tmp_path / 'in.npy'}",
                     "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "c.npy"), 2 * np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(np.load(tmp_path / "kept.npy"), np.full(4, 7, np.float32))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["c.npy"]  # no temporary file is left


def test_argument_named_like_a_result_is_saved_apart_from_the_result(work, tmp_path):
    (tmp_path / "fill.mlir").write_text(NAMED_LIKE_A_RESULT)
    np.save(tmp_path / "r.npy", np.zeros(4, np.float32))
    done = memkernel(work, "call", str(tmp_path / "fill.mlir"), "fill", "--arg", f"result0={tmp_path / 'r.npy'}",
                     "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "result0_.npy"), np.ones(4, np.float32))
    assert np.load(tmp_path / "out" / "result0.npy") == np.float32(2.0)
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == ["result0_", "result0"]


def test_generated_argument_names_skip_the_names_the_source_spells(work, tmp_path):
    (tmp_path / "copy.mlir").write_text(NAMED_LIKE_GENERATED)
    done = memkernel(work, "info", str(tmp_path / "copy.mlir"))
    assert done.returncode == 0, done.stderr
    assert "  call:  copy(arg1, arg1_)\n     or: arg1_ = copy(arg1)" in done.stdout
    np.save(tmp_path / "x.npy", np.arange(3, dtype=np.float32))
    done = memkernel(work, "call", str(tmp_path / "copy.mlir"), "copy", "--arg", f"arg1={tmp_path / 'x.npy'}",
                     "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "arg1_.npy"), np.arange(3, dtype=np.float32))


@pytest.mark.parametrize("where", ["before", "after"])
def test_traceback_option_shows_the_traceback(work, where):
    command = ["call", "kernels.mlir", "nope"]
    args = ["--traceback", *command] if where == "before" else [*command, "--traceback"]
    done = memkernel(work, *args)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "memkernel.cli.CommandLineError: kernels.mlir defines no func.func @nope" in done.stderr
    assert done.stderr.splitlines()[-1].startswith("memkernel: error: kernels.mlir defines no func.func @nope")


@pytest.mark.parametrize("args", [["call"], ["frobnicate"], ["bench", "kernels.mlir", "matmul", "--repeat", "0"]])
def test_usage_errors_exit_with_status_2(work, args):
    done = memkernel(work, *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith("memkernel")
    assert ": error: " in done.stderr.splitlines()[-1]


def _bench_line(out: str, label: str) -> str:
    (line,) = [x for x in out.splitlines() if x.strip().startswith(label + ":")]
    return line.split(":", 1)[1].strip()


def _seconds(text: str) -> float:
    value, unit = text.split()[:2]
    return float(value) * {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}[unit]


def test_bench_splits_the_time_and_counts_the_flops_of_matmul(work):
    done = memkernel(work, "bench", "kernels.mlir", "matmul", "--shape", "a=64x32", "--shape", "b=32x48",
                     "--repeat", "3")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.splitlines()[0] == "@matmul(a float32[64, 32], b float32[32, 48]) -> c allocated"
    assert "a call on the smallest shapes: a float32[1, 1], b float32[1, 1]" in out
    call, overhead = _seconds(_bench_line(out, "call")), _seconds(_bench_line(out, "wrapper overhead"))
    kernel = _seconds(_bench_line(out, "kernel"))
    assert 0 < overhead < call and kernel == pytest.approx(call - overhead, rel=0.01, abs=2e-9)
    assert "of 3 batches" in _bench_line(out, "call")
    size = (64 * 32 + 32 * 48 + 64 * 48) * 4
    bandwidth = _bench_line(out, "bandwidth")
    assert f"({size:,} bytes of arrays / kernel)" in bandwidth
    assert float(bandwidth.split()[0]) == pytest.approx(size / kernel / 1e9, rel=0.01)
    compute = _bench_line(out, "compute")
    assert compute.endswith(f"({2 * 64 * 48 * 32:,} flops: linalg.matmul 2·64·48·32)")
    assert float(compute.split()[0]) == pytest.approx(2 * 64 * 48 * 32 / kernel / 1e9, rel=0.01)


@pytest.mark.parametrize("fast, path", [("1", "fast"), ("0", "checked")])
def test_bench_says_which_call_path_it_timed(work, fast, path):
    done = memkernel(work, "bench", "kernels.mlir", "matmul", "--shape", "a=2x2", "--shape", "b=2x2", "--repeat", "1",
                     MEMKERNEL_FAST_PATH=fast)
    assert done.returncode == 0, done.stderr
    assert _bench_line(done.stdout, "call").endswith(f"median of 1 batches ({path} path)")


def test_bench_with_a_scalar_counts_the_body_s_arithmetic(work):
    done = memkernel(work, "bench", "kernels.mlir", "axpy", "--scalar", "alpha=1.5", "--shape", "in_=1000",
                     "--shape", "y=1000", "--repeat", "2", "--pipeline", "fast")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("@axpy(alpha=1.5, in_ float64[1000], y float64[1000])\n")
    assert "smallest shapes: alpha=1.5, in_ float64[1], y float64[1])" in done.stdout
    assert _bench_line(done.stdout, "compute").endswith("(2,000 flops: linalg.generic 2·1000)")


def test_bench_keeps_static_dims_in_the_smallest_shapes(work):
    done = memkernel(work, "bench", "kernels.mlir", "split", "--shape", "arg0=4", "--repeat", "2")
    assert done.returncode == 0, done.stderr
    assert "smallest shapes: arg0 int32[4])" in done.stdout
    assert "(8 flops: linalg.generic 2·4)" in done.stdout


def test_bench_s_smallest_shapes_respect_static_dims_and_convolution_bounds(work, tmp_path):
    (tmp_path / "conv.mlir").write_text("""
func.func @conv(%in: memref<?xf32>, %k: memref<3xf32>, %out: memref<?xf32>) {
  linalg.conv_1d ins(%in, %k : memref<?xf32>, memref<3xf32>) outs(%out : memref<?xf32>)
  return
}""")
    done = memkernel(work, "bench", str(tmp_path / "conv.mlir"), "conv", "--shape", "in=100", "--shape", "k=3",
                     "--shape", "%out=98", "--repeat", "2")
    assert done.returncode == 0, done.stderr
    assert "smallest shapes: in_ float32[3], k float32[3], out_ float32[1])" in done.stdout
    assert _bench_line(done.stdout, "compute").endswith(f"({2 * 98 * 3:,} flops: linalg.conv_1d 2·98·3)")


def test_bench_shows_a_progress_line_after_a_second_and_erases_it(work):
    env = dict(os.environ, MEMKERNEL_CACHE_DIR=str(work / "cache"))
    done = subprocess.run([sys.executable, "-m", "memkernel", "bench", "kernels.mlir", "matmul", "--shape", "a=8x8",
                           "--shape", "b=8x8"], cwd=work, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stderr = done.stderr.decode()
    assert stderr.startswith("\rmemkernel bench: timing the call: ")
    last = stderr.rsplit("\r", 2)
    assert last[-1] == "" and last[-2].strip() == "", "the last progress line is erased"
    assert "\n" not in stderr and "memkernel bench" not in done.stdout.decode()


# -- run -------------------------------------------------------------------------------------

FAILING_ASSERTION = """
func.func @main() {
  %no = arith.constant 0 : i1
  %yes = arith.constant 1 : i1
  vector.print str "before\\n"
  cf.assert %yes, "assertion bar"
  cf.assert %no, "assertion foo"
  vector.print str "after\\n"
  return
}
"""

TO_LLVM = ["-convert-vector-to-llvm", "-convert-cf-to-llvm", "-convert-func-to-llvm", "-convert-arith-to-llvm",
           "-reconcile-unrealized-casts"]

SCHEDULED = """
func.func private @printMemrefF32(memref<*xf32>)
func.func @main() {
  %a = memref.alloc() : memref<10xf32>
  %two = arith.constant 2.0 : f32
  linalg.fill ins(%two : f32) outs(%a : memref<10xf32>)
  linalg.add ins(%a, %a : memref<10xf32>, memref<10xf32>) outs(%a : memref<10xf32>)
  %u = memref.cast %a : memref<10xf32> to memref<*xf32>
  call @printMemrefF32(%u) : (memref<*xf32>) -> ()
  memref.dealloc %a : memref<10xf32>
  return
}
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %add = transform.structured.match ops{["linalg.add"]} in %root : (!transform.any_op) -> !transform.any_op
    SCHEDULE
    transform.yield
  }
}
"""
TILE = ("%tiled, %loop = transform.structured.tile_using_for %add tile_sizes [4] "
        ": (!transform.any_op) -> (!transform.any_op, !transform.any_op)")
FAILING_SCHEDULE = '%loop = transform.get_parent_op %add {op_name = "scf.for"} : (!transform.any_op) -> !transform.any_op'
PRINTED_FOURS = "[" + ",  ".join(["4"] * 10) + "]"


def mlir_tool(name: str) -> Path:
    import mlir.ir

    return Path(mlir.ir.__file__).parent / "bin" / name


def lowered_by_mlir_opt(source: str, passes: list[str]) -> str:
    return subprocess.run([str(mlir_tool("mlir-opt")), *passes], input=source, capture_output=True, text=True,
                          check=True).stdout


def test_run_prints_a_failed_assertions_message_as_mlir_runner_does_and_exits_with_status_1(work, tmp_path):
    (tmp_path / "assert.mlir").write_text(FAILING_ASSERTION)
    done = memkernel(work, "run", str(tmp_path / "assert.mlir"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stdout == "before\nassertion foo\n"
    assert done.stderr.startswith("memkernel: error: main(): the kernel stopped at a failed assertion:\nassertion foo")


@pytest.mark.skipif(shutil.which("stdbuf") is None, reason="needs stdbuf to see what mlir-runner printed")
def test_run_of_upstream_lowered_ir_prints_what_mlir_runner_prints_before_it_aborts(work):
    lowered = lowered_by_mlir_opt(FAILING_ASSERTION, TO_LLVM)
    runtime = mlir_tool("mlir-runner").parent.parent / "lib" / "libmlir_c_runner_utils.so"
    # Unbuffered, so that what mlir-runner printed before abort() reaches the pipe.
    upstream = subprocess.run(["stdbuf", "-o0", str(mlir_tool("mlir-runner")), "-e", "main",
                               "-entry-point-result=void", f"-shared-libs={runtime}"], input=lowered,
                              capture_output=True, text=True)
    assert upstream.returncode != 0 and upstream.stdout == "before\nassertion foo\n"
    done = subprocess.run([sys.executable, "-m", "memkernel", "run", "-"], input=lowered, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, MEMKERNEL_CACHE_DIR=str(work / "cache")))
    assert (done.returncode, done.stdout) == (1, upstream.stdout)


def test_run_of_ir_lowered_from_a_function_with_a_c_interface(work):
    source = """
func.func @main() -> i32 attributes { llvm.emit_c_interface } {
  %v = arith.constant dense<[1.0, 2.5]> : vector<2xf32>
  vector.print %v : vector<2xf32>
  %c = arith.constant 7 : i32
  return %c : i32
}"""
    lowered = lowered_by_mlir_opt(source, TO_LLVM)
    assert "llvm.func @_mlir_ciface_main" in lowered
    done = subprocess.run([sys.executable, "-m", "memkernel", "run", "-", "-entry-point-result=i32"], input=lowered,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, MEMKERNEL_CACHE_DIR=str(work / "cache")))
    assert (done.returncode, done.stdout, done.stderr) == (0, "( 1, 2.5 )\n7\n", "")


def test_run_skips_the_files_schedule_when_told_to(work, tmp_path):
    (tmp_path / "scheduled.mlir").write_text(SCHEDULED.replace("SCHEDULE", FAILING_SCHEDULE))
    applied = memkernel(work, "run", str(tmp_path / "scheduled.mlir"))
    assert "the module's transform schedule failed" in _error(applied)
    skipped = memkernel(work, "run", str(tmp_path / "scheduled.mlir"), "--schedule=skip")
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout.splitlines()[1] == PRINTED_FOURS


def test_run_with_a_pipeline_that_runs_the_transform_interpreter_applies_the_schedule_there(work, tmp_path):
    (tmp_path / "scheduled.mlir").write_text(SCHEDULED.replace("SCHEDULE", TILE))
    passes = ("builtin.module(transform-interpreter,convert-linalg-to-loops,convert-scf-to-cf,expand-strided-metadata,"
              "lower-affine,convert-arith-to-llvm,finalize-memref-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,"
              "reconcile-unrealized-casts)")
    done = memkernel(work, "run", str(tmp_path / "scheduled.mlir"), f"--pipeline={passes}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == PRINTED_FOURS
