// RUN: not kiln-opt %s --kiln-select-kernels="target=x86_64-linux-gnu allow-portable-ops=model\.layers\.[0-9]+\.mlp\..*" 2>&1 | FileCheck %s
// RUN: not kiln-opt %s --kiln-select-kernels="target=x86_64-linux-gnu allow-portable-ops=(" 2>&1 | FileCheck %s --check-prefix=BADREGEX

// --allow-portable-ops: ops whose whole name matches may run the portable
// reference kernel on a CPU target (a remark says so and why); others may not, and
// the error names them. Here: int4 weights on baseline x86-64, which lacks the f16
// conversion their scales need. Kinds only the runtime's copies run are never refused.
// CHECK-DAG: remark: loc("model.layers.0.mlp.up_proj"): bound to linear_bias_f32_f32_wany_1x16_ref_portable (portable): portable reference kernel, allowed by allow-portable-ops (linear_bias_f32_f32_wany_4x4_x86_avx512: needs {{.*}}; linear_bias_f32_qai8dx_wq_4x4_gen: no generated int4 matmul on x86_64-linux-gnu without f16 conversion (F16C))
// CHECK-DAG: error: loc("model.layers.0.self_attn.q_proj"): 'kiln.linear' op 'model.layers.0.self_attn.q_proj' has no generated or hand-written kernel on target 'x86_64-linux-gnu'
// CHECK-DAG: remark: bound to slice_rows_f32_f32_ref_portable (portable)
// BADREGEX: allow-portable-ops '(':

kiln.weight @w4 : tensor<32x32xf32> from #kiln.source<"m.safetensors", offset = 0, size = 4096, dtype = "F32"> as #kiln.encoding<int4, group = 32>
func.func @stage(%x: tensor<?x32xf32>) -> tensor<?x32xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %w = kiln.weight_ref @w4 : tensor<32x32xf32>
  %y = kiln.linear %x, %w : tensor<?x32xf32>, tensor<32x32xf32> -> tensor<?x32xf32> loc("model.layers.0.mlp.up_proj")
  %z = kiln.linear %y, %w : tensor<?x32xf32>, tensor<32x32xf32> -> tensor<?x32xf32> loc("model.layers.0.self_attn.q_proj")
  %s = kiln.slice_rows %z {start = 1 : i64} : tensor<?x32xf32> -> tensor<?x32xf32>
  return %s : tensor<?x32xf32>
}
