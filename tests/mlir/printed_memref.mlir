// A matmul on memrefs, printed with printMemrefF32. The declaration of
// printMemrefVector4x4xf32 is never called: its types need not be bindable.
// RUN: memkernel run %s -e main -entry-point-result=void -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils | FileCheck %s

func.func private @printMemrefF32(memref<*xf32>)
func.func private @printMemrefVector4x4xf32(memref<?x?xvector<4x4xf32>>)

func.func @main() {
  %a = memref.get_global @a : memref<2x3xf32>
  %b = memref.get_global @b : memref<3x2xf32>
  %c = memref.alloc() : memref<2x2xf32>
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<2x2xf32>)
  linalg.matmul ins(%a, %b : memref<2x3xf32>, memref<3x2xf32>) outs(%c : memref<2x2xf32>)
  %printed = memref.cast %c : memref<2x2xf32> to memref<*xf32>
  call @printMemrefF32(%printed) : (memref<*xf32>) -> ()
  memref.dealloc %c : memref<2x2xf32>
  return
}

// [[1 2 3] [4 5 6]] times [[1 0] [0 1] [1 1]] is [[4 5] [10 11]].
memref.global "private" constant @a : memref<2x3xf32> = dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]>
memref.global "private" constant @b : memref<3x2xf32> = dense<[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]>

// CHECK: Unranked Memref base@ = {{.*}} rank = 2 offset = 0 sizes = [2, 2] strides = [2, 1] data =
// CHECK-NEXT: {{\[}}[4,   5],
// CHECK-NEXT:  [10,   11]]
