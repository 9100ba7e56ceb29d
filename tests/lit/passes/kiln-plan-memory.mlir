// RUN: kiln-opt %s -split-input-file --kiln-plan-memory=max-prefill-tokens=8 | FileCheck %s

// CHECK: module attributes {kiln.kv_cache = #kiln.kv_cache<f32>, kiln.max_prefill_tokens = 8 : i64}
kiln.weight @w : tensor<32x16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "F32"> as #kiln.encoding<f32>
kiln.weight @n : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 2048, size = 64, dtype = "F32"> as #kiln.encoding<f32>
// 8 rows x 16 f32 = 512 bytes; 8 x 32 = 1024 bytes.
// CHECK-LABEL: func.func @stage
// CHECK-SAME: kiln.arena_bytes = 1536 : i64
func.func @stage(%x: tensor<?x16xf32>) -> tensor<?x32xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %n = kiln.weight_ref @n : tensor<16xf32>
  // CHECK: kiln.rms_norm {{.*}}kiln.offset = [[H:[0-9]+]] : i64
  %h = kiln.rms_norm %x, %n {epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<16xf32> -> tensor<?x16xf32>
  // The norm's output dies here: the residual add reuses its buffer (in place).
  // CHECK: kiln.add {{.*}}kiln.offset = [[H]] : i64
  %r = kiln.add %h, %x : tensor<?x16xf32>
  %w = kiln.weight_ref @w : tensor<32x16xf32>
  // CHECK: kiln.linear {{.*}}kiln.offset = [[Y:[0-9]+]] : i64
  %y = kiln.linear %r, %w : tensor<?x16xf32>, tensor<32x16xf32> -> tensor<?x32xf32>
  // The stage's result goes to its output buffer, not the arena.
  // CHECK: kiln.activation {{.*}}kiln.output = 0 : i64
  %a = kiln.activation %y {kind = #kiln.activation<silu>} : tensor<?x32xf32>
  return %a : tensor<?x32xf32>
}

// -----

// Buffers whose lifetimes do not overlap share memory: a chain of adds over two
// alternating buffers.
// CHECK-LABEL: func.func @chain
// CHECK-SAME: kiln.arena_bytes = 256 : i64
func.func @chain(%x: tensor<4x16xf32>) -> tensor<4x16xf32> attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  %a = kiln.mul %x, %x : tensor<4x16xf32>
  %b = kiln.mul %a, %x : tensor<4x16xf32>
  %c = kiln.mul %b, %x : tensor<4x16xf32>
  %d = kiln.mul %c, %x : tensor<4x16xf32>
  return %d : tensor<4x16xf32>
}

// -----

// No stages: nothing to plan (only the module attribute).
// CHECK-LABEL: func.func @not_a_stage
// CHECK-NOT: kiln.offset
func.func @not_a_stage(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %a = kiln.mul %x, %x : tensor<4x16xf32>
  return %a : tensor<4x16xf32>
}
