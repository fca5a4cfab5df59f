// A tensor kernel that carries its own schedule: tile the add by 4. memkernel
// applies it before bufferization, erases it, and runs the tiled code.
// RUN: memkernel run %s -e main -entry-point-result=void | FileCheck %s

func.func private @printMemrefF32(memref<*xf32>)

func.func @add(%a: tensor<10xf32>, %b: tensor<10xf32>) -> tensor<10xf32> {
  %empty = tensor.empty() : tensor<10xf32>
  %sum = linalg.add ins(%a, %b : tensor<10xf32>, tensor<10xf32>) outs(%empty : tensor<10xf32>) -> tensor<10xf32>
  return %sum : tensor<10xf32>
}

func.func @main() {
  %a = arith.constant dense<[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]> : tensor<10xf32>
  %b = arith.constant dense<10.0> : tensor<10xf32>
  %sum = call @add(%a, %b) : (tensor<10xf32>, tensor<10xf32>) -> tensor<10xf32>
  %buffer = bufferization.to_buffer %sum : tensor<10xf32> to memref<10xf32>
  %printed = memref.cast %buffer : memref<10xf32> to memref<*xf32>
  call @printMemrefF32(%printed) : (memref<*xf32>) -> ()
  return
}

// CHECK: rank = 1 offset = 0 sizes = [10] strides = [1] data =
// CHECK-NEXT: [10,  11,  12,  13,  14,  15,  16,  17,  18,  19]

module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %add = transform.structured.match ops{["linalg.add"]} in %root : (!transform.any_op) -> !transform.any_op
    %tiled, %loop = transform.structured.tile_using_for %add tile_sizes [4]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }
}
