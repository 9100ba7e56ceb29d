// Idefics3 (SmolVLM): SigLIP tower with post_layernorm, pixel-shuffle connector,
// Llama decoder.
// RUN: rm -rf %t && %python %kiln_src/tests/models/generate.py --preset tiny-idefics3 --out %t > /dev/null
// RUN: kiln-compile --emit=ir %t | FileCheck %s
// RUN: kiln-compile --emit=ir %t | kiln-opt | FileCheck %s

// CHECK: kiln.image = #kiln.image_config<image_size = 64, channels = 3, image_tokens = 16, image_token_id = 482>
// CHECK-SAME: processor = "Idefics3ImageProcessor"
// CHECK-SAME: kiln.prompt_template = "idefics3"
// CHECK: kiln.weight @model.vision_model.embeddings.patch_embedding.bias : tensor<32xf32>
// CHECK: kiln.weight @model.vision_model.embeddings.position_embedding.weight : tensor<64x32xf32>
// CHECK: kiln.weight @model.vision_model.post_layernorm.weight
// CHECK: kiln.weight @model.connector.modality_projection.proj.weight : tensor<64x128xf32>
// CHECK: kiln.weight @model.text_model.embed_tokens.weight
// CHECK-LABEL: func.func @vision_encoder(%arg0: tensor<3x64x64xf32>) -> tensor<64x32xf32>
// CHECK: kiln.patch_embed %arg0, %{{.*}}, %{{.*}} {patch_size = 8 : i64}
// CHECK-NOT: kiln.class_token
// CHECK: kiln.activation {{.*}} {kind = #kiln.activation<gelu_tanh>}
// CHECK-LABEL: func.func @projector(%arg0: tensor<64x32xf32>) -> tensor<16x64xf32>
// CHECK: kiln.pixel_shuffle %arg0 {scale_factor = 2 : i64} : tensor<64x32xf32> -> tensor<16x128xf32>
// CHECK: kiln.linear {{.*}} : tensor<16x128xf32>, tensor<64x128xf32> -> tensor<16x64xf32>
// CHECK-LABEL: func.func @lm_head
// CHECK: kiln.weight_ref @lm_head.weight
