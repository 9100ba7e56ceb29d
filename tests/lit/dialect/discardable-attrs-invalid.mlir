// RUN: kiln-opt %s -split-input-file -verify-diagnostics

// Every kiln.* attribute is typed and checked where it appears.

// expected-error @+1 {{unknown attribute 'kiln.banana'}}
module attributes {kiln.banana = 1 : i64} {}

// -----

// expected-error @+1 {{attribute 'kiln.max_prefill_tokens' must be an i64 integer}}
module attributes {kiln.max_prefill_tokens = "oops"} {}

// -----

// expected-error @+1 {{attribute 'kiln.prompt_template' must be one of llava, llava-chatml, idefics3, plain}}
module attributes {kiln.prompt_template = "vicuna"} {}

// -----

// The module configuration is typed: a dictionary is refused.
// expected-error @+1 {{attribute 'kiln.text' must be a #kiln.text_config<...>}}
module attributes {kiln.text = {vocab_size = 8 : i64, hidden_size = 4 : i64}} {}

// -----

// expected-error @+1 {{struct is missing required parameter: head_dim}}
module attributes {kiln.text = #kiln.text_config<vocab_size = 8, hidden_size = 4, num_layers = 1, num_heads = 1, num_kv_heads = 1, max_position_embeddings = 16>} {}

// -----

// expected-error @+1 {{num_heads (6) must be a multiple of num_kv_heads (4)}}
module attributes {kiln.text = #kiln.text_config<vocab_size = 8, hidden_size = 24, num_layers = 1, num_heads = 6, num_kv_heads = 4, head_dim = 4, max_position_embeddings = 16>} {}

// -----

// expected-error @+1 {{vocab_size must be at least 1, got 0}}
module attributes {kiln.text = #kiln.text_config<vocab_size = 0, hidden_size = 4, num_layers = 1, num_heads = 1, num_kv_heads = 1, head_dim = 4, max_position_embeddings = 16>} {}

// -----

// expected-error @+1 {{attribute 'kiln.text' must be a #kiln.text_config<...>}}
module attributes {kiln.text = #kiln.image_config<image_size = 32, channels = 3, image_tokens = 16, image_token_id = 480>} {}

// -----

// expected-error @+1 {{attribute 'kiln.text' belongs on the module}}
func.func private @f() attributes {kiln.text = #kiln.text_config<vocab_size = 8, hidden_size = 4, num_layers = 1, num_heads = 1, num_kv_heads = 1, head_dim = 4, max_position_embeddings = 16>}

// -----

// expected-error @+1 {{duplicate or unknown struct parameter name: eos}}
module attributes {kiln.generation = #kiln.generation_config<eos = [2]>} {}

// -----

// expected-error @+1 {{top_p must lie in (0, 1]}}
module attributes {kiln.generation = #kiln.generation_config<eos_token_ids = [2], top_p = 1.5>} {}

// -----

// expected-error @+1 {{image_mean and image_std need one value per channel (got 3 and 2)}}
module attributes {kiln.preprocessor = #kiln.preprocessor_config<processor = "CLIPImageProcessor", do_convert_rgb = true, do_resize = true, shortest_edge = 32, longest_edge = 0, resample = 3, do_center_crop = true, crop_size = [32, 32], do_rescale = true, rescale_factor = 0.00392, do_normalize = true, image_mean = [0.5, 0.5, 0.5], image_std = [0.5, 0.5], max_image_edge = 0>} {}

// -----

// expected-error @+1 {{processor must be CLIPImageProcessor or Idefics3ImageProcessor, got 'BlipImageProcessor'}}
module attributes {kiln.preprocessor = #kiln.preprocessor_config<processor = "BlipImageProcessor", do_convert_rgb = true, do_resize = true, shortest_edge = 32, longest_edge = 0, resample = 3, do_center_crop = true, crop_size = [32, 32], do_rescale = true, rescale_factor = 0.00392, do_normalize = true, image_mean = [0.5], image_std = [0.5], max_image_edge = 0>} {}

// -----

// expected-error @+1 {{image_token_id must be at least 0, got -1}}
module attributes {kiln.image = #kiln.image_config<image_size = 32, channels = 3, image_tokens = 16, image_token_id = -1>} {}

// -----

// expected-error @+1 {{attribute 'kiln.target' must be a #kiln.target<...>}}
module attributes {kiln.target = {triple = "x86_64-linux-gnu", features = "", generate = true}} {}

// -----

// expected-error @+1 {{triple must name an LLVM target triple}}
module attributes {kiln.target = #kiln.target<triple = "", features = "", generate = true>} {}

// -----

func.func @stage(%a: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kiln.stage = #kiln.stage<projector>} {
  // expected-error @+1 {{attribute 'kiln.kernel' must be a non-empty string}}
  %y = kiln.add %a, %a {kiln.kernel = 42 : i64} : tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

func.func @stage(%a: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kiln.stage = #kiln.stage<projector>} {
  // expected-error @+1 {{attribute 'kiln.offset' must be an i64 integer}}
  %y = kiln.add %a, %a {kiln.offset = "oops"} : tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

func.func @stage(%a: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kiln.stage = #kiln.stage<projector>} {
  // expected-error @+1 {{attribute 'kiln.offset' must be a multiple of 64 and at least 0, got 65}}
  %y = kiln.add %a, %a {kiln.offset = 65 : i64} : tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

// A kernel binding outside a stage function means nothing.
func.func @helper(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{attribute 'kiln.kernel' belongs on a kiln op inside a stage function}}
  %y = kiln.add %a, %a {kiln.kernel = "add_f32_f32_f32_ref_portable"} : tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

// expected-error @+1 {{attribute 'kiln.stage' must be a #kiln.stage<...> on a func.func}}
func.func @f() attributes {kiln.stage = "vision"} {
  return
}

// -----

// expected-error @+1 {{attribute 'kiln.sensitivity': unknown encoding 'int3'}}
kiln.weight @w : tensor<4x4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 64, dtype = "F32"> as #kiln.encoding<f32> {kiln.sensitivity = {int3 = 1.0 : f64}}

// -----

// expected-error @+1 {{attribute 'kiln.sensitivity': 'int8' must be a non-negative float}}
kiln.weight @w : tensor<4x4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 64, dtype = "F32"> as #kiln.encoding<f32> {kiln.sensitivity = {int8 = -1.0 : f64}}

// -----

// expected-error @+1 {{attribute 'kiln.arena_bytes' belongs on a stage function}}
func.func @f() attributes {kiln.arena_bytes = 64 : i64} {
  return
}

// -----

// Routing statistics: per-expert arrays of one length, on a weight.
// expected-error @+1 {{attribute 'kiln.routing' has 2 selections and 3 masses}}
kiln.weight @r : tensor<2x4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 32, dtype = "F32"> as #kiln.encoding<f32> {kiln.routing = {tokens = 3 : i64, selected = array<i64: 1, 2>, mass = array<f64: 1.0, 1.0, 1.0>}}

// -----

// expected-error @+1 {{attribute 'kiln.routing' must be {tokens = N, selected = array<i64>, mass = array<f64>, optional similarity = array<f64>} on a kiln.weight}}
kiln.weight @r : tensor<2x4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 32, dtype = "F32"> as #kiln.encoding<f32> {kiln.routing = {tokens = 3 : i64, selected = [1, 2], mass = array<f64: 1.0, 1.0>}}

// -----

// expected-error @+1 {{attribute 'kiln.pruned_experts' has 1 expert ids and 2 selections}}
kiln.weight @r : tensor<2x4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 32, dtype = "F32"> as #kiln.encoding<f32> {kiln.pruned_experts = {expert_ids = array<i64: 3>, tokens = 3 : i64, selected = array<i64: 1, 2>, mass = array<f64: 1.0, 1.0>}}

// -----

// expected-error @+1 {{attribute 'kiln.routing': expert 1 has selections 2 and mass -1.000000e+00 (counts and masses are finite and non-negative)}}
kiln.weight @r : tensor<2x4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 32, dtype = "F32"> as #kiln.encoding<f32> {kiln.routing = {tokens = 3 : i64, selected = array<i64: 1, 2>, mass = array<f64: 1.0, -1.0>}}
