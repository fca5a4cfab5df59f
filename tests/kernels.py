"""The MLIR sources and builders the tests share, one library for every test folder."""

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


# -- kernels of the memkernel.testing tests ------------------------------------------

ADD = elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="add")
ADD_2D = elementwise("arith.addf", "memref<?x?xf32>", "f32", 2, name="add")
ADD_ROWS_OF_4 = elementwise("arith.addf", "memref<?x4xf32>", "f32", 2, name="add")

# Adds in chunks of 4 elements and forgets the tail: wrong for sizes not divisible by 4.
ADD_CHUNKS_NO_TAIL = """
func.func @add_chunks(%a: memref<?xf32>, %b: memref<?xf32>, %out: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %n = memref.dim %a, %c0 : memref<?xf32>
  %chunks = arith.divui %n, %c4 : index
  %end = arith.muli %chunks, %c4 : index
  scf.for %i = %c0 to %end step %c4 {
    scf.for %k = %c0 to %c4 step %c1 {
      %j = arith.addi %i, %k : index
      %x = memref.load %a[%j] : memref<?xf32>
      %y = memref.load %b[%j] : memref<?xf32>
      %s = arith.addf %x, %y : f32
      memref.store %s, %out[%j] : memref<?xf32>
    }
  }
  return
}
"""

_RELU_BODY = """
func.func @{name}(%x: memref<?xf32>, %out: memref<?xf32>) {{
  %zero = arith.constant 0.0 : f32
  linalg.generic {{indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                  iterator_types = ["parallel"]}} ins(%x : memref<?xf32>) outs(%out : memref<?xf32>) {{
  ^bb0(%v: f32, %o: f32):
    {body}
    linalg.yield %r : f32
  }}
  return
}}
"""
RELU = _RELU_BODY.format(name="relu", body="%r = arith.maximumf %v, %zero : f32")
# A sign error: |x| agrees with max(x, 0) on every non-negative input.
RELU_ABS = _RELU_BODY.format(name="relu_abs", body="%r = math.absf %v : f32")

MATMUL = """
func.func @matmul(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %c: memref<?x?xf32>) {
  linalg.matmul ins(%a, %b : memref<?x?xf32>, memref<?x?xf32>) outs(%c : memref<?x?xf32>)
  return
}
"""

CONV = """
func.func @conv(%i: memref<?x?x?x?xf32>, %f: memref<?x?x?x?xf32>, %o: memref<?x?x?x?xf32>) {
  linalg.conv_2d_nhwc_hwcf ins(%i, %f : memref<?x?x?x?xf32>, memref<?x?x?x?xf32>)
      outs(%o : memref<?x?x?x?xf32>)
  return
}
"""

# y = x * s with hand-written loops: nothing in the IR ties x to y, only the dim names do.
SCALE = """
func.func @scale(%x: memref<?xf32>, %s: f32, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    %v = memref.load %x[%i] : memref<?xf32>
    %r = arith.mulf %v, %s : f32
    memref.store %r, %y[%i] : memref<?xf32>
  }
  return
}
"""

SCALARS = """
func.func @scalars(%a: i8, %flag: i1, %x: f32, %u: ui16, %h: f16) -> (i8, i1, f32, ui16, f16) {
  return %a, %flag, %x, %u, %h : i8, i1, f32, ui16, f16
}
"""

TENSOR_ADD = """
func.func @tadd(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %r = arith.addf %a, %b : tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
"""

COLUMN_MAJOR_COPY = """
func.func @copy(%a: memref<?x?xf32, strided<[1, ?], offset: ?>>, %out: memref<?x?xf32>) {
  linalg.copy ins(%a : memref<?x?xf32, strided<[1, ?], offset: ?>>) outs(%out : memref<?x?xf32>)
  return
}
"""

UNRANKED_RANK = """
func.func @rank(%a: memref<*xf32>) -> index {
  %r = memref.rank %a : memref<*xf32>
  return %r : index
}
"""

TWO_RESULTS = """
func.func @two(%x: f64, %n: i32) -> (f64, i32) {
  return %x, %n : f64, i32
}
"""


def copy(element: str) -> str:
    """``func.func @copy(%a: memref<?xT>, %out: memref<?xT>)``: copies, no arithmetic on the elements."""
    memref = f"memref<?x{element}>"
    return f"""
func.func @copy(%a: {memref}, %out: {memref}) {{
  linalg.copy ins(%a : {memref}) outs(%out : {memref})
  return
}}
"""

# Returns its first argument and ignores the others: the tests hand it the values a (correct or buggy)
# matmul of a and b would give, and judge them against np.matmul(a, b).
GIVEN = """
func.func @given(%x: memref<?x?xf32>, %a: memref<?x?xf32>, %b: memref<?x?xf32>, %out: memref<?x?xf32>) {
  linalg.copy ins(%x : memref<?x?xf32>) outs(%out : memref<?x?xf32>)
  return
}
"""

# y += a @ x, in place.
MATVEC_IN_PLACE = """
func.func @matvec(%a: memref<?x?xf32>, %x: memref<?xf32>, %y: memref<?xf32>) {
  linalg.matvec ins(%a, %x : memref<?x?xf32>, memref<?xf32>) outs(%y : memref<?xf32>)
  return
}
"""

# out[i] = 2i over an scf.parallel loop, calling the callback @visit(i) for each i.
PARALLEL_FILL = """
func.func private @visit(index)
func.func @fill(%out: memref<?xi64>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %out, %c0 : memref<?xi64>
  scf.parallel (%i) = (%c0) to (%n) step (%c1) {
    %v = arith.index_cast %i : index to i64
    %twice = arith.addi %v, %v : i64
    memref.store %twice, %out[%i] : memref<?xi64>
    func.call @visit(%i) : (index) -> ()
    scf.reduce
  }
  return
}"""
