// RUN: kiln-opt %s | FileCheck %s
// The printed form parses back to the same IR:
// RUN: kiln-opt %s | kiln-opt | FileCheck %s
// RUN: kiln-opt %s --mlir-print-op-generic | kiln-opt | FileCheck %s

// CHECK: kiln.weight @embed : tensor<64x16xbf16> from <"model.safetensors", offset = 8, size = 2048, dtype = "BF16"> as <bf16>
kiln.weight @embed : tensor<64x16xbf16> from #kiln.source<"model.safetensors", offset = 8, size = 2048, dtype = "BF16"> as #kiln.encoding<bf16>
// CHECK: kiln.weight @norm : tensor<16xf32> from <"model.safetensors", offset = 2056, size = 64, dtype = "F32"> as <f32>
kiln.weight @norm : tensor<16xf32> from #kiln.source<"model.safetensors", offset = 2056, size = 64, dtype = "F32"> as #kiln.encoding<f32>
// CHECK: kiln.weight @wq : tensor<16x16xf16> {{.*}} as <int4, group = 32, asym, act = int8_per_token>
kiln.weight @wq : tensor<16x16xf16> from #kiln.source<"model.safetensors", offset = 2120, size = 512, dtype = "F16"> as #kiln.encoding<int4, group = 32, asym, act = int8_per_token>
// CHECK: kiln.weight @bq : tensor<16xf16> {{.*}} as <int8>
kiln.weight @bq : tensor<16xf16> from #kiln.source<"model.safetensors", offset = 2632, size = 32, dtype = "F16"> as #kiln.encoding<int8>
// CHECK: kiln.weight @wk : tensor<8x16xf16> {{.*}} as <fp8_e4m3>
kiln.weight @wk : tensor<8x16xf16> from #kiln.source<"model.safetensors", offset = 2664, size = 256, dtype = "F16"> as #kiln.encoding<fp8_e4m3>
kiln.weight @gate : tensor<32x16xf32> from #kiln.source<"model.safetensors", offset = 2920, size = 2048, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @gate_up : tensor<64x16xf32> from #kiln.concat<axis = 0, block = 16, [#kiln.source<"model.safetensors", offset = 2920, size = 2048, dtype = "F32", shape = [32, 16]>, #kiln.source<"model.safetensors", offset = 2920, size = 2048, dtype = "F32", shape = [32, 16]>]> as #kiln.encoding<f32>
kiln.weight @down : tensor<16x32xf32> from #kiln.source<"model.safetensors", offset = 4968, size = 2048, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @router : tensor<2x16xf32> from #kiln.source<"model.safetensors", offset = 7016, size = 128, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @patch : tensor<16x3x4x4xf32> from #kiln.source<"model.safetensors", offset = 7144, size = 3072, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @cls : tensor<16xf32> from #kiln.source<"model.safetensors", offset = 10216, size = 64, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @pos : tensor<17x16xf32> from #kiln.source<"model.safetensors", offset = 10280, size = 1088, dtype = "F32"> as #kiln.encoding<f32>

// CHECK-LABEL: func.func @vision
// CHECK-SAME: kiln.stage = #kiln.stage<vision_encoder>
func.func @vision(%px: tensor<3x16x16xf32>) -> tensor<4x64xf32> attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  %w = kiln.weight_ref @patch : tensor<16x3x4x4xf32>
  // CHECK: kiln.patch_embed %{{.*}}, %{{.*}} {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32> -> tensor<16x16xf32>
  %p = kiln.patch_embed %px, %w {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32> -> tensor<16x16xf32>
  // CHECK: kiln.patch_embed %{{.*}}, %{{.*}}, %{{.*}} {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32>, tensor<16xf32> -> tensor<16x16xf32>
  %cls = kiln.weight_ref @cls : tensor<16xf32>
  %pb = kiln.patch_embed %px, %w, %cls {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32>, tensor<16xf32> -> tensor<16x16xf32>
  // A position table added in the patch embedding's epilogue (kiln-fuse-residual).
  %t17 = kiln.weight_ref @pos : tensor<17x16xf32>
  // CHECK: kiln.patch_embed %{{.*}}, %{{.*}}, %{{.*}} position(%{{.*}}) {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32>, tensor<16xf32> position tensor<17x16xf32> -> tensor<16x16xf32>
  %pp = kiln.patch_embed %px, %w, %cls position(%t17) {patch_size = 4 : i64} : tensor<3x16x16xf32>, tensor<16x3x4x4xf32>, tensor<16xf32> position tensor<17x16xf32> -> tensor<16x16xf32>
  // CHECK: kiln.class_token {{.*}} : tensor<16x16xf32>, tensor<16xf32> -> tensor<17x16xf32>
  %c = kiln.class_token %p, %cls : tensor<16x16xf32>, tensor<16xf32> -> tensor<17x16xf32>
  %t = kiln.weight_ref @pos : tensor<17x16xf32>
  // CHECK: kiln.position_embedding {{.*}} : tensor<17x16xf32>, tensor<17x16xf32> -> tensor<17x16xf32>
  %e = kiln.position_embedding %c, %t : tensor<17x16xf32>, tensor<17x16xf32> -> tensor<17x16xf32>
  // CHECK: kiln.layer_norm {{.*}} {epsilon = 9.99999974E-6 : f32} : tensor<17x16xf32>, tensor<16xf32>, tensor<16xf32> -> tensor<17x16xf32>
  %n = kiln.weight_ref @norm : tensor<16xf32>
  %ln = kiln.layer_norm %e, %n, %n {epsilon = 1.0e-05 : f32} : tensor<17x16xf32>, tensor<16xf32>, tensor<16xf32> -> tensor<17x16xf32>
  // CHECK: kiln.attention {{.*}} {head_dim = 8 : i64, num_heads = 2 : i64, num_kv_heads = 2 : i64, scale = 0.35355339059327373 : f64} : tensor<17x16xf32>, tensor<17x16xf32>, tensor<17x16xf32> -> tensor<17x16xf32>
  %a = kiln.attention %ln, %ln, %ln {num_heads = 2 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, scale = 0.35355339059327373 : f64} : tensor<17x16xf32>, tensor<17x16xf32>, tensor<17x16xf32> -> tensor<17x16xf32>
  // CHECK: kiln.activation {{.*}} {kind = #kiln.activation<quick_gelu>} : tensor<17x16xf32>
  %g = kiln.activation %a {kind = #kiln.activation<quick_gelu>} : tensor<17x16xf32>
  // CHECK: kiln.select_tokens {{.*}} {keep = 9 : i64, score = "distinct"} : tensor<17x16xf32> -> tensor<9x16xf32>
  %sel = kiln.select_tokens %g {keep = 9 : i64, score = "distinct"} : tensor<17x16xf32> -> tensor<9x16xf32>
  // CHECK: kiln.slice_rows {{.*}} {start = 1 : i64} : tensor<17x16xf32> -> tensor<16x16xf32>
  %s = kiln.slice_rows %g {start = 1 : i64} : tensor<17x16xf32> -> tensor<16x16xf32>
  // CHECK: kiln.pixel_shuffle {{.*}} {scale_factor = 2 : i64} : tensor<16x16xf32> -> tensor<4x64xf32>
  %ps = kiln.pixel_shuffle %s {scale_factor = 2 : i64} : tensor<16x16xf32> -> tensor<4x64xf32>
  // CHECK: kiln.concat {{.*}} : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x32xf32>
  %cc = kiln.concat %s, %pb : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x32xf32>
  return %ps : tensor<4x64xf32>
}

// CHECK-LABEL: func.func @decoder
func.func @decoder(%ids: tensor<?xi32>, %pos: tensor<?xi32>, %img: tensor<?x16xf32>) -> tensor<?x64xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %tab = kiln.weight_ref @embed : tensor<64x16xbf16>
  // CHECK: kiln.embedding {{.*}} : tensor<64x16xbf16>, tensor<?xi32> -> tensor<?x16xf32>
  %x = kiln.embedding %tab, %ids : tensor<64x16xbf16>, tensor<?xi32> -> tensor<?x16xf32>
  // CHECK: kiln.merge_image_tokens {{.*}} {image_token_id = 63 : i64} : tensor<?x16xf32>, tensor<?xi32>, tensor<?x16xf32> -> tensor<?x16xf32>
  %m = kiln.merge_image_tokens %x, %ids, %img {image_token_id = 63 : i64} : tensor<?x16xf32>, tensor<?xi32>, tensor<?x16xf32> -> tensor<?x16xf32>
  %n = kiln.weight_ref @norm : tensor<16xf32>
  // CHECK: kiln.rms_norm {{.*}} {epsilon = 9.99999997E-7 : f32} : tensor<?x16xf32>, tensor<16xf32> -> tensor<?x16xf32>
  %h = kiln.rms_norm %m, %n {epsilon = 1.0e-06 : f32} : tensor<?x16xf32>, tensor<16xf32> -> tensor<?x16xf32>
  %wq = kiln.weight_ref @wq : tensor<16x16xf16>
  %bq = kiln.weight_ref @bq : tensor<16xf16>
  %wk = kiln.weight_ref @wk : tensor<8x16xf16>
  // CHECK: kiln.linear {{.*}} : tensor<?x16xf32>, tensor<16x16xf16>, tensor<16xf16> -> tensor<?x16xf32>
  %q = kiln.linear %h, %wq, %bq : tensor<?x16xf32>, tensor<16x16xf16>, tensor<16xf16> -> tensor<?x16xf32>
  // CHECK: kiln.linear {{.*}} : tensor<?x16xf32>, tensor<8x16xf16> -> tensor<?x8xf32>
  %k = kiln.linear %h, %wk : tensor<?x16xf32>, tensor<8x16xf16> -> tensor<?x8xf32>
  // CHECK: kiln.rope {{.*}} {head_dim = 8 : i64, num_heads = 2 : i64, theta = 1.000000e+04 : f64} : tensor<?x16xf32>, tensor<?xi32> -> tensor<?x16xf32>
  %qr = kiln.rope %q, %pos {num_heads = 2 : i64, head_dim = 8 : i64, theta = 10000.0 : f64} : tensor<?x16xf32>, tensor<?xi32> -> tensor<?x16xf32>
  // CHECK: kiln.rope {{.*}} {factor = 3.200000e+01 : f64, head_dim = 8 : i64, high_freq_factor = 4.000000e+00 : f64, low_freq_factor = 1.000000e+00 : f64, num_heads = 1 : i64, original_max_position_embeddings = 8192 : i64, rope_type = "llama3", theta = 5.000000e+05 : f64}
  %kr = kiln.rope %k, %pos {num_heads = 1 : i64, head_dim = 8 : i64, theta = 500000.0 : f64, rope_type = "llama3", factor = 32.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64, original_max_position_embeddings = 8192 : i64} : tensor<?x8xf32>, tensor<?xi32> -> tensor<?x8xf32>
  // CHECK: kiln.attention {{.*}} positions(%{{.*}}) {cache_layer = 0 : i64, causal, head_dim = 8 : i64, num_heads = 2 : i64, num_kv_heads = 1 : i64, scale = 3.535530e-01 : f64} : tensor<?x16xf32>, tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi32> -> tensor<?x16xf32>
  %a = kiln.attention %qr, %kr, %k positions(%pos) {num_heads = 2 : i64, num_kv_heads = 1 : i64, head_dim = 8 : i64, scale = 0.353553 : f64, causal, cache_layer = 0 : i64} : tensor<?x16xf32>, tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi32> -> tensor<?x16xf32>
  // CHECK: kiln.add {{.*}} : tensor<?x16xf32>
  %r = kiln.add %m, %a : tensor<?x16xf32>
  // CHECK: kiln.mul {{.*}} : tensor<?x16xf32>
  %mu = kiln.mul %r, %r : tensor<?x16xf32>
  %gw = kiln.weight_ref @gate : tensor<32x16xf32>
  %dw = kiln.weight_ref @down : tensor<16x32xf32>
  // CHECK: kiln.gated_mlp {{.*}} {activation = #kiln.activation<silu>} : tensor<?x16xf32>, tensor<32x16xf32>, tensor<32x16xf32>, tensor<16x32xf32> -> tensor<?x16xf32>
  %mlp = kiln.gated_mlp %mu, %gw, %gw, %dw {activation = #kiln.activation<silu>} : tensor<?x16xf32>, tensor<32x16xf32>, tensor<32x16xf32>, tensor<16x32xf32> -> tensor<?x16xf32>
  // Gate and up as one interleaved weight (kiln-fuse-gate-up): no up operand.
  %guw = kiln.weight_ref @gate_up : tensor<64x16xf32>
  // CHECK: kiln.gated_mlp %{{.*}}, %{{.*}}, %{{.*}} residual(%{{.*}}) {activation = #kiln.activation<silu>, gate_up_block = 16 : i64} : tensor<?x16xf32>, tensor<64x16xf32>, tensor<16x32xf32> residual tensor<?x16xf32> -> tensor<?x16xf32>
  %mlp2 = kiln.gated_mlp %mlp, %guw, %dw residual(%mlp) {activation = #kiln.activation<silu>, gate_up_block = 16 : i64} : tensor<?x16xf32>, tensor<64x16xf32>, tensor<16x32xf32> residual tensor<?x16xf32> -> tensor<?x16xf32>
  %rw = kiln.weight_ref @router : tensor<2x16xf32>
  // CHECK: kiln.moe %{{.*}}, %{{.*}} gate(%{{.*}}, %{{.*}}) up(%{{.*}}, %{{.*}}) down(%{{.*}}, %{{.*}}) {activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 3>, normalize_top_k = true, top_k = 1 : i64}
  %moe = kiln.moe %mlp2, %rw gate(%gw, %gw) up(%gw, %gw) down(%dw, %dw) {top_k = 1 : i64, normalize_top_k = true, activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 3>} : tensor<?x16xf32>, tensor<2x16xf32>, (tensor<32x16xf32>, tensor<32x16xf32>), (tensor<32x16xf32>, tensor<32x16xf32>), (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<?x16xf32>
  // CHECK: kiln.lm_head {{.*}} : tensor<?x16xf32>, tensor<64x16xbf16> -> tensor<?x64xf32>
  %logits = kiln.lm_head %moe, %tab : tensor<?x16xf32>, tensor<64x16xbf16> -> tensor<?x64xf32>
  return %logits : tensor<?x64xf32>
}
