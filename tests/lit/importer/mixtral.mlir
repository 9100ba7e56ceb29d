// Mixtral: each decoder MLP is a 4-expert top-2 MoE block with renormalised routing.
// RUN: rm -rf %t && %python %kiln_src/tests/models/generate.py --preset tiny-mixtral --out %t > /dev/null
// RUN: kiln-compile --emit=ir %t | FileCheck %s
// RUN: kiln-compile --emit=ir %t | kiln-opt | FileCheck %s

// CHECK: kiln.weight @model.layers.0.block_sparse_moe.gate.weight : tensor<4x64xf32>
// CHECK: kiln.weight @model.layers.0.block_sparse_moe.experts.0.w1.weight : tensor<128x64xf32>
// CHECK: kiln.weight @model.layers.0.block_sparse_moe.experts.0.w3.weight : tensor<128x64xf32>
// CHECK: kiln.weight @model.layers.0.block_sparse_moe.experts.0.w2.weight : tensor<64x128xf32>
// CHECK-LABEL: func.func @decoder_prefill
// CHECK: kiln.moe %{{.*}}, %{{.*}} gate(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) up(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) down(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) {activation = #kiln.activation<silu>, expert_ids = array<i64: 0, 1, 2, 3>, normalize_top_k = true, top_k = 2 : i64}
// CHECK-NOT: kiln.gated_mlp
