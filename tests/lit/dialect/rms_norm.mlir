// RUN: kiln-opt %s | FileCheck %s
// Round trip: the printed form parses back to the same IR.
// RUN: kiln-opt %s | kiln-opt | FileCheck %s

// CHECK-LABEL: func.func @norm
// CHECK: %[[Y:.*]] = kiln.rms_norm %arg0, %arg1 {epsilon = 9.99999974E-6 : f32} : tensor<?x576xf32>, tensor<576xf32> -> tensor<?x576xf32>
// CHECK: return %[[Y]]
func.func @norm(%x: tensor<?x576xf32>, %w: tensor<576xf32>) -> tensor<?x576xf32> {
  %y = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32}
      : tensor<?x576xf32>, tensor<576xf32> -> tensor<?x576xf32>
  return %y : tensor<?x576xf32>
}

// CHECK-LABEL: func.func @norm_bf16
// CHECK: kiln.rms_norm {{.*}} : tensor<1x7x64xbf16>, tensor<64xbf16> -> tensor<1x7x64xbf16>
func.func @norm_bf16(%x: tensor<1x7x64xbf16>, %w: tensor<64xbf16>) -> tensor<1x7x64xbf16> {
  %y = kiln.rms_norm %x, %w {epsilon = 1.0e-06 : f32}
      : tensor<1x7x64xbf16>, tensor<64xbf16> -> tensor<1x7x64xbf16>
  return %y : tensor<1x7x64xbf16>
}
