"""JAX arrays as arguments: read zero-copy through DLPack, never written, and JAX out, against jax.numpy."""

from __future__ import annotations

import re

import numpy as np
import pytest

from memkernel import ArgumentError, DTypeError, mlir_kernel

from ..kernels import SCALE, elementwise

jax = pytest.importorskip(
    "jax", reason="JAX is not installed: memkernel[test] installs it on Python 3.11 only, beside torch")
jnp = pytest.importorskip("jax.numpy")

ADD = elementwise("arith.addf", "memref<?xf32>", "f32", 1)
ADD_BF16 = elementwise("arith.addf", "memref<?xbf16>", "bf16", 1)



@pytest.fixture(scope="module")
def add():
    return mlir_kernel(ADD)(lambda a, b: None)


def test_a_call_on_jax_arrays_returns_a_jax_array_equal_to_jnp_add(add):
    a, b = jnp.arange(16, dtype=jnp.float32), jnp.full(16, 0.25, jnp.float32)
    got = add(a, b)
    assert isinstance(got, jax.Array) and got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.add(a, b)))


def test_a_jax_array_as_out_is_an_error_that_says_jax_arrays_are_immutable(add):
    out = jnp.zeros(3, jnp.float32)
    with pytest.raises(ArgumentError, match=re.escape(
            "k(): argument 'out' expects memref<?xf32>; got a read-only jax.Array float32[3] as out=: JAX arrays "
            "are immutable (their DLPack export is read-only), so a kernel cannot write one.")):
        add(jnp.ones(3, jnp.float32), jnp.ones(3, jnp.float32), out=out)
    np.testing.assert_array_equal(np.asarray(out), np.zeros(3, np.float32))


def test_a_jax_array_the_kernel_writes_is_an_error_too():
    scale = mlir_kernel(SCALE)(lambda x, s, y: None)  # y named: written in place
    with pytest.raises(ArgumentError, match=re.escape(
            "got a read-only jax.Array float32[2] for an argument the kernel may write: JAX arrays are immutable")):
        scale(jnp.ones(2, jnp.float32), 2.0, jnp.zeros(2, jnp.float32))


def test_mixed_jax_and_numpy_arguments_return_numpy(add):
    got = add(jnp.ones(3, jnp.float32), np.ones(3, np.float32))
    assert type(got) is np.ndarray
    np.testing.assert_array_equal(got, np.full(3, 2, np.float32))


def test_an_int32_jax_array_for_f32_is_a_dtype_error_naming_the_fix(add):
    with pytest.raises(DTypeError, match=re.escape(
            "k(): argument 'a' expects memref<?xf32> (float32, 1-d); got jax.Array int32[3]. "
            "Pass a.astype(jnp.float32).")):
        add(jnp.arange(3, dtype=jnp.int32), jnp.ones(3, jnp.float32))


def test_bf16_jax_arrays_compute_as_jnp_does():
    add = mlir_kernel(ADD_BF16)(lambda a, b: None)
    a = jnp.linspace(-3, 3, 11).astype(jnp.bfloat16)
    b = jnp.full(11, 0.125, jnp.bfloat16)
    got = add(a, b)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got), np.asarray(a + b))


def test_a_deleted_jax_array_is_an_error_that_says_it_was_deleted(add):
    deleted = jnp.ones(3, jnp.float32)
    deleted.delete()
    with pytest.raises(ArgumentError, match=re.escape(
            "k(): argument 'a' expects memref<?xf32>; got a jax.Array that was deleted (by .delete(), or donated to "
            "a jitted function): its memory is freed. Pass an array that is alive.")):
        add(deleted, jnp.ones(3, jnp.float32))
