// RUN: kiln-opt %s -split-input-file --kiln-select-kernels='target=x86_64-linux-gnu' -verify-diagnostics
// RUN: not kiln-opt %s -split-input-file --kiln-select-kernels='target=banana' 2>&1 | FileCheck %s --check-prefix=TARGET
// RUN: not kiln-opt %s -split-input-file --kiln-select-kernels='target=x86_64-linux-gnu cpu-features=+sme2' 2>&1 | FileCheck %s --check-prefix=FEATURE
// RUN: not kiln-opt %s -split-input-file --kiln-select-kernels='target=x86_64-linux-gnu kernels=fastest' 2>&1 | FileCheck %s --check-prefix=KERNELS

// An unknown target is an error, not silently the host.
// TARGET: error: kiln-select-kernels: unsupported target 'banana'
// FEATURE: error: kiln-select-kernels: unknown CPU feature 'sme2' for x86_64-linux-gnu
// KERNELS: error: kiln-select-kernels: kernels 'fastest' is not generated or hand-written

// Normalisation kernels read float weights only: an int8 norm weight has no kernel,
// and the compiler says so instead of falling back at run time.
kiln.weight @n : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 64, dtype = "F32"> as #kiln.encoding<int8>
func.func @stage(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %n = kiln.weight_ref @n : tensor<16xf32>
  // expected-error @+1 {{'kiln.rms_norm' op has no kernel for weight encoding(s) int8 on target}}
  %h = kiln.rms_norm %x, %n {epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<16xf32> -> tensor<?x16xf32>
  return %h : tensor<?x16xf32>
}

// -----

// Every binding is a remark naming the kernel, its ISA and, for the portable
// reference kernels, that nothing faster exists for the target.
func.func @stage2(%a: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kiln.stage = #kiln.stage<projector>} {
  // expected-remark @+1 {{bound to add_f32_f32_f32_gen (generated)}}
  %y = kiln.add %a, %a : tensor<4x8xf32>
  // expected-remark @+1 {{bound to slice_rows_f32_f32_ref_portable (portable): portable reference kernel, no generated kernel for x86_64-linux-gnu}}
  %z = kiln.slice_rows %y {start = 1 : i64} : tensor<4x8xf32> -> tensor<3x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

// No fallback: on a CPU target an op of a kind that has generated or hand-written
// kernels must be bound to one (int4 weights have none on baseline x86-64, which
// has no f16 conversion for their scales); the error names the op and why each
// faster kernel does not qualify.
kiln.weight @w4 : tensor<32x32xf32> from #kiln.source<"m.safetensors", offset = 0, size = 4096, dtype = "F32"> as #kiln.encoding<int4, group = 32>
func.func @stage3(%x: tensor<?x32xf32>) -> tensor<?x32xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %w = kiln.weight_ref @w4 : tensor<32x32xf32>
  // expected-error @+1 {{'kiln.linear' op 'kiln.linear' has no generated or hand-written kernel on target 'x86_64-linux-gnu' (linear_bias_f32_f32_wany_4x4_x86_avx512: needs avx2,fma,avx512f,avx512bw,avx512vnni,avx512vl,f16c; linear_bias_f32_f32_wfloat_4x4_gen: does not read int4; linear_bias_f32_qai8dx_wq_4x4_gen: no generated int4 matmul on x86_64-linux-gnu without f16 conversion (F16C)); --allow-portable-ops=REGEX lets ops whose names match run the portable reference kernel}}
  %y = kiln.linear %x, %w : tensor<?x32xf32>, tensor<32x32xf32> -> tensor<?x32xf32>
  return %y : tensor<?x32xf32>
}
