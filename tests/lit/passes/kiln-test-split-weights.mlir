// RUN: kiln-opt %s --kiln-test-split-weights | FileCheck %s
// The result verifies and round-trips.
// RUN: kiln-opt %s --kiln-test-split-weights | kiln-opt | FileCheck %s

// A [4, 6] weight: top rows as two column slices side by side, bottom rows as a slice
// transposed twice; every leaf the weight's own source with its shape stated.
// CHECK: kiln.weight @w : tensor<4x6xf32> from #kiln.concat<axis = 0, [#kiln.concat<axis = 1, [#kiln.slice<[[X:#kiln.source<"m.safetensors", offset = 64, size = 96, dtype = "F32", shape = \[4, 6\]>]], offsets = [0, 0], sizes = [2, 3]>, #kiln.slice<[[X]], offsets = [0, 3], sizes = [2, 3]>]>, #kiln.permute<#kiln.permute<#kiln.slice<[[X]], offsets = [2, 0], sizes = [2, 6]>, dims = [1, 0]>, dims = [1, 0]>]> as <int8> {kiln.sensitivity = {int8 = 1.000000e-03 : f64}}{{$}}
kiln.weight @w : tensor<4x6xf32> from #kiln.source<"m.safetensors", offset = 64, size = 96, dtype = "F32"> as #kiln.encoding<int8> {kiln.sensitivity = {int8 = 1.000000e-03 : f64}}

// Odd sizes: the second halves take the remainder.
// CHECK: kiln.weight @odd : tensor<5x3xbf16> from #kiln.concat<axis = 0, [#kiln.concat<axis = 1, [#kiln.slice<[[Y:#kiln.source<"m.safetensors", offset = 0, size = 30, dtype = "BF16", shape = \[5, 3\]>]], offsets = [0, 0], sizes = [2, 1]>, #kiln.slice<[[Y]], offsets = [0, 1], sizes = [2, 2]>]>, #kiln.permute<#kiln.permute<#kiln.slice<[[Y]], offsets = [2, 0], sizes = [3, 3]>, dims = [1, 0]>, dims = [1, 0]>]> as <bf16>{{$}}
kiln.weight @odd : tensor<5x3xbf16> from #kiln.source<"m.safetensors", offset = 0, size = 30, dtype = "BF16"> as #kiln.encoding<bf16>

// A [5] weight: two slices.
// CHECK: kiln.weight @v : tensor<5xf16> from #kiln.concat<axis = 0, [#kiln.slice<[[Z:#kiln.source<"m.safetensors", offset = 32, size = 10, dtype = "F16", shape = \[5\]>]], offsets = [0], sizes = [2]>, #kiln.slice<[[Z]], offsets = [2], sizes = [3]>]> as <f16>{{$}}
kiln.weight @v : tensor<5xf16> from #kiln.source<"m.safetensors", offset = 32, size = 10, dtype = "F16"> as #kiln.encoding<f16>

// Left alone: a dimension below 2, rank 4, and an expression already.
// CHECK: kiln.weight @row : tensor<1x6xf32> from <"m.safetensors", offset = 0, size = 24, dtype = "F32"> as <f32>{{$}}
kiln.weight @row : tensor<1x6xf32> from #kiln.source<"m.safetensors", offset = 0, size = 24, dtype = "F32"> as #kiln.encoding<f32>
// CHECK: kiln.weight @conv : tensor<2x3x2x2xf32> from <"m.safetensors", offset = 0, size = 96, dtype = "F32"> as <f32>{{$}}
kiln.weight @conv : tensor<2x3x2x2xf32> from #kiln.source<"m.safetensors", offset = 0, size = 96, dtype = "F32"> as #kiln.encoding<f32>
// CHECK: kiln.weight @t : tensor<6x4xf32> from #kiln.permute<#kiln.source<"m.safetensors", offset = 64, size = 96, dtype = "F32", shape = [4, 6]>, dims = [1, 0]> as <f32>{{$}}
kiln.weight @t : tensor<6x4xf32> from #kiln.permute<#kiln.source<"m.safetensors", offset = 64, size = 96, dtype = "F32", shape = [4, 6]>, dims = [1, 0]> as #kiln.encoding<f32>

// Weight references are untouched.
// CHECK-LABEL: func.func @stage
func.func @stage(%x: tensor<?x6xf32>) -> tensor<?x4xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  // CHECK: kiln.weight_ref @w : tensor<4x6xf32>
  %w = kiln.weight_ref @w : tensor<4x6xf32>
  %y = kiln.linear %x, %w : tensor<?x6xf32>, tensor<4x6xf32> -> tensor<?x4xf32>
  return %y : tensor<?x4xf32>
}
