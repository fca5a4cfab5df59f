// A memref kernel with a transform.sequence that tiles its generic by 3 and
// unrolls nothing else: the printed result is the same as untiled.
// RUN: memkernel run %s -e main -entry-point-result=void | FileCheck %s

func.func private @printMemrefF32(memref<*xf32>)

func.func @main() {
  %x = memref.alloc() : memref<7xf32>
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c7 = arith.constant 7 : index
  scf.for %i = %c0 to %c7 step %c1 {
    %v = arith.index_cast %i : index to i32
    %f = arith.sitofp %v : i32 to f32
    memref.store %f, %x[%i] : memref<7xf32>
  }
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>], iterator_types = ["parallel"]} outs(%x : memref<7xf32>) {
  ^bb0(%value: f32):
    %squared = arith.mulf %value, %value : f32
    linalg.yield %squared : f32
  }
  %printed = memref.cast %x : memref<7xf32> to memref<*xf32>
  call @printMemrefF32(%printed) : (memref<*xf32>) -> ()
  memref.dealloc %x : memref<7xf32>
  return
}

// CHECK: [0,  1,  4,  9,  16,  25,  36]

transform.sequence failures(propagate) {
^bb0(%root: !transform.any_op):
  %generic = transform.structured.match ops{["linalg.generic"]} in %root : (!transform.any_op) -> !transform.any_op
  %tiled, %loop = transform.structured.tile_using_for %generic tile_sizes [3]
    : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
}
