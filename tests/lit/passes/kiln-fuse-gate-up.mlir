// RUN: kiln-opt %s -split-input-file --kiln-fuse-gate-up=block=16 | FileCheck %s
// RUN: kiln-opt %s -split-input-file --kiln-fuse-gate-up=block=16 -verify-diagnostics > /dev/null
// RUN: kiln-opt %s -split-input-file --kiln-fuse-gate-up=block=8 | FileCheck %s --check-prefix=BLOCK8
// RUN: kiln-opt %s -split-input-file --kiln-fuse-gate-up | FileCheck %s --check-prefix=DEFAULT
// RUN: not kiln-opt %s -split-input-file --kiln-fuse-gate-up=block=300 2>&1 | FileCheck %s --check-prefix=RANGE

// A gated MLP's gate and up ([24, 16] each, int8 with int8 activations): one
// [48, 16] weight interleaving their rows in blocks of 16 here (the last block of
// each 8 rows), named after the gate's, and the op without an up operand. The residual and
// the norm prologue it already had stay.
// CHECK: kiln.weight @l.mlp.gate_up_proj.weight : tensor<48x16xf32> from #kiln.concat<axis = 0, block = 16, [#kiln.source<"m.safetensors", offset = 0, size = 1536, dtype = "F32", shape = [24, 16]>, #kiln.source<"m.safetensors", offset = 1536, size = 1536, dtype = "F32", shape = [24, 16]>]> as <int8, act = int8_per_token> {kiln.fused_from = [@l.mlp.gate_proj.weight, @l.mlp.up_proj.weight]}
// CHECK-NOT: kiln.weight @l.mlp.gate_proj.weight
// CHECK-NOT: kiln.weight @l.mlp.up_proj.weight
// CHECK-LABEL: func.func @mlp
// CHECK: %[[D:.*]] = kiln.weight_ref @l.mlp.down_proj.weight : tensor<16x24xf32>
// CHECK: %[[GU:.*]] = kiln.weight_ref @l.mlp.gate_up_proj.weight : tensor<48x16xf32>
// CHECK: kiln.gated_mlp %arg0, %[[GU]], %[[D]] residual(%arg1) norm(%{{.*}}) {activation = #kiln.activation<silu>, gate_up_block = 16 : i64, kiln.fused = ["l.post_attention_layernorm", "l.mlp", "l.residual2"], norm = "rms", norm_epsilon = 9.99999974E-6 : f32} : tensor<?x16xf32>, tensor<48x16xf32>, tensor<16x24xf32> residual tensor<?x16xf32> norm tensor<16xf32> -> tensor<?x16xf32>
// BLOCK8: #kiln.concat<axis = 0, block = 8,
// BLOCK8: gate_up_block = 8 : i64
// The default block, 128, holds all 24 rows: gate's rows, then up's.
// DEFAULT: #kiln.concat<axis = 0, block = 128,
// DEFAULT: gate_up_block = 128 : i64
// RANGE: kiln-fuse-gate-up: block 300 must lie in [1, 256]
kiln.weight @n : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 4608, size = 64, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @l.mlp.gate_proj.weight : tensor<24x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 1536, dtype = "F32"> as #kiln.encoding<int8, act = int8_per_token>
kiln.weight @l.mlp.up_proj.weight : tensor<24x16xf32> from #kiln.source<"m.safetensors", offset = 1536, size = 1536, dtype = "F32"> as #kiln.encoding<int8, act = int8_per_token>
kiln.weight @l.mlp.down_proj.weight : tensor<16x24xf32> from #kiln.source<"m.safetensors", offset = 3072, size = 1536, dtype = "F32"> as #kiln.encoding<int8, act = int8_per_token>
func.func @mlp(%x: tensor<?x16xf32>, %r: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %n = kiln.weight_ref @n : tensor<16xf32>
  %g = kiln.weight_ref @l.mlp.gate_proj.weight : tensor<24x16xf32>
  %u = kiln.weight_ref @l.mlp.up_proj.weight : tensor<24x16xf32>
  %d = kiln.weight_ref @l.mlp.down_proj.weight : tensor<16x24xf32>
  // expected-remark @+1 {{kiln-fuse-gate-up: l.mlp.gate_proj.weight and l.mlp.up_proj.weight fused into one 48-row product l.mlp.gate_up_proj.weight (int8_a8, rows interleaved in blocks of 16), whose epilogue writes silu(gate) * up}}
  %y = kiln.gated_mlp %x, %g, %u, %d residual(%r) norm(%n) {activation = #kiln.activation<silu>, kiln.fused = ["l.post_attention_layernorm", "l.mlp", "l.residual2"], norm = "rms", norm_epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<24x16xf32>, tensor<24x16xf32>, tensor<16x24xf32> residual tensor<?x16xf32> norm tensor<16xf32> -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}

// -----

// Refused: gate and up were assigned different encodings, which fusion keeps.
// CHECK-LABEL: func.func @mixed
// CHECK: kiln.gated_mlp %arg0, %{{.*}}, %{{.*}}, %{{.*}} {activation = #kiln.activation<gelu_tanh>}
// CHECK-NOT: gate_up_block
kiln.weight @g : tensor<32x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32"> as #kiln.encoding<int8>
kiln.weight @u : tensor<32x16xf32> from #kiln.source<"m.safetensors", offset = 2048, size = 2048, dtype = "F32"> as #kiln.encoding<int4, group = 32>
kiln.weight @d : tensor<16x32xf32> from #kiln.source<"m.safetensors", offset = 4096, size = 2048, dtype = "F32"> as #kiln.encoding<f32>
func.func @mixed(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %g = kiln.weight_ref @g : tensor<32x16xf32>
  %u = kiln.weight_ref @u : tensor<32x16xf32>
  %d = kiln.weight_ref @d : tensor<16x32xf32>
  // expected-remark @+1 {{kiln-fuse-gate-up: not fused: their weights were assigned different encodings (gate int8, up int4_g32); kept apart to honour the precision assignment}}
  %y = kiln.gated_mlp %x, %g, %u, %d {activation = #kiln.activation<gelu_tanh>} : tensor<?x16xf32>, tensor<32x16xf32>, tensor<32x16xf32>, tensor<16x32xf32> -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}

// -----

// Refused: the same encoding, different element types.
// CHECK-LABEL: func.func @types
// CHECK-NOT: gate_up_block
kiln.weight @g : tensor<32x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @u : tensor<32x16xbf16> from #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "BF16"> as #kiln.encoding<f32>
kiln.weight @d : tensor<16x32xf32> from #kiln.source<"m.safetensors", offset = 4096, size = 2048, dtype = "F32"> as #kiln.encoding<f32>
func.func @types(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %g = kiln.weight_ref @g : tensor<32x16xf32>
  %u = kiln.weight_ref @u : tensor<32x16xbf16>
  %d = kiln.weight_ref @d : tensor<16x32xf32>
  // expected-remark @+1 {{kiln-fuse-gate-up: not fused: their weights have different element types}}
  %y = kiln.gated_mlp %x, %g, %u, %d {activation = #kiln.activation<silu>} : tensor<?x16xf32>, tensor<32x16xf32>, tensor<32x16xbf16>, tensor<16x32xf32> -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}

// -----

// No-op: a gated MLP already fused, a MoE's experts (not this pass's) and no other
// op are touched, and nothing is reported.
// CHECK-LABEL: func.func @noop
// CHECK: kiln.gated_mlp %arg0, %{{.*}}, %{{.*}} {activation = #kiln.activation<silu>, gate_up_block = 16 : i64}
// CHECK: kiln.moe %{{.*}}, %{{.*}} gate(%{{.*}}) up(%{{.*}}) down(%{{.*}})
kiln.weight @gu : tensor<64x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 4096, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @g : tensor<32x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @d : tensor<16x32xf32> from #kiln.source<"m.safetensors", offset = 4096, size = 2048, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @router : tensor<1x16xf32> from #kiln.source<"m.safetensors", offset = 6144, size = 64, dtype = "F32"> as #kiln.encoding<f32>
func.func @noop(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %gu = kiln.weight_ref @gu : tensor<64x16xf32>
  %g = kiln.weight_ref @g : tensor<32x16xf32>
  %d = kiln.weight_ref @d : tensor<16x32xf32>
  %rw = kiln.weight_ref @router : tensor<1x16xf32>
  %y = kiln.gated_mlp %x, %gu, %d {activation = #kiln.activation<silu>, gate_up_block = 16 : i64} : tensor<?x16xf32>, tensor<64x16xf32>, tensor<16x32xf32> -> tensor<?x16xf32>
  %m = kiln.moe %y, %rw gate(%g) up(%g) down(%d) {top_k = 1 : i64, normalize_top_k = true, activation = #kiln.activation<silu>, expert_ids = array<i64: 0>} : tensor<?x16xf32>, tensor<1x16xf32>, (tensor<32x16xf32>), (tensor<32x16xf32>), (tensor<16x32xf32>) -> tensor<?x16xf32>
  return %m : tensor<?x16xf32>
}
