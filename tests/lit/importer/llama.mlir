// Llama-3 style (GQA 4/2, llama3 rope scaling, untied head) imported from a
// generated checkpoint: stages, weight references and attributes.
// RUN: rm -rf %t && %python %kiln_src/tests/models/generate.py --preset tiny-llama --out %t > /dev/null
// RUN: kiln-compile --emit=ir %t | FileCheck %s
// RUN: kiln-compile --emit=ir %t | kiln-opt | FileCheck %s

// CHECK: module attributes {kiln.architecture = "LlamaForCausalLM", kiln.checkpoint = "{{[^"]*}}"
// CHECK-SAME: kiln.prompt_template = "plain"
// CHECK-SAME: kiln.text = #kiln.text_config<vocab_size = 512, hidden_size = 64, num_layers = 2, num_heads = 4, num_kv_heads = 2, head_dim = 16, max_position_embeddings = 131072>
// CHECK: kiln.weight @model.embed_tokens.weight : tensor<512x64xf32> from <"model.safetensors", offset = {{[0-9]+}}, size = 131072, dtype = "F32"> as <f32>
// CHECK: kiln.weight @model.layers.0.self_attn.k_proj.weight : tensor<32x64xf32>
// CHECK: kiln.weight @lm_head.weight : tensor<512x64xf32>
// CHECK-NOT: kiln.weight

// CHECK-LABEL: func.func @decoder_prefill(%arg0: tensor<?xi32>, %arg1: tensor<?xi32>) -> tensor<?x64xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>}
// CHECK: kiln.embedding {{.*}} : tensor<512x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
// CHECK: kiln.rms_norm {{.*}} {epsilon = 9.99999974E-6 : f32}
// CHECK: kiln.rope {{.*}} {factor = 3.200000e+01 : f64, head_dim = 16 : i64, high_freq_factor = 4.000000e+00 : f64, low_freq_factor = 1.000000e+00 : f64, num_heads = 4 : i64, original_max_position_embeddings = 8192 : i64, rope_type = "llama3", theta = 5.000000e+05 : f64}
// CHECK: kiln.rope {{.*}} num_heads = 2 : i64
// CHECK: kiln.attention {{.*}} positions(%arg1) {cache_layer = 0 : i64, causal, head_dim = 16 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64, scale = 2.500000e-01 : f64} : tensor<?x64xf32>, tensor<?x32xf32>, tensor<?x32xf32>, tensor<?xi32> -> tensor<?x64xf32>
// CHECK: kiln.gated_mlp {{.*}} {activation = #kiln.activation<silu>} : tensor<?x64xf32>, tensor<176x64xf32>, tensor<176x64xf32>, tensor<64x176xf32> -> tensor<?x64xf32>
// CHECK: kiln.attention {{.*}}cache_layer = 1 : i64
// CHECK-NOT: cache_layer = 2
// CHECK: return

// CHECK-LABEL: func.func @decoder_decode(%arg0: tensor<1xi32>, %arg1: tensor<1xi32>) -> tensor<1x64xf32> attributes {kiln.stage = #kiln.stage<decoder_decode>}
// CHECK: kiln.attention {{.*}}cache_layer = 0
// CHECK: kiln.attention {{.*}}cache_layer = 1

// CHECK-LABEL: func.func @lm_head(%arg0: tensor<?x64xf32>) -> tensor<?x512xf32> attributes {kiln.stage = #kiln.stage<lm_head>}
// CHECK: %[[W:.*]] = kiln.weight_ref @lm_head.weight : tensor<512x64xf32>
// CHECK: kiln.lm_head %arg0, %[[W]]
