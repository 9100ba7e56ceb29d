// RUN: kiln-opt %s --kiln-select-kernels -verify-diagnostics

// Normalisation kernels read float weights only: an int8 norm weight has no kernel,
// and the compiler says so instead of falling back at run time.
kiln.weight @n : tensor<16xf32> from #kiln.source<"m.safetensors", offset = 0, size = 64, dtype = "F32"> as #kiln.encoding<int8>
func.func @stage(%x: tensor<?x16xf32>) -> tensor<?x16xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %n = kiln.weight_ref @n : tensor<16xf32>
  // expected-error @+1 {{'kiln.rms_norm' op has no kernel for weight encoding(s) int8 on target 'host'}}
  %h = kiln.rms_norm %x, %n {epsilon = 1.0e-05 : f32} : tensor<?x16xf32>, tensor<16xf32> -> tensor<?x16xf32>
  return %h : tensor<?x16xf32>
}
