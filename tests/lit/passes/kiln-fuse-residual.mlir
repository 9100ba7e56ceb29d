// RUN: kiln-opt %s -split-input-file --kiln-fuse-residual | FileCheck %s
// RUN: kiln-opt %s -split-input-file --kiln-fuse-residual -verify-diagnostics > /dev/null
// RUN: kiln-opt %s -split-input-file --kiln-fuse-residual --kiln-plan-memory | FileCheck %s --check-prefix=PLAN

// The residual adds after o_proj and after the MLP become the epilogues of the
// matmuls; each writes over its residual, which dies there (kiln-plan-memory).
// CHECK-LABEL: func.func @layer
// CHECK: %[[X2:.*]] = kiln.rms_norm
// CHECK: %[[O:.*]] = kiln.linear %arg1, %{{.*}} residual(%[[X2]]) {kiln.fused = ["kiln.linear", "l.residual1"]} : tensor<?x16xf32>, tensor<16x16xf32> residual tensor<?x16xf32> -> tensor<?x16xf32>
// CHECK: kiln.gated_mlp %[[N:.*]], %{{.*}}, %{{.*}}, %{{.*}} residual(%[[O]]) {activation = #kiln.activation<silu>, kiln.fused = ["kiln.gated_mlp", "l.residual2"]}
// CHECK-NOT: kiln.add
// PLAN-LABEL: func.func @layer
// PLAN: kiln.rms_norm {{.*}}kiln.offset = [[X:[0-9]+]] : i64
// PLAN: kiln.linear {{.*}}kiln.offset = [[X]] : i64
// PLAN: kiln.rms_norm {{.*}}kiln.offset = [[H:[0-9]+]] : i64
// PLAN: kiln.gated_mlp {{.*}}kiln.offset = [[X]] : i64
kiln.weight @n : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 64, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @w : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 64, size = 1024, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @g : tensor<24x16xf32> from #kiln.source<"m.safetensors", offset = 1088, size = 1536, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @d : tensor<16x24xf32> from #kiln.source<"m.safetensors", offset = 2624, size = 1536, dtype = "F32"> as #kiln.encoding<f32>
func.func @layer(%x: tensor<?x16xf32>, %a: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %n = kiln.weight_ref @n : tensor<16xf32>
  %w = kiln.weight_ref @w : tensor<16x16xf32>
  %g = kiln.weight_ref @g : tensor<24x16xf32>
  %d = kiln.weight_ref @d : tensor<16x24xf32>
  %x2 = kiln.rms_norm %x, %n {epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<16xf32> -> tensor<?x16xf32>
  // expected-remark @+1 {{kiln-fuse-residual: l.residual1 fused as the epilogue of}}
  %o = kiln.linear %a, %w : tensor<?x16xf32>, tensor<16x16xf32> -> tensor<?x16xf32>
  %x1 = kiln.add %x2, %o : tensor<?x16xf32> loc("l.residual1")
  %h = kiln.rms_norm %x1, %n {epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<16xf32> -> tensor<?x16xf32>
  // expected-remark @+1 {{kiln-fuse-residual: l.residual2 fused as the epilogue of}}
  %m = kiln.gated_mlp %h, %g, %g, %d {activation = #kiln.activation<silu>} : tensor<?x16xf32>, tensor<24x16xf32>, tensor<24x16xf32>, tensor<16x24xf32> -> tensor<?x16xf32>
  %x3 = kiln.add %x1, %m : tensor<?x16xf32> loc("l.residual2")
  %r = kiln.activation %x3 {kind = #kiln.activation<silu>} : tensor<?x16xf32>
  return %r : tensor<?x16xf32>
}

// -----

// No-op: the product is read by another op too; the residual is the linear's own
// input; neither operand is a matmul.
// CHECK-LABEL: func.func @kept
// CHECK-COUNT-3: kiln.add
kiln.weight @w : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F32"> as #kiln.encoding<f32>
func.func @kept(%x: tensor<?x16xf32>) -> (tensor<?x16xf32>, tensor<?x16xf32>, tensor<?x16xf32>, tensor<?x16xf32>) attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %w = kiln.weight_ref @w : tensor<16x16xf32>
  %o = kiln.linear %x, %w : tensor<?x16xf32>, tensor<16x16xf32> -> tensor<?x16xf32> loc("l.o_proj")
  // expected-remark @+1 {{kiln-fuse-residual: not fused: the residual is also an operand of l.o_proj}}
  %s = kiln.add %x, %o : tensor<?x16xf32>
  %p = kiln.linear %s, %w : tensor<?x16xf32>, tensor<16x16xf32> -> tensor<?x16xf32> loc("l.p")
  // expected-remark @+1 {{kiln-fuse-residual: not fused: l.p is also read by other ops}}
  %t = kiln.add %x, %p : tensor<?x16xf32>
  // expected-remark @+1 {{kiln-fuse-residual: not fused: neither operand is a matmul}}
  %u = kiln.add %t, %t : tensor<?x16xf32>
  return %s, %t, %u, %p : tensor<?x16xf32>, tensor<?x16xf32>, tensor<?x16xf32>, tensor<?x16xf32>
}

// -----

// SigLIP: the position embedding of the patch embedding becomes its epilogue (the
// table's rows added to the patches'). CLIP: the class token between them comes too
// (row 0 of the result), unless something else reads the class token's result.
// CHECK-LABEL: func.func @siglip
// CHECK: kiln.patch_embed %arg0, %{{.*}}, %{{.*}} position(%{{.*}}) {kiln.fused = ["v.patch_embedding", "kiln.position_embedding"], patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32>, tensor<16xf32> position tensor<16x16xf32> -> tensor<16x16xf32>
// CHECK-NOT: kiln.position_embedding
// CHECK-LABEL: func.func @clip
// CHECK: %[[CLS:.*]] = kiln.weight_ref @b
// CHECK: %[[T:.*]] = kiln.weight_ref @t17
// CHECK: %[[E:.*]] = kiln.patch_embed %arg0, %{{.*}} position(%[[T]]) class(%[[CLS]]) {kiln.fused = ["v.patch_embedding", "v.class_embedding", "kiln.position_embedding"], patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32> position tensor<17x16xf32> class tensor<16xf32> -> tensor<17x16xf32>
// CHECK-NOT: kiln.class_token
// CHECK-NOT: kiln.position_embedding
// CHECK: return %[[E]]
// CHECK-LABEL: func.func @clip_class_token_read_twice
// CHECK: kiln.class_token
// CHECK: kiln.position_embedding
kiln.weight @w : tensor<16x3x4x4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 3072, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @b : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 3072, size = 64, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @t : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 3136, size = 1024, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @t17 : tensor<17x16xf32> from #kiln.source<"m.safetensors", offset = 4160, size = 1088, dtype = "F32"> as #kiln.encoding<f32>
func.func @siglip(%px: tensor<3x16x16xf32>) -> tensor<16x16xf32> attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  %w = kiln.weight_ref @w : tensor<16x3x4x4xf32>
  %b = kiln.weight_ref @b : tensor<16xf32>
  %p = kiln.patch_embed %px, %w, %b {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32>, tensor<16xf32> -> tensor<16x16xf32> loc("v.patch_embedding")
  %t = kiln.weight_ref @t : tensor<16x16xf32>
  // expected-remark @+1 {{kiln-fuse-residual: kiln.position_embedding fused as the epilogue of v.patch_embedding}}
  %e = kiln.position_embedding %p, %t : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
  return %e : tensor<16x16xf32>
}
func.func @clip(%px: tensor<3x16x16xf32>) -> tensor<17x16xf32> attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  %w = kiln.weight_ref @w : tensor<16x3x4x4xf32>
  %b = kiln.weight_ref @b : tensor<16xf32>
  %p = kiln.patch_embed %px, %w {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32> -> tensor<16x16xf32> loc("v.patch_embedding")
  %c = kiln.class_token %p, %b : tensor<16x16xf32>, tensor<16xf32> -> tensor<17x16xf32> loc("v.class_embedding")
  %t = kiln.weight_ref @t17 : tensor<17x16xf32>
  // expected-remark @+1 {{kiln-fuse-residual: v.class_embedding and kiln.position_embedding fused as the epilogue of v.patch_embedding}}
  %e = kiln.position_embedding %c, %t : tensor<17x16xf32>, tensor<17x16xf32> -> tensor<17x16xf32>
  return %e : tensor<17x16xf32>
}
func.func @clip_class_token_read_twice(%px: tensor<3x16x16xf32>) -> (tensor<17x16xf32>, tensor<17x16xf32>) attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  %w = kiln.weight_ref @w : tensor<16x3x4x4xf32>
  %b = kiln.weight_ref @b : tensor<16xf32>
  %p = kiln.patch_embed %px, %w {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32> -> tensor<16x16xf32>
  %c = kiln.class_token %p, %b : tensor<16x16xf32>, tensor<16xf32> -> tensor<17x16xf32> loc("v.class_embedding")
  %t = kiln.weight_ref @t17 : tensor<17x16xf32>
  // expected-remark @+1 {{kiln-fuse-residual: not fused: v.class_embedding is also read by other ops}}
  %e = kiln.position_embedding %c, %t : tensor<17x16xf32>, tensor<17x16xf32> -> tensor<17x16xf32>
  return %e, %c : tensor<17x16xf32>, tensor<17x16xf32>
}
