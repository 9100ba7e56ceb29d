// RUN: kiln-opt %s -split-input-file --kiln-fuse-qkv | FileCheck %s
// RUN: kiln-opt %s -split-input-file --kiln-fuse-qkv -verify-diagnostics > /dev/null

// A decoder layer's projections and ropes: one [64, 16] weight concatenating the
// three (the plain sources state their shapes), one linear, and one attention over
// its output that rotates q and k (6 heads: 4 of q, 2 of k) itself.
// CHECK: kiln.weight @l.qkv_proj.weight : tensor<64x16xf32> from #kiln.concat<axis = 0, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [32, 16]>, #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F32", shape = [16, 16]>, #kiln.source<"m.safetensors", offset = 3072, size = 1024, dtype = "F32", shape = [16, 16]>]> as <int8> {kiln.fused_from = [@l.q_proj.weight, @l.k_proj.weight, @l.v_proj.weight]}
// CHECK-NOT: kiln.weight @l.q_proj.weight
// CHECK-LABEL: func.func @decode
// CHECK: %[[W:.*]] = kiln.weight_ref @l.qkv_proj.weight : tensor<64x16xf32>
// CHECK: %[[QKV:.*]] = kiln.linear %arg0, %[[W]] {kiln.fused = ["l.q_proj", "l.k_proj", "l.v_proj"]} : tensor<1x16xf32>, tensor<64x16xf32> -> tensor<1x64xf32>
// CHECK: kiln.qkv_attention %[[QKV]] positions(%arg1) {cache_layer = 0 : i64, causal, head_dim = 8 : i64, kiln.fused = ["kiln.attention", "l.rotary_q", "l.rotary_k"], num_heads = 4 : i64, num_kv_heads = 2 : i64, rope = {head_dim = 8 : i64, num_heads = 6 : i64, rope_type = "default", theta = 1.000000e+04 : f64}
// CHECK-NOT: kiln.rope
// CHECK-NOT: kiln.attention
kiln.weight @l.q_proj.weight : tensor<32x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32"> as #kiln.encoding<int8>
kiln.weight @l.k_proj.weight : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F32"> as #kiln.encoding<int8>
kiln.weight @l.v_proj.weight : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 3072, size = 1024, dtype = "F32"> as #kiln.encoding<int8>
func.func @decode(%x: tensor<1x16xf32>, %pos: tensor<1xi32>) -> tensor<1x32xf32> attributes {kiln.stage = #kiln.stage<decoder_decode>} {
  %wq = kiln.weight_ref @l.q_proj.weight : tensor<32x16xf32>
  %wk = kiln.weight_ref @l.k_proj.weight : tensor<16x16xf32>
  %wv = kiln.weight_ref @l.v_proj.weight : tensor<16x16xf32>
  %q = kiln.linear %x, %wq : tensor<1x16xf32>, tensor<32x16xf32> -> tensor<1x32xf32> loc("l.q_proj")
  %k = kiln.linear %x, %wk : tensor<1x16xf32>, tensor<16x16xf32> -> tensor<1x16xf32> loc("l.k_proj")
  %v = kiln.linear %x, %wv : tensor<1x16xf32>, tensor<16x16xf32> -> tensor<1x16xf32> loc("l.v_proj")
  %qr = kiln.rope %q, %pos {num_heads = 4 : i64, head_dim = 8 : i64, theta = 10000.0 : f64} : tensor<1x32xf32>, tensor<1xi32> -> tensor<1x32xf32> loc("l.rotary_q")
  %kr = kiln.rope %k, %pos {num_heads = 2 : i64, head_dim = 8 : i64, theta = 10000.0 : f64} : tensor<1x16xf32>, tensor<1xi32> -> tensor<1x16xf32> loc("l.rotary_k")
  // expected-remark @+1 {{kiln-fuse-qkv: l.q_proj, l.k_proj and l.v_proj fused into one 64-wide projection l.qkv_proj (int8), read by the attention, which rotates q and k itself (l.rotary_q, l.rotary_k)}}
  %a = kiln.attention %qr, %kr, %v positions(%pos) {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35355339 : f64, causal, cache_layer = 0 : i64} : tensor<1x32xf32>, tensor<1x16xf32>, tensor<1x16xf32>, tensor<1xi32> -> tensor<1x32xf32>
  return %a : tensor<1x32xf32>
}

// -----

// A vision encoder's attention: biases concatenated too, no rope, no positions.
// CHECK-LABEL: kiln.weight @v.qkv_proj.weight : tensor<48x16xf32>
// CHECK: kiln.weight @v.qkv_proj.bias : tensor<48xf32> from #kiln.concat<axis = 0, [#kiln.source<"m.safetensors", offset = 3072, size = 64, dtype = "F32", shape = [16]>,
// CHECK-LABEL: func.func @vision
// CHECK: %[[QKV:.*]] = kiln.linear %arg0, %{{.*}}, %{{.*}} {kiln.fused
// CHECK: kiln.qkv_attention %[[QKV]] {head_dim = 8 : i64, num_heads = 2 : i64, num_kv_heads = 2 : i64, scale
kiln.weight @v.q_proj.weight : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @v.k_proj.weight : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 1024, size = 1024, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @v.v_proj.weight : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @v.q_proj.bias : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 3072, size = 64, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @v.k_proj.bias : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 3136, size = 64, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @v.v_proj.bias : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 3200, size = 64, dtype = "F32"> as #kiln.encoding<f32>
func.func @vision(%x: tensor<5x16xf32>) -> tensor<5x16xf32> attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  %wq = kiln.weight_ref @v.q_proj.weight : tensor<16x16xf32>
  %wk = kiln.weight_ref @v.k_proj.weight : tensor<16x16xf32>
  %wv = kiln.weight_ref @v.v_proj.weight : tensor<16x16xf32>
  %bq = kiln.weight_ref @v.q_proj.bias : tensor<16xf32>
  %bk = kiln.weight_ref @v.k_proj.bias : tensor<16xf32>
  %bv = kiln.weight_ref @v.v_proj.bias : tensor<16xf32>
  %q = kiln.linear %x, %wq, %bq : tensor<5x16xf32>, tensor<16x16xf32>, tensor<16xf32> -> tensor<5x16xf32>
  %k = kiln.linear %x, %wk, %bk : tensor<5x16xf32>, tensor<16x16xf32>, tensor<16xf32> -> tensor<5x16xf32>
  %v = kiln.linear %x, %wv, %bv : tensor<5x16xf32>, tensor<16x16xf32>, tensor<16xf32> -> tensor<5x16xf32>
  // expected-remark @+1 {{fused into one 48-wide projection kiln.linear_qkv (f32), read by the attention}}
  %a = kiln.attention %q, %k, %v {num_heads = 2 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35355339 : f64} : tensor<5x16xf32>, tensor<5x16xf32>, tensor<5x16xf32> -> tensor<5x16xf32>
  return %a : tensor<5x16xf32>
}

// -----

// No-op: K and V were assigned another encoding than Q; the precision assignment
// is kept and the remark says so.
// CHECK-LABEL: func.func @mixed
// CHECK-COUNT-3: kiln.linear
// CHECK: kiln.attention
kiln.weight @q : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F32"> as #kiln.encoding<int4, group = 32>
kiln.weight @k : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 1024, size = 1024, dtype = "F32"> as #kiln.encoding<int8>
kiln.weight @v : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F32"> as #kiln.encoding<int8>
func.func @mixed(%x: tensor<5x16xf32>) -> tensor<5x16xf32> attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  %wq = kiln.weight_ref @q : tensor<16x16xf32>
  %wk = kiln.weight_ref @k : tensor<16x16xf32>
  %wv = kiln.weight_ref @v : tensor<16x16xf32>
  %q = kiln.linear %x, %wq : tensor<5x16xf32>, tensor<16x16xf32> -> tensor<5x16xf32>
  %k = kiln.linear %x, %wk : tensor<5x16xf32>, tensor<16x16xf32> -> tensor<5x16xf32>
  %v = kiln.linear %x, %wv : tensor<5x16xf32>, tensor<16x16xf32> -> tensor<5x16xf32>
  // expected-remark @+1 {{kiln-fuse-qkv: not fused: their weights were assigned different encodings (q int4_g32, k int8, v int8); kept apart to honour the precision assignment}}
  %a = kiln.attention %q, %k, %v {num_heads = 2 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35355339 : f64} : tensor<5x16xf32>, tensor<5x16xf32>, tensor<5x16xf32> -> tensor<5x16xf32>
  return %a : tensor<5x16xf32>
}

// -----

// No-op: another op reads the key projection.
// CHECK-LABEL: func.func @shared
// CHECK: kiln.attention
kiln.weight @q : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F32"> as #kiln.encoding<f32>
func.func @shared(%x: tensor<5x16xf32>) -> tensor<5x16xf32> attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  %w = kiln.weight_ref @q : tensor<16x16xf32>
  %q = kiln.linear %x, %w : tensor<5x16xf32>, tensor<16x16xf32> -> tensor<5x16xf32>
  %k = kiln.linear %x, %w : tensor<5x16xf32>, tensor<16x16xf32> -> tensor<5x16xf32>
  %v = kiln.linear %x, %w : tensor<5x16xf32>, tensor<16x16xf32> -> tensor<5x16xf32>
  // expected-remark @+1 {{kiln-fuse-qkv: not fused: a projection is read by other ops than the attention}}
  %a = kiln.attention %q, %k, %v {num_heads = 2 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35355339 : f64} : tensor<5x16xf32>, tensor<5x16xf32>, tensor<5x16xf32> -> tensor<5x16xf32>
  %s = kiln.add %a, %k : tensor<5x16xf32>
  return %s : tensor<5x16xf32>
}

// -----

// The checkpoint already has a weight of the fused name (read by another op): the
// fused weight gets another name instead of taking it over.
// CHECK-LABEL: kiln.weight @l.qkv_proj.weight : tensor<4x16xf32>
// CHECK: kiln.weight @l.qkv_proj.weight.fused1 : tensor<48x16xf32> from #kiln.concat
// CHECK-LABEL: func.func @collision
// CHECK: kiln.weight_ref @l.qkv_proj.weight.fused1
kiln.weight @l.qkv_proj.weight : tensor<4x16xf32> from #kiln.source<"m.safetensors", offset = 4096, size = 256, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @l.q_proj.weight : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @l.k_proj.weight : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 1024, size = 1024, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @l.v_proj.weight : tensor<16x16xf32> from #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F32"> as #kiln.encoding<f32>
func.func @collision(%x: tensor<5x16xf32>) -> (tensor<5x16xf32>, tensor<5x4xf32>) attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  %wq = kiln.weight_ref @l.q_proj.weight : tensor<16x16xf32>
  %wk = kiln.weight_ref @l.k_proj.weight : tensor<16x16xf32>
  %wv = kiln.weight_ref @l.v_proj.weight : tensor<16x16xf32>
  %wo = kiln.weight_ref @l.qkv_proj.weight : tensor<4x16xf32>
  %q = kiln.linear %x, %wq : tensor<5x16xf32>, tensor<16x16xf32> -> tensor<5x16xf32>
  %k = kiln.linear %x, %wk : tensor<5x16xf32>, tensor<16x16xf32> -> tensor<5x16xf32>
  %v = kiln.linear %x, %wv : tensor<5x16xf32>, tensor<16x16xf32> -> tensor<5x16xf32>
  // expected-remark @+1 {{fused into one 48-wide projection}}
  %a = kiln.attention %q, %k, %v {num_heads = 2 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35355339 : f64} : tensor<5x16xf32>, tensor<5x16xf32>, tensor<5x16xf32> -> tensor<5x16xf32>
  %o = kiln.linear %x, %wo : tensor<5x16xf32>, tensor<4x16xf32> -> tensor<5x4xf32>
  return %a, %o : tensor<5x16xf32>, tensor<5x4xf32>
}
