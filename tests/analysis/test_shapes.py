"""Dims that must agree: read off the IR and from named dims, checked before every call, used to allocate."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memkernel import ShapeError, SignatureError, mlir_kernel

from ..fastpath.conftest import with_fast_path
from ..kernels import CONV, LOOP_MATMUL, MATMUL, PAIRS, SCALE, SLICES_AND_CASTS

REPO = str(Path(__file__).resolve().parents[2])
F32 = np.float32

ADD = """func.func @add(%a: memref<?xf32>, %b: memref<?xf32>, %out: memref<?xf32>) {
  linalg.elementwise kind=#linalg.elementwise_kind<add>
      ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%out : memref<?xf32>)
  return
}"""

# c[i, j] = a[i]: c dim 0 is tied to a dim 0, c dim 1 to nothing.
SPREAD = """func.func @spread(%a: memref<?xf32>, %c: memref<?x?xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<?xf32>) outs(%c : memref<?x?xf32>) {
  ^bb0(%x: f32, %y: f32):
    linalg.yield %x : f32
  }
  return
}"""

TENSOR_ADD = """func.func @tadd(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
  %r = arith.addf %a, %b : tensor<?xf32>
  return %r : tensor<?xf32>
}"""

COPY = """func.func @copy(%a: memref<?x?xf32>, %b: memref<?x?xf32>) {
  memref.copy %a, %b : memref<?x?xf32> to memref<?x?xf32>
  return
}"""

CAST_THEN_ADD = """func.func @add(%a: memref<?xf32>, %b: memref<?xf32>, %out: memref<?xf32>) {
  %c = memref.cast %b : memref<?xf32> to memref<?xf32>
  linalg.add ins(%a, %c : memref<?xf32>, memref<?xf32>) outs(%out : memref<?xf32>)
  return
}"""

CONDITIONAL_COPY = """func.func @maybe(%a: memref<?xf32>, %b: memref<?xf32>, %go: i1) {
  scf.if %go {
    linalg.copy ins(%a : memref<?xf32>) outs(%b : memref<?xf32>)
  }
  return
}"""


@pytest.fixture(scope="module")
def add():
    return mlir_kernel(ADD)(lambda a, b: None)


def ones(n: int) -> np.ndarray:
    return np.ones(n, F32)


def test_a_too_small_out_is_a_shape_error_naming_both_arguments(add):
    with pytest.raises(ShapeError, match=re.escape(
            "add(): a has 6 elements on dim 0 but out has 1 on dim 0; @add's linalg.elementwise needs them equal.")):
        add(ones(6), ones(6), out=np.zeros(1, F32))


def test_a_view_as_out_is_never_written_past(add):
    big = np.zeros(12, F32)
    with pytest.raises(ShapeError, match="out has 5 on dim 0"):
        add(ones(6), ones(6), out=big[:5])
    assert not big.any()


def test_a_short_input_is_never_read_past(add):
    with pytest.raises(ShapeError, match="a has 6 elements on dim 0 but b has 3"):
        add(np.arange(6, dtype=F32), ones(3), out=np.zeros(6, F32))


def test_the_issues_crashing_call_is_an_error_in_a_live_process():
    script = "\n".join([
        "import numpy as np",
        "from memkernel import ShapeError, mlir_kernel",
        f"add = mlir_kernel({ADD!r})(lambda a, b: None)",
        "try:",
        "    add(np.ones(10**7, np.float32), np.ones(10**7, np.float32), out=np.zeros(1, np.float32))",
        "except ShapeError as exc:",
        "    print('ShapeError:', exc)",
    ])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "a has 10000000 elements on dim 0 but out has 1" in done.stdout


def test_an_object_that_changes_shape_between_conversions_cannot_overflow(add):
    class Liar:
        """Answers 6 elements, then 2, then 6, ... on each conversion."""

        conversions = 0

        def __array__(self, dtype=None, copy=None):
            Liar.conversions += 1
            return np.full(6 if Liar.conversions % 2 else 2, 5, F32)

    guarded = np.zeros(8, F32)
    for _ in range(6):
        for out in (None, guarded[:6]):
            try:
                result = add(Liar(), ones(6), out=out)
            except ShapeError as exc:
                assert "a has 2 elements on dim 0 but b has 6" in str(exc)
            else:
                np.testing.assert_array_equal(result, np.full(6, 6, F32))
    assert not guarded[6:].any()


def test_matching_calls_take_their_output_from_the_ties(add):
    a, b = np.arange(6, dtype=F32), np.full(6, 2, F32)
    np.testing.assert_array_equal(add(a, b), a + b)


def test_matmul_needs_no_shape_function():
    matmul = mlir_kernel(MATMUL)(lambda a, b: None)
    rng = np.random.default_rng(0)
    a, b = rng.integers(-3, 4, (4, 3)).astype(F32), rng.integers(-3, 4, (3, 5)).astype(F32)
    np.testing.assert_array_equal(matmul(a, b), a @ b)
    with pytest.raises(ShapeError, match=re.escape(
            "matmul(): a has 3 elements on dim 1 but b has 5 on dim 0; @matmul's linalg.matmul needs them equal.")):
        matmul(a, b.T.copy())
    with pytest.raises(ShapeError, match="a has 4 elements on dim 0 but out has 5"):
        matmul(a, b, out=np.zeros((5, 5), F32))


def test_a_shape_functions_answer_is_checked_against_the_ties():
    spread = mlir_kernel(SPREAD)(lambda a: (2, 3))
    with pytest.raises(ShapeError, match="a has 6 elements on dim 0 but out has 2 on dim 0"):
        spread(ones(6))
    fitting = mlir_kernel(SPREAD)(lambda a: (a.shape[0], 3))
    a = np.arange(4, dtype=F32)
    np.testing.assert_array_equal(fitting(a), np.repeat(a[:, None], 3, axis=1))


def test_a_convolution_input_smaller_than_its_window_is_refused():
    conv = mlir_kernel(CONV)(lambda i, f: None)
    image, window = np.ones((1, 5, 5, 2), F32), np.ones((3, 3, 2, 4), F32)
    with pytest.raises(ShapeError, match=re.escape(
            "conv(): i has 5 elements on dim 1 but @conv's linalg.conv_2d_nhwc_hwcf reads up to index 5 there "
            "(out dim 1 = 4, f dim 0 = 3); pass at least 6.")):
        conv(image, window, out=np.zeros((1, 4, 3, 4), F32))
    out = np.zeros((1, 3, 3, 4), F32)
    conv(image, window, out=out)
    np.testing.assert_array_equal(out, np.full((1, 3, 3, 4), 18, F32))


def test_tensor_arguments_used_together_are_tied():
    tadd = mlir_kernel(TENSOR_ADD)(lambda a, b: None)
    with pytest.raises(ShapeError, match="a has 4 elements on dim 0 but b has 3 on dim 0; @tadd's arith.addf"):
        tadd(ones(4), ones(3))
    np.testing.assert_array_equal(tadd(np.arange(3, dtype=F32), ones(3)), np.arange(3) + 1)


def test_memref_copy_ties_every_dim():
    copy = mlir_kernel(COPY)(lambda a, b: None)
    with pytest.raises(ShapeError, match="a has 3 elements on dim 1 but b has 4 on dim 1; @copy's memref.copy"):
        copy(np.ones((2, 3), F32), np.zeros((2, 4), F32))


def test_a_cast_of_an_argument_is_still_that_argument():
    add = mlir_kernel(CAST_THEN_ADD)(lambda a, b: None)
    with pytest.raises(ShapeError, match="a has 2 elements on dim 0 but b has 3"):
        add(ones(2), ones(3))


# b is static; cast to `?` before the add, it still ties a and out to its 5 elements.
STATIC_CAST_THEN_ADD = """func.func @add(%a: memref<?xf32>, %b: memref<5xf32>, %out: memref<?xf32>) {
  %c = memref.cast %b : memref<5xf32> to memref<?xf32>
  linalg.add ins(%a, %c : memref<?xf32>, memref<?xf32>) outs(%out : memref<?xf32>)
  return
}"""


def test_a_cast_from_a_static_shape_carries_the_static_size():
    add = mlir_kernel(STATIC_CAST_THEN_ADD)(lambda a, b: None)
    np.testing.assert_array_equal(add(ones(5), ones(5)), 2 * ones(5))
    with pytest.raises(ShapeError, match=re.escape("add(): a has 4 elements on dim 0 but b has 5 on dim 0")):
        add(ones(4), ones(5))


def test_an_op_under_scf_if_ties_nothing():
    maybe = mlir_kernel(CONDITIONAL_COPY)(lambda a, b, go: None)
    b = np.zeros(2, F32)
    maybe(ones(5), b, False)
    assert not b.any()


def test_named_dims_tie_what_the_ir_does_not():
    @mlir_kernel(SCALE)
    def scale(x: "N", s, y: "N"): ...

    with pytest.raises(ShapeError, match=re.escape(
            "scale(): N is 3 from x but 4 from y (dims 0 and 0); every dim named N must have one size.")):
        scale(ones(3), 2.0, np.zeros(4, F32))
    y = np.zeros(3, F32)
    scale(np.arange(3, dtype=F32), 2.0, y)
    np.testing.assert_array_equal(y, np.arange(3) * 2)


def test_named_dims_shape_an_allocated_output():
    @mlir_kernel(LOOP_MATMUL)
    def matmul(a: "M K", b: "K N") -> "M N": ...

    rng = np.random.default_rng(1)
    a, b = rng.integers(-3, 4, (2, 3)).astype(F32), rng.integers(-3, 4, (3, 4)).astype(F32)
    np.testing.assert_array_equal(matmul(a, b), a @ b)
    with pytest.raises(ShapeError, match="K is 3 from a but 2 from b"):
        matmul(a, np.ones((2, 4), F32))


def test_named_dims_show_in_the_signature_and_repr():
    @mlir_kernel(LOOP_MATMUL)
    def matmul(a: "M K", b: "K N") -> "M N": ...

    shown = "matmul(a: memref<?x?xf32> (M, K), b: memref<?x?xf32> (K, N), *, out: None | memref<?x?xf32> = None)" \
            " -> memref<?x?xf32> (M, N)"
    assert str(inspect.signature(matmul)) == shown[len("matmul"):]
    assert repr(matmul) == f"<memkernel.Kernel {shown}>"


def test_a_number_on_a_dynamic_dim_is_checked_at_the_call():
    @mlir_kernel(SCALE)
    def scale(x: "4", s, y: "_"): ...

    with pytest.raises(ShapeError, match=re.escape("x has 3 elements on dim 0 but its annotation '4' is 4")):
        scale(ones(3), 1.0, np.zeros(3, F32))


def test_several_outputs_take_a_tuple_of_patterns():
    source = """func.func @two(%a: memref<?xf32>, %b: memref<?xf32>, %c: memref<?x?xf32>) { return }"""

    @mlir_kernel(source)
    def two(a: "N") -> ("N", "N 2"): ...

    first, second = two(ones(3))
    assert first.shape == (3,) and second.shape == (3, 2)


@pytest.mark.parametrize("annotation, message", [
    ('"M K"', "parameter 'x' is annotated 'M K', 2 dims, but its type memref<?xf32> has 1."),
    ('"M-1"', "a dim pattern is names, numbers and _ separated by spaces"),
])
def test_a_named_dim_pattern_that_does_not_fit_is_refused_at_decoration(annotation, message):
    namespace: dict = {}
    exec(f"def scale(x: {annotation}, s, y): ...", namespace)
    with pytest.raises(SignatureError, match=re.escape(message)):
        mlir_kernel(SCALE)(namespace["scale"])


def test_a_number_contradicting_a_static_dim_is_refused_at_decoration():
    def k(a: "5"): ...

    with pytest.raises(SignatureError, match=re.escape("fixes dim 0 to 4")):
        mlir_kernel("func.func @k(%a: memref<4xf32>) { return }")(k)


def test_a_named_scalar_is_refused_at_decoration():
    def scale(x, s: "N", y): ...

    with pytest.raises(SignatureError, match="parameter 's' is annotated 'N' but is not a ranked memref"):
        mlir_kernel(SCALE)(scale)


def test_a_return_pattern_without_outputs_is_refused_at_decoration():
    def scale(x, s, y) -> "N": ...

    with pytest.raises(SignatureError, match=re.escape("must name the dims of the 0 output(s)")):
        mlir_kernel(SCALE)(scale)


# -- slices and elements at constant positions -----------------------------------------

# out = x[2:6] + 1, through a subview at a constant offset of a `?` input.
WINDOW = """func.func @window(%x: memref<?xf32>, %out: memref<4xf32>) {
  %w = memref.subview %x[2] [4] [1] : memref<?xf32> to memref<4xf32, strided<[1], offset: 2>>
  %one = arith.constant 1.0 : f32
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                  iterator_types = ["parallel"]}
      ins(%w : memref<4xf32, strided<[1], offset: 2>>) outs(%out : memref<4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %s = arith.addf %v, %one : f32
    linalg.yield %s : f32
  }
  return
}"""

# Every third element of rows 1 to 2 of x, on tensors: x[1:3, 0:7:3].
SLICE = """func.func @slice(%x: tensor<?x?xf32>) -> tensor<2x3xf32> {
  %s = tensor.extract_slice %x[1, 0] [2, 3] [1, 3] : tensor<?x?xf32> to tensor<2x3xf32>
  return %s : tensor<2x3xf32>
}"""

# y[4] = x[3] (scalar) and a vector of 8 from x[1].
ELEMENTS = """func.func @elements(%x: memref<?xf32>, %y: memref<?xf32>, %v: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c4 = arith.constant 4 : index
  %c0 = arith.constant 0 : index
  %e = memref.load %x[%c3] : memref<?xf32>
  memref.store %e, %y[%c4] : memref<?xf32>
  %vec = vector.load %x[%c1] : memref<?xf32>, vector<8xf32>
  vector.store %vec, %v[%c0] : memref<8xf32>, vector<8xf32>
  return
}"""

# y[i] = x[5] for each i of y: the load is in a loop, which runs no times for an empty y.
IN_A_LOOP = """func.func @fill(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c5 = arith.constant 5 : index
  %n = memref.dim %y, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    %e = memref.load %x[%c5] : memref<?xf32>
    memref.store %e, %y[%i] : memref<?xf32>
  }
  return
}"""


def test_a_subview_at_a_constant_offset_needs_its_input_long_enough():
    window = with_fast_path(mlir_kernel(WINDOW)(lambda x: None))
    x = np.arange(10, dtype=F32)
    np.testing.assert_array_equal(window(x), x[2:6] + 1)
    assert window.invoker.last_path == "fast"  # a minimum size is checked in compiled code too
    np.testing.assert_array_equal(window(x[:6]), x[2:6] + 1)
    with pytest.raises(ShapeError, match=re.escape(
            "window(): x has 5 elements on dim 0 but @window's memref.subview reaches up to index 5 there; "
            "pass at least 6.")):
        window(x[:5])


def test_a_strided_slice_at_constant_positions_needs_every_dim_long_enough():
    cut = mlir_kernel(SLICE)(lambda x: None)
    x = np.arange(4 * 9, dtype=F32).reshape(4, 9)
    np.testing.assert_array_equal(cut(x), x[1:3, 0:7:3])
    np.testing.assert_array_equal(cut(x[:3, :7]), x[1:3, 0:7:3])
    with pytest.raises(ShapeError, match=re.escape(
            "slice(): x has 6 elements on dim 1 but @slice's tensor.extract_slice reaches up to index 6 there; "
            "pass at least 7.")):
        cut(x[:, :6])
    with pytest.raises(ShapeError, match=r"x has 2 elements on dim 0 .* reaches up to index 2 there"):
        cut(x[:2])


def test_loads_and_stores_at_constant_indices_need_their_arrays_long_enough():
    elements = mlir_kernel(ELEMENTS)(lambda x, y: None)
    x = np.arange(10, dtype=F32)
    y = np.zeros(5, F32)
    vector = elements(x[:9], y)
    assert y[4] == x[3]
    np.testing.assert_array_equal(vector, x[1:9])
    with pytest.raises(ShapeError, match=re.escape(
            "elements(): y has 4 elements on dim 0 but @elements's memref.store reaches up to index 4 there; "
            "pass at least 5.")):
        elements(x, np.zeros(4, F32))
    with pytest.raises(ShapeError, match=re.escape(
            "elements(): x has 8 elements on dim 0 but @elements's vector.load reaches up to index 8 there; "
            "pass at least 9.")):
        elements(x[:8], y)


def test_a_load_in_a_loop_asks_only_when_the_loop_runs():
    fill = mlir_kernel(IN_A_LOOP)(lambda x, y: None)
    fill(np.zeros(0, F32), np.zeros(0, F32))  # the loop runs no times: nothing is read
    y = np.zeros(3, F32)
    fill(np.arange(6, dtype=F32), y)
    np.testing.assert_array_equal(y, [5, 5, 5])
    with pytest.raises(ShapeError, match=re.escape(
            "fill(): x has 5 elements on dim 0 but @fill's memref.load reaches up to index 5 there (y dim 0 = 3); "
            "pass at least 6.")):
        fill(np.arange(5, dtype=F32), y)


def test_scf_loops_over_one_arrays_dims_need_the_arrays_they_index_to_reach_them():
    matmul = with_fast_path(mlir_kernel(LOOP_MATMUL)(lambda a, b: (a.shape[0], b.shape[1])))
    rng = np.random.default_rng(0)
    a, b = rng.integers(-3, 4, (4, 3)).astype(F32), rng.integers(-3, 4, (3, 5)).astype(F32)
    np.testing.assert_array_equal(matmul(a, b), a @ b)
    assert matmul.invoker.last_path == "fast"
    with pytest.raises(ShapeError, match=re.escape(
            "matmul(): b has 2 elements on dim 0 but @matmul's memref.load reaches up to index 2 there (a dim 0 = 4, "
            "b dim 1 = 5, a dim 1 = 3); pass at least 3.")):
        matmul(a, b[:2])
    with pytest.raises(ShapeError, match=r"out has 3 elements on dim 0 but @matmul's memref.load "
                                         r"reaches up to index 3"):
        matmul(a, b, out=np.zeros((3, 5), F32))
    with pytest.raises(ShapeError, match=r"out has 4 elements on dim 1 but @matmul's memref.load "
                                         r"reaches up to index 4"):
        matmul(a, b, out=np.zeros((4, 4), F32))
    # A bigger out= is fine (the loops write its top-left corner), and so is anything when a loop runs no times.
    big = np.zeros((5, 6), F32)
    matmul(a, b, out=big)
    np.testing.assert_array_equal(big[:4, :5], a @ b)
    assert not big[4:].any() and not big[:, 5:].any()
    np.testing.assert_array_equal(matmul(np.zeros((0, 3), F32), b[:1]), np.zeros((0, 5), F32))


def test_an_index_one_past_the_loop_variable_needs_one_more_element():
    pairs = mlir_kernel(PAIRS)(lambda x, y: None)
    x, y = np.arange(6, dtype=F32), np.zeros(5, F32)
    pairs(x, y)
    np.testing.assert_array_equal(y, x[:-1] + x[1:])
    with pytest.raises(ShapeError, match=re.escape(
            "pairs(): x has 5 elements on dim 0 but @pairs's memref.load reaches up to index 5 there (y dim 0 = 5); "
            "pass at least 6.")):
        pairs(x[:5], y)
    pairs(x[:0], y[:0])


# y[i] = x[i] for each i of x, y carried through the loop: as a tensor, and as a memref.
CARRIED = {
    "tensor": """func.func @carry(%x: tensor<?xf32>, %y: tensor<?xf32>) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = tensor.dim %x, %c0 : tensor<?xf32>
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%t = %y) -> tensor<?xf32> {
    %v = tensor.extract %x[%i] : tensor<?xf32>
    %t2 = tensor.insert %v into %t[%i] : tensor<?xf32>
    scf.yield %t2 : tensor<?xf32>
  }
  return %r : tensor<?xf32>
}""",
    "memref": """func.func @carry(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%m = %y) -> memref<?xf32> {
    %v = memref.load %x[%i] : memref<?xf32>
    memref.store %v, %m[%i] : memref<?xf32>
    scf.yield %m : memref<?xf32>
  }
  return
}"""}


@pytest.mark.parametrize("kind", CARRIED)
def test_an_array_carried_through_a_loop_is_still_that_array(kind):
    carry = mlir_kernel(CARRIED[kind])(lambda x, y: None)
    x, y = np.arange(4, dtype=F32), np.zeros(6, F32)
    returned = carry(x, y)
    got = returned if kind == "tensor" else y
    np.testing.assert_array_equal(got[:4], x)
    op = "tensor.insert" if kind == "tensor" else "memref.store"
    with pytest.raises(ShapeError, match=re.escape(
            f"carry(): y has 1 elements on dim 0 but @carry's {op} reaches up to index 3 there (x dim 0 = 4); "
            "pass at least 4.")):
        carry(x, np.zeros(1, F32))


# x[i + 1] = x[i] for each i of x: one past the end of x, whatever its length.
PAST_ITS_END = """func.func @shift(%x: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    %j = arith.addi %i, %c1 : index
    %v = memref.load %x[%i] : memref<?xf32>
    memref.store %v, %x[%j] : memref<?xf32>
  }
  return
}"""

# out[i + 2] = x[i] for each i of x, out allocated as long as x (the shape function's answer).
PAST_AN_ALLOCATED_END = PAST_ITS_END.replace("%x: memref<?xf32>) {", "%x: memref<?xf32>, %y: memref<?xf32>) {").replace(
    "%j = arith.addi %i, %c1 : index", "%c2 = arith.constant 2 : index\n    %j = arith.addi %i, %c2 : index").replace(
    "memref.store %v, %x[%j]", "memref.store %v, %y[%j]")


def test_a_loop_past_the_end_of_its_own_array_says_the_kernel_is_wrong():
    shift = mlir_kernel(PAST_ITS_END)(lambda x: None)
    assert shift.spec.shapes.bounds == tuple(b for b in shift.spec.shapes.bounds if b.reason.endswith("store"))
    with pytest.raises(ShapeError, match=re.escape(
            "shift(): x has 4 elements on dim 0 but @shift's memref.store reaches up to index 4 there (x dim 0 = 4); "
            "that is past the end of x whatever its size, since the loops run over its own length: the kernel "
            "indexes out of bounds.")):
        shift(np.zeros(4, F32))
    shift(np.zeros(0, F32))


def test_an_allocated_output_too_short_for_the_loops_asks_for_out():
    widen = mlir_kernel(PAST_AN_ALLOCATED_END)(lambda x: x.shape)
    x = np.arange(5, dtype=F32)
    with pytest.raises(ShapeError, match=re.escape(
            "shift(): out has 5 elements on dim 0 but @shift's memref.store reaches up to index 6 there "
            "(x dim 0 = 5); out was allocated for this call with that size; pass out= with at least 7 there, or "
            "return that shape from the decorated function.")):
        widen(x)
    out = np.zeros(7, F32)
    widen(x, out=out)
    np.testing.assert_array_equal(out[2:], x)


# c = a @ b.T, b transposed by a view: its dims tie through the permutation.
TRANSPOSED = """func.func @abt(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %c: memref<?x?xf32>) {
  %bt = memref.transpose %b (i, j) -> (j, i) : memref<?x?xf32> to memref<?x?xf32, strided<[1, ?]>>
  linalg.matmul ins(%a, %bt : memref<?x?xf32>, memref<?x?xf32, strided<[1, ?]>>) outs(%c : memref<?x?xf32>)
  return
}"""


def test_a_transposed_view_of_an_argument_ties_its_dims_through_the_permutation():
    abt = mlir_kernel(TRANSPOSED)(lambda a, b: None)
    rng = np.random.default_rng(0)
    a, b = rng.integers(-3, 4, (5, 7)).astype(F32), rng.integers(-3, 4, (3, 7)).astype(F32)
    np.testing.assert_array_equal(abt(a, b), a @ b.T)  # out's shape comes from a's rows and b's rows
    with pytest.raises(ShapeError, match=re.escape(
            "abt(): a has 7 elements on dim 1 but b has 6 on dim 1; @abt's linalg.matmul needs them equal.")):
        abt(a, b[:, :6])
    with pytest.raises(ShapeError, match=re.escape(
            "abt(): b has 3 elements on dim 0 but out has 100 on dim 1; @abt's linalg.matmul needs them equal.")):
        abt(a, b, out=np.zeros((5, 100), F32))


# -- accesses behind branches of a cf control-flow graph ---------------------------------

# y[5] = 1 only when y has more than 5 elements: the store's block runs behind the cf.cond_br's test.
GUARDED_BY_BRANCH = """func.func @put(%y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c5 = arith.constant 5 : index
  %n = memref.dim %y, %c0 : memref<?xf32>
  %big = arith.cmpi sgt, %n, %c5 : index
  cf.cond_br %big, ^store, ^done
^store:
  %one = arith.constant 1.0 : f32
  memref.store %one, %y[%c5] : memref<?xf32>
  cf.br ^done
^done:
  return
}"""

# out = a + b in the block where both branches meet again: it runs on every call.
ADD_AFTER_BRANCHES = """func.func @add(%a: memref<?xf32>, %b: memref<?xf32>, %go: i1, %out: memref<?xf32>) {
  cf.cond_br %go, ^left, ^right
^left:
  cf.br ^join
^right:
  cf.br ^join
^join:
  linalg.add ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%out : memref<?xf32>)
  return
}"""


@pytest.mark.parametrize("n", [0, 3, 5, 6, 9])
def test_a_store_behind_a_cf_branch_asks_nothing_of_calls_that_skip_it(n):
    put = mlir_kernel(GUARDED_BY_BRANCH)(lambda y: None)
    y = np.zeros(n, F32)
    put(y)
    expected = np.zeros(n, F32)
    expected[5:6] = 1
    np.testing.assert_array_equal(y, expected)


def test_an_op_where_cf_branches_meet_again_still_ties_its_operands():
    add = mlir_kernel(ADD_AFTER_BRANCHES)(lambda a, b, go: None)
    a, b = np.arange(4, dtype=F32), np.full(4, 2, F32)
    np.testing.assert_array_equal(add(a, b, True), a + b)
    with pytest.raises(ShapeError, match=re.escape(
            "add(): a has 4 elements on dim 0 but b has 3 on dim 0; @add's linalg.add needs them equal.")):
        add(a, b[:3], False)


# -- indices below 0, casts to static dims, slices the linalg ops see -----------------------------------------

# y[i + shift] = x[i] for each i of x, shift a negative constant: y[-1] (or before) whenever x is not empty.
def shifted_store(index: str) -> str:
    return f"""func.func @k(%x: memref<?xf32>, %y: memref<?xf32>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %cm1 = arith.constant -1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {{
    %v = memref.load %x[%i] : memref<?xf32>
    %j = {index} : index
    memref.store %v, %y[%j] : memref<?xf32>
  }}
  return
}}"""


BELOW_0 = {"addi %i, %cm1": -1, "addi %cm1, %i": -1, "subi %i, %c1": -1, "subi %i, %c3": -3}


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
@pytest.mark.parametrize("index", BELOW_0)
def test_a_store_below_the_loop_variable_is_refused_when_the_loop_runs(index, fast):
    k = with_fast_path(mlir_kernel(shifted_store(f"arith.{index}"))(lambda x, y: None), fast)
    buf = np.full(12, -1, F32)
    low = BELOW_0[index]
    with pytest.raises(ShapeError, match=re.escape(
            f"k(): y has 4 elements on dim 0 but @k's memref.store reaches indices {low} to {3 + low} there "
            f"(x dim 0 = 4); they must lie in 0 to 3, and index {low} is before the start of y whatever its size: "
            "the kernel indexes out of bounds.")):
        k(np.arange(4, dtype=F32), buf[4:8])
    assert (buf == -1).all()
    k(np.zeros(0, F32), buf[4:8])  # the loop runs no times: nothing is written
    assert (buf == -1).all()


# y[i - 1] = x[i] for i from 1: every index lies inside y; the rules do not follow loops from 1, and refuse nothing.
FROM_ONE = shifted_store("arith.subi %i, %c1").replace("scf.for %i = %c0 to", "scf.for %i = %c1 to")


def test_an_index_below_a_loop_variable_that_starts_at_1_is_accepted():
    k = with_fast_path(mlir_kernel(FROM_ONE)(lambda x, y: None))
    x, y = np.arange(10, 15, dtype=F32), np.zeros(4, F32)
    k(x, y)
    np.testing.assert_array_equal(y, x[1:])
    assert k.invoker.last_path == "fast"


CONSTANT_BELOW_0 = {
    "memref.store": """func.func @k(%y: memref<?xf32>) {
  %cm1 = arith.constant -1 : index
  %v = arith.constant 7.0 : f32
  memref.store %v, %y[%cm1] : memref<?xf32>
  return
}""",
    "vector.store": """func.func @k(%y: memref<?xf32>) {
  %cm2 = arith.constant -2 : index
  %v = arith.constant dense<7.0> : vector<2xf32>
  vector.store %v, %y[%cm2] : memref<?xf32>, vector<2xf32>
  return
}""",
    "tensor.insert": """func.func @k(%y: memref<?xf32>) {
  %cm1 = arith.constant -1 : index
  %v = arith.constant 7.0 : f32
  %t = bufferization.to_tensor %y restrict writable : memref<?xf32> to tensor<?xf32>
  %t2 = tensor.insert %v into %t[%cm1] : tensor<?xf32>
  bufferization.materialize_in_destination %t2 in restrict writable %y : (tensor<?xf32>, memref<?xf32>) -> ()
  return
}"""}


@pytest.mark.parametrize("op", CONSTANT_BELOW_0)
def test_a_constant_index_below_0_on_every_call_is_refused_at_decoration(op):
    low = -2 if op == "vector.store" else -1
    with pytest.raises(SignatureError, match=re.escape(
            f"k(): @k's {op} reaches index {low} of y on dim 0, on every call: an index below 0 is outside y "
            "whatever its size. Index from 0.")):
        mlir_kernel(CONSTANT_BELOW_0[op])(lambda y: None)


# y[-1] = 7 for each i of x: wrong whenever the loop runs, which it does not for an empty x.
CONSTANT_BELOW_0_IN_A_LOOP = """func.func @k(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %cm1 = arith.constant -1 : index
  %v = arith.constant 7.0 : f32
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    memref.store %v, %y[%cm1] : memref<?xf32>
  }
  return
}"""


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
def test_a_constant_index_below_0_in_a_loop_is_checked_at_the_call(fast):
    k = with_fast_path(mlir_kernel(CONSTANT_BELOW_0_IN_A_LOOP)(lambda x, y: None), fast)
    buf = np.full(8, -1, F32)
    k(np.zeros(0, F32), buf[2:6])
    with pytest.raises(ShapeError, match=re.escape(
            "k(): y has 4 elements on dim 0 but @k's memref.store reaches indices -1 to -1 there (x dim 0 = 2)")):
        k(np.zeros(2, F32), buf[2:6])
    assert (buf == -1).all()


CAST_TO_STATIC = {
    "memref.cast": """func.func @k(%x: f32, %o: memref<?xf32>) {
  %c = memref.cast %o : memref<?xf32> to memref<4xf32>
  linalg.fill ins(%x : f32) outs(%c : memref<4xf32>)
  return
}""",
    "tensor.cast": """func.func @k(%x: memref<?xf32>, %o: tensor<?xf32>) -> tensor<4xf32> {
  %c = tensor.cast %o : tensor<?xf32> to tensor<4xf32>
  %e = tensor.empty() : tensor<4xf32>
  %r = linalg.copy ins(%c : tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}"""}


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
def test_a_memref_cast_of_an_argument_to_a_static_size_needs_that_size(fast):
    k = with_fast_path(mlir_kernel(CAST_TO_STATIC["memref.cast"])(lambda x: None), fast)
    np.testing.assert_array_equal(k(2.5), np.full(4, 2.5, F32))  # the output is allocated at the cast's size
    big = np.full(8, -1, F32)
    with pytest.raises(ShapeError, match=re.escape(
            "k(): out has 2 elements on dim 0 but @k's memref.cast needs 4 there (it casts out to memref<4xf32>). "
            "Pass out with dim 0 == 4.")):
        k(2.5, out=big[:2])
    assert (big == -1).all()


def test_a_tensor_cast_of_an_argument_to_a_static_size_needs_that_size():
    k = mlir_kernel(CAST_TO_STATIC["tensor.cast"])(lambda x, o: None)
    o = np.arange(4, dtype=F32)
    np.testing.assert_array_equal(k(np.zeros(1, F32), o), o)
    with pytest.raises(ShapeError, match=re.escape(
            "k(): o has 2 elements on dim 0 but @k's tensor.cast needs 4 there (it casts o to tensor<4xf32>). "
            "Pass o with dim 0 == 4.")):
        k(np.zeros(1, F32), np.arange(8, dtype=F32)[:2])


# o = a[2:6], a slice of a constant size: o must have that size.
CONSTANT_SLICE_COPY = """func.func @k(%a: memref<?xf32>, %o: memref<?xf32>) {
  %s = memref.subview %a[2] [4] [1] : memref<?xf32> to memref<4xf32, strided<[1], offset: 2>>
  linalg.copy ins(%s : memref<4xf32, strided<[1], offset: 2>>) outs(%o : memref<?xf32>)
  return
}"""


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
def test_a_slice_of_a_constant_size_ties_the_other_operand_to_it(fast):
    k = with_fast_path(mlir_kernel(CONSTANT_SLICE_COPY)(lambda a, o: None), fast)
    a = np.arange(10, 18, dtype=F32)
    o = np.zeros(4, F32)
    k(a, o)
    np.testing.assert_array_equal(o, a[2:6])
    assert k.invoker.last_path == ("fast" if fast else "checked")
    big = np.full(8, -1, F32)
    with pytest.raises(ShapeError, match=re.escape(
            "k(): o has 2 elements on dim 0 but @k's linalg.copy needs 4 there (@k's memref.subview of a has 4 "
            "there). Pass o with dim 0 == 4.")):
        k(a, big[:2])
    assert (big == -1).all()


# o[1:1 + len(x)] = x, through a slice of o sized by x's dim: o must reach 1 + len(x) elements.
SLICE_SIZED_BY_ANOTHER = """func.func @k(%x: memref<?xf32>, %o: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %s = memref.subview %o[1] [%n] [1] : memref<?xf32> to memref<?xf32, strided<[1], offset: 1>>
  linalg.copy ins(%x : memref<?xf32>) outs(%s : memref<?xf32, strided<[1], offset: 1>>)
  return
}"""


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
def test_a_slice_sized_by_another_arguments_dim_must_fit_its_source(fast):
    k = with_fast_path(mlir_kernel(SLICE_SIZED_BY_ANOTHER)(lambda x, o: None), fast)
    x = np.arange(10, 16, dtype=F32)
    o = np.zeros(7, F32)
    k(x, o)
    np.testing.assert_array_equal(o[1:], x)
    k(x[:0], o[:0])  # an empty slice reaches nothing
    big = np.full(8, -1, F32)
    with pytest.raises(ShapeError, match=re.escape(
            "k(): o has 2 elements on dim 0 but @k's memref.subview reaches up to index 6 there (x dim 0 = 6); "
            "pass at least 7.")):
        k(x, big[:2])
    assert (big == -1).all()


# The parts of tests/kernels.py's SLICES_AND_CASTS, against numpy; z[i] = x[i - 1] reads before x.
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
def test_slices_casts_and_a_read_below_0_together(fast):
    parts = with_fast_path(mlir_kernel(SLICES_AND_CASTS)(lambda x, w, z: None), fast)
    x, w = np.arange(10, 16, dtype=F32), np.zeros(4, F32)
    np.testing.assert_array_equal(parts(x, w, np.zeros(0, F32)), x[:3])
    np.testing.assert_array_equal(w, x[1:5])
    assert parts.invoker.last_path == ("fast" if fast else "checked")
    z = np.zeros(2, F32)
    with pytest.raises(ShapeError, match=re.escape(
            "parts(): x has 6 elements on dim 0 but @parts's memref.load reaches indices -1 to 0 there (z dim 0 = 2); "
            "they must lie in 0 to 5")):
        parts(x, w, z)
    assert not z.any()
    with pytest.raises(ShapeError, match="x has 4 elements on dim 0 but @parts's memref.subview reaches up to index 4"):
        parts(x[:4], w, np.zeros(0, F32))


# y[1:1 + len(z)] = x on tensors, the slice sized by z's dim: x must have len(z) elements, y at least one more.
INSERT_SIZED_BY_ANOTHER = """func.func @k(%x: tensor<?xf32>, %z: tensor<?xf32>, %y: tensor<?xf32>) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %z, %c0 : tensor<?xf32>
  %r = tensor.insert_slice %x into %y[1] [%n] [1] : tensor<?xf32> into tensor<?xf32>
  return %r : tensor<?xf32>
}"""


def test_an_insert_slice_sized_by_another_arguments_dim_ties_what_it_inserts_and_must_fit():
    k = mlir_kernel(INSERT_SIZED_BY_ANOTHER)(lambda x, z, y: None)
    x = np.arange(10, 13, dtype=F32)
    np.testing.assert_array_equal(k(x, np.zeros(3, F32), np.zeros(5, F32)), [0, 10, 11, 12, 0])
    with pytest.raises(ShapeError, match=re.escape(
            "k(): x has 3 elements on dim 0 but z has 2 on dim 0; @k's tensor.insert_slice needs them equal.")):
        k(x, np.zeros(2, F32), np.zeros(5, F32))
    with pytest.raises(ShapeError, match=re.escape(
            "k(): y has 3 elements on dim 0 but @k's tensor.insert_slice reaches up to index 3 there (z dim 0 = 3); "
            "pass at least 4.")):
        k(x, np.zeros(3, F32), np.zeros(3, F32))
