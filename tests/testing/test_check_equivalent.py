"""memkernel.testing.check_equivalent: planted miscompiles are found and shrunk to small examples."""

from __future__ import annotations

import re

import pytest
from hypothesis import strategies as st

from memkernel import SignatureError, mlir_kernel
from memkernel.testing import check_equivalent
from memkernel.testing.equivalence import _default_name, with_pipeline

from .. import kernels


@pytest.fixture(scope="module")
def add():
    return mlir_kernel(kernels.ADD)(lambda a, b: None)


@pytest.fixture(scope="module")
def add_chunks():
    @mlir_kernel(kernels.ADD_CHUNKS_NO_TAIL)
    def add_chunks(a: "N", b: "N") -> "N":  # noqa: F821
        pass

    return add_chunks


def _failure(*args, **kwargs) -> str:
    with pytest.raises(AssertionError) as caught:
        check_equivalent(*args, **kwargs)
    return str(caught.value)


def test_a_lowering_that_skips_the_tail_is_caught_on_a_single_element(add, add_chunks):
    message = _failure(add_chunks, add, examples=100)
    assert message.startswith("check_equivalent(add_chunks, add): the kernels differ on this example "
                              "(shrunk by hypothesis):\n")
    assert "add_chunks (the kernel) differs from add (the reference)\n" in message
    # Shrunk to the smallest size not divisible by 4, contiguous arrays, one nonzero value.
    assert "  arguments: a float32[1], b float32[1]\n" in message
    assert "  output 'out' differs from the reference in 1 of 1 elements\n" in message
    # The tail is left as allocated (zero); the sum there is one nonzero element of a or b.
    assert re.search(r"first mismatch at index \(0,\): kernel 0\.0, reference -?\d+\.\d+\n", message)
    assert re.search(r"    a = array\(\[-?\d+\.\d*\], dtype=float32\)\n    b = array\(\[-?\d+\.\d*\], dtype=float32\)\n",
                     message)


def test_a_sign_error_is_caught_on_one_negative_input():
    relu = mlir_kernel(kernels.RELU)(lambda x: None)
    relu_abs = mlir_kernel(kernels.RELU_ABS)(lambda x: None)
    message = _failure(relu_abs, relu, examples=100)
    assert "  arguments: x float32[1]\n" in message
    # The smallest negative value the default elements hold.
    assert "    x = array([-0.125], dtype=float32)\n" in message
    assert "first mismatch at index (0,): kernel 0.125, reference 0.0\n" in message


def test_the_bug_hides_from_sizes_divisible_by_4(add, add_chunks):
    check_equivalent(add_chunks, add, examples=30, elements=st.just(1.0), min_side=4, max_side=4)


def test_equivalent_kernels_pass(add):
    other = mlir_kernel(kernels.ADD.replace("arith.addf %x0, %x1", "arith.addf %x1, %x0"))(lambda a, b: None)
    check_equivalent(add, other, examples=50)


def test_a_pipeline_string_compares_the_same_source_under_that_pipeline(add):
    check_equivalent(add, "fast", examples=50)


def test_a_check_is_reported_under_its_name():
    source = kernels.elementwise("arith.subf", "memref<?xf32>", "f32", 1, name="sub")
    sub = mlir_kernel(source)(lambda a, b: None)
    swapped = mlir_kernel(source.replace("arith.subf %x0, %x1", "arith.subf %x1, %x0"))(lambda a, b: None)
    message = _failure(swapped, sub, examples=100, name="subtraction order")
    assert message.startswith("check_equivalent(subtraction order): the kernels differ")
    assert "arguments: a float32[1], b float32[1]" in message


def test_the_default_name_of_one_source_under_two_pipelines_shows_both(add):
    assert _default_name(add, with_pipeline(add, "fast")) == "add with pipeline=None, with pipeline='fast'"


def test_in_place_writes_are_compared():
    @mlir_kernel(kernels.SCALE)
    def scale(x: "N", s, y: "N"):  # noqa: F821
        pass

    wrong = kernels.SCALE.replace("arith.mulf", "arith.addf").replace("@scale", "@scale_wrong")

    @mlir_kernel(wrong)
    def scale_wrong(x: "N", s, y: "N"):  # noqa: F821
        pass

    message = _failure(scale_wrong, scale, examples=100)
    assert "  argument 'y' after the call differs from the reference in 1 of 1 elements\n" in message
    assert "arguments: x float32[1], s = " in message


def test_kernels_with_different_signatures_are_refused(add):
    other = mlir_kernel(kernels.elementwise("arith.addf", "memref<?xf64>", "f64", 1, name="add64"))(
        lambda a, b: None)
    with pytest.raises(SignatureError, match=r"check_equivalent\(\): add takes \(memref<\?xf32>, memref<\?xf32>\) "
                                             r"outputs \(memref<\?xf32>\) -> \(\) but add64 takes "
                                             r"\(memref<\?xf64>, memref<\?xf64>\)"):
        check_equivalent(add, other)
    with pytest.raises(TypeError):
        check_equivalent(add, other)


def test_each_kernel_gets_its_own_copy_of_the_arguments():
    # Both kernels write x in place. Had they shared the arrays, both would be judged by the same
    # array after both calls, and doubling would pass for tripling.
    double_source = kernels.loop_map("double", "f32", "%r = arith.addf %v, %v : f32", in_place=True)
    double = mlir_kernel(double_source)(lambda x: None)
    triple_source = kernels.loop_map("triple", "f32", "%w = arith.addf %v, %v : f32", "%r = arith.addf %w, %v : f32",
                                     in_place=True)
    triple = mlir_kernel(triple_source)(lambda x: None)
    message = _failure(double, triple, examples=50)
    assert "  argument 'x' after the call differs from the reference in 1 of 1 elements\n" in message
    check_equivalent(double, mlir_kernel(double_source, cache=False)(lambda x: None), examples=50)
