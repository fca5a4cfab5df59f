// Vector arithmetic printed with vector.print, and f32 values rounded through
// f4E2M1FN and f6E2M3FN (ties to even; f4E2M1FN saturates at 6).
// RUN: memkernel run %s -e main -entry-point-result=void | FileCheck %s

func.func @main() {
  %x = arith.constant dense<[1.0, -2.0, 3.5, 0.25]> : vector<4xf32>
  %y = arith.constant dense<[0.5, 4.0, -1.5, 2.0]> : vector<4xf32>
  %sum = arith.addf %x, %y : vector<4xf32>
  vector.print %sum : vector<4xf32>
  // CHECK: ( 1.5, 2, 2, 2.25 )
  %product = arith.mulf %x, %y : vector<4xf32>
  %total = vector.reduction <add>, %product : vector<4xf32> into f32
  vector.print %total : f32
  // CHECK-NEXT: -12.25
  %steps = vector.step : vector<5xindex>
  vector.print %steps : vector<5xindex>
  // CHECK-NEXT: ( 0, 1, 2, 3, 4 )

  %values = arith.constant dense<[0.25, 0.75, 1.25, 2.5, 5.0, -0.3, 100.0]> : vector<7xf32>
  %f4 = arith.truncf %values : vector<7xf32> to vector<7xf4E2M1FN>
  %back4 = arith.extf %f4 : vector<7xf4E2M1FN> to vector<7xf32>
  vector.print %back4 : vector<7xf32>
  // CHECK-NEXT: ( 0, 1, 1, 2, 4, -0.5, 6 )
  %f6 = arith.truncf %values : vector<7xf32> to vector<7xf6E2M3FN>
  %back6 = arith.extf %f6 : vector<7xf6E2M3FN> to vector<7xf32>
  vector.print %back6 : vector<7xf32>
  // CHECK-NEXT: ( 0.25, 0.75, 1.25, 2.5, 5, -0.25, 7.5 )
  return
}
