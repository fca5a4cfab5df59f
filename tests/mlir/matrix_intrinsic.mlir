// An LLVM matrix intrinsic, which LLVM lowers only with -enable-matrix: the
// plugin passes mlir-runner's LLVM options on (the mlir-opt part is not run).
// RUN: mlir-opt %s -convert-vector-to-llvm | mlir-runner -e main -entry-point-result=void -enable-matrix -march=x86-64 | FileCheck %s

func.func @main() {
  // Column-major 2x2 matrices: [[1 3] [2 4]] times [[0 1] [1 0]] is [[3 1] [4 2]].
  %a = arith.constant dense<[1.0, 2.0, 3.0, 4.0]> : vector<4xf32>
  %b = arith.constant dense<[0.0, 1.0, 1.0, 0.0]> : vector<4xf32>
  %product = llvm.intr.matrix.multiply %a, %b { lhs_rows = 2 : i32, lhs_columns = 2 : i32, rhs_columns = 2 : i32 }
    : (vector<4xf32>, vector<4xf32>) -> vector<4xf32>
  vector.print %product : vector<4xf32>
  return
}

// CHECK: ( 3, 4, 1, 2 )
