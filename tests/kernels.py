"""MLIR text builders shared by the tests."""

from __future__ import annotations


def elementwise(op: str, memref: str, element: str, rank: int, *, n_inputs: int = 2, name: str = "k") -> str:
    """``func.func @name(inputs..., out)`` applying ``op`` (an arith op name) elementwise."""
    dims = ", ".join(f"d{i}" for i in range(rank))
    identity = f"affine_map<({dims}) -> ({dims})>"
    maps = ", ".join([identity] * (n_inputs + 1))
    iterators = ", ".join(['"parallel"'] * rank)
    ins = ", ".join(f"%in{i}" for i in range(n_inputs))
    in_types = ", ".join([memref] * n_inputs)
    block_args = ", ".join(f"%x{i}: {element}" for i in range(n_inputs))
    operands = ", ".join(f"%x{i}" for i in range(n_inputs))
    params = ", ".join(f"%in{i}: {memref}" for i in range(n_inputs))
    return f"""
func.func @{name}({params}, %out: {memref}) {{
  linalg.generic {{indexing_maps = [{maps}], iterator_types = [{iterators}]}}
      ins({ins} : {in_types}) outs(%out : {memref}) {{
  ^bb0({block_args}, %o: {element}):
    %r = {op} {operands} : {element}
    linalg.yield %r : {element}
  }}
  return
}}
"""


# Spins until another thread sets flag[0] or %limit turns pass, reading the flag atomically each turn so
# that LLVM cannot drop the loop: returns the turns it made.
WAIT_FOR_FLAG = """
func.func @wait_for(%flag: memref<1xi32>, %limit: i64) -> i64 {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0 : i32
  %one = arith.constant 1 : i64
  %start = arith.constant 0 : i64
  %seen = scf.while (%i = %start) : (i64) -> i64 {
    %v = memref.atomic_rmw addi %zero, %flag[%c0] : (i32, memref<1xi32>) -> i32
    %unset = arith.cmpi eq, %v, %zero : i32
    %more = arith.cmpi slt, %i, %limit : i64
    %go = arith.andi %unset, %more : i1
    scf.condition(%go) %i : i64
  } do {
  ^bb0(%i: i64):
    %next = arith.addi %i, %one : i64
    scf.yield %next : i64
  }
  return %seen : i64
}"""


def strided_window(element: str = "i8", step: int = 2) -> str:
    """``func.func @window(%x, %w, %y)``: ``y[i] += x[step * i + j] * w[j]``, every memref of a strided layout
    (stride-0 views pass as they are), so ``x`` must reach ``step * (len(y) - 1) + len(w)`` elements."""
    memref = f"memref<?x{element}, strided<[?], offset: ?>>"
    return f"""
func.func @window(%x: {memref}, %w: {memref}, %y: {memref}) {{
  linalg.generic {{indexing_maps = [affine_map<(i, j) -> ({step} * i + j)>, affine_map<(i, j) -> (j)>,
                                   affine_map<(i, j) -> (i)>],
                  iterator_types = ["parallel", "reduction"]}}
      ins(%x, %w : {memref}, {memref}) outs(%y : {memref}) {{
  ^bb0(%a: {element}, %b: {element}, %c: {element}):
    %m = arith.muli %a, %b : {element}
    %s = arith.addi %c, %m : {element}
    linalg.yield %s : {element}
  }}
  return
}}
"""


def total(layout: str = "") -> str:
    """``func.func @total(%x: memref<?xf32{layout}>, %out: memref<f32>)``: adds ``x``'s elements into ``out``.

    ``layout`` follows the element type, e.g. ``", strided<[?], offset: ?>"``."""
    memref = f"memref<?xf32{layout}>"
    return f"""func.func @total(%x: {memref}, %out: memref<f32>) {{
  linalg.reduce ins(%x : {memref}) outs(%out : memref<f32>) dimensions = [0]
    (%a: f32, %acc: f32) {{
      %s = arith.addf %a, %acc : f32
      linalg.yield %s : f32
    }}
  return
}}"""
