// RUN: kiln-opt %s --kiln-plan-memory -verify-diagnostics
// RUN: not kiln-opt %s --kiln-plan-memory=max-prefill-tokens=0 2>&1 | FileCheck %s --check-prefix=ZERO
// ZERO: error: kiln-plan-memory: max-prefill-tokens must be positive

func.func @stage(%x: tensor<4x?xf32>) -> tensor<4x?xf32> attributes {kiln.stage = #kiln.stage<vision_encoder>} {
  // expected-error @+1 {{'kiln.mul' op kiln-plan-memory: only the leading (token) dimension may be dynamic, got 'tensor<4x?xf32>'}}
  %a = kiln.mul %x, %x : tensor<4x?xf32>
  %b = kiln.mul %a, %x : tensor<4x?xf32>
  return %b : tensor<4x?xf32>
}
