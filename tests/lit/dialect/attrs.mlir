// RUN: kiln-opt %s | FileCheck %s
// RUN: kiln-opt %s | kiln-opt | FileCheck %s

// CHECK: as <f32>
kiln.weight @a : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16, dtype = "F32"> as #kiln.encoding<f32>
// CHECK: as <fp8_e5m2>
kiln.weight @b : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 16, size = 16, dtype = "F32"> as #kiln.encoding<fp8_e5m2>
// CHECK: as <int8, act = int8_per_token>
kiln.weight @c : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 32, size = 16, dtype = "F32"> as #kiln.encoding<int8, act = int8_per_token>
// CHECK: as <int4, group = 128>
kiln.weight @d : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 48, size = 16, dtype = "F32"> as #kiln.encoding<int4, group = 128>
// CHECK: as <int4, group = 64, asym>
kiln.weight @e : tensor<4xf32> from #kiln.source<"m.safetensors", offset = 64, size = 16, dtype = "F32"> as #kiln.encoding<int4, group = 64, asym>
// CHECK: func.func private @stages() attributes {kiln.stage = #kiln.stage<lm_head>}
func.func private @stages() attributes {kiln.stage = #kiln.stage<lm_head>}
