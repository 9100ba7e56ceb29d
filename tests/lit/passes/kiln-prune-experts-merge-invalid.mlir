// RUN: kiln-opt %s -split-input-file --kiln-prune-experts="prune=1 merge=true" -verify-diagnostics

// Merging needs the experts' similarity: an error naming the router.
// expected-error @below {{kiln-prune-experts: merging the experts of r2 needs their similarity (kiln.routing's similarity, measured by calibration: kiln-compile --prune-experts-merge runs it)}}
kiln.weight @r2 : tensor<2x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32> {kiln.routing = {tokens = 4 : i64, selected = array<i64: 1, 3>, mass = array<f64: 1.0, 3.0>}}
kiln.weight @g0 : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @g1 : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 768, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @d : tensor<16x8xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
func.func @nosimilarity(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %r = kiln.weight_ref @r2 : tensor<2x16xf32>
  %g0 = kiln.weight_ref @g0 : tensor<8x16xf32>
  %g1 = kiln.weight_ref @g1 : tensor<8x16xf32>
  %d = kiln.weight_ref @d : tensor<16x8xf32>
  %y = kiln.moe %x, %r gate(%g0, %g1) up(%g0, %g1) down(%d, %d) {top_k = 1 : i64, normalize_top_k = true, activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 1>} : tensor<?x16xf32>, tensor<2x16xf32>, (tensor<8x16xf32>, tensor<8x16xf32>), (tensor<8x16xf32>, tensor<8x16xf32>), (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}

// -----

// A similarity of the wrong size is refused where the attribute is.
// expected-error @below {{'kiln.weight' op attribute 'kiln.routing' has 3 similarities for 2 experts (expected 4)}}
kiln.weight @r3 : tensor<2x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32> {kiln.routing = {tokens = 4 : i64, selected = array<i64: 1, 3>, mass = array<f64: 1.0, 3.0>, similarity = array<f64: 1.0, 0.5, 0.5>}}

// -----

// A merged_into that does not match the record's experts.
// expected-error @below {{'kiln.weight' op attribute 'kiln.pruned_experts' has 1 expert ids and 2 merged_into entries}}
kiln.weight @r4 : tensor<2x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32> {kiln.pruned_experts = {expert_ids = array<i64: 2>, tokens = 4 : i64, selected = array<i64: 1>, mass = array<f64: 1.0>, merged_into = array<i64: 0, 1>}}

// -----

// Routing weights not renormalised and no kept expert alike: nothing can go.
// expected-remark @below {{kiln-prune-experts: r5 not pruned: no chosen expert has a kept one alike enough to merge into, and its routing weights are not renormalised over the chosen experts, so removing one would change the others'}}
kiln.weight @r5 : tensor<2x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32> {kiln.routing = {tokens = 4 : i64, selected = array<i64: 1, 3>, mass = array<f64: 1.0, 3.0>, similarity = array<f64: 1.0, 0.1, 0.1, 1.0>}}
kiln.weight @g0 : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @g1 : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 768, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @d : tensor<16x8xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
func.func @unnormalised(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %r = kiln.weight_ref @r5 : tensor<2x16xf32>
  %g0 = kiln.weight_ref @g0 : tensor<8x16xf32>
  %g1 = kiln.weight_ref @g1 : tensor<8x16xf32>
  %d = kiln.weight_ref @d : tensor<16x8xf32>
  %y = kiln.moe %x, %r gate(%g0, %g1) up(%g0, %g1) down(%d, %d) {top_k = 1 : i64, normalize_top_k = false, activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 1>} : tensor<?x16xf32>, tensor<2x16xf32>, (tensor<8x16xf32>, tensor<8x16xf32>), (tensor<8x16xf32>, tensor<8x16xf32>), (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}

// -----

// Routing weights not renormalised, a kept expert alike: the merge keeps every router
// row, so it goes ahead.
// expected-remark @below {{kiln-prune-experts: pruned expert 0 (selected by 1 of 4 tokens, 25.0% of the gate mass) merged into expert 1 (cosine 0.900); kept 1 of 2}}
kiln.weight @r6 : tensor<2x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32> {kiln.routing = {tokens = 4 : i64, selected = array<i64: 1, 3>, mass = array<f64: 1.0, 3.0>, similarity = array<f64: 1.0, 0.9, 0.9, 1.0>}}
kiln.weight @g0 : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @g1 : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 768, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @d : tensor<16x8xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
func.func @unnormalised_alike(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %r = kiln.weight_ref @r6 : tensor<2x16xf32>
  %g0 = kiln.weight_ref @g0 : tensor<8x16xf32>
  %g1 = kiln.weight_ref @g1 : tensor<8x16xf32>
  %d = kiln.weight_ref @d : tensor<16x8xf32>
  %y = kiln.moe %x, %r gate(%g0, %g1) up(%g0, %g1) down(%d, %d) {top_k = 1 : i64, normalize_top_k = false, activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 1>} : tensor<?x16xf32>, tensor<2x16xf32>, (tensor<8x16xf32>, tensor<8x16xf32>), (tensor<8x16xf32>, tensor<8x16xf32>), (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}
