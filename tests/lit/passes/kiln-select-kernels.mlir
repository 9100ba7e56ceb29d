// RUN: kiln-opt %s -split-input-file --kiln-select-kernels=target=portable | FileCheck %s
// RUN: kiln-opt %s -split-input-file --kiln-select-kernels=target=portable --kiln-select-kernels=target=portable | FileCheck %s
// By default (kernels=generated) a CPU target binds every op the generator serves
// to a generated kernel: the norm, the linear (int4 weights with float
// activations, W4A16) and the activation, on the full AVX-512 target too.
// RUN: kiln-opt %s -split-input-file --kiln-select-kernels="target=x86_64-linux-gnu cpu-features=+avx2,+fma,+f16c,+avx512f,+avx512bw,+avx512vl,+avx512vnni" | FileCheck %s --check-prefix=GEN
// RUN: kiln-opt %s -split-input-file --kiln-select-kernels="target=x86_64-linux-gnu cpu-features=+avx2,+fma,+f16c,+avx512f,+avx512bw,+avx512vl,+avx512vnni kernels=generated" | FileCheck %s --check-prefix=GEN
// With kernels=hand-written an AVX-512 target binds ops that have AVX-512
// micro-kernels to them (the most specialised kernel that runs them: here the norm
// and the linear) ...
// RUN: kiln-opt %s -split-input-file --kiln-select-kernels="target=x86_64-linux-gnu cpu-features=+avx2,+fma,+f16c,+avx512f,+avx512bw,+avx512vl,+avx512vnni kernels=hand-written" | FileCheck %s --check-prefix=AVX512
// ... and without VNNI the AVX-512 kernels do not qualify: generated ones again.
// RUN: kiln-opt %s -split-input-file --kiln-select-kernels="target=x86_64-linux-gnu cpu-features=+avx2,+fma,+f16c,+avx512f,+avx512bw,+avx512vl kernels=hand-written" | FileCheck %s --check-prefix=GEN

kiln.weight @w : tensor<32x32xbf16> from #kiln.source<"m.safetensors", offset = 0, size = 2048, dtype = "BF16"> as #kiln.encoding<int4, group = 32>
kiln.weight @n : tensor<32xf32> from #kiln.source<"m.safetensors", offset = 2048, size = 128, dtype = "F32"> as #kiln.encoding<f32>
// CHECK-LABEL: func.func @stage
func.func @stage(%x: tensor<?x32xf32>) -> tensor<?x32xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %n = kiln.weight_ref @n : tensor<32xf32>
  // CHECK: kiln.rms_norm {{.*}} {epsilon = {{.*}}, kiln.kernel = "rmsnorm_f32_f32_wfloat_ref_portable"}
  %h = kiln.rms_norm %x, %n {epsilon = 1.0e-05 : f32} : tensor<?x32xf32>, tensor<32xf32> -> tensor<?x32xf32>
  %w = kiln.weight_ref @w : tensor<32x32xbf16>
  // CHECK: kiln.linear {{.*}} {kiln.kernel = "linear_bias_f32_f32_wany_1x16_ref_portable"}
  // AVX512: kiln.rms_norm {{.*}} kiln.kernel = "rmsnorm_f32_f32_wfloat_x86_avx512"
  // GEN: kiln.rms_norm {{.*}} kiln.kernel = "rmsnorm_f32_f32_wfloat_gen"
  // GEN: kiln.linear {{.*}} {kiln.kernel = "linear_bias_f32_qai8dx_wq_4x4_gen"}
  // GEN: kiln.activation {{.*}} {kiln.kernel = "act_f32_f32_gen", kind = #kiln.activation<silu>}
  // AVX512: kiln.linear {{.*}} {kiln.kernel = "linear_bias_f32_f32_wany_4x4_x86_avx512"}
  %y = kiln.linear %h, %w : tensor<?x32xf32>, tensor<32x32xbf16> -> tensor<?x32xf32>
  // CHECK: kiln.activation {{.*}} {kiln.kernel = "act_f32_f32_ref_portable", kind = #kiln.activation<silu>}
  %a = kiln.activation %y {kind = #kiln.activation<silu>} : tensor<?x32xf32>
  return %a : tensor<?x32xf32>
}

// -----

// Functions that are not stages are left alone.
// CHECK-LABEL: func.func @helper
// CHECK-NOT: kiln.kernel
func.func @helper(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %y = kiln.add %a, %a : tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
