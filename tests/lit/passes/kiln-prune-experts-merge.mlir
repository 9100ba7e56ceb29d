// RUN: kiln-opt %s --kiln-prune-experts="prune=1 merge=true" | FileCheck %s
// RUN: kiln-opt %s --kiln-prune-experts="prune=1 merge=true" -verify-diagnostics > /dev/null
// RUN: kiln-opt %s --kiln-prune-experts="prune=2 merge=true" | FileCheck %s --check-prefix=TWO
// RUN: kiln-opt %s --kiln-prune-experts="prune=0 merge=true" | FileCheck %s --check-prefix=NONE
// RUN: kiln-opt %s --kiln-prune-experts="prune=1 merge=true" --kiln-prune-experts="prune=1" | FileCheck %s --check-prefix=THEN-DROP
// RUN: kiln-opt %s --kiln-prune-experts="prune=2 merge=true merge-min-similarity=0.8" 2>&1 | FileCheck %s --check-prefix=MIXED
// RUN: not kiln-opt %s --kiln-prune-experts="prune=1 merge=true" --kiln-prune-experts="prune=1 merge=true" 2>&1 | FileCheck %s --check-prefix=TWICE

// The layer of kiln-prune-experts.mlir with the experts' similarity. prune=1
// merge=true: expert 1 (the least mass) goes into expert 2, the kept expert most
// like it (cosine 0.9). Expert 2's weights become the mean of 2's and 1's, expert
// 1's weights leave the module, the router keeps its 4 rows and expert_ids all
// four, and expert 1's slot reads expert 2's weights.
// CHECK: kiln.weight @r : tensor<4x16xf32> from <"m.safetensors", offset = 0, size = 256, dtype = "F32">
// CHECK-SAME: kiln.pruned_experts = {expert_ids = array<i64: 1>, mass = array<f64: 2.000000e+00>, merged_into = array<i64: 2>, selected = array<i64: 5>, tokens = 100 : i64}
// CHECK-NOT: kiln.weight @e1.
// CHECK: kiln.weight @e2.g : tensor<8x16xf32> from #kiln.weighted_sum<[#kiln.source<"m.safetensors", offset = 1280, size = 512, dtype = "F32", shape = [8, 16]>, #kiln.source<"m.safetensors", offset = 768, size = 512, dtype = "F32", shape = [8, 16]>], weights = array<f64: 5.000000e-01, 5.000000e-01>>
// CHECK: kiln.weight @e2.u : tensor<8x16xf32> from #kiln.weighted_sum<
// CHECK: kiln.weight @e2.d : tensor<16x8xf32> from #kiln.weighted_sum<[#kiln.source<"m.safetensors", offset = 1280, size = 512, dtype = "F32", shape = [16, 8]>, #kiln.source<"m.safetensors", offset = 768, size = 512, dtype = "F32", shape = [16, 8]>]
// CHECK: kiln.weight @e3.g : tensor<8x16xf32> from <"m.safetensors"
// CHECK-LABEL: func.func @prefill
// CHECK: %[[G0:.*]] = kiln.weight_ref @e0.g
// CHECK: %[[G2:.*]] = kiln.weight_ref @e2.g
// CHECK: %[[G3:.*]] = kiln.weight_ref @e3.g
// CHECK: kiln.moe %arg0, %{{.*}} gate(%[[G0]], %[[G2]], %[[G2]], %[[G3]]) {{.*}}expert_ids = array<i64: 0, 1, 2, 3>
// CHECK-LABEL: func.func @decode
// CHECK: kiln.moe {{.*}}expert_ids = array<i64: 0, 1, 2, 3>
// CHECK-NOT: kiln.weight_ref @e1.

// Two: experts 1 and 3 go, 1 into 2 and 3 into 0 (cosine 0.7 against 0.1); each
// kept expert's sum lists itself first.
// TWO: kiln.pruned_experts = {expert_ids = array<i64: 1, 3>, mass = array<f64: 2.000000e+00, 8.000000e+00>, merged_into = array<i64: 2, 0>
// TWO: kiln.weight @e0.g : tensor<8x16xf32> from #kiln.weighted_sum<[#kiln.source<"m.safetensors", offset = 256, {{.*}}>, #kiln.source<"m.safetensors", offset = 1792, {{.*}}>], weights = array<f64: 5.000000e-01, 5.000000e-01>>
// TWO: kiln.weight @e2.g : tensor<8x16xf32> from #kiln.weighted_sum<
// TWO-NOT: kiln.weight @e3.
// TWO: gate(%[[T0:[a-z0-9_]+]], %[[T2:[a-z0-9_]+]], %[[T2]], %[[T0]])

// Mixed: with merge-min-similarity=0.8, expert 1 still goes into 2 (0.9), but
// expert 3's nearest kept expert, 0, is only 0.7 alike: 3 is removed (its router
// row, its operands), and the similarity follows the router's rows.
// MIXED: remark: kiln-prune-experts: pruned expert 1 (selected by 5 of 100 tokens, 1.0% of the gate mass) merged into expert 2 (cosine 0.900), expert 3 (selected by 25 of 100 tokens, 4.0% of the gate mass) removed: the nearest kept expert, 0, has cosine 0.700 < 0.80; kept 2 of 4
// MIXED: kiln.weight @r : tensor<3x16xf32> from #kiln.slice<{{.*}}, offsets = [0, 0], sizes = [3, 16]>
// MIXED-SAME: merged_into = array<i64: 2, -1>
// MIXED-SAME: kiln.routing = {mass = array<f64: 6.000000e+01, 2.000000e+00, 1.300000e+02>, selected = array<i64: 90, 5, 80>, similarity = array<f64: 1.000000e+00, 2.000000e-01, 3.000000e-01, 2.000000e-01, 1.000000e+00, 9.000000e-01, 3.000000e-01, 9.000000e-01, 1.000000e+00>
// MIXED-NOT: kiln.weight @e3.
// MIXED: gate(%[[M0:[a-z0-9_]+]], %[[M2:[a-z0-9_]+]], %[[M2]]) {{.*}}expert_ids = array<i64: 0, 1, 2>

// NONE-NOT: weighted_sum
// NONE-NOT: kiln.pruned_experts

// A merge, then a removal: the removal takes the row with the least mass, which is
// expert 1's (merged, its row still routing to expert 2). The record lists expert 1
// for both rounds: merged into 2, then removed (-1).
// THEN-DROP: kiln.weight @r : tensor<3x16xf32>
// THEN-DROP-SAME: kiln.pruned_experts = {expert_ids = array<i64: 1, 1>, mass = array<f64: 2.000000e+00, 2.000000e+00>, merged_into = array<i64: 2, -1>

// TWICE: error: kiln-prune-experts: the experts of r were merged already (experts 1 and 2 share their weights)

// expected-remark @below {{kiln-prune-experts: pruned expert 1 (selected by 5 of 100 tokens, 1.0% of the gate mass) merged into expert 2 (cosine 0.900); kept 3 of 4}}
kiln.weight @r : tensor<4x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 256, dtype = "F32"> as #kiln.encoding<f32> {kiln.routing = {tokens = 100 : i64, selected = array<i64: 90, 5, 80, 25>, mass = array<f64: 60.0, 2.0, 130.0, 8.0>, similarity = array<f64: 1.0, 0.2, 0.3, 0.7, 0.2, 1.0, 0.9, 0.5, 0.3, 0.9, 1.0, 0.1, 0.7, 0.5, 0.1, 1.0>}}
kiln.weight @e0.g : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @e0.u : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @e0.d : tensor<16x8xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @e1.g : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 768, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @e1.u : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 768, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @e1.d : tensor<16x8xf32> from #kiln.source<"m.safetensors", offset = 768, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @e2.g : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 1280, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @e2.u : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 1280, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @e2.d : tensor<16x8xf32> from #kiln.source<"m.safetensors", offset = 1280, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @e3.g : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 1792, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @e3.u : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 1792, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @e3.d : tensor<16x8xf32> from #kiln.source<"m.safetensors", offset = 1792, size = 512, dtype = "F32"> as #kiln.encoding<f32>
func.func @prefill(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %r = kiln.weight_ref @r : tensor<4x16xf32>
  %g0 = kiln.weight_ref @e0.g : tensor<8x16xf32>
  %u0 = kiln.weight_ref @e0.u : tensor<8x16xf32>
  %d0 = kiln.weight_ref @e0.d : tensor<16x8xf32>
  %g1 = kiln.weight_ref @e1.g : tensor<8x16xf32>
  %u1 = kiln.weight_ref @e1.u : tensor<8x16xf32>
  %d1 = kiln.weight_ref @e1.d : tensor<16x8xf32>
  %g2 = kiln.weight_ref @e2.g : tensor<8x16xf32>
  %u2 = kiln.weight_ref @e2.u : tensor<8x16xf32>
  %d2 = kiln.weight_ref @e2.d : tensor<16x8xf32>
  %g3 = kiln.weight_ref @e3.g : tensor<8x16xf32>
  %u3 = kiln.weight_ref @e3.u : tensor<8x16xf32>
  %d3 = kiln.weight_ref @e3.d : tensor<16x8xf32>
  %y = kiln.moe %x, %r gate(%g0, %g1, %g2, %g3) up(%u0, %u1, %u2, %u3) down(%d0, %d1, %d2, %d3) {top_k = 2 : i64, normalize_top_k = true, activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 1, 2, 3>, kiln.kernel = "k"} : tensor<?x16xf32>, tensor<4x16xf32>, (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>), (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>), (tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}
func.func @decode(%x: tensor<1x16xf32>) -> tensor<1x16xf32> attributes {kiln.stage = #kiln.stage<decoder_decode>} {
  %r = kiln.weight_ref @r : tensor<4x16xf32>
  %g0 = kiln.weight_ref @e0.g : tensor<8x16xf32>
  %u0 = kiln.weight_ref @e0.u : tensor<8x16xf32>
  %d0 = kiln.weight_ref @e0.d : tensor<16x8xf32>
  %g1 = kiln.weight_ref @e1.g : tensor<8x16xf32>
  %u1 = kiln.weight_ref @e1.u : tensor<8x16xf32>
  %d1 = kiln.weight_ref @e1.d : tensor<16x8xf32>
  %g2 = kiln.weight_ref @e2.g : tensor<8x16xf32>
  %u2 = kiln.weight_ref @e2.u : tensor<8x16xf32>
  %d2 = kiln.weight_ref @e2.d : tensor<16x8xf32>
  %g3 = kiln.weight_ref @e3.g : tensor<8x16xf32>
  %u3 = kiln.weight_ref @e3.u : tensor<8x16xf32>
  %d3 = kiln.weight_ref @e3.d : tensor<16x8xf32>
  %y = kiln.moe %x, %r gate(%g0, %g1, %g2, %g3) up(%u0, %u1, %u2, %u3) down(%d0, %d1, %d2, %d3) {top_k = 2 : i64, normalize_top_k = true, activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 1, 2, 3>} : tensor<1x16xf32>, tensor<4x16xf32>, (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>), (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>), (tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<1x16xf32>
  return %y : tensor<1x16xf32>
}
