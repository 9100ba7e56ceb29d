// RUN: kiln-opt %s -split-input-file -verify-diagnostics

// Every check of weight expressions: the attribute verifiers (at parse time, on the
// weight's line) and WeightOp::verify (which names the weight).

// expected-error @+1 {{concat operand 1 has rank 1 but operand 0 has rank 2}}
kiln.weight @w : tensor<24x32xf32> from #kiln.concat<axis = 0, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32", shape = [32]>]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{concat operand 1 has shape [8, 16], which differs from operand 0's [16, 32] outside axis 0}}
kiln.weight @w : tensor<24x32xf32> from #kiln.concat<axis = 0, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 0, size = 512, dtype = "F32", shape = [8, 16]>]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{concat axis 2 is out of range for rank 2}}
kiln.weight @w : tensor<16x32xf32> from #kiln.concat<axis = 2, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{concat axis -1 is out of range for rank 2}}
kiln.weight @w : tensor<16x32xf32> from #kiln.concat<axis = -1, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{concat operand 1 has dtype F16 but operand 0 has F32 (the leaves of a weight share one dtype)}}
kiln.weight @w : tensor<24x32xf32> from #kiln.concat<axis = 0, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 0, size = 512, dtype = "F16", shape = [8, 32]>]> as #kiln.encoding<f32>

// -----

// A mixed-dtype concat deeper in the expression.
// expected-error @+2 {{concat operand 1 has dtype BF16 but operand 0 has F32}}
// expected-error @+1 {{failed to parse Kiln_PermuteAttr parameter 'operand'}}
kiln.weight @w : tensor<32x16xf32> from #kiln.permute<#kiln.concat<axis = 1, [#kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F32", shape = [16, 16]>, #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "BF16", shape = [16, 32]>, offsets = [0, 0], sizes = [16, 16]>]>, dims = [1, 0]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{concat operand 0 is not a weight expression (#kiln.source, #kiln.concat, #kiln.slice, #kiln.permute or #kiln.weighted_sum)}}
kiln.weight @w : tensor<16x32xf32> from #kiln.concat<axis = 0, [1 : i64]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{concat operand 1 has no shape: a #kiln.source inside a transform needs shape = [...]}}
kiln.weight @w : tensor<24x32xf32> from #kiln.concat<axis = 0, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F32">]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{slice offsets [0, 24] and sizes [16, 16] exceed operand shape [16, 32] in dimension 1}}
kiln.weight @w : tensor<16x16xf32> from #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, offsets = [0, 24], sizes = [16, 16]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{slice offsets [-1, 0] and sizes [16, 16] exceed operand shape [16, 32] in dimension 0}}
kiln.weight @w : tensor<16x16xf32> from #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, offsets = [-1, 0], sizes = [16, 16]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{slice offsets [0, 0] and sizes [0, 16] exceed operand shape [16, 32] in dimension 0}}
kiln.weight @w : tensor<16x16xf32> from #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, offsets = [0, 0], sizes = [0, 16]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{slice has 1 offsets and 2 sizes for an operand of rank 2}}
kiln.weight @w : tensor<16x16xf32> from #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, offsets = [0], sizes = [16, 16]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{slice operand 0 has no shape: a #kiln.source inside a transform needs shape = [...]}}
kiln.weight @w : tensor<16x16xf32> from #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32">, offsets = [0, 0], sizes = [16, 16]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{permute dims [0, 0] are not a permutation of [0, 2)}}
kiln.weight @w : tensor<16x32xf32> from #kiln.permute<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, dims = [0, 0]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{permute dims [1, 2] are not a permutation of [0, 2)}}
kiln.weight @w : tensor<32x16xf32> from #kiln.permute<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, dims = [1, 2]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{permute dims [1] are not a permutation of [0, 2)}}
kiln.weight @w : tensor<32x16xf32> from #kiln.permute<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, dims = [1]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{permute operand 0 is not a weight expression}}
kiln.weight @w : tensor<32x16xf32> from #kiln.permute<"x", dims = [1, 0]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{source size 2000 bytes does not match shape [16, 32] of F32 (2048 bytes)}}
kiln.weight @w : tensor<16x32xf32> from #kiln.source<"m.safetensors", offset = 0, size = 2000, dtype = "F32", shape = [16, 32]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{source dtype I64 is not F32, F16 or BF16}}
kiln.weight @w : tensor<16x32xf32> from #kiln.source<"m.safetensors", offset = 0, size = 4096, dtype = "I64", shape = [16, 32]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{source shape [16, 0] has a dimension below 1}}
kiln.weight @w : tensor<16x0xf32> from #kiln.source<"m.safetensors", offset = 0, size = 0, dtype = "F32", shape = [16, 0]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{source offset + size overflows}}
kiln.weight @w : tensor<16x32xf32> from #kiln.source<"m.safetensors", offset = 18446744073709551600, size = 2048, dtype = "F32", shape = [16, 32]> as #kiln.encoding<f32>

// -----

// The expression against the weight's type: errors name the weight.

// expected-error @+1 {{'kiln.weight' op weight 'w': expression shape [16, 32] does not match 'tensor<32x16xf32>'}}
kiln.weight @w : tensor<32x16xf32> from #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, offsets = [0, 0], sizes = [16, 32]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{'kiln.weight' op weight 'qk': expression shape [32, 32] does not match 'tensor<24x32xf32>'}}
kiln.weight @qk : tensor<24x32xf32> from #kiln.concat<axis = 0, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 2048, size = 2048, dtype = "F32", shape = [16, 32]>]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{'kiln.weight' op weight 'w': source dtype F16 does not match element type 'bf16'}}
kiln.weight @w : tensor<32x16xbf16> from #kiln.permute<#kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F16", shape = [16, 32]>, dims = [1, 0]> as #kiln.encoding<bf16>

// -----

// A plain source may state its shape; it must be the weight's.
// expected-error @+1 {{'kiln.weight' op weight 'w': expression shape [8, 4] does not match 'tensor<4x8xf32>'}}
kiln.weight @w : tensor<4x8xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32", shape = [8, 4]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{expected a weight expression (#kiln.source, #kiln.concat, #kiln.slice, #kiln.permute or #kiln.weighted_sum), got #kiln.encoding<f32>}}
kiln.weight @w : tensor<4x8xf32> from #kiln.encoding<f32> as #kiln.encoding<f32>

// -----

// An unknown layout.
// expected-error @+2 {{expected ::kiln::LayoutKind to be one of: row_major, panel16, int4_p16k8, int8_p16k4, int4_p128k4, int4_p16k16}}
// expected-error @+1 {{failed to parse Kiln_LayoutAttr parameter 'value'}}
kiln.weight @w : tensor<4x8xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32> layout #kiln.layout<tiled>

// -----

// int4_p16k8 holds symmetric int4 only, with a group that is a multiple of 8.
// expected-error @+1 {{'kiln.weight' op weight 'w': layout int4_p16k8 needs symmetric int4 with a group that is a multiple of 8 and divides the input dimension, got #kiln.encoding<int8>}}
kiln.weight @w : tensor<4x32xf32> from #kiln.source<"m.safetensors", offset = 0, size = 512, dtype = "F32"> as #kiln.encoding<int8> layout #kiln.layout<int4_p16k8>

// -----

// expected-error @+1 {{layout int4_p16k8 needs symmetric int4}}
kiln.weight @w : tensor<4x32xf32> from #kiln.source<"m.safetensors", offset = 0, size = 512, dtype = "F32"> as #kiln.encoding<int4, group = 32, asym> layout #kiln.layout<int4_p16k8>

// -----

// int4_p128k4 holds symmetric int4 only, with a group that is a multiple of 4.
// expected-error @+1 {{'kiln.weight' op weight 'w': layout int4_p128k4 needs symmetric int4 with a group that is a multiple of 4 and divides the input dimension, got #kiln.encoding<int8> for 'tensor<4x32xf32>'}}
kiln.weight @w : tensor<4x32xf32> from #kiln.source<"m.safetensors", offset = 0, size = 512, dtype = "F32"> as #kiln.encoding<int8> layout #kiln.layout<int4_p128k4>

// -----

// expected-error @+1 {{layout int4_p128k4 needs symmetric int4}}
kiln.weight @w : tensor<4x32xf32> from #kiln.source<"m.safetensors", offset = 0, size = 512, dtype = "F32"> as #kiln.encoding<int4, group = 32, asym> layout #kiln.layout<int4_p128k4>

// -----

// int4_p16k16 holds symmetric int4 with a group that is a multiple of 16, in whole
// panels of 16 rows.
// expected-error @+1 {{'kiln.weight' op weight 'w': layout int4_p16k16 needs symmetric int4 with a group that is a multiple of 16 and divides the input dimension, and rows a multiple of 16, got #kiln.encoding<int4, group = 32> for 'tensor<8x32xf32>'}}
kiln.weight @w : tensor<8x32xf32> from #kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F32"> as #kiln.encoding<int4, group = 32> layout #kiln.layout<int4_p16k16>

// -----

// expected-error @+1 {{layout int4_p16k16 needs symmetric int4}}
kiln.weight @w : tensor<16x32xf32> from #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32"> as #kiln.encoding<int4, group = 32, asym> layout #kiln.layout<int4_p16k16>

// -----

// int8_p16k4 holds int8 whose input dimension is a multiple of 4.
// expected-error @+1 {{layout int8_p16k4 needs int8 with an input dimension that is a multiple of 4, got #kiln.encoding<int8> for 'tensor<4x30xf32>'}}
kiln.weight @w : tensor<4x30xf32> from #kiln.source<"m.safetensors", offset = 0, size = 480, dtype = "F32"> as #kiln.encoding<int8> layout #kiln.layout<int8_p16k4>

// -----

// panel16 holds float and fp8 weights.
// expected-error @+1 {{'kiln.weight' op weight 'w': layout panel16 needs f32, f16, bf16 or fp8, got #kiln.encoding<int8>}}
kiln.weight @w : tensor<4x32xf32> from #kiln.source<"m.safetensors", offset = 0, size = 512, dtype = "F32"> as #kiln.encoding<int8> layout #kiln.layout<panel16>


// -----

// Interleaved operands have one shape.
// expected-error @+1 {{concat operand 1 has 8 elements along axis 0 but operand 0 has 16 (interleaved in blocks of 4, the operands have the same shape)}}
kiln.weight @w : tensor<24x32xf32> from #kiln.concat<axis = 0, block = 4, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F32", shape = [8, 32]>]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{concat block -1 is negative}}
kiln.weight @w : tensor<32x32xf32> from #kiln.concat<axis = 0, block = -1, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>]> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{weighted_sum operand 1 has shape [8, 32] but operand 0 has [16, 32]}}
kiln.weight @w : tensor<16x32xf32> from #kiln.weighted_sum<[#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F32", shape = [8, 32]>], weights = array<f64: 0.5, 0.5>> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{weighted_sum has 1 weights for 2 operands}}
kiln.weight @w : tensor<16x32xf32> from #kiln.weighted_sum<[#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 2048, size = 2048, dtype = "F32", shape = [16, 32]>], weights = array<f64: 1.0>> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{weighted_sum operand 1 has dtype F16 but operand 0 has F32 (the leaves of a weight share one dtype)}}
kiln.weight @w : tensor<16x32xf32> from #kiln.weighted_sum<[#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F16", shape = [16, 32]>], weights = array<f64: 0.5, 0.5>> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{weighted_sum weight 1 is not finite}}
kiln.weight @w : tensor<16x32xf32> from #kiln.weighted_sum<[#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 2048, size = 2048, dtype = "F32", shape = [16, 32]>], weights = array<f64: 0.5, 0x7FF0000000000000>> as #kiln.encoding<f32>

// -----

// The weight's own shape check covers the sum's.
// expected-error @+1 {{'kiln.weight' op weight 'w': expression shape [16, 32] does not match 'tensor<32x16xf32>'}}
kiln.weight @w : tensor<32x16xf32> from #kiln.weighted_sum<[#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>], weights = array<f64: 1.0>> as #kiln.encoding<f32>

// -----

// expected-error @+1 {{weighted_sum weights must be an array<f64: ...>}}
kiln.weight @w : tensor<16x32xf32> from #kiln.weighted_sum<[#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>], weights = [1.0]> as #kiln.encoding<f32>
