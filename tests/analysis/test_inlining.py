"""The shape rules read the functions a kernel calls as if their bodies were in place of the calls."""

from __future__ import annotations

import re

import numpy as np
import pytest

from memkernel import ShapeError, SignatureError, mlir_kernel

from ..fastpath.conftest import with_fast_path

F32 = np.float32

HELPER = """func.func private @helper(%a: memref<?xf32>, %b: memref<?xf32>, %o: memref<?xf32>) {
  linalg.add ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%o : memref<?xf32>)
  return
}
"""

# The kernel: @add's work is @helper's linalg.add.
CALLS_HELPER = HELPER + """func.func @add(%a: memref<?xf32>, %b: memref<?xf32>, %out: memref<?xf32>) {
  call @helper(%a, %b, %out) : (memref<?xf32>, memref<?xf32>, memref<?xf32>) -> ()
  return
}"""

# y[i] = x[i + 2] for each i of y, the load done by @get, which takes the caller's loop index.
GET_IN_A_LOOP = """func.func private @get(%x: memref<?xf32>, %i: index) -> f32 {
  %c2 = arith.constant 2 : index
  %j = arith.addi %i, %c2 : index
  %v = memref.load %x[%j] : memref<?xf32>
  return %v : f32
}
func.func @shifted(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %y, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    %v = func.call @get(%x, %i) : (memref<?xf32>, index) -> f32
    memref.store %v, %y[%i] : memref<?xf32>
  }
  return
}"""

# @add calls @twice, a function of two blocks, which calls @helper on both sides of its branch.
THROUGH_TWO_LEVELS = HELPER + """func.func private @twice(%a: memref<?xf32>, %b: memref<?xf32>, %o: memref<?xf32>) {
  call @helper(%a, %b, %o) : (memref<?xf32>, memref<?xf32>, memref<?xf32>) -> ()
  cf.br ^again
^again:
  call @helper(%o, %b, %o) : (memref<?xf32>, memref<?xf32>, memref<?xf32>) -> ()
  return
}
func.func @add(%a: memref<?xf32>, %b: memref<?xf32>, %out: memref<?xf32>) {
  call @twice(%a, %b, %out) : (memref<?xf32>, memref<?xf32>, memref<?xf32>) -> ()
  return
}"""

# @helper has two blocks, which the inliner cannot put in an scf.for body: its rules are carried over instead.
IN_A_LOOP_OF_ONE = """func.func private @helper(%a: memref<?xf32>, %b: memref<?xf32>, %o: memref<?xf32>) {
  cf.br ^add
^add:
  linalg.add ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%o : memref<?xf32>)
  return
}
func.func @add(%a: memref<?xf32>, %b: memref<?xf32>, %out: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  scf.for %i = %c0 to %c1 step %c1 {
    func.call @helper(%a, %b, %out) : (memref<?xf32>, memref<?xf32>, memref<?xf32>) -> ()
  }
  return
}"""

# y[i] = x[5] for each i of y, x[5] read by a function of two blocks: asked only when the loop runs.
LOAD_IN_A_CALLEE_OF_TWO_BLOCKS = """func.func private @sixth(%x: memref<?xf32>) -> f32 {
  %c5 = arith.constant 5 : index
  cf.br ^load
^load:
  %v = memref.load %x[%c5] : memref<?xf32>
  return %v : f32
}
func.func @fill(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %y, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    %v = func.call @sixth(%x) : (memref<?xf32>) -> f32
    memref.store %v, %y[%i] : memref<?xf32>
  }
  return
}"""

CALLED_UNDER_IF = HELPER + """func.func @maybe(%a: memref<?xf32>, %b: memref<?xf32>, %go: i1, %out: memref<?xf32>) {
  scf.if %go {
    func.call @helper(%a, %b, %out) : (memref<?xf32>, memref<?xf32>, memref<?xf32>) -> ()
  }
  return
}"""


def test_a_linalg_op_in_a_called_function_ties_the_kernels_arguments():
    add = mlir_kernel(CALLS_HELPER, name="add")(lambda a, b: None)
    x = np.ones(65536, F32)
    big = np.zeros(65536, F32)
    with pytest.raises(ShapeError, match=re.escape(
            "add(): a has 65536 elements on dim 0 but out has 4 on dim 0; @helper's linalg.add needs them equal.")):
        add(x, x, out=big[:4])
    assert not big.any()
    a, b = np.arange(5, dtype=F32), np.full(5, 3, F32)
    np.testing.assert_array_equal(add(a, b), a + b)  # out's shape comes from the callee's ties


def test_an_access_in_a_callee_at_the_callers_loop_index_is_bounded():
    shifted = mlir_kernel(GET_IN_A_LOOP, name="shifted")(lambda x, y: None)
    x, y = np.arange(7, dtype=F32), np.zeros(5, F32)
    shifted(x, y)
    np.testing.assert_array_equal(y, x[2:])
    with pytest.raises(ShapeError, match=re.escape(
            "shifted(): x has 6 elements on dim 0 but @get's memref.load reaches up to index 6 there (y dim 0 = 5); "
            "pass at least 7.")):
        shifted(x[:6], y)
    shifted(x[:0], y[:0])


def test_calls_are_followed_through_every_level_and_block():
    add = mlir_kernel(THROUGH_TWO_LEVELS, name="add")(lambda a, b: None)
    a, b = np.arange(4, dtype=F32), np.full(4, 2, F32)
    np.testing.assert_array_equal(add(a, b), a + 2 * b)
    with pytest.raises(ShapeError, match=re.escape("a has 4 elements on dim 0 but b has 3 on dim 0; "
                                                   "@helper's linalg.add needs them equal.")):
        add(a, b[:3])


def test_a_call_the_inliner_leaves_carries_its_callees_rules_over():
    add = mlir_kernel(IN_A_LOOP_OF_ONE, name="add")(lambda a, b: None)
    a, b = np.arange(4, dtype=F32), np.full(4, 2, F32)
    np.testing.assert_array_equal(add(a, b), a + b)
    with pytest.raises(ShapeError, match=re.escape(
            "add(): a has 4 elements on dim 0 but out has 2 on dim 0; @helper's linalg.add needs them equal.")):
        add(a, b, out=np.zeros(2, F32))


def test_a_bound_carried_over_from_a_callee_holds_only_when_the_loops_around_the_call_run():
    fill = mlir_kernel(LOAD_IN_A_CALLEE_OF_TWO_BLOCKS, name="fill")(lambda x, y: None)
    x, y = np.arange(6, dtype=F32), np.zeros(3, F32)
    fill(x, y)
    np.testing.assert_array_equal(y, np.full(3, x[5]))
    with pytest.raises(ShapeError, match=re.escape(
            "fill(): x has 5 elements on dim 0 but @sixth's memref.load reaches up to index 5 there (y dim 0 = 3); "
            "pass at least 6.")):
        fill(x[:5], y)
    fill(x[:0], y[:0])


def test_a_call_under_scf_if_ties_nothing():
    maybe = mlir_kernel(CALLED_UNDER_IF, name="maybe")(lambda a, b, go: None)
    out = np.zeros(2, F32)
    maybe(np.ones(5, F32), np.ones(5, F32), False, out=out)
    assert not out.any()


# o = a[2:6], the slice passed to @work, whose linalg.copy writes o: o must have the slice's 4 elements.
SLICE_THROUGH_A_CALL = """func.func private @work(%a: memref<?xf32, strided<[?], offset: ?>>, %o: memref<?xf32>) {
  linalg.copy ins(%a : memref<?xf32, strided<[?], offset: ?>>) outs(%o : memref<?xf32>)
  return
}
func.func @k(%a: memref<?xf32>, %o: memref<?xf32>) {
  %s = memref.subview %a[2] [4] [1] : memref<?xf32> to memref<4xf32, strided<[1], offset: 2>>
  %c = memref.cast %s : memref<4xf32, strided<[1], offset: 2>> to memref<?xf32, strided<[?], offset: ?>>
  func.call @work(%c, %o) : (memref<?xf32, strided<[?], offset: ?>>, memref<?xf32>) -> ()
  return
}"""

# The same, @work of two blocks called from a loop body: the inliner leaves the call, its rules are carried over.
SLICE_THROUGH_A_CALL_LEFT = SLICE_THROUGH_A_CALL.replace("""  linalg.copy ins""", """  cf.br ^copy
^copy:
  linalg.copy ins""").replace("""  func.call @work(%c, %o) : (memref<?xf32, strided<[?], offset: ?>>, memref<?xf32>) -> ()
""", """  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  scf.for %i = %c0 to %c1 step %c1 {
    func.call @work(%c, %o) : (memref<?xf32, strided<[?], offset: ?>>, memref<?xf32>) -> ()
  }
""")


@pytest.mark.parametrize("source", [SLICE_THROUGH_A_CALL, SLICE_THROUGH_A_CALL_LEFT], ids=["inlined", "left"])
def test_a_slice_passed_to_a_callee_ties_what_the_callee_does_with_it(source):
    k = mlir_kernel(source, name="k")(lambda a, o: None)
    a, o = np.arange(10, 18, dtype=F32), np.zeros(4, F32)
    k(a, o)
    np.testing.assert_array_equal(o, a[2:6])
    big = np.full(8, -1, F32)
    with pytest.raises(ShapeError, match=re.escape(
            "k(): o has 2 elements on dim 0 but @work's linalg.copy needs 4 there (@k's memref.subview of a has 4 "
            "there). Pass o with dim 0 == 4.")):
        k(a, big[:2])
    assert (big == -1).all()


# o = a through a function value: func.call_indirect of a func.constant.
INDIRECT = """func.func private @work(%a: memref<?xf32>, %o: memref<?xf32>) {
  linalg.copy ins(%a : memref<?xf32>) outs(%o : memref<?xf32>)
  return
}
func.func @k(%a: memref<?xf32>, %o: memref<?xf32>) {
  %f = func.constant @work : (memref<?xf32>, memref<?xf32>) -> ()
  func.call_indirect %f(%a, %o) : (memref<?xf32>, memref<?xf32>) -> ()
  return
}"""


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
def test_a_call_indirect_of_a_func_constant_carries_its_callees_rules_over(fast):
    k = with_fast_path(mlir_kernel(INDIRECT, name="k")(lambda a, o: None), fast)
    a = np.arange(10, 16, dtype=F32)
    o = np.zeros(6, F32)
    k(a, o)
    np.testing.assert_array_equal(o, a)
    big = np.full(8, -1, F32)
    with pytest.raises(ShapeError, match=re.escape(
            "k(): a has 6 elements on dim 0 but o has 2 on dim 0; @work's linalg.copy needs them equal.")):
        k(a, big[:2])
    assert (big == -1).all()


# Which function runs is chosen at the call: the rules cannot follow it.
INDIRECT_CHOSEN = INDIRECT.replace("func.func @k(%a: memref<?xf32>, %o: memref<?xf32>) {", """func.func private @none(%a: memref<?xf32>, %o: memref<?xf32>) {
  return
}
func.func @k(%a: memref<?xf32>, %o: memref<?xf32>, %go: i1) {""").replace("""  func.call_indirect %f(""", """  %g = func.constant @none : (memref<?xf32>, memref<?xf32>) -> ()
  %h = arith.select %go, %f, %g : (memref<?xf32>, memref<?xf32>) -> ()
  func.call_indirect %h(""")


def test_a_call_indirect_of_a_function_the_rules_cannot_name_is_refused_unless_the_dims_are_named():
    with pytest.raises(SignatureError, match=re.escape(
            "k(): @k's func.call_indirect calls a function that is not a func.constant, passing a: the shape rules "
            "cannot read which function runs, so nothing ties the dims it indexes. Name every dim of what it is "
            "passed (e.g. a: \"N\"), or call the function with func.call.")):
        mlir_kernel(INDIRECT_CHOSEN, name="k")(lambda a, o, go: None)

    def half_named(a: "N", o: "_", go):  # type: ignore[no-untyped-def]  # noqa: F821
        return None

    with pytest.raises(SignatureError, match="passing o: "):
        mlir_kernel(INDIRECT_CHOSEN, name="k")(half_named)


def test_a_call_indirect_of_a_function_the_rules_cannot_name_is_tied_by_the_named_dims():
    def copy_or_not(a: "N", o: "N", go):  # type: ignore[no-untyped-def]  # noqa: F821
        return None

    k = mlir_kernel(INDIRECT_CHOSEN, name="k")(copy_or_not)
    a, o = np.arange(10, 16, dtype=F32), np.zeros(6, F32)
    k(a, o, True)
    np.testing.assert_array_equal(o, a)
    big = np.full(8, -1, F32)
    with pytest.raises(ShapeError, match=re.escape("k(): N is 6 from a but 2 from o (dims 0 and 0)")):
        k(a, big[:2], True)
    assert (big == -1).all()


# y[-1] = 7 in @put, of two blocks, called in a loop over x: wrong whenever the loop runs.
BELOW_0_IN_A_CALLEE_LEFT = """func.func private @put(%y: memref<?xf32>) {
  %cm1 = arith.constant -1 : index
  %v = arith.constant 7.0 : f32
  cf.br ^store
^store:
  memref.store %v, %y[%cm1] : memref<?xf32>
  return
}
func.func @k(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    func.call @put(%y) : (memref<?xf32>) -> ()
  }
  return
}"""


def test_an_index_below_0_in_a_callee_the_inliner_leaves_is_checked_when_the_loop_runs():
    k = mlir_kernel(BELOW_0_IN_A_CALLEE_LEFT, name="k")(lambda x, y: None)
    buf = np.full(8, -1, F32)
    k(np.zeros(0, F32), buf[2:6])
    with pytest.raises(ShapeError, match=re.escape(
            "k(): y has 4 elements on dim 0 but @put's memref.store reaches indices -1 to -1 there (x dim 0 = 3)")):
        k(np.zeros(3, F32), buf[2:6])
    assert (buf == -1).all()
