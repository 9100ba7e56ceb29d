// LLaVA-1.5 layout: CLIP tower run to vision_feature_layer = -2 (the last layer and
// post_layernorm are dropped), CLS removed, gelu projector, Llama decoder with the
// image tokens merged in.
// RUN: rm -rf %t && %python %kiln_src/tests/models/generate.py --preset tiny-llava --out %t > /dev/null
// RUN: kiln-compile --emit=ir --remarks %t 2>%t.err | FileCheck %s
// RUN: FileCheck %s --check-prefix=REMARK < %t.err
// RUN: kiln-compile --emit=ir %t | kiln-opt | FileCheck %s

// REMARK: remark: vision_encoder: vision_feature_layer = -2: vision layer(s) 2 and post_layernorm never run; their weights are dropped

// CHECK: kiln.architecture = "LlavaForConditionalGeneration"
// CHECK-SAME: kiln.image = #kiln.image_config<image_size = 32, channels = 3, image_tokens = 16, image_token_id = 480>
// CHECK-SAME: kiln.preprocessor = #kiln.preprocessor_config<processor = "CLIPImageProcessor",
// CHECK-SAME: resample = 3, do_center_crop = true, crop_size = [32, 32]
// CHECK-SAME: kiln.prompt_template = "llava"
// CHECK: kiln.weight @vision_tower.vision_model.embeddings.patch_embedding.weight : tensor<32x3x8x8xf32>
// CHECK-NOT: encoder.layers.2.
// CHECK-NOT: post_layernorm
// CHECK: kiln.weight @multi_modal_projector.linear_1.weight : tensor<64x32xf32>
// CHECK: kiln.weight @language_model.model.embed_tokens.weight
// CHECK: kiln.weight @language_model.lm_head.weight : tensor<512x64xf32>

// CHECK-LABEL: func.func @vision_encoder(%arg0: tensor<3x32x32xf32>) -> tensor<16x32xf32> attributes {kiln.stage = #kiln.stage<vision_encoder>}
// CHECK: kiln.patch_embed %arg0, %{{.*}} {patch_size = 8 : i64} : tensor<3x32x32xf32>, tensor<32x3x8x8xf32> -> tensor<16x32xf32>
// CHECK: kiln.class_token {{.*}} -> tensor<17x32xf32>
// CHECK: kiln.position_embedding
// CHECK: kiln.layer_norm
// CHECK: kiln.attention {{.*}} {head_dim = 8 : i64, num_heads = 4 : i64, num_kv_heads = 4 : i64, scale = 0.35355339059327373 : f64} : tensor<17x32xf32>
// CHECK: kiln.activation {{.*}} {kind = #kiln.activation<quick_gelu>}
// CHECK: kiln.slice_rows {{.*}} {start = 1 : i64} : tensor<17x32xf32> -> tensor<16x32xf32>
// CHECK-LABEL: func.func @projector(%arg0: tensor<16x32xf32>) -> tensor<16x64xf32> attributes {kiln.stage = #kiln.stage<projector>}
// CHECK: kiln.linear
// CHECK: kiln.activation {{.*}} {kind = #kiln.activation<gelu>}
// CHECK: kiln.linear
// CHECK-LABEL: func.func @decoder_prefill(%arg0: tensor<?xi32>, %arg1: tensor<?xi32>, %arg2: tensor<?x64xf32>) -> tensor<?x64xf32>
// CHECK: kiln.merge_image_tokens {{.*}}, %arg0, %arg2 {image_token_id = 480 : i64}
// CHECK-LABEL: func.func @decoder_decode
// CHECK-NOT: merge_image_tokens
// CHECK-LABEL: func.func @lm_head
