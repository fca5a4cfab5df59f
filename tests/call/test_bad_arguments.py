"""Inputs a hostile user tries: each is an error that names the kernel and the argument, or numpy's answer."""

from __future__ import annotations

import array
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memkernel import (
    AllocationError,
    ArgumentError,
    CompileError,
    MemkernelError,
    ShapeError,
    ValueRangeError,
    mlir_kernel,
)

from ..kernels import MATMUL, total
from ..processes import run_python

F32 = np.float32

SELECT = """func.func @pick(%b: i1, %x: i32, %y: i32) -> (i32, i32) {
  %r = arith.select %b, %x, %y : i32
  %w = arith.extui %b : i1 to i32
  return %r, %w : i32, i32
}"""

SUM = total()

SCALE = """func.func @scale(%s: {t}, %x: memref<?x{t}>) {{
  linalg.generic {{indexing_maps = [affine_map<(i) -> (i)>], iterator_types = ["parallel"]}}
      outs(%x : memref<?x{t}>) {{
  ^bb0(%v: {t}):
    %m = arith.{mul} %v, %s : {t}
    linalg.yield %m : {t}
  }}
  return
}}"""

STRIDED_COPY = """func.func @copy(%a: memref<?x?xf32, strided<[?, 1], offset: ?>>,
                 %b: memref<?x?xf32, strided<[?, 1], offset: ?>>) {
  linalg.copy ins(%a : memref<?x?xf32, strided<[?, 1], offset: ?>>)
      outs(%b : memref<?x?xf32, strided<[?, 1], offset: ?>>)
  return
}"""

IN_PLACE_OUT = """func.func @axpy(%x: memref<?xf32>, %out: memref<?xf32>) {
  linalg.add ins(%x, %out : memref<?xf32>, memref<?xf32>) outs(%out : memref<?xf32>)
  return
}"""

ALLOCATE = """func.func @allocate(%n: index) -> memref<?xi8> {
  %m = memref.alloc(%n) : memref<?xi8>
  return %m : memref<?xi8>
}"""


@pytest.mark.parametrize("value", [-1, np.int8(-1), True, 1])
def test_i1_true_in_any_spelling_is_the_bit_1(value):
    pick = mlir_kernel(SELECT)(lambda b, x, y: None)
    assert pick(value, 7, 9) == (7, 1)


@pytest.mark.parametrize("value", [0, False, np.int8(0)])
def test_i1_false_in_any_spelling_is_the_bit_0(value):
    pick = mlir_kernel(SELECT)(lambda b, x, y: None)
    assert pick(value, 7, 9) == (9, 0)


def test_an_integer_list_that_float32_would_round_is_refused():
    total = mlir_kernel(SUM)(lambda x: None)
    with pytest.raises(ValueRangeError, match=re.escape(
            "total(): argument 'x' expects memref<?xf32>; got list whose value 16777217 is not exactly a "
            "float32. Round it explicitly: np.asarray(x, np.float32).")):
        total([16777217])
    assert total([16777216, 1]) == 16777217  # exact values still convert


def test_a_typed_float64_buffer_is_held_to_the_ndarray_rule():
    total = mlir_kernel(SUM)(lambda x: None)
    with pytest.raises(ArgumentError, match=re.escape("argument 'x' expects memref<?xf32> (float32, 1-d); "
                                                      "got float64[1]. Pass x.astype(np.float32).")):
        total(array.array("d", [0.1]))
    assert total(array.array("f", [0.5, 0.25])) == 0.75


def test_a_longdouble_beyond_f64_is_a_range_error():
    scale = mlir_kernel(SCALE.format(t="f64", mul="mulf"))(lambda s, x: None)
    with pytest.raises(ValueRangeError, match="argument 's' expects f64: value np.longdouble.*overflows f64"):
        scale(np.longdouble("1e400"), np.ones(2))


@pytest.mark.parametrize("t, mul, dtype", [("f32", "mulf", np.float32), ("i64", "muli", np.int64)])
def test_a_0d_array_is_a_scalar_for_every_type(t, mul, dtype):
    scale = mlir_kernel(SCALE.format(t=t, mul=mul))(lambda s, x: None)
    x = np.arange(3, dtype=dtype)
    scale(np.array(3, dtype), x)
    np.testing.assert_array_equal(x, np.arange(3) * 3)


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
def test_an_empty_array_fits_any_strided_layout(shape):
    copy = mlir_kernel(STRIDED_COPY)(lambda a: None)
    empty = np.zeros(shape, F32)
    assert copy(empty).shape == shape
    assert copy(np.zeros((shape[0], 2 * shape[1]), F32)[:, ::2]).shape == shape


def test_an_in_place_kernel_may_name_a_parameter_out():
    axpy = mlir_kernel(IN_PLACE_OUT)(lambda x, out: None)
    out = np.ones(3, F32)
    axpy(np.arange(3, dtype=F32), out=out)
    np.testing.assert_array_equal(out, np.arange(3) + 1)


def test_a_parameter_named_self_is_passed_by_keyword():
    def scale(s, self): ...

    kernel = mlir_kernel(SCALE.format(t="f32", mul="mulf"), name="scale")(scale)
    x = np.ones(2, F32)
    kernel(2.0, self=x)
    np.testing.assert_array_equal(x, [2, 2])


def test_a_masked_array_is_told_that_masks_are_not_seen():
    total = mlir_kernel(SUM)(lambda x: None)
    with pytest.raises(ArgumentError, match=re.escape("got a masked array float32[2]. A kernel does not see masks: "
                                                      "pass x.filled(fill_value) or np.ma.getdata(x).")):
        total(np.ma.masked_array(np.ones(2, F32), mask=[0, 1]))


def test_a_ragged_list_is_an_argument_error():
    total = mlir_kernel(SUM)(lambda x: None)
    with pytest.raises(ArgumentError, match=r"argument 'x' expects memref<\?xf32>; got list, which numpy cannot"):
        total([[1.0], [1.0, 2.0]])


def test_an_object_whose_len_lies_is_an_argument_error():
    class Liar:
        def __len__(self):
            return 2**62

        def __getitem__(self, i):
            raise IndexError(i)

    total = mlir_kernel(SUM)(lambda x: None)
    with pytest.raises(MemkernelError, match="argument 'x'"):
        total(Liar())


def test_a_huge_static_output_is_an_allocation_error_naming_it():
    kernel = mlir_kernel("func.func @k(%a: memref<?xf32>, %c: memref<100000000000xf32>) { return }")(
        lambda a: None)
    with pytest.raises(AllocationError, match=re.escape("k(): cannot allocate output 'out' of shape "
                                                        "(100000000000,) and dtype float32 (373 GiB)")):
        kernel(np.ones(1, F32))


def test_an_impossible_output_shape_is_a_shape_error_naming_it():
    kernel = mlir_kernel("func.func @k(%a: memref<?xf32>, %c: memref<?x?xf32>) { return }")(
        lambda a: (2**32, 2**32))
    with pytest.raises(MemkernelError, match=re.escape("k(): cannot allocate output 'out' of shape "
                                                       "(4294967296, 4294967296)")):
        kernel(np.ones(1, F32))


def test_a_failed_allocation_of_a_returned_buffer_is_an_allocation_error():
    allocate = mlir_kernel(ALLOCATE)(lambda n: None)
    with pytest.raises(AllocationError, match=re.escape(
            "allocate(): a memref.alloc in the kernel could not get 4611686018427387904 bytes (4.29e+09 GiB): "
            "malloc returned NULL.")):
        allocate(2**62)
    assert allocate(16).shape == (16,)


def test_the_recursion_limit_is_never_a_ctypes_error():
    total = mlir_kernel(SUM)(lambda x: None)
    values = [1.0, 2.0]  # a list: the checked path, which calls the kernel through ctypes
    seen: list[BaseException] = []

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
            return
        try:
            total(values)
        except Exception as exc:  # noqa: BLE001 - collecting what the call raises
            seen.append(exc)

    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(200)
        for depth in range(120, 200, 2):
            try:
                deep(depth)
            except RecursionError:
                pass
    finally:
        sys.setrecursionlimit(limit)
    assert all(isinstance(exc, RecursionError) for exc in seen), seen


@pytest.mark.parametrize("option", ["index-bitwidth=32"])
def test_a_pipeline_lowering_to_another_calling_convention_is_refused(option):
    pipeline = (f"convert-linalg-to-loops,convert-scf-to-cf,convert-arith-to-llvm{{{option}}},"
                f"finalize-memref-to-llvm{{{option}}},convert-func-to-llvm{{{option}}},convert-cf-to-llvm{{{option}}},"
                "reconcile-unrealized-casts")
    total = mlir_kernel(SUM, pipeline=pipeline)(lambda x: None)
    with pytest.raises(CompileError, match=re.escape("memkernel calls it as !llvm.func<void (ptr, ptr, i64, i64, i64, "
                                                     "ptr, ptr, i64)>")):
        total(np.ones(3, F32))


ADD_1D = """func.func @add(%a: memref<?xf32>, %b: memref<?xf32>, %c: memref<?xf32>) {
  linalg.add ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%c : memref<?xf32>)
  return
}"""


def test_a_shape_error_names_the_kernel_even_for_a_view_of_a_view():
    add = mlir_kernel(ADD_1D)(lambda a, b: None)
    base = np.ones(10, F32)
    with pytest.raises(ShapeError, match="add\\(\\): a has 5 elements"):
        add(base[::2], base[:4])


def test_an_output_overlapping_its_inputs_computes_as_if_they_were_copied_first():
    add = mlir_kernel(ADD_1D)(lambda a, b: None)
    x, expected = np.arange(6, dtype=F32), np.arange(6, dtype=F32)
    np.add(expected[:-1], expected[:-1], out=expected[1:])
    add(x[:-1], x[:-1], out=x[1:])
    np.testing.assert_array_equal(x, expected)
    assert add.invoker.last_path == "checked"  # the fast path declines, the checked path copies


def test_the_same_array_as_input_and_out_stays_one_buffer_on_the_fast_path():
    add = mlir_kernel(ADD_1D)(lambda a, b: None)
    x = np.arange(6, dtype=F32)
    add(x, x, out=x)
    np.testing.assert_array_equal(x, np.arange(6) * 2)


def test_a_matmul_whose_out_overlaps_an_input_matches_numpy():
    matmul = mlir_kernel(MATMUL)(lambda a, b: None)
    rng = np.random.default_rng(3)
    big = rng.integers(-3, 4, (5, 4)).astype(F32)
    b = rng.integers(-3, 4, (4, 4)).astype(F32)
    expected = big[1:] + big[:4] @ b
    matmul(big[:4], b, out=big[1:])
    np.testing.assert_array_equal(big[1:], expected)


def test_two_written_arguments_that_partly_overlap_are_refused():
    swap = mlir_kernel("""func.func @swap(%a: memref<?xf32>, %b: memref<?xf32>) {
      linalg.copy ins(%a : memref<?xf32>) outs(%b : memref<?xf32>)
      linalg.copy ins(%b : memref<?xf32>) outs(%a : memref<?xf32>)
      return }""")(lambda a, b: None)
    x = np.arange(6, dtype=F32)
    with pytest.raises(ArgumentError, match=re.escape(
            "swap(): 'a' and 'b' overlap in memory without being the same view, and the kernel may write both")):
        swap(x[:4], x[2:])
    np.testing.assert_array_equal(x, np.arange(6))


# y[i] = x[i] + 1, each element after a long busy loop: seconds of work the kernel finishes.
SLOW_INCREMENT = """func.func @slow(%x: memref<?xf32>, %y: memref<?xf32>, %spin: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %one = arith.constant 1.0 : f32
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    %v = memref.load %x[%i] : memref<?xf32>
    %w = scf.for %k = %c0 to %spin step %c1 iter_args(%acc = %v) -> f32 {
      %s = arith.addf %acc, %one : f32
      %t = arith.subf %s, %one : f32
      scf.yield %t : f32
    }
    %r = arith.addf %w, %one : f32
    memref.store %r, %y[%i] : memref<?xf32>
  }
  return
}"""


def test_ctrl_c_during_a_kernel_still_copies_its_result_back_into_a_view():
    """SIGINT arrives while the kernel runs; the kernel completes, its result reaches the non-contiguous
    out= view (through the copy-back), and then the KeyboardInterrupt is raised."""
    script = "\n".join([
        "import os, signal, threading, time",
        "import numpy as np",
        "from memkernel import mlir_kernel",
        f"slow = mlir_kernel({SLOW_INCREMENT!r})(lambda x, y, spin: None)",
        "x = np.arange(8, dtype=np.float32)",
        "slow(x, np.zeros(8, np.float32), 1)  # compiled before the timer starts",
        "base = np.zeros(16, np.float32)",
        "threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()",
        "try:",
        "    slow(x, base[::2], 150_000_000)",
        "except KeyboardInterrupt:",
        "    print('interrupted', base[::2].tolist(), base[1::2].tolist())",
    ])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=str(Path(__file__).resolve().parents[2]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("interrupted", 1)[1].strip() == str([float(v + 1) for v in range(8)]) + " " + \
        str([0.0] * 8)


def test_a_kernel_that_frees_an_argument_is_refused_at_decoration():
    from memkernel import SignatureError

    with pytest.raises(SignatureError, match=re.escape("k(): @k passes argument #0 to memref.dealloc")):
        mlir_kernel("""func.func @k(%a: memref<?xf32>) {
          memref.dealloc %a : memref<?xf32>
          return }""")(lambda a: None)


def test_a_returned_view_past_an_arguments_end_is_refused():
    # A subview of a size the call passes: no shape rule bounds it before the call.
    k = mlir_kernel("""func.func @r(%a: memref<?xf32>, %n: index) -> memref<?xf32, strided<[1]>> {
      %r = memref.subview %a[0] [%n] [1] : memref<?xf32> to memref<?xf32, strided<[1]>>
      return %r : memref<?xf32, strided<[1]>> }""")(lambda a, n: None)
    with pytest.raises(ShapeError, match=re.escape("r(): the kernel returned a memref<?xf32, strided<[1]>> "
                                                   "of shape (100000,) over the memory of an argument")):
        k(np.arange(4, dtype=F32), 100000)


STORE_TO_NULL = """func.func @z(%a: memref<*xf32>) {
  %p = llvm.mlir.zero : !llvm.ptr
  %v = arith.constant 1.0 : f32
  llvm.store %v, %p : f32, !llvm.ptr
  return }"""


def test_an_object_the_jit_linker_would_abort_on_is_a_compile_error():
    # Undefined behaviour all through: LLVM leaves no code in any function, an object JITLink asserts on. An
    # unranked argument: no fast path, whose code would give the object content. Compiled for a CPU, as
    # `memkernel build --target-cpu` does: compiled for a Zen 4 host, the kernel's C interface is kept out of the
    # engine's wrapper (see memkernel.compile.engine.prefer_host_vector_width), and the wrapper's jump to it is code.
    from memkernel.compile import requests, worker

    k = mlir_kernel(STORE_TO_NULL, checked=True, cache=False)(lambda a: None)
    with pytest.raises(CompileError, match="crashed the compile worker"):
        worker.run((), "compiling @z", requests.object_code, STORE_TO_NULL, "z",
                   requests.PipelineChoice.of(k.options), 3, (), None, (), (), "x86-64")


@pytest.mark.parametrize("output_map, size, message", [
    ("-d0 + 3", 8, "reads indices -4 to 3 there (a dim 0 = 8); they must lie in 0 to 7."),
    ("d0 floordiv 2", 4, None),
])
def test_maps_that_are_not_sums_of_loop_dims_are_checked(output_map, size, message):
    k = mlir_kernel(f"""func.func @g(%a: memref<?xf32>, %o: memref<?xf32>) {{
      linalg.generic {{indexing_maps = [affine_map<(d0)->(d0)>, affine_map<(d0)->({output_map})>],
                      iterator_types = ["parallel"]}}
          ins(%a : memref<?xf32>) outs(%o : memref<?xf32>) {{
      ^bb0(%x: f32, %y: f32):
        linalg.yield %x : f32
      }}
      return }}""")(lambda a, o: None)
    guarded = np.full(size + 4, -7.0, F32)
    a = np.arange(1, 9, dtype=F32)
    if message is None:  # every index the loops reach lies inside o: numpy's answer
        k(a, guarded[4:])
        expected = np.full(size, -7.0, F32)
        for i in range(8):
            expected[i // 2] = a[i]
        np.testing.assert_array_equal(guarded[4:], expected)
    else:
        with pytest.raises(ShapeError, match=re.escape(message)):
            k(a, guarded[4:])
    assert (guarded[:4] == -7).all()


def test_the_masked_array_check_imports_no_numpy_ma():
    # A process that never made a masked array has none to refuse; numpy.ma is 17 ms to import at a first call.
    out = run_python("""
        import sys
        import numpy as np
        from memkernel import mlir_kernel
        sys.path.append("tests")
        from kernels import total

        kernel = mlir_kernel(total())(lambda x: None)
        print(kernel([1.0, 2.0]), "numpy.ma" in sys.modules)
    """)
    assert out.split() == ["3.0", "False"]
