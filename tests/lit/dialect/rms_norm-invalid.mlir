// RUN: kiln-opt %s -split-input-file -verify-diagnostics

func.func @weight_length(%x: tensor<4x8xf32>, %w: tensor<7xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op weight length 7 does not match the last dimension of the input (8)}}
  %y = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32} : tensor<4x8xf32>, tensor<7xf32> -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

func.func @weight_rank(%x: tensor<4x8xf32>, %w: tensor<1x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op weight must be 1-D, got rank 2}}
  %y = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32} : tensor<4x8xf32>, tensor<1x8xf32> -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

func.func @result_type(%x: tensor<4x8xf32>, %w: tensor<8xf32>) -> tensor<4x8xf16> {
  // expected-error @+1 {{'kiln.rms_norm' op result type 'tensor<4x8xf16>' must equal the input type 'tensor<4x8xf32>'}}
  %y = kiln.rms_norm %x, %w {epsilon = 1.0e-05 : f32} : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf16>
  return %y : tensor<4x8xf16>
}

// -----

func.func @epsilon(%x: tensor<4x8xf32>, %w: tensor<8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'kiln.rms_norm' op epsilon must be positive}}
  %y = kiln.rms_norm %x, %w {epsilon = 0.0 : f32} : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
