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

// expected-error @+1 {{attribute 'kiln.text' lacks the field 'head_dim'}}
module attributes {kiln.text = {vocab_size = 8 : i64, hidden_size = 4 : i64, num_layers = 1 : i64, num_heads = 1 : i64, num_kv_heads = 1 : i64, max_position_embeddings = 16 : i64}} {}

// -----

// expected-error @+1 {{attribute 'kiln.text': vocab_size must be an integer}}
module attributes {kiln.text = {vocab_size = "8", hidden_size = 4 : i64}} {}

// -----

// expected-error @+1 {{attribute 'kiln.generation' has an unknown field 'eos'}}
module attributes {kiln.generation = {eos = array<i64: 2>}} {}

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
