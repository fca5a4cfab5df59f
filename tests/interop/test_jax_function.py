"""kernel.as_jax(): a JAX function usable inside jax.jit, its result shapes from the shape rules, checked against jnp."""

from __future__ import annotations

import numpy as np
import pytest

from memkernel import mlir_kernel
from memkernel.errors import ArgumentError, ShapeError, SignatureError
from tests.kernels import ADD, MATMUL, MATVEC_IN_PLACE, PAIRS, SCALE, SPREAD, TENSOR_ADD, TWO_RESULTS, copy
from tests.test_stdio import run_threads
from tests.ufunc.test_gufunc import NON_NEGATIVE

jax = pytest.importorskip("jax", reason="jax is not installed in this environment (the 3.11 venv has it)")
jnp = jax.numpy


@pytest.fixture(scope="module")
def add():
    return mlir_kernel(ADD)(lambda a, b: None).as_jax()


@pytest.fixture(scope="module")
def matmul():
    return mlir_kernel(MATMUL)(lambda a, b: None).as_jax()


def test_add_under_jit_matches_jnp_add(add):
    a, b = jnp.arange(5, dtype=jnp.float32), jnp.ones(5, jnp.float32)
    np.testing.assert_array_equal(jax.jit(add)(a, b), jnp.add(a, b))


def test_matmul_under_jit_matches_jnp_matmul(matmul):
    a, b = jax.random.normal(jax.random.key(0), (3, 4)), jax.random.normal(jax.random.key(1), (4, 5))
    np.testing.assert_allclose(jax.jit(matmul)(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_result_shape_is_derived_at_trace(matmul):
    traced = jax.eval_shape(matmul, jax.ShapeDtypeStruct((6, 2), jnp.float32), jax.ShapeDtypeStruct((2, 9), jnp.float32))
    assert (traced.shape, traced.dtype) == ((6, 9), jnp.float32)


def test_called_outside_jit_returns_jax_arrays(add):
    out = add(np.ones(3, np.float32), np.ones(3, np.float32))
    assert isinstance(out, jax.Array)
    np.testing.assert_array_equal(out, np.full(3, 2.0, np.float32))


def test_vmap_runs_the_kernel_per_batch_element(matmul):
    a, b = jnp.ones((4, 2, 3)), jnp.ones((4, 3, 5))
    np.testing.assert_array_equal(jax.jit(jax.vmap(matmul))(a, b), jnp.matmul(a, b))


def test_scalar_parameter_concrete_and_traced():
    scale = mlir_kernel(SCALE)(lambda x, s: None).as_jax()
    x = jnp.arange(4, dtype=jnp.float32)
    np.testing.assert_array_equal(jax.jit(scale)(x, 2.5), x * 2.5)
    np.testing.assert_array_equal(jax.jit(scale, static_argnums=1)(x, 3.0), x * 3.0)
    np.testing.assert_array_equal(jax.vmap(scale, in_axes=(None, 0))(x, jnp.array([1.0, 2.0])), jnp.outer(
        jnp.array([1.0, 2.0]), x))


def test_keyword_arguments_bind_like_the_kernel(add):
    np.testing.assert_array_equal(add(b=jnp.ones(2), a=jnp.zeros(2)), jnp.ones(2))


def test_in_place_kernel_returns_the_new_value_and_leaves_its_argument():
    matvec = mlir_kernel(MATVEC_IN_PLACE)(lambda a, x, y: None).as_jax()
    a, x, y = jnp.ones((3, 4)), jnp.arange(4.0), jnp.ones(3)
    np.testing.assert_array_equal(jax.jit(matvec)(a, x, y), y + a @ x)
    np.testing.assert_array_equal(y, jnp.ones(3))


def test_output_shaped_by_the_decorated_function():
    pairs = mlir_kernel(PAIRS)(lambda x: (x.shape[0] - 1,)).as_jax()
    x = jnp.arange(6.0)
    np.testing.assert_array_equal(jax.jit(pairs)(x), x[:-1] + x[1:])


@pytest.mark.parametrize("element, dtype", [("bf16", "bfloat16"), ("i1", "bool_"), ("complex<f32>", "complex64"),
                                            ("f16", "float16"), ("ui8", "uint8")])
def test_dtypes_travel_unchanged(element, dtype):
    copy_kernel = jax.jit(mlir_kernel(copy(element))(lambda a: None).as_jax())
    x = jnp.array([1, 0, 1], getattr(jnp, dtype))
    out = copy_kernel(x)
    assert out.dtype == x.dtype
    np.testing.assert_array_equal(out, x)


def test_mismatched_tie_is_a_shape_error_at_trace(add):
    with pytest.raises(ShapeError, match="a has 5 elements on dim 0 but b has 4 on dim 0"):
        jax.jit(add)(jnp.ones(5), jnp.ones(4))


def test_wrong_dtype_is_an_argument_error_at_trace(add):
    with pytest.raises(ArgumentError, match=r"argument 'a' expects memref<\?xf32> \(float32, 1-d\); got int32\[5\]\. "
                                            r"Pass a.astype\(jnp.float32\)\."):
        jax.jit(add)(jnp.ones(5, jnp.int32), jnp.ones(5))


def test_wrong_rank_is_an_argument_error_at_trace(add):
    with pytest.raises(ArgumentError, match=r"got float32\[2, 2\]\. Pass a with shape \(\*,\)\."):
        jax.jit(add)(jnp.ones((2, 2)), jnp.ones((2, 2)))


def test_missing_argument_is_an_argument_error(add):
    with pytest.raises(ArgumentError, match=r"add\(\): missing a required argument: 'b'"):
        add(jnp.ones(2))


def test_64_bit_types_without_x64_are_refused():
    two = mlir_kernel(TWO_RESULTS)(lambda x, n: None).as_jax()
    with pytest.raises(ArgumentError, match=r"two\(\): the kernel takes or returns float64, which .*jax_enable_x64"):
        two(1.5, 3)


def test_output_shape_past_a_bound_is_a_shape_error_at_trace():
    pairs = mlir_kernel(PAIRS)(lambda x: (x.shape[0] + 1,)).as_jax()  # out would make the kernel read past x
    with pytest.raises(ShapeError, match=r"pairs\(\): x has 4 elements on dim 0 but @pairs's memref.load reaches"):
        jax.jit(pairs)(jnp.ones(4))


def test_kernel_error_inside_jit_reaches_the_caller_with_memkernels_message():
    check = mlir_kernel(NON_NEGATIVE)(lambda x: None).as_jax()
    with pytest.raises(Exception, match=r"KernelAssertionError: non_negative\(\): the kernel stopped at a failed "
                                        r"assertion:\nx must not be negative"):
        jax.block_until_ready(jax.jit(check)(jnp.array([1.0, -1.0])))


def test_result_with_dynamic_dims_is_refused():
    with pytest.raises(SignatureError, match=r"tadd.as_jax\(\): result 0 \(tensor<\?x\?xf32>\)"):
        mlir_kernel(TENSOR_ADD)(lambda a, b: None).as_jax()


def test_output_no_rule_shapes_is_refused():
    with pytest.raises(SignatureError, match=r"spread.as_jax\(\): output 'out' has a \? dim"):
        mlir_kernel(SPREAD)(lambda x: None).as_jax()


def test_as_jax_is_made_once():
    kernel = mlir_kernel(ADD)(lambda a, b: None)
    assert kernel.as_jax() is kernel.as_jax()


def test_scalar_results_with_x64_are_zero_dim_arrays():
    two = mlir_kernel(TWO_RESULTS)(lambda x, n: None).as_jax()
    with jax.enable_x64(True):
        x, n = jax.jit(two)(jnp.float64(1.5), jnp.int32(7))
    assert (x.dtype, x.shape, float(x)) == (jnp.float64, (), 1.5)
    assert (n.dtype, n.shape, int(n)) == (jnp.int32, (), 7)


def test_out_of_range_scalar_inside_jit_is_memkernels_error():
    two = mlir_kernel(TWO_RESULTS)(lambda x, n: None).as_jax()
    with jax.enable_x64(True), pytest.raises(Exception, match=r"ValueRangeError: two\(\): argument 'n'"):
        jax.block_until_ready(jax.jit(lambda x: two(x, 2**40))(jnp.float64(1.0)))


def test_calls_from_threads_agree_with_jnp(add):
    jitted = jax.jit(add)
    a = jnp.arange(1000, dtype=jnp.float32)

    def work():
        for _ in range(50):
            np.testing.assert_array_equal(jitted(a, a), a + a)

    run_threads(*[work] * 4)


def test_zero_size_arrays(add):
    out = jax.jit(add)(jnp.ones(0), jnp.ones(0))
    assert out.shape == (0,)


def test_python_sequence_is_converted_as_a_call_converts_it(add):
    np.testing.assert_array_equal(add([1.0, 2.0], np.ones(2, np.float32)), np.array([2.0, 3.0], np.float32))


def test_python_sequence_that_would_round_is_refused_as_a_call_refuses_it(add):
    with pytest.raises(ValueError, match=r"add\(\): argument 'a' .* is not exactly a float32"):
        add([0.1], np.ones(1, np.float32))


def test_traced_array_for_a_scalar_is_an_argument_error_at_trace():
    scale = mlir_kernel(SCALE)(lambda x, s: None).as_jax()
    with pytest.raises(ArgumentError, match=r"scale\(\): argument 's' expects f32; got an array float32\[2\]\. "
                                            r"Pass one number"):
        jax.jit(scale)(jnp.ones(2), jnp.ones(2))


def test_vmap_of_an_in_place_kernel_returns_each_new_value():
    matvec = mlir_kernel(MATVEC_IN_PLACE)(lambda a, x, y: None).as_jax()
    a, x, y = jnp.ones((2, 3, 4)), jnp.arange(8.0).reshape(2, 4), jnp.ones((2, 3))
    np.testing.assert_array_equal(jax.vmap(matvec)(a, x, y), y + jnp.einsum("bij,bj->bi", a, x))


def test_grad_is_refused_by_jax():
    add = mlir_kernel(ADD)(lambda a, b: None).as_jax()
    with pytest.raises(ValueError, match="cannot be differentiated"):
        jax.grad(lambda x: add(x, x).sum())(jnp.ones(3))


def test_traced_scalar_of_a_narrower_dtype_is_read_as_its_own_dtype():
    scale = mlir_kernel(SCALE)(lambda x, s: None).as_jax()
    x = jnp.arange(4, dtype=jnp.float32)
    np.testing.assert_array_equal(jax.jit(scale)(x, jnp.float16(2.5)), x * 2.5)


def test_signless_integers_of_either_sign_travel_as_given():
    matching = mlir_kernel(copy("i32"))(lambda a: None).as_jax()
    x = jnp.array([1, 2, 3], jnp.uint32)
    np.testing.assert_array_equal(jax.jit(matching)(x), np.array([1, 2, 3], np.int32))
