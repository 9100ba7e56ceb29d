// RUN: kiln-opt %s -split-input-file --kiln-fuse-norm | FileCheck %s
// RUN: kiln-opt %s -split-input-file --kiln-fuse-norm -verify-diagnostics > /dev/null

// An RMSNorm read by one linear becomes its prologue; a LayerNorm read by a gated
// MLP likewise, with its bias.
// CHECK-LABEL: func.func @prologues
// CHECK-NOT: kiln.rms_norm
// CHECK: %[[Y:.*]] = kiln.linear %arg0, %{{.*}} norm(%{{.*}}) {kiln.fused = ["l.input_layernorm", "kiln.linear"], norm = "rms", norm_epsilon = 9.99999974E-6 : f32} : tensor<?x16xf32>, tensor<32x16xf32> norm tensor<16xf32> -> tensor<?x32xf32>
// CHECK-NOT: kiln.layer_norm
// CHECK: kiln.gated_mlp %arg1, %{{.*}}, %{{.*}}, %{{.*}} norm(%{{.*}}) norm_bias(%{{.*}}) {activation = #kiln.activation<silu>, kiln.fused = ["l.post_attention_layernorm", "kiln.gated_mlp"], norm = "layer", norm_epsilon = 9.99999974E-6 : f32}
kiln.weight @n : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 64, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @nb : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 64, size = 64, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @w : tensor<32x16xf32> from #kiln.source<"m.safetensors", offset = 128, size = 2048, dtype = "F32"> as #kiln.encoding<int8>
kiln.weight @g : tensor<24x16xf32> from #kiln.source<"m.safetensors", offset = 2176, size = 1536, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @d : tensor<16x24xf32> from #kiln.source<"m.safetensors", offset = 3712, size = 1536, dtype = "F32"> as #kiln.encoding<f32>
func.func @prologues(%x: tensor<?x16xf32>, %z: tensor<?x16xf32>) -> (tensor<?x32xf32>, tensor<?x16xf32>) attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %n = kiln.weight_ref @n : tensor<16xf32>
  %nb = kiln.weight_ref @nb : tensor<16xf32>
  %w = kiln.weight_ref @w : tensor<32x16xf32>
  %h = kiln.rms_norm %x, %n {epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<16xf32> -> tensor<?x16xf32> loc("l.input_layernorm")
  // expected-remark @+1 {{kiln-fuse-norm: l.input_layernorm (RMSNorm) fused as the prologue of}}
  %y = kiln.linear %h, %w : tensor<?x16xf32>, tensor<32x16xf32> -> tensor<?x32xf32>
  %g = kiln.weight_ref @g : tensor<24x16xf32>
  %d = kiln.weight_ref @d : tensor<16x24xf32>
  %h2 = kiln.layer_norm %z, %n, %nb {epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<16xf32>, tensor<16xf32> -> tensor<?x16xf32> loc("l.post_attention_layernorm")
  // expected-remark @+1 {{kiln-fuse-norm: l.post_attention_layernorm (LayerNorm) fused as the prologue of}}
  %m = kiln.gated_mlp %h2, %g, %g, %d {activation = #kiln.activation<silu>} : tensor<?x16xf32>, tensor<24x16xf32>, tensor<24x16xf32>, tensor<16x24xf32> -> tensor<?x16xf32>
  return %y, %m : tensor<?x32xf32>, tensor<?x16xf32>
}

// -----

// No-op: a norm read by two ops (unfused Q and K projections) stays, and so does one
// whose reader takes no prologue (the LM head's final norm).
// CHECK-LABEL: func.func @kept
// CHECK: kiln.rms_norm
// CHECK: kiln.rms_norm
kiln.weight @n : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 64, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @w : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 64, size = 1024, dtype = "F32"> as #kiln.encoding<f32>
func.func @kept(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %n = kiln.weight_ref @n : tensor<16xf32>
  %w = kiln.weight_ref @w : tensor<16x16xf32>
  // expected-remark @+1 {{kiln-fuse-norm: not fused: read by 2 ops (a prologue would compute it once per reader)}}
  %h = kiln.rms_norm %x, %n {epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<16xf32> -> tensor<?x16xf32>
  %q = kiln.linear %h, %w : tensor<?x16xf32>, tensor<16x16xf32> -> tensor<?x16xf32>
  %k = kiln.linear %h, %w : tensor<?x16xf32>, tensor<16x16xf32> -> tensor<?x16xf32>
  %s = kiln.add %q, %k : tensor<?x16xf32>
  // expected-remark @+1 {{kiln-fuse-norm: not fused: its reader lm_head (kiln.lm_head) takes no norm prologue}}
  %f = kiln.rms_norm %s, %n {epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<16xf32> -> tensor<?x16xf32>
  %l = kiln.lm_head %f, %w : tensor<?x16xf32>, tensor<16x16xf32> -> tensor<?x16xf32> loc("lm_head")
  return %l : tensor<?x16xf32>
}
