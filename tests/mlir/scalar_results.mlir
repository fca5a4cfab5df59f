// Entry points that return a scalar, printed as mlir-runner prints it.
// RUN: memkernel run %s -e sum_to_ten -entry-point-result=i32 | FileCheck %s --check-prefix=SUM
// RUN: memkernel run %s -e big -entry-point-result=i64 -O0 | FileCheck %s --check-prefix=BIG
// RUN: memkernel run %s -e half_of_five -entry-point-result=f32 | FileCheck %s --check-prefix=HALF

func.func @sum_to_ten() -> i32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c11 = arith.constant 11 : index
  %zero = arith.constant 0 : i32
  %sum = scf.for %i = %c1 to %c11 step %c1 iter_args(%acc = %zero) -> (i32) {
    %value = arith.index_cast %i : index to i32
    %next = arith.addi %acc, %value : i32
    scf.yield %next : i32
  }
  return %sum : i32
}
// SUM: 55

func.func @big() -> i64 {
  %a = arith.constant 3000000000 : i64
  %b = arith.constant 7 : i64
  %p = arith.muli %a, %b : i64
  return %p : i64
}
// BIG: 21000000000

func.func @half_of_five() -> f32 {
  %five = arith.constant 5.0 : f32
  %two = arith.constant 2.0 : f32
  %half = arith.divf %five, %two : f32
  return %half : f32
}
// HALF: 2.500000e+00
