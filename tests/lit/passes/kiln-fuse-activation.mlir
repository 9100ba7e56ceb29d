// RUN: kiln-opt %s -split-input-file --kiln-fuse-activation | FileCheck %s
// RUN: kiln-opt %s -split-input-file --kiln-fuse-activation -verify-diagnostics > /dev/null

// A CLIP MLP: fc1's activation becomes its epilogue; fc2 stays as it is.
// CHECK-LABEL: func.func @clip_mlp
// CHECK: %[[H:.*]] = kiln.linear %arg0, %{{.*}}, %{{.*}} {activation = #kiln.activation<quick_gelu>, kiln.fused = ["v.fc1", "kiln.activation"]}
// CHECK-NOT: kiln.activation
// CHECK: kiln.linear %[[H]]
kiln.weight @w1 : tensor<32x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @b1 : tensor<32xf32> from #kiln.source<"m.safetensors", offset = 2048, size = 128, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @w2 : tensor<16x32xf32> from #kiln.source<"m.safetensors", offset = 2176, size = 2048, dtype = "F32"> as #kiln.encoding<f32>
func.func @clip_mlp(%x: tensor<5x16xf32>) -> tensor<5x16xf32> attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  %w1 = kiln.weight_ref @w1 : tensor<32x16xf32>
  %b1 = kiln.weight_ref @b1 : tensor<32xf32>
  %w2 = kiln.weight_ref @w2 : tensor<16x32xf32>
  %h = kiln.linear %x, %w1, %b1 : tensor<5x16xf32>, tensor<32x16xf32>, tensor<32xf32> -> tensor<5x32xf32> loc("v.fc1")
  // expected-remark @+1 {{kiln-fuse-activation: kiln.activation (quick_gelu) fused as the epilogue of v.fc1}}
  %a = kiln.activation %h {kind = #kiln.activation<quick_gelu>} : tensor<5x32xf32>
  %y = kiln.linear %a, %w2 : tensor<5x32xf32>, tensor<16x32xf32> -> tensor<5x16xf32>
  return %y : tensor<5x16xf32>
}

// -----

// No-op: the product is read twice; the input is no linear.
// CHECK-LABEL: func.func @kept
// CHECK-COUNT-2: kiln.activation
kiln.weight @w : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F32"> as #kiln.encoding<f32>
func.func @kept(%x: tensor<5x16xf32>) -> tensor<5x16xf32> attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  %w = kiln.weight_ref @w : tensor<16x16xf32>
  %h = kiln.linear %x, %w : tensor<5x16xf32>, tensor<16x16xf32> -> tensor<5x16xf32> loc("v.fc1")
  // expected-remark @+1 {{kiln-fuse-activation: not fused: v.fc1 is also read by other ops}}
  %a = kiln.activation %h {kind = #kiln.activation<gelu>} : tensor<5x16xf32>
  %s = kiln.add %a, %h : tensor<5x16xf32>
  // expected-remark @+1 {{kiln-fuse-activation: not fused: its input is not a kiln.linear}}
  %b = kiln.activation %s {kind = #kiln.activation<gelu>} : tensor<5x16xf32>
  return %b : tensor<5x16xf32>
}
