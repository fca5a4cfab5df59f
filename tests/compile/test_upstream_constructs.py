"""What upstream MLIR's CPU integration tests need, each on a small kernel of our own: transform
schedules carried in the module, declarations nothing calls, llvm.func entry points, f4/f6 floats,
and ``memkernel run`` (as mlir-runner runs a test file)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from mlir import ir

from memkernel import mlir_kernel
from memkernel.compile.build import compile_function
from memkernel.compile.engine import lowered_text
from memkernel.compile.requests import PipelineChoice
from memkernel.compile.pipeline import parse_pipeline
from memkernel.errors import CompileError, SignatureError
from memkernel.analysis.types import element_type
from memkernel.analysis.types import read_signature
from memkernel.model.signature import ScalarSpec, Signature
from memkernel.analysis.source import MLIR_LOCK, parse_source

from ..kernels import TILE_ADDS_BY_4

# -- transform schedules in the module -------------------------------------------------------

TILED_ADD = """
func.func @add(%a: tensor<10xf32>, %b: tensor<10xf32>) -> tensor<10xf32> {
  %empty = tensor.empty() : tensor<10xf32>
  %sum = linalg.add ins(%a, %b : tensor<10xf32>, tensor<10xf32>) outs(%empty : tensor<10xf32>) -> tensor<10xf32>
  return %sum : tensor<10xf32>
}""" + TILE_ADDS_BY_4


def test_a_named_sequence_in_the_module_is_applied_then_erased() -> None:
    @mlir_kernel(TILED_ADD, cache=False)
    def add(a, b): ...

    a, b = np.arange(10, dtype=np.float32), np.full(10, 0.5, np.float32)
    np.testing.assert_array_equal(add(a, b), a + b)
    bufferized = add.ir("bufferized")
    assert "scf.for" in bufferized and "transform." not in bufferized
    assert "transform." not in add.ir("llvm")


SCALED_SEQUENCE = """
func.func @scale(%x: memref<?xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>], iterator_types = ["parallel"]} outs(%x : memref<?xf32>) {
  ^bb0(%v: f32):
    %three = arith.constant 3.0 : f32
    %r = arith.mulf %v, %three : f32
    linalg.yield %r : f32
  }
  return
}
transform.sequence failures(propagate) {
^bb0(%root: !transform.any_op):
  %g = transform.structured.match ops{["linalg.generic"]} in %root : (!transform.any_op) -> !transform.any_op
  %tiled, %loop = transform.structured.tile_using_for %g tile_sizes [3]
    : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
}
"""


def test_a_transform_sequence_on_memref_code_is_applied_then_erased() -> None:
    @mlir_kernel(SCALED_SEQUENCE, cache=False)
    def scale(x): ...

    x = np.arange(11, dtype=np.float32)  # not a multiple of the tile: the last tile is partial
    scale(x)
    np.testing.assert_array_equal(x, np.arange(11, dtype=np.float32) * 3)
    assert "memref.subview" in scale.ir("vectorized") and "transform." not in scale.ir("vectorized")


TOP_LEVEL_SCHEDULE = """
module attributes {transform.with_named_sequence} {
  func.func @add(%a: memref<10xf32>, %b: memref<10xf32>, %c: memref<10xf32>) {
    linalg.add ins(%a, %b : memref<10xf32>, memref<10xf32>) outs(%c : memref<10xf32>)
    return
  }
  transform.named_sequence @tile(%op: !transform.any_op {transform.consumed}) {
    %t, %l = transform.structured.tile_using_for %op tile_sizes [4]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %add = transform.structured.match ops{["linalg.add"]} in %root : (!transform.any_op) -> !transform.any_op
    transform.include @tile failures(propagate) (%add) : (!transform.any_op) -> ()
    transform.yield
  }
}"""


def test_a_schedule_beside_the_kernel_in_the_top_module_may_include_helper_sequences() -> None:
    @mlir_kernel(TOP_LEVEL_SCHEDULE, cache=False)
    def add(a, b): ...

    a = np.linspace(0, 1, 10, dtype=np.float32)
    np.testing.assert_array_equal(add(a, a), a + a)
    vectorized = add.ir("vectorized")
    assert "scf.for" in vectorized and "transform" not in vectorized


ANNOTATED = """
func.func @add(%a: tensor<8xf32>, %b: tensor<8xf32>) -> tensor<8xf32> {
  %e = tensor.empty() : tensor<8xf32>
  %r = linalg.add ins(%a, %b : tensor<8xf32>, tensor<8xf32>) outs(%e : tensor<8xf32>) -> tensor<8xf32>
  return %r : tensor<8xf32>
}
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %add = transform.structured.match ops{["linalg.add"]} in %root : (!transform.any_op) -> !transform.any_op
    transform.annotate %add "scheduled" : !transform.any_op
    %allocs = transform.structured.match ops{["memref.alloc"]} in %root : (!transform.any_op) -> !transform.any_op
    transform.annotate %allocs "after_bufferization" : !transform.any_op
    transform.yield
  }
}
"""


@pytest.mark.parametrize(("schedule", "applied", "after"), [
    (None, True, False),
    ("before-bufferization", True, False),
    ("after-bufferization", True, True),
    ("skip", False, False),
])
def test_schedule_says_where_the_modules_schedule_is_applied(schedule: str | None, applied: bool,
                                                             after: bool) -> None:
    # The schedule annotates linalg.add, and the memref.alloc ops that exist only once bufferized.
    text = lowered_text(ANNOTATED, "add", parse_pipeline(None, schedule=schedule), (), "bufferized")
    assert ("scheduled" in text, "after_bufferization" in text) == (applied, after)
    assert "transform." not in text


def test_a_schedule_is_applied_before_a_custom_pipeline() -> None:
    lowering = ("convert-linalg-to-loops,lower-affine,convert-scf-to-cf,expand-strided-metadata,lower-affine,"
                "finalize-memref-to-llvm,convert-arith-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,"
                "reconcile-unrealized-casts")

    @mlir_kernel(SCALED_SEQUENCE, pipeline=lowering, cache=False)
    def scale(x): ...

    x = np.arange(11, dtype=np.float32)
    scale(x)
    np.testing.assert_array_equal(x, np.arange(11, dtype=np.float32) * 3)


def test_a_failing_schedule_is_a_compile_error_with_its_diagnostic() -> None:
    failing = TILED_ADD.replace("tile_sizes [4]\n      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)",
                                "tile_sizes [4, 4]\n      : (!transform.any_op) -> (!transform.any_op, !transform.any_op, "
                                "!transform.any_op)").replace("%tiled, %loop", "%tiled, %outer, %inner")
    assert failing != TILED_ADD

    @mlir_kernel(failing, cache=False)
    def add(a, b): ...

    with pytest.raises(CompileError, match=r"(?s)transform schedule failed: .*too many tiles provided"):
        add.compile()


def test_an_unknown_schedule_value_is_refused() -> None:
    with pytest.raises(CompileError, match=r"schedule= must be None .* got 'early'"):
        parse_pipeline(None, schedule="early")


# -- declarations nothing calls ---------------------------------------------------------------

UNUSED_DECLARATIONS = """
func.func private @printMemrefVector4x4xf32(memref<?x?xvector<4x4xf32>>)
func.func private @odd(i7) -> i7
func.func @double(%x: memref<?xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>], iterator_types = ["parallel"]} outs(%x : memref<?xf32>) {
  ^bb0(%v: f32):
    %r = arith.addf %v, %v : f32
    linalg.yield %r : f32
  }
  return
}
"""


def test_declarations_with_unbindable_types_that_nothing_calls_do_not_fail_the_kernel() -> None:
    @mlir_kernel(UNUSED_DECLARATIONS, cache=False)
    def double(x): ...

    x = np.array([1.5, -2.0, 3.25], np.float32)
    double(x)
    np.testing.assert_array_equal(x, [3.0, -4.0, 6.5])


def test_a_declaration_bound_as_a_callback_is_still_checked() -> None:
    with pytest.raises(SignatureError, match=r"@odd argument #0 has type i7: element type i7 is not supported"):
        @mlir_kernel(UNUSED_DECLARATIONS, callbacks={"odd": lambda v: v}, cache=False)
        def double(x): ...


# -- llvm.func entry points ---------------------------------------------------------------

LLVM_FUNCTIONS = """
llvm.func @answer() -> i32 {
  %c = llvm.mlir.constant(42 : i32) : i32
  llvm.return %c : i32
}
llvm.func @scaled(%n: i64, %x: f64) -> f64 {
  %f = llvm.sitofp %n : i64 to f64
  %r = llvm.fmul %f, %x : f64
  llvm.return %r : f64
}
llvm.func @nothing(%n: i32) {
  llvm.return
}
llvm.func @pointer(%p: !llvm.ptr) {
  llvm.return
}
llvm.func @variadic(%n: i32, ...) {
  llvm.return
}
"""


def _signature(name: str) -> Signature:
    parsed = parse_source(LLVM_FUNCTIONS)
    with MLIR_LOCK, parsed.context:
        return read_signature(parsed.function(name))


def test_an_llvm_func_signature_on_scalars_is_read() -> None:
    scaled = _signature("scaled")
    assert [a.mlir for a in scaled.args] == ["i64", "f64"] and [r.mlir for r in scaled.results] == ["f64"]
    assert all(isinstance(s, ScalarSpec) for s in (*scaled.args, *scaled.results))
    assert _signature("nothing").results == () and _signature("answer").args == ()


def test_an_llvm_func_with_a_pointer_argument_is_refused() -> None:
    with pytest.raises(SignatureError, match=r"@pointer argument #0 has type !llvm.ptr: memkernel calls an "
                                             r"llvm.func with scalar arguments and results only"):
        _signature("pointer")
    with pytest.raises(SignatureError, match="variadic"):
        _signature("variadic")


def test_an_llvm_func_compiles_with_a_c_interface_and_computes() -> None:
    compiled = compile_function(LLVM_FUNCTIONS, "scaled", PipelineChoice(None, False, None, False), 3, ())
    n, x, result = ctypes.c_int64(7), ctypes.c_double(1.5), ctypes.c_double()
    args = (ctypes.c_void_p * 3)(*(ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in (n, x, result)))
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(compiled.address)(ctypes.addressof(args))
    assert result.value == 10.5


def test_an_llvm_func_is_called_like_a_func_func() -> None:
    @mlir_kernel(LLVM_FUNCTIONS, cache=False)
    def scaled(n, x): ...

    @mlir_kernel(LLVM_FUNCTIONS, cache=False)
    def answer(): ...

    assert scaled(7, 1.5) == 10.5 and answer() == np.int32(42)


# -- f4 and f6 floats ------------------------------------------------------------------------------

SMALL_FLOATS = {"f4E2M1FN": ml_dtypes.float4_e2m1fn, "f6E2M3FN": ml_dtypes.float6_e2m3fn,
                "f6E3M2FN": ml_dtypes.float6_e3m2fn}
# Ties (0.25, 0.75, 1.25, 2.5, 5), negatives, values past the largest finite one (saturating), subnormals.
VALUES = np.array([0.0, -0.0, 0.25, 0.75, 1.25, 2.5, 5.0, -0.3, -2.7, 100.0, -100.0, 0.0625, 0.1, 7.0, 13.0],
                  np.float32)


def _convert(mlir: str, source: str, target: str) -> str:
    return f"""
func.func @convert(%a: memref<?x{source}>, %b: memref<?x{target}>) {{
  linalg.generic {{indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>], iterator_types = ["parallel"]}}
    ins(%a : memref<?x{source}>) outs(%b : memref<?x{target}>) {{
  ^bb0(%x: {source}, %y: {target}):
    %c = arith.{mlir} %x : {source} to {target}
    linalg.yield %c : {target}
  }}
  return
}}"""


@pytest.mark.parametrize("mlir", SMALL_FLOATS)
def test_truncation_to_a_small_float_rounds_as_ml_dtypes_does(mlir: str) -> None:
    @mlir_kernel(_convert("truncf", "f32", mlir), cache=False)
    def convert(a): ...

    rounded = convert(VALUES)
    assert rounded.dtype == np.dtype(SMALL_FLOATS[mlir])
    np.testing.assert_array_equal(rounded.view(np.uint8), VALUES.astype(SMALL_FLOATS[mlir]).view(np.uint8))


@pytest.mark.parametrize("mlir", SMALL_FLOATS)
def test_every_small_float_value_extends_to_f32_as_ml_dtypes_says(mlir: str) -> None:
    @mlir_kernel(_convert("extf", mlir, "f32"), cache=False)
    def convert(a): ...

    bits = 4 if mlir.startswith("f4") else 6
    every = np.arange(1 << bits, dtype=np.uint8).view(SMALL_FLOATS[mlir])
    np.testing.assert_array_equal(convert(every), every.astype(np.float32))


@pytest.mark.parametrize("mlir", SMALL_FLOATS)
def test_small_float_scalars_pass_in_and_come_back(mlir: str) -> None:
    @mlir_kernel(f"""
func.func @add(%x: {mlir}, %y: f32) -> {mlir} {{
  %e = arith.extf %x : {mlir} to f32
  %s = arith.addf %e, %y : f32
  %t = arith.truncf %s : f32 to {mlir}
  return %t : {mlir}
}}""", cache=False)
    def add(x, y): ...

    dtype = SMALL_FLOATS[mlir]
    for x, y in [(1.5, 1.0), (-2.0, 0.5), (3.0, 3.0), (0.5, -0.25)]:
        result = add(dtype(x), y)
        assert result.dtype == np.dtype(dtype)
        assert result == (np.float32(dtype(x)) + np.float32(y)).astype(dtype)


def test_small_float_types_map_to_ml_dtypes() -> None:
    with ir.Context():
        for mlir, dtype in SMALL_FLOATS.items():
            element = element_type(ir.Type.parse(mlir))
            assert element is not None and element.dtype == np.dtype(dtype)


def test_vector_accesses_of_an_f4_memref_are_refused() -> None:
    source = """
func.func @load(%a: memref<8xf4E2M1FN>, %b: memref<8xf32>) {
  %c0 = arith.constant 0 : index
  %v = vector.load %a[%c0] : memref<8xf4E2M1FN>, vector<8xf4E2M1FN>
  %e = arith.extf %v : vector<8xf4E2M1FN> to vector<8xf32>
  vector.store %e, %b[%c0] : memref<8xf32>, vector<8xf32>
  return
}"""
    with pytest.raises(SignatureError, match="vector.load on an f4E2M1FN memref: .* bit-packed"):
        @mlir_kernel(source, cache=False)
        def load(a): ...


# -- memkernel run -----------------------------------------------------------------------------------

PRINTS = """
func.func @main() -> i32 {
  %v = arith.constant dense<[1.0, 2.5]> : vector<2xf32>
  vector.print %v : vector<2xf32>
  %c = arith.constant 7 : i32
  return %c : i32
}
func.func @takes(%x: i32) {
  return
}
func.func @third() -> f32 {
  %c = arith.constant 0.333333343 : f32
  return %c : f32
}
"""


def memkernel_run(*arguments: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memkernel.cli", "run", *arguments], input=stdin,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def prints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("run") / "prints.mlir"
    path.write_text(PRINTS)
    return path


def test_run_prints_what_the_entry_prints_then_its_result(prints: Path) -> None:
    run = memkernel_run(str(prints), "-e", "main", "-entry-point-result=i32")
    assert (run.returncode, run.stdout, run.stderr) == (0, "( 1, 2.5 )\n7\n", "")


def test_run_reads_standard_input_and_takes_two_dash_options() -> None:
    run = memkernel_run("-", "--entry-point-result", "f32", "-e", "third", "-O0", "--pipeline=fast", stdin=PRINTS)
    assert (run.returncode, run.stdout) == (0, f"{np.float32(1 / 3):e}\n")


@pytest.mark.parametrize(("arguments", "message"), [
    (["missing.mlir"], "cannot read missing.mlir: No such file or directory"),
    (["{prints}", "-e", "nowhere"], "defines no function @nowhere with a body; it defines: main, takes, third. "
                                    "Pass -e NAME."),
    (["{prints}", "-e", "takes"], "@takes takes 1 argument(s) (i32); an entry point takes none"),
    (["{prints}", "-e", "main"], "@main returns i32, but --entry-point-result=void expects nothing; "
                                 "pass --entry-point-result=i32."),
    (["{prints}", "-e", "third", "-entry-point-result=i64"], "@third returns f32, but --entry-point-result=i64 "
                                                              "expects i64; pass --entry-point-result=f32."),
    (["{prints}", "-e", "main", "-entry-point-result=i32", "-shared-libs=libnowhere.so"], "libnowhere"),
])
def test_run_errors_are_one_line_on_stderr_and_a_failing_status(prints: Path, arguments: list[str],
                                                                message: str) -> None:
    run = memkernel_run(*(a.format(prints=prints) for a in arguments))
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith("memkernel: error: ") and run.stderr.count("\n") == 1, run.stderr
    assert message in run.stderr


def test_run_reports_a_syntax_error_with_its_line() -> None:
    run = memkernel_run("-", stdin="func.func @main() {\n  retur\n}\n")
    assert run.returncode == 1 and run.stderr.startswith("memkernel: error: the MLIR source does not parse")
    assert "2:" in run.stderr


def test_run_applies_the_schedule_a_file_carries() -> None:
    main = TILED_ADD + """
func.func private @printMemrefF32(memref<*xf32>)
func.func @main() {
  %a = arith.constant dense<2.0> : tensor<10xf32>
  %s = call @add(%a, %a) : (tensor<10xf32>, tensor<10xf32>) -> tensor<10xf32>
  %m = bufferization.to_buffer %s : tensor<10xf32> to memref<10xf32>
  %u = memref.cast %m : memref<10xf32> to memref<*xf32>
  call @printMemrefF32(%u) : (memref<*xf32>) -> ()
  return
}"""
    run = memkernel_run("-", stdin=main)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[1] == "[" + ",  ".join(["4"] * 10) + "]"


def test_run_passes_llvm_options_on() -> None:
    path = Path(__file__).parents[1] / "mlir" / "matrix_intrinsic.mlir"
    run = memkernel_run(str(path), "--llvm-option=-enable-matrix")
    assert (run.returncode, run.stdout) == (0, "( 3, 4, 1, 2 )\n")
    without = memkernel_run(str(path))
    assert without.returncode == 1 and "Cannot select: intrinsic %llvm.matrix.multiply" in without.stderr
    assert "pass llvm_options=" in without.stderr


def test_run_calls_an_llvm_func_entry() -> None:
    run = memkernel_run("-", "-e", "answer", "-entry-point-result=i32", stdin=LLVM_FUNCTIONS)
    assert (run.returncode, run.stdout) == (0, "42\n")

