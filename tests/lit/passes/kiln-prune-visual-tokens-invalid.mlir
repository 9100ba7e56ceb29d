// RUN: kiln-opt %s -split-input-file --kiln-prune-visual-tokens=keep=4 -verify-diagnostics

// A text-only model has no image tokens to prune.
// expected-error @below {{kiln-prune-visual-tokens: the model takes no images (no projector stage)}}
module {
  func.func @decoder_prefill(%ids: tensor<?xi32>) -> tensor<?xi32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
    return %ids : tensor<?xi32>
  }
}
