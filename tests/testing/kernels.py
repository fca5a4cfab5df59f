"""MLIR sources for the tests of memkernel.testing."""

from __future__ import annotations

from tests.kernels import elementwise

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
