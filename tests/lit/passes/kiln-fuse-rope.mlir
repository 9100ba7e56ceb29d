// RUN: kiln-opt %s -split-input-file --kiln-fuse-rope | FileCheck %s
// RUN: kiln-opt %s -split-input-file --kiln-fuse-rope -verify-diagnostics > /dev/null

// A decoder layer's q|k|v product takes the rotation (6 heads: 4 of q, 2 of k) and the
// KV-cache write into its epilogue, the attention's positions as its own; the
// attention keeps its cache layer, loses its rope and attends only (kv_written). The
// rotations' names move to the linear.
// CHECK-LABEL: func.func @decode
// CHECK: %[[QKV:.*]] = kiln.linear %arg0, %{{.*}} positions(%arg1) norm(%{{.*}}) {kiln.fused = ["l.input_layernorm", "l.q_proj", "l.k_proj", "l.v_proj", "l.rotary_q", "l.rotary_k"], norm = "rms", norm_epsilon = 9.99999997E-7 : f32, qkv = {cache_layer = 0 : i64, head_dim = 8 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64, rope = {head_dim = 8 : i64, num_heads = 6 : i64, rope_type = "default", theta = 1.000000e+04 : f64}}} : tensor<1x16xf32>, tensor<64x16xf32> positions tensor<1xi32> norm tensor<16xf32> -> tensor<1x64xf32>
// CHECK: kiln.qkv_attention %[[QKV]] positions(%arg1) {cache_layer = 0 : i64, causal, head_dim = 8 : i64, kv_written, num_heads = 4 : i64, num_kv_heads = 2 : i64, scale = 0.35355339000000002 : f64} : tensor<1x64xf32>, tensor<1xi32> -> tensor<1x32xf32>
kiln.weight @w : tensor<64x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 4096, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @n : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 4096, size = 64, dtype = "F32"> as #kiln.encoding<f32>
func.func @decode(%x: tensor<1x16xf32>, %pos: tensor<1xi32>) -> tensor<1x32xf32> attributes {kiln.stage = #kiln.stage<decoder_decode>} {
  %w = kiln.weight_ref @w : tensor<64x16xf32>
  %n = kiln.weight_ref @n : tensor<16xf32>
  // expected-remark @+1 {{kiln-fuse-rope: kiln.qkv_attention's rotation and KV-cache write fused as the epilogue of kiln.linear}}
  %qkv = kiln.linear %x, %w norm(%n) {kiln.fused = ["l.input_layernorm", "l.q_proj", "l.k_proj", "l.v_proj"], norm = "rms", norm_epsilon = 1.0e-06 : f32} : tensor<1x16xf32>, tensor<64x16xf32> norm tensor<16xf32> -> tensor<1x64xf32>
  %a = kiln.qkv_attention %qkv positions(%pos) {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35355339 : f64, causal, cache_layer = 0 : i64, kiln.fused = ["l.self_attn", "l.rotary_q", "l.rotary_k"], rope = {num_heads = 6 : i64, head_dim = 8 : i64, theta = 10000.0 : f64, rope_type = "default"}} : tensor<1x64xf32>, tensor<1xi32> -> tensor<1x32xf32>
  return %a : tensor<1x32xf32>
}

// -----

// A KV cache without a rope (absolute positions elsewhere): the write alone moves.
// A vision encoder's attention (no rope, no cache) is left as it is, silently.
// CHECK-LABEL: func.func @no_rope
// CHECK: kiln.linear %arg0, %{{.*}} positions(%arg1) {qkv = {cache_layer = 1 : i64, head_dim = 8 : i64, num_heads = 2 : i64, num_kv_heads = 2 : i64}}
// CHECK: kiln.qkv_attention %{{.*}} positions(%arg1) {cache_layer = 1 : i64, causal, head_dim = 8 : i64, kv_written,
// CHECK-LABEL: func.func @vision
// CHECK: %[[QKV:.*]] = kiln.linear %arg0, %{{.*}} : tensor<5x16xf32>, tensor<48x16xf32> -> tensor<5x48xf32>
// CHECK: kiln.qkv_attention %[[QKV]] {head_dim = 8 : i64, num_heads = 2 : i64, num_kv_heads = 2 : i64, scale
kiln.weight @w48 : tensor<48x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 3072, dtype = "F32"> as #kiln.encoding<f32>
func.func @no_rope(%x: tensor<1x16xf32>, %pos: tensor<1xi32>) -> tensor<1x16xf32> attributes {kiln.stage = #kiln.stage<decoder_decode>} {
  %w = kiln.weight_ref @w48 : tensor<48x16xf32>
  // expected-remark @+1 {{kiln-fuse-rope: kiln.qkv_attention's KV-cache write fused as the epilogue of kiln.linear}}
  %qkv = kiln.linear %x, %w : tensor<1x16xf32>, tensor<48x16xf32> -> tensor<1x48xf32>
  %a = kiln.qkv_attention %qkv positions(%pos) {num_heads = 2 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35355339 : f64, causal, cache_layer = 1 : i64} : tensor<1x48xf32>, tensor<1xi32> -> tensor<1x16xf32>
  return %a : tensor<1x16xf32>
}
func.func @vision(%x: tensor<5x16xf32>) -> tensor<5x16xf32> attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  %w = kiln.weight_ref @w48 : tensor<48x16xf32>
  %qkv = kiln.linear %x, %w : tensor<5x16xf32>, tensor<48x16xf32> -> tensor<5x48xf32>
  %a = kiln.qkv_attention %qkv {num_heads = 2 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35355339 : f64} : tensor<5x48xf32> -> tensor<5x16xf32>
  return %a : tensor<5x16xf32>
}

// -----

// Refused: another op reads the q|k|v product.
// CHECK-LABEL: func.func @refused
// CHECK-NOT: kv_written
// CHECK: return
kiln.weight @w64 : tensor<64x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 4096, dtype = "F32"> as #kiln.encoding<f32>
func.func @refused(%x: tensor<1x16xf32>, %pos: tensor<1xi32>) -> (tensor<1x32xf32>, tensor<1x64xf32>) attributes {kiln.stage = #kiln.stage<decoder_decode>} {
  %w = kiln.weight_ref @w64 : tensor<64x16xf32>
  %qkv = kiln.linear %x, %w : tensor<1x16xf32>, tensor<64x16xf32> -> tensor<1x64xf32>
  // expected-remark @+1 {{kiln-fuse-rope: not fused: kiln.linear is also read by other ops}}
  %a = kiln.qkv_attention %qkv positions(%pos) {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35355339 : f64, causal, cache_layer = 0 : i64} : tensor<1x64xf32>, tensor<1xi32> -> tensor<1x32xf32>
  return %a, %qkv : tensor<1x32xf32>, tensor<1x64xf32>
}
