// RUN: kiln-opt %s | FileCheck %s
// RUN: kiln-opt %s | kiln-opt | FileCheck %s
// RUN: kiln-opt %s --mlir-print-op-generic | kiln-opt | FileCheck %s

// A weight's values: one tensor of the checkpoint, printed as it always was (the
// source's prefix elided), or transforms of tensors that state their shape.

// CHECK: kiln.weight @plain : tensor<4x8xf32> from <"m.safetensors", offset = 0, size = 128, dtype = "F32"> as <f32>{{$}}
kiln.weight @plain : tensor<4x8xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32>

// The prefix may be elided in the input too; a plain source may state its shape.
// CHECK: kiln.weight @shaped : tensor<4x8xbf16> from <"m.safetensors", offset = 128, size = 64, dtype = "BF16", shape = [4, 8]> as <bf16>{{$}}
kiln.weight @shaped : tensor<4x8xbf16> from <"m.safetensors", offset = 128, size = 64, dtype = "BF16", shape = [4, 8]> as #kiln.encoding<bf16>

// Q and K fused: [16, 32] and [8, 32] along axis 0.
// CHECK: kiln.weight @qk : tensor<24x32xf32> from #kiln.concat<axis = 0, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F32", shape = [8, 32]>]> as <int8>{{$}}
kiln.weight @qk : tensor<24x32xf32> from #kiln.concat<axis = 0, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F32", shape = [8, 32]>]> as #kiln.encoding<int8>

// Along the last axis.
// CHECK: kiln.weight @cols : tensor<16x48xf32> from #kiln.concat<axis = 1, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F32", shape = [16, 16]>]> as <f32>
kiln.weight @cols : tensor<16x48xf32> from #kiln.concat<axis = 1, [#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, #kiln.source<"m.safetensors", offset = 2048, size = 1024, dtype = "F32", shape = [16, 16]>]> as #kiln.encoding<f32>

// CHECK: kiln.weight @right : tensor<16x16xf16> from #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F16", shape = [16, 32]>, offsets = [0, 16], sizes = [16, 16]> as <f16>{{$}}
kiln.weight @right : tensor<16x16xf16> from #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 1024, dtype = "F16", shape = [16, 32]>, offsets = [0, 16], sizes = [16, 16]> as #kiln.encoding<f16>

// CHECK: kiln.weight @transposed : tensor<32x16xf32> from #kiln.permute<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, dims = [1, 0]> as <int4, group = 32>{{$}}
kiln.weight @transposed : tensor<32x16xf32> from #kiln.permute<#kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32", shape = [16, 32]>, dims = [1, 0]> as #kiln.encoding<int4, group = 32>

// A 3-D permutation, a 1-D slice.
// CHECK: kiln.weight @cube : tensor<4x2x3xf32> from #kiln.permute<#kiln.source<"m.safetensors", offset = 0, size = 96, dtype = "F32", shape = [2, 3, 4]>, dims = [2, 0, 1]> as <f32>
kiln.weight @cube : tensor<4x2x3xf32> from #kiln.permute<#kiln.source<"m.safetensors", offset = 0, size = 96, dtype = "F32", shape = [2, 3, 4]>, dims = [2, 0, 1]> as #kiln.encoding<f32>
// CHECK: kiln.weight @bias : tensor<3xf32> from #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 32, dtype = "F32", shape = [8]>, offsets = [5], sizes = [3]> as <f32>
kiln.weight @bias : tensor<3xf32> from #kiln.slice<#kiln.source<"m.safetensors", offset = 0, size = 32, dtype = "F32", shape = [8]>, offsets = [5], sizes = [3]> as #kiln.encoding<f32>

// Nested: gate and up fused, each transposed back from an [in, out] checkpoint
// tensor, the up part cut from a larger one.
// CHECK: kiln.weight @gate_up : tensor<16x8xbf16> from #kiln.concat<axis = 0, [#kiln.permute<#kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "BF16", shape = [8, 8]>, dims = [1, 0]>, #kiln.permute<#kiln.slice<#kiln.source<"n.safetensors", offset = 64, size = 256, dtype = "BF16", shape = [8, 16]>, offsets = [0, 8], sizes = [8, 8]>, dims = [1, 0]>]> as <bf16>
kiln.weight @gate_up : tensor<16x8xbf16>
    from #kiln.concat<axis = 0, [
        #kiln.permute<#kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "BF16", shape = [8, 8]>, dims = [1, 0]>,
        #kiln.permute<#kiln.slice<#kiln.source<"n.safetensors", offset = 64, size = 256, dtype = "BF16", shape = [8, 16]>,
                                  offsets = [0, 8], sizes = [8, 8]>, dims = [1, 0]>]>
    as #kiln.encoding<bf16>

// The default layout is not printed.
// CHECK: kiln.weight @laid_out : tensor<4x8xf32> from <"m.safetensors", offset = 0, size = 128, dtype = "F32"> as <f32>{{$}}
kiln.weight @laid_out : tensor<4x8xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32> layout #kiln.layout<row_major>
// CHECK: kiln.weight @laid_out_short : tensor<4x8xf32> from <"m.safetensors", offset = 0, size = 128, dtype = "F32"> as <f32> {kiln.sensitivity = {int8 = 1.000000e-03 : f64}}{{$}}
kiln.weight @laid_out_short : tensor<4x8xf32> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "F32"> as #kiln.encoding<f32> layout <row_major> {kiln.sensitivity = {int8 = 1.000000e-03 : f64}}

// A transformed weight is used like any other.
// CHECK-LABEL: func.func @stage
func.func @stage(%x: tensor<?x32xf32>) -> tensor<?x24xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  // CHECK: kiln.weight_ref @qk : tensor<24x32xf32>
  %w = kiln.weight_ref @qk : tensor<24x32xf32>
  %y = kiln.linear %x, %w : tensor<?x32xf32>, tensor<24x32xf32> -> tensor<?x24xf32>
  return %y : tensor<?x24xf32>
}

// A gated MLP's gate and up interleaved in blocks of 16 rows (kiln-fuse-gate-up).
// CHECK: kiln.weight @gate_up_blocks : tensor<48x32xf32> from #kiln.concat<axis = 0, block = 16, [#kiln.source<"m.safetensors", offset = 0, size = 3072, dtype = "F32", shape = [24, 32]>, #kiln.source<"m.safetensors", offset = 3072, size = 3072, dtype = "F32", shape = [24, 32]>]> as <f32>{{$}}
kiln.weight @gate_up_blocks : tensor<48x32xf32> from #kiln.concat<axis = 0, block = 16, [#kiln.source<"m.safetensors", offset = 0, size = 3072, dtype = "F32", shape = [24, 32]>, #kiln.source<"m.safetensors", offset = 3072, size = 3072, dtype = "F32", shape = [24, 32]>]> as #kiln.encoding<f32>
