// Qwen2: q/k/v biases (o_proj without), tied head.
// RUN: rm -rf %t && %python %kiln_src/tests/models/generate.py --preset tiny-qwen2 --out %t > /dev/null
// RUN: kiln-compile --emit=ir %t | FileCheck %s

// CHECK: kiln.prompt_template = "plain"
// CHECK: kiln.weight @model.layers.0.self_attn.q_proj.bias : tensor<64xf32>
// CHECK: kiln.weight @model.layers.0.self_attn.k_proj.bias : tensor<32xf32>
// CHECK: kiln.weight @model.layers.0.self_attn.v_proj.bias : tensor<32xf32>
// CHECK-NOT: o_proj.bias
// CHECK-LABEL: func.func @decoder_prefill
// CHECK: kiln.rope {{.*}} theta = 1.000000e+06 : f64
// CHECK-LABEL: func.func @lm_head
// CHECK: kiln.weight_ref @model.embed_tokens.weight : tensor<600x64xf32>
