// RUN: kiln-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{int4 needs group = 32, 64 or 128, got 0}}
kiln.weight @w : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16, dtype = "F32"> as #kiln.encoding<int4>

// -----

// expected-error @+1 {{int4 needs group = 32, 64 or 128, got 48}}
kiln.weight @w : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16, dtype = "F32"> as #kiln.encoding<int4, group = 48>

// -----

// expected-error @+1 {{group size applies to int4 only}}
kiln.weight @w : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16, dtype = "F32"> as #kiln.encoding<int8, group = 32>

// -----

// expected-error @+1 {{asymmetric (zero-point) storage applies to int4 only}}
kiln.weight @w : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16, dtype = "F32"> as #kiln.encoding<int8, asym>

// -----

// expected-error @+1 {{int8 activations need an int8 or int4 weight encoding}}
kiln.weight @w : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16, dtype = "F32"> as #kiln.encoding<f16, act = int8_per_token>

// -----

// expected-error @+1 {{unknown encoding 'int3'; expected f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8 or int4}}
kiln.weight @w : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16, dtype = "F32"> as #kiln.encoding<int3>

// -----

// expected-error @+1 {{unknown encoding parameter 'scale'}}
kiln.weight @w : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16, dtype = "F32"> as #kiln.encoding<int4, group = 32, scale>

// -----

// expected-error @+1 {{unknown activation mode 'fp8'}}
kiln.weight @w : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16, dtype = "F32"> as #kiln.encoding<int4, group = 32, act = fp8>

// -----

// expected-error @+1 {{a KV cache is f32, f16, int8 or int4, not bf16}}
module attributes {kiln.kv_cache = #kiln.kv_cache<bf16>} {}

// -----

// expected-error @+1 {{an int8 KV cache needs a positive group (at most 65536), got 0}}
module attributes {kiln.kv_cache = #kiln.kv_cache<int8>} {}

// -----

// expected-error @+1 {{an int4 KV cache needs a positive even group (at most 65536), got 7}}
module attributes {kiln.kv_cache = #kiln.kv_cache<int4, group = 7>} {}

// -----

// expected-error @+1 {{a f16 KV cache has no group}}
module attributes {kiln.kv_cache = #kiln.kv_cache<f16, group = 32>} {}
