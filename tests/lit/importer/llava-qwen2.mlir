// LLaVA with a Qwen2 decoder, the 'full' strategy (CLS kept) and two feature layers
// concatenated along the feature dimension.
// RUN: rm -rf %t && %python %kiln_src/tests/models/generate.py --preset tiny-llava-qwen2 --out %t > /dev/null
// RUN: kiln-compile --emit=ir %t | FileCheck %s

// CHECK: image_tokens = 17,
// CHECK-SAME: kiln.prompt_template = "llava-chatml"
// CHECK-LABEL: func.func @vision_encoder(%arg0: tensor<3x32x32xf32>) -> tensor<17x64xf32>
// CHECK-NOT: kiln.slice_rows
// CHECK: kiln.concat {{.*}} : tensor<17x32xf32>, tensor<17x32xf32> -> tensor<17x64xf32>
// CHECK-LABEL: func.func @projector(%arg0: tensor<17x64xf32>)
// CHECK-LABEL: func.func @decoder_prefill
// CHECK: kiln.linear {{.*}}, tensor<{{[0-9]+}}xf32> -> tensor<?x
