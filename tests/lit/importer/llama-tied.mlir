// Llama-2 style with tied embeddings, head_dim != hidden/heads, attention and MLP
// biases: the LM head reads the embedding table and the MLP is spelled out.
// RUN: rm -rf %t && %python %kiln_src/tests/models/generate.py --preset tiny-llama-tied --out %t > /dev/null
// RUN: kiln-compile --emit=ir %t | FileCheck %s

// CHECK-NOT: kiln.weight @lm_head.weight
// CHECK: kiln.weight @model.layers.0.self_attn.q_proj.bias : tensor<128xf32>
// CHECK: kiln.weight @model.layers.0.self_attn.o_proj.bias : tensor<64xf32>
// CHECK-LABEL: func.func @decoder_prefill
// CHECK: kiln.linear {{.*}} : tensor<?x64xf32>, tensor<128x64xf32>, tensor<128xf32> -> tensor<?x128xf32>
// CHECK: kiln.attention {{.*}}head_dim = 32 : i64, num_heads = 4 : i64, num_kv_heads = 4 : i64
// CHECK: kiln.linear {{.*}} : tensor<?x128xf32>, tensor<64x128xf32>, tensor<64xf32> -> tensor<?x64xf32>
// CHECK: kiln.activation {{.*}} {kind = #kiln.activation<silu>} : tensor<?x176xf32>
// CHECK: kiln.mul {{.*}} : tensor<?x176xf32>
// CHECK-NOT: kiln.gated_mlp
// CHECK-LABEL: func.func @lm_head
// CHECK: kiln.weight_ref @model.embed_tokens.weight : tensor<512x64xf32>
