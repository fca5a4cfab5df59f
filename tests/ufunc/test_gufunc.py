"""kernel.gufunc(): a real numpy gufunc whose signature comes from the shape rules, checked against numpy."""

import re

import numpy as np
import pytest

from memkernel import mlir_kernel
from memkernel.errors import AllocationError, ArgumentError, KernelAssertionError, SignatureError

from ..kernels import ADD, CONV, MATMUL, PAIRS, SCALE, TENSOR_ADD, TWO_RESULTS, UNRANKED_RANK
from ..threads import run_together

# C = A @ B on static 4x4 memrefs, in the vector dialect: a row of C in a register, one FMA per k.
MATMUL_4X4_VECTOR = """
func.func @matmul4(%a: memref<4x4xf32>, %b: memref<4x4xf32>, %c: memref<4x4xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  scf.for %i = %c0 to %c4 step %c1 {
    %init = vector.load %c[%i, %c0] : memref<4x4xf32>, vector<4xf32>
    %row = scf.for %k = %c0 to %c4 step %c1 iter_args(%acc = %init) -> (vector<4xf32>) {
      %x = memref.load %a[%i, %k] : memref<4x4xf32>
      %y = vector.load %b[%k, %c0] : memref<4x4xf32>, vector<4xf32>
      %s = vector.broadcast %x : f32 to vector<4xf32>
      %n = vector.fma %s, %y, %acc : vector<4xf32>
      scf.yield %n : vector<4xf32>
    }
    vector.store %row, %c[%i, %c0] : memref<4x4xf32>, vector<4xf32>
  }
  return
}
"""

# y = x, asserting that no element of x is negative.
NON_NEGATIVE = """
func.func @non_negative(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    %v = memref.load %x[%i] : memref<?xf32>
    %ok = arith.cmpf oge, %v, %zero : f32
    cf.assert %ok, "x must not be negative"
    memref.store %v, %y[%i] : memref<?xf32>
  }
  return
}
"""

STRIDED_COPY = """
func.func @scopy(%a: memref<?x?xf32, strided<[?, 1], offset: ?>>, %out: memref<?x?xf32>) {
  linalg.copy ins(%a : memref<?x?xf32, strided<[?, 1], offset: ?>>) outs(%out : memref<?x?xf32>)
  return
}
"""

COLUMN_MAJOR_COPY = """
func.func @ccopy(%a: memref<?x?xf32, strided<[1, ?], offset: ?>>, %out: memref<?x?xf32>) {
  linalg.copy ins(%a : memref<?x?xf32, strided<[1, ?], offset: ?>>) outs(%out : memref<?x?xf32>)
  return
}
"""

# Copies x into y, then writes y back into x: it writes its input.
WRITES_ITS_INPUT = """
func.func @bump(%x: memref<?xf32>, %y: memref<?xf32>) {
  linalg.copy ins(%x : memref<?xf32>) outs(%y : memref<?xf32>)
  linalg.copy ins(%y : memref<?xf32>) outs(%x : memref<?xf32>)
  return
}
"""

# Fills y with ones: nothing ties y to x.
FILL = """
func.func @fill(%x: memref<?xf32>, %y: memref<?xf32>) {
  %one = arith.constant 1.0 : f32
  linalg.fill ins(%one : f32) outs(%y : memref<?xf32>)
  return
}
"""

RNG = np.random.default_rng(19)


def floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


@pytest.fixture(scope="module")
def matmul() -> np.ufunc:
    return mlir_kernel(MATMUL)(lambda a, b: None).gufunc()


def test_gufunc_is_a_numpy_ufunc_with_the_signature_of_the_ties(matmul: np.ufunc) -> None:
    assert isinstance(matmul, np.ufunc)
    assert (matmul.signature, matmul.types, matmul.nin, matmul.nout) == ("(m,k),(k,n)->(m,n)", ["ff->f"], 2, 1)


def test_elementwise_kernel_on_1d_memrefs_gets_one_core_dim() -> None:
    assert mlir_kernel(ADD)(lambda a, b: None).gufunc().signature == "(n),(n)->(n)"


def test_static_dims_are_numbers_in_the_signature() -> None:
    assert mlir_kernel(MATMUL_4X4_VECTOR)(lambda a, b: None).gufunc().signature == "(4,4),(4,4)->(4,4)"


def test_dim_names_of_the_python_signature_name_the_core_dims() -> None:
    kernel = mlir_kernel(SCALE)(scale)
    assert kernel.gufunc().signature == "(N),()->(N)"


def scale(x: "N", s) -> "N":  # type: ignore[no-untyped-def]  # noqa: F821
    return None


def test_gufunc_is_made_once_per_kernel() -> None:
    kernel = mlir_kernel(ADD)(lambda a, b: None)
    assert kernel.gufunc() is kernel.gufunc()


def test_batched_matmul_matches_numpy(matmul: np.ufunc) -> None:
    a, b = floats(7, 3, 5), floats(7, 5, 2)
    np.testing.assert_allclose(matmul(a, b), np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_batch_dims_broadcast_as_numpy_broadcasts_them(matmul: np.ufunc) -> None:
    a, b = floats(2, 1, 3, 4), floats(5, 4, 6)
    np.testing.assert_allclose(matmul(a, b), np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_unbatched_call_is_one_kernel_call(matmul: np.ufunc) -> None:
    a, b = floats(3, 4), floats(4, 2)
    np.testing.assert_allclose(matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_out_is_overwritten_not_accumulated_into(matmul: np.ufunc) -> None:
    a, b = floats(4, 3, 5), floats(4, 5, 2)
    out = np.full((4, 3, 2), 100, np.float32)
    assert matmul(a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_non_contiguous_cores_are_copied_in_and_out(matmul: np.ufunc) -> None:
    a, b = floats(4, 5, 3).transpose(0, 2, 1), floats(4, 2, 5)[:, :, ::-1].transpose(0, 2, 1)
    out = np.zeros((4, 2, 3), np.float32).transpose(0, 2, 1)
    matmul(a, b, out=out)
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_out_view_keeps_the_elements_between_untouched(matmul: np.ufunc) -> None:
    a, b = floats(2, 3, 4), floats(2, 4, 3)
    base = np.full((2, 3, 6), 7, np.float32)
    matmul(a, b, out=base[:, :, ::2])
    np.testing.assert_allclose(base[:, :, ::2], a @ b, rtol=1e-5, atol=1e-5)
    assert (base[:, :, 1::2] == 7).all()


def test_axes_pick_the_core_dims(matmul: np.ufunc) -> None:
    a, b = floats(3, 5, 4), floats(5, 2)
    got = matmul(a, b, axes=[(0, 1), (0, 1), (0, 1)])
    np.testing.assert_allclose(got, np.matmul(a, b, axes=[(0, 1), (0, 1), (0, 1)]), rtol=1e-5, atol=1e-5)


def test_broadcast_core_of_stride_zero_is_read_correctly(matmul: np.ufunc) -> None:
    a, b = np.broadcast_to(floats(1, 4), (3, 4)), floats(4, 2)
    np.testing.assert_allclose(matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_output_overlapping_an_input_computes_as_numpy_does(matmul: np.ufunc) -> None:
    a, b = floats(3, 4, 4), floats(3, 4, 4)
    expected = np.matmul(a, b)
    matmul(a, b, out=a)
    np.testing.assert_allclose(a, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("where", ["batch", "core"])
def test_output_partly_overlapping_an_input_computes_as_numpy_does(matmul: np.ufunc, where: str) -> None:
    buffer, b = floats(6, 4, 4), floats(4, 4)
    expected, got = buffer.copy(), buffer.copy()
    if where == "batch":  # out is the input shifted by two batch elements
        np.matmul(expected[:4], b, out=expected[2:])
        matmul(got[:4], b, out=got[2:])
    else:  # out is the input shifted by one row and one column, in every batch element
        np.matmul(expected[:, :3, :3], b[:3, :3], out=expected[:, 1:, 1:])
        matmul(got[:, :3, :3], b[:3, :3], out=got[:, 1:, 1:])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_empty_batch_and_empty_core_dims(matmul: np.ufunc) -> None:
    assert matmul(floats(0, 3, 4), floats(0, 4, 2)).shape == (0, 3, 2)
    np.testing.assert_array_equal(matmul(floats(2, 3, 0), floats(2, 0, 2)), np.zeros((2, 3, 2), np.float32))


def test_wrong_core_dim_size_is_numpys_error(matmul: np.ufunc) -> None:
    with pytest.raises(ValueError, match=r"core dimension 0.*\(m,k\),\(k,n\)->\(m,n\).*size 4 is different from 5"):
        matmul(floats(3, 5), floats(4, 2))


def test_wrong_static_core_dim_is_numpys_error() -> None:
    gufunc = mlir_kernel(MATMUL_4X4_VECTOR)(lambda a, b: None).gufunc()
    with pytest.raises(ValueError, match=r"core dimension 1.*size 5 is different from 4"):
        gufunc(floats(4, 5), floats(4, 4))


def test_static_matmul_matches_numpy() -> None:
    gufunc = mlir_kernel(MATMUL_4X4_VECTOR)(lambda a, b: None).gufunc()
    a, b = floats(50, 4, 4), floats(50, 4, 4)
    np.testing.assert_allclose(gufunc(a, b), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["out filled", "transposed views", "out is an input", "out view with gaps"])
def test_static_cores_are_zero_filled_copied_and_kept_apart_as_dynamic_ones(case: str) -> None:
    """A fixed core size is a constant in the loop (the zero-fill of each output core is inlined): the kernel,
    which accumulates into its output, still sees zeros, contiguous copies of views, and no input it wrote."""
    gufunc = mlir_kernel(MATMUL_4X4_VECTOR)(lambda a, b: None).gufunc()
    a, b = floats(6, 4, 4), floats(6, 4, 4)
    out = np.full((6, 4, 4), 100, np.float32)
    if case == "transposed views":
        a, b, out = a.transpose(0, 2, 1), b.transpose(0, 2, 1), out.transpose(0, 2, 1)
    expected = np.matmul(a, b)
    if case == "out is an input":
        out = a
    elif case == "out view with gaps":
        base = np.full((6, 4, 8), 7, np.float32)
        out = base[:, :, ::2]
    gufunc(a, b, out=out)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    if case == "out view with gaps":
        assert (base[:, :, 1::2] == 7).all()


ROW_SUM_BY_LOOPS = """
func.func @rowsum(%a: memref<?x4xf32>, %o: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %n = memref.dim %a, %c0 : memref<?x4xf32>
  scf.for %i = %c0 to %n step %c1 {
    scf.for %j = %c0 to %c4 step %c1 {
      %v = memref.load %a[%i, %j] : memref<?x4xf32>
      %acc = memref.load %o[%i] : memref<?xf32>
      %x = arith.addf %acc, %v : f32
      memref.store %x, %o[%i] : memref<?xf32>
    }
  }
  return
}"""


def rowsum(a: "N 4") -> "N":  # type: ignore[no-untyped-def]  # noqa: F821
    return None


def test_a_fixed_dim_reached_by_a_loop_of_fixed_length_under_a_free_one_makes_a_gufunc():
    """The inner loop's reach (3) is bounded with the outer loop's dim at coefficient 0: it does not count."""
    gufunc = mlir_kernel(ROW_SUM_BY_LOOPS)(rowsum).gufunc()
    assert gufunc.signature == "(N,4)->(N)"
    a = floats(5, 3, 4)
    np.testing.assert_allclose(gufunc(a), a.sum(axis=-1), rtol=1e-6)


def test_a_core_dim_fixed_at_zero_is_a_signature_error_not_numpys_value_error():
    kernel = mlir_kernel("""func.func @z(%a: memref<0x4xf32>, %o: memref<4xf32>) {
      linalg.reduce ins(%a : memref<0x4xf32>) outs(%o : memref<4xf32>) dimensions = [0]
        (%x: f32, %acc: f32) { %s = arith.addf %x, %acc : f32
          linalg.yield %s : f32 }
      return }""")(lambda a: None)
    with pytest.raises(SignatureError, match=re.escape("z.gufunc(): dim 0 of a (memref<0x4xf32>) is 0, a size numpy "
                                                       "does not take in a gufunc signature")):
        kernel.gufunc()


def test_float64_input_is_numpys_casting_error(matmul: np.ufunc) -> None:
    with pytest.raises(TypeError, match="not supported for the input types"):
        matmul(floats(3, 4).astype(np.float64), floats(4, 2))


def test_dtype_argument_casts_as_numpy_casts(matmul: np.ufunc) -> None:
    a, b = np.arange(12.0).reshape(3, 4), np.ones((4, 2))
    np.testing.assert_allclose(matmul(a, b, dtype=np.float32, casting="same_kind"), a @ b)


def test_scalar_argument_is_a_broadcast_core_of_its_own() -> None:
    gufunc = mlir_kernel(SCALE)(scale).gufunc()
    x, s = floats(3, 5), np.array([1.0, 2.0, -0.5], np.float32)
    np.testing.assert_allclose(gufunc(x, s), x * s[:, None], rtol=1e-6)


def test_parallel_gufunc_matches_numpy_across_threads() -> None:
    gufunc = mlir_kernel(MATMUL, parallel=True)(lambda a, b: None).gufunc()
    a, b = floats(1001, 3, 5), floats(1001, 5, 4)
    np.testing.assert_allclose(gufunc(a, b), np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_calls_from_several_python_threads_give_numpys_answers(matmul: np.ufunc) -> None:
    a, b = floats(200, 4, 4), floats(200, 4, 4)
    expected, results = np.matmul(a, b), [None] * 4

    def run(i: int) -> None:
        results[i] = matmul(a, b)

    run_together(run, range(4))
    for got in results:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("parallel", [False, True])
def test_failed_assertion_raises_kernel_assertion_error(parallel: bool) -> None:
    gufunc = mlir_kernel(NON_NEGATIVE, parallel=parallel)(non_negative).gufunc()
    x = np.abs(floats(100, 3))
    x[60, 1] = -1
    with pytest.raises(KernelAssertionError, match=r"(?s)non_negative\(\): the kernel stopped at a failed assertion:\nx must not be negative"):
        gufunc(x)
    np.testing.assert_array_equal(gufunc(np.abs(x)), np.abs(x))


def non_negative(x: "n") -> "n":  # type: ignore[no-untyped-def]  # noqa: F821
    return None


def test_copy_that_cannot_be_allocated_is_an_allocation_error(matmul: np.ufunc) -> None:
    row, column = np.broadcast_to(np.float32(1), (1, 2**42)), np.broadcast_to(np.float32(1), (2**42, 1))
    with pytest.raises(AllocationError, match=r"matmul.gufunc\(\): could not get 17592186044416 bytes to copy"):
        matmul(row, column)  # cores of stride 0: contiguous copies of 16 TiB each


def test_strided_layout_with_dynamic_strides_is_accepted() -> None:
    gufunc = mlir_kernel(STRIDED_COPY)(lambda a: None).gufunc()
    a = floats(3, 4, 6)[:, ::2, 1:]
    np.testing.assert_array_equal(gufunc(a), a)


# y[i - 1] = y[i] * s for each i of y: y[-1] whenever y is not empty.
BACK = SCALE.replace("memref.dim %x", "memref.dim %y").replace("memref.load %x[%i]", "memref.load %y[%i]").replace(
    "memref.store %r, %y[%i]", "%j = arith.subi %i, %c1 : index\n    memref.store %r, %y[%j]")


@pytest.mark.parametrize(("source", "function", "message"), [
    (BACK, lambda x, s: None, r"scale.gufunc\(\): @scale's memref.store needs a dim"),
    (TWO_RESULTS, lambda x, n: None, r"two.gufunc\(\): @two returns 2 result\(s\); a gufunc's values are its outputs"),
    (WRITES_ITS_INPUT, lambda x: None, r"bump.gufunc\(\): argument 'x' .* may write this input"),
    (CONV, lambda i, f: None, r"conv.gufunc\(\): @conv's linalg.conv_2d_nhwc_hwcf needs a dim at least as large"),
    (PAIRS, lambda x: None, r"pairs.gufunc\(\): @pairs's memref.load needs a dim at least as large"),
    (UNRANKED_RANK, lambda a: None, r"rank.gufunc\(\): @rank returns 1 result"),
    (COLUMN_MAJOR_COPY, lambda a: None, r"ccopy.gufunc\(\): argument 'a' .* fixes the stride of dim 0 to 1"),
    (TENSOR_ADD, lambda a, b: None, r"tadd.gufunc\(\): @tadd returns 1 result"),
])
def test_kernel_no_signature_describes_is_refused_with_the_rule(source: str, function, message: str) -> None:  # type: ignore[no-untyped-def]
    kernel = mlir_kernel(source)(function)
    with pytest.raises(SignatureError, match=message):
        kernel.gufunc()


def test_output_shaped_by_the_python_function_is_refused() -> None:
    kernel = mlir_kernel(FILL)(lambda x: (5,))
    with pytest.raises(SignatureError, match=r"fill.gufunc\(\): dim 0 of out .* is tied to no input dim"):
        kernel.gufunc()


def test_refusal_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        mlir_kernel(TWO_RESULTS)(lambda x, n: None).gufunc()


def test_kernel_with_no_output_is_refused() -> None:
    with pytest.raises(SignatureError, match=r"matmul.gufunc\(\): it has no output memref"):
        mlir_kernel(MATMUL)(lambda a, b, c: None).gufunc()


def test_isolated_kernel_is_refused() -> None:
    with pytest.raises(SignatureError, match=r"add.gufunc\(\): .* isolate=True"):
        mlir_kernel(ADD, isolate=True)(lambda a, b: None).gufunc()


def test_kernel_with_callbacks_is_refused() -> None:
    source = """
func.func private @log(f32)
func.func @logged(%x: memref<?xf32>, %y: memref<?xf32>) {
  linalg.copy ins(%x : memref<?xf32>) outs(%y : memref<?xf32>)
  return
}"""
    kernel = mlir_kernel(source, callbacks={"log": lambda v: None})(lambda x: None)
    with pytest.raises(SignatureError, match=r"logged.gufunc\(\): a kernel with callbacks= cannot be a gufunc"):
        kernel.gufunc()


def test_dask_array_in_gives_a_lazy_dask_array_out(matmul: np.ufunc) -> None:
    da = pytest.importorskip("dask.array")
    a, b = floats(12, 3, 5), floats(12, 5, 2)
    lazy = matmul(da.from_array(a, chunks=(4, 3, 5)), da.from_array(b, chunks=(4, 5, 2)))
    assert isinstance(lazy, da.Array)
    np.testing.assert_allclose(lazy.compute(), np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_static_core_gufunc_takes_dask_arrays_through_apply_gufunc() -> None:
    da = pytest.importorskip("dask.array")
    import memkernel.dask

    gufunc = mlir_kernel(MATMUL_4X4_VECTOR)(lambda a, b: None).gufunc()
    a, b = floats(12, 4, 4), floats(4, 4)
    lazy = memkernel.dask.apply_gufunc(gufunc, da.from_array(a, chunks=(5, 4, 4)), b)
    assert isinstance(lazy, da.Array)
    np.testing.assert_allclose(lazy.compute(), np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_apply_gufunc_of_a_ufunc_that_is_not_generalized_is_an_argument_error() -> None:
    pytest.importorskip("dask.array")
    import memkernel.dask

    with pytest.raises(ArgumentError, match=r"apply_gufunc\(\): expected a generalized numpy ufunc with one loop"):
        memkernel.dask.apply_gufunc(np.add, floats(3))


def test_array_ufunc_override_is_dispatched(matmul: np.ufunc) -> None:
    class Wrapped:
        def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):  # type: ignore[no-untyped-def]
            return ("dispatched", ufunc, method)

    assert matmul(Wrapped(), floats(4, 2)) == ("dispatched", matmul, "__call__")
