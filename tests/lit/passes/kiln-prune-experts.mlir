// RUN: kiln-opt %s -split-input-file --kiln-prune-experts=prune=1 | FileCheck %s
// RUN: kiln-opt %s -split-input-file --kiln-prune-experts=prune=1 -verify-diagnostics > /dev/null
// RUN: kiln-opt %s -split-input-file --kiln-prune-experts=prune=50% | FileCheck %s --check-prefix=HALF
// RUN: kiln-opt %s -split-input-file --kiln-prune-experts=prune=0.25 | FileCheck %s --check-prefix=QUARTER
// RUN: kiln-opt %s -split-input-file --kiln-prune-experts=prune=0 | FileCheck %s --check-prefix=NONE
// RUN: kiln-opt %s --kiln-prune-experts=prune=1 --kiln-prune-experts=prune=1 | FileCheck %s --check-prefix=TWICE
// RUN: not kiln-opt %s --kiln-prune-experts=prune=3 2>&1 | FileCheck %s --check-prefix=TOPK
// RUN: not kiln-opt %s --kiln-prune-experts=prune=many 2>&1 | FileCheck %s --check-prefix=SPEC

// A 4-expert top-2 layer read by prefill and decode. Expert 1 has the least gate
// mass: prune=1 removes it, its three weights leave the module, the router keeps
// rows 0 and 2-3 (two slices of the checkpoint tensor), expert_ids follow, and the
// statistics of the pruned expert are recorded on the router.
// CHECK: kiln.weight @r : tensor<3x16xf32> from #kiln.concat<axis = 0, [#kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 256, dtype = "F32", shape = [4, 16]>, offsets = [0, 0], sizes = [1, 16]>, #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 256, dtype = "F32", shape = [4, 16]>, offsets = [2, 0], sizes = [2, 16]>]> as <f32>
// CHECK-SAME: kiln.pruned_experts = {expert_ids = array<i64: 1>, mass = array<f64: 2.000000e+00>, selected = array<i64: 5>, tokens = 100 : i64}
// CHECK-SAME: kiln.routing = {mass = array<f64: 6.000000e+01, 1.300000e+02, 8.000000e+00>, selected = array<i64: 90, 80, 25>, tokens = 100 : i64}
// CHECK-NOT: kiln.weight @e1.
// CHECK: kiln.weight @e2.g
// CHECK-LABEL: func.func @prefill
// CHECK: %[[R:.*]] = kiln.weight_ref @r : tensor<3x16xf32>
// CHECK: kiln.moe %arg0, %[[R]] gate(%{{.*}}, %{{.*}}, %{{.*}}) up(%{{.*}}, %{{.*}}, %{{.*}}) down(%{{.*}}, %{{.*}}, %{{.*}}) {activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 2, 3>, kiln.kernel = "k", normalize_top_k = true, top_k = 2 : i64} : tensor<?x16xf32>, tensor<3x16xf32>
// CHECK-LABEL: func.func @decode
// CHECK: kiln.moe {{.*}}expert_ids = array<i64: 0, 2, 3>
// CHECK-NOT: kiln.weight_ref @e1.

// Half: experts 1 and 3 (the least mass) go; the router keeps rows 0 and 2.
// HALF: kiln.weight @r : tensor<2x16xf32> from #kiln.concat<axis = 0, [#kiln.slice<{{.*}}, offsets = [0, 0], sizes = [1, 16]>, #kiln.slice<{{.*}}, offsets = [2, 0], sizes = [1, 16]>]>
// HALF-SAME: kiln.pruned_experts = {expert_ids = array<i64: 1, 3>
// HALF: expert_ids = array<i64: 0, 2>
// A quarter of 4 is one expert.
// QUARTER: kiln.weight @r : tensor<3x16xf32>
// QUARTER: expert_ids = array<i64: 0, 2, 3>
// Pruned twice: the second round slices the first's router (rows 0 and 2 of the
// original), and the record lists both rounds' experts.
// TWICE: kiln.weight @r : tensor<2x16xf32> from #kiln.slice<#kiln.concat<
// TWICE-SAME: kiln.pruned_experts = {expert_ids = array<i64: 1, 3>, mass = array<f64: 2.000000e+00, 8.000000e+00>, selected = array<i64: 5, 25>, tokens = 100 : i64}
// TWICE: expert_ids = array<i64: 0, 2>
// NONE: kiln.weight @r : tensor<4x16xf32> from <"m.safetensors", offset = 0, size = 256, dtype = "F32">
// NONE-NOT: kiln.pruned_experts
// NONE: expert_ids = array<i64: 0, 1, 2, 3>
// TOPK: error: kiln-prune-experts: pruning 3 of the 4 experts of r leaves fewer than top_k = 2
// SPEC: error: kiln-prune-experts: prune must be a count (2), a fraction (0.25) or a percentage (25%), got 'many'

// expected-remark @below {{kiln-prune-experts: pruned expert 1 (selected by 5 of 100 tokens, 1.0% of the gate mass); kept 3 of 4}}
kiln.weight @r : tensor<4x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 256, dtype = "F32"> as #kiln.encoding<f32> {kiln.routing = {tokens = 100 : i64, selected = array<i64: 90, 5, 80, 25>, mass = array<f64: 60.0, 2.0, 130.0, 8.0>}}
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
