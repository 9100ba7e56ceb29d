// RUN: kiln-opt %s -split-input-file --kiln-prune-experts=prune=1 -verify-diagnostics

// No statistics: an error naming the router.
// expected-error @below {{kiln-prune-experts: router r2 has no routing statistics (kiln.routing, measured by calibration: kiln-compile --prune-experts runs it)}}
kiln.weight @r2 : tensor<2x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @g : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @d : tensor<16x8xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
func.func @nostats(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %r = kiln.weight_ref @r2 : tensor<2x16xf32>
  %g = kiln.weight_ref @g : tensor<8x16xf32>
  %d = kiln.weight_ref @d : tensor<16x8xf32>
  %y = kiln.moe %x, %r gate(%g, %g) up(%g, %g) down(%d, %d) {top_k = 1 : i64, normalize_top_k = true, activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 1>} : tensor<?x16xf32>, tensor<2x16xf32>, (tensor<8x16xf32>, tensor<8x16xf32>), (tensor<8x16xf32>, tensor<8x16xf32>), (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}

// -----

// Statistics of the wrong length.
// expected-error @below {{kiln-prune-experts: kiln.routing of r3 has 3 selections and 3 masses for 2 experts}}
kiln.weight @r3 : tensor<2x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32> {kiln.routing = {tokens = 4 : i64, selected = array<i64: 1, 2, 1>, mass = array<f64: 1.0, 3.0, 0.5>}}
kiln.weight @g : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @d : tensor<16x8xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
func.func @badstats(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %r = kiln.weight_ref @r3 : tensor<2x16xf32>
  %g = kiln.weight_ref @g : tensor<8x16xf32>
  %d = kiln.weight_ref @d : tensor<16x8xf32>
  %y = kiln.moe %x, %r gate(%g, %g) up(%g, %g) down(%d, %d) {top_k = 1 : i64, normalize_top_k = true, activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 1>} : tensor<?x16xf32>, tensor<2x16xf32>, (tensor<8x16xf32>, tensor<8x16xf32>), (tensor<8x16xf32>, tensor<8x16xf32>), (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}

// -----

// Routing weights not renormalised over the chosen experts: left alone.
// expected-remark @below {{kiln-prune-experts: r4 not pruned: its routing weights are not renormalised over the chosen experts, so removing one would change the others'}}
kiln.weight @r4 : tensor<2x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32> {kiln.routing = {tokens = 4 : i64, selected = array<i64: 1, 3>, mass = array<f64: 1.0, 3.0>}}
kiln.weight @g : tensor<8x16xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @d : tensor<16x8xf32> from #kiln.source<"m.safetensors", offset = 256, size = 512, dtype = "F32"> as #kiln.encoding<f32>
func.func @unnormalised(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %r = kiln.weight_ref @r4 : tensor<2x16xf32>
  %g = kiln.weight_ref @g : tensor<8x16xf32>
  %d = kiln.weight_ref @d : tensor<16x8xf32>
  %y = kiln.moe %x, %r gate(%g, %g) up(%g, %g) down(%d, %d) {top_k = 1 : i64, normalize_top_k = false, activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 1>} : tensor<?x16xf32>, tensor<2x16xf32>, (tensor<8x16xf32>, tensor<8x16xf32>), (tensor<8x16xf32>, tensor<8x16xf32>), (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}
