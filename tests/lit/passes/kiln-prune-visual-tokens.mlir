// RUN: kiln-opt %s --kiln-prune-visual-tokens=keep=50% | FileCheck %s
// RUN: kiln-opt %s --kiln-prune-visual-tokens=keep=50% -verify-diagnostics > /dev/null
// RUN: kiln-opt %s --kiln-prune-visual-tokens="keep=0.25 score=norm" | FileCheck %s --check-prefix=NORM
// RUN: kiln-opt %s --kiln-prune-visual-tokens=keep=12 --kiln-prune-visual-tokens=keep=6 | FileCheck %s --check-prefix=TWICE
// RUN: kiln-opt %s --kiln-prune-visual-tokens=keep=16 | FileCheck %s --check-prefix=ALL
// RUN: kiln-opt %s --kiln-prune-visual-tokens=keep=100% | FileCheck %s --check-prefix=ALL
// RUN: not kiln-opt %s --kiln-prune-visual-tokens=keep=0 2>&1 | FileCheck %s --check-prefix=NONE
// RUN: not kiln-opt %s --kiln-prune-visual-tokens=keep=half 2>&1 | FileCheck %s --check-prefix=SPEC
// RUN: not kiln-opt %s --kiln-prune-visual-tokens="keep=8 score=attention" 2>&1 | FileCheck %s --check-prefix=SCORE
// RUN: kiln-opt %s --kiln-prune-visual-tokens="keep=8 positions=consecutive" | FileCheck %s --check-prefix=CONSEC
// RUN: kiln-opt %s --kiln-prune-visual-tokens=keep=8 -mlir-print-op-generic | kiln-opt | FileCheck %s --check-prefix=ORIG
// RUN: kiln-opt %s --kiln-prune-visual-tokens="keep=12 positions=consecutive" --kiln-prune-visual-tokens=keep=6 | FileCheck %s --check-prefix=TWICE
// RUN: not kiln-opt %s --kiln-prune-visual-tokens="keep=8 positions=sorted" 2>&1 | FileCheck %s --check-prefix=POS

// The projector's 16 tokens: 50% keeps 8, selected by a kiln.select_tokens before the
// return; the stage's result type and the module's image_tokens follow, the decoder is
// untouched (its image input has a dynamic row count).
// CHECK: kiln.image = #kiln.image_config<image_size = 32, channels = 3, image_tokens = 8, image_token_id = 7>
// CHECK-LABEL: func.func @projector(%arg0: tensor<16x32xf32>) -> tensor<8x64xf32>
// CHECK: %[[P:.*]] = kiln.linear %arg0
// CHECK: %[[S:.*]] = kiln.select_tokens %[[P]] {keep = 8 : i64, original_positions, score = "distinct"} : tensor<16x64xf32> -> tensor<8x64xf32>
// CHECK: return %[[S]] : tensor<8x64xf32>
// CHECK-LABEL: func.func @decoder_prefill
// CHECK-SAME: tensor<?x64xf32>
// NORM: image_tokens = 4
// NORM: kiln.select_tokens %{{.*}} {keep = 4 : i64, original_positions, score = "norm"} : tensor<16x64xf32> -> tensor<4x64xf32>
// A second pruning selects once, from the projector's 16 tokens.
// TWICE: image_tokens = 6
// TWICE: kiln.select_tokens %{{.*}} {keep = 6 : i64, original_positions, score = "distinct"} : tensor<16x64xf32> -> tensor<6x64xf32>
// TWICE-NOT: kiln.select_tokens
// ALL: image_tokens = 16
// ALL-NOT: kiln.select_tokens
// NONE: error: kiln-prune-visual-tokens: keeping '0' of 16 image tokens leaves none
// SPEC: error: kiln-prune-visual-tokens: keep must be a count (72), a fraction (0.5) or a percentage (50%), got 'half'
// SCORE: error: kiln-prune-visual-tokens: score must be norm or distinct, got 'attention'
// By default the kept tokens keep the RoPE positions they have unpruned (the
// artifact's SelectTokensParams.original_positions), through a round trip of the
// generic form too; positions=consecutive drops the attribute.
// CONSEC: kiln.select_tokens %{{.*}} {keep = 8 : i64, score = "distinct"} : tensor<16x64xf32> -> tensor<8x64xf32>
// ORIG: kiln.select_tokens %{{.*}} {keep = 8 : i64, original_positions, score = "distinct"} : tensor<16x64xf32> -> tensor<8x64xf32>
// POS: error: kiln-prune-visual-tokens: positions must be consecutive or original, got 'sorted'

module attributes {kiln.image = #kiln.image_config<image_size = 32, channels = 3, image_tokens = 16, image_token_id = 7>} {
  kiln.weight @p : tensor<64x32xf32> from #kiln.source<"m.safetensors", offset = 0, size = 8192, dtype = "F32"> as #kiln.encoding<f32>
  func.func @projector(%x: tensor<16x32xf32>) -> tensor<16x64xf32> attributes {kiln.stage = #kiln.stage<projector>} {
    %w = kiln.weight_ref @p : tensor<64x32xf32>
    %y = kiln.linear %x, %w : tensor<16x32xf32>, tensor<64x32xf32> -> tensor<16x64xf32>
    // expected-remark @+1 {{kiln-prune-visual-tokens: keeps 8 of 16 image tokens per image, the highest-scoring by distinct, in their order, at their original positions}}
    return %y : tensor<16x64xf32>
  }
  func.func @decoder_prefill(%ids: tensor<?xi32>, %pos: tensor<?xi32>, %img: tensor<?x64xf32>) -> tensor<?x64xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
    return %img : tensor<?x64xf32>
  }
}
