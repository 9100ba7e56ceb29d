// RUN: kiln-opt %s --kiln-select-kernels="target=x86_64-linux-gnu cpu-features=+avx2,+fma,+f16c" --kiln-pack-weights | FileCheck %s
// RUN: kiln-opt %s --kiln-select-kernels="target=aarch64-linux-android cpu-features=+dotprod" --kiln-pack-weights | FileCheck %s
// RUN: kiln-opt %s --kiln-select-kernels=target=portable --kiln-pack-weights | FileCheck %s --check-prefix=PORTABLE
// RUN: kiln-opt %s --kiln-select-kernels="target=aarch64-linux-android cpu-features=+dotprod,+i8mm,+sme,+sme2" --kiln-pack-weights | FileCheck %s --check-prefix=SME2
// RUN: kiln-opt %s --kiln-select-kernels="target=aarch64-linux-android cpu-features=+dotprod,+i8mm" --kiln-pack-weights | FileCheck %s --check-prefix=I8MM

// kiln-pack-weights: symmetric int4 weights that only generated W4A8 matmuls read
// are stored packed in panels of 16 rows (int4_p16k8), int8 ones likewise
// (int8_p16k4); the generated embedding gather reads int4_p16k8 too, so an
// embedding table tied to the LM head is packed for the head. A weight with zero
// points and every weight of a portable artifact stay row major. Float matmul
// weights of the generated float matmuls are stored in panels of 16 rows
// (panel16); a bias and a norm's weight are not.
// CHECK-LABEL: kiln.weight @gate
// CHECK-SAME: layout <int4_p16k8>
// CHECK-LABEL: kiln.weight @up
// CHECK-SAME: layout <int4_p16k8>
// CHECK-LABEL: kiln.weight @down
// CHECK-SAME: layout <int8_p16k4>
// CHECK-LABEL: kiln.weight @asym
// CHECK-NOT: layout
// CHECK-LABEL: kiln.weight @tied
// CHECK-SAME: layout <int4_p16k8>
// CHECK-LABEL: kiln.weight @proj
// CHECK-SAME: layout <panel16>
// CHECK-LABEL: kiln.weight @proj_bias
// CHECK-NOT: layout
// CHECK-LABEL: kiln.weight @norm
// CHECK-NOT: layout
// CHECK-LABEL: func.func
// PORTABLE-NOT: layout <
//
// With SME2, int4 weights that only W4A8 matmuls read are packed for the LUTI4 kernels
// (int4_p128k4); the table that the embedding gather also reads keeps int4_p16k8.
// SME2-LABEL: kiln.weight @gate
// SME2-SAME: layout <int4_p128k4>
// SME2-LABEL: kiln.weight @up
// SME2-SAME: layout <int4_p128k4>
// SME2-LABEL: kiln.weight @down
// SME2-SAME: layout <int8_p16k4>
// SME2-LABEL: kiln.weight @asym
// SME2-NOT: layout
// SME2-LABEL: kiln.weight @tied
// SME2-SAME: layout <int4_p16k8>
//
// With i8mm, int4 weights that only W4A8 matmuls read are packed by channel pairs for
// SMMLA (int4_p16k16) where their rows fill whole panels of 16 (@wide); @gate and @up
// (12 rows) keep int4_p16k8, and so does the table the embedding gather also reads.
// I8MM-LABEL: kiln.weight @gate
// I8MM-SAME: layout <int4_p16k8>
// I8MM-LABEL: kiln.weight @up
// I8MM-SAME: layout <int4_p16k8>
// I8MM-LABEL: kiln.weight @down
// I8MM-SAME: layout <int8_p16k4>
// I8MM-LABEL: kiln.weight @asym
// I8MM-NOT: layout
// I8MM-LABEL: kiln.weight @tied
// I8MM-SAME: layout <int4_p16k8>
// I8MM-LABEL: kiln.weight @wide
// I8MM-SAME: layout <int4_p16k16>

kiln.weight @gate : tensor<12x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 3072, dtype = "F32"> as #kiln.encoding<int4, group = 32, act = int8_per_token>
kiln.weight @up : tensor<12x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 3072, dtype = "F32"> as #kiln.encoding<int4, group = 64, act = int8_per_token>
kiln.weight @down : tensor<64x12xf32> from #kiln.source<"m.safetensors", offset = 0, size = 3072, dtype = "F32"> as #kiln.encoding<int8, act = int8_per_token>
kiln.weight @asym : tensor<64x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16384, dtype = "F32"> as #kiln.encoding<int4, group = 32, asym, act = int8_per_token>
kiln.weight @tied : tensor<100x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 25600, dtype = "F32"> as #kiln.encoding<int4, group = 32, act = int8_per_token>
kiln.weight @wide : tensor<32x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 8192, dtype = "F32"> as #kiln.encoding<int4, group = 32, act = int8_per_token>
kiln.weight @proj : tensor<64x64xbf16> from #kiln.source<"m.safetensors", offset = 0, size = 8192, dtype = "BF16"> as #kiln.encoding<bf16>
kiln.weight @proj_bias : tensor<64xbf16> from #kiln.source<"m.safetensors", offset = 0, size = 128, dtype = "BF16"> as #kiln.encoding<bf16>
kiln.weight @norm : tensor<64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 256, dtype = "F32"> as #kiln.encoding<f32>
func.func @stage(%ids: tensor<?xi32>) -> tensor<?x100xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %t = kiln.weight_ref @tied : tensor<100x64xf32>
  %x = kiln.embedding %t, %ids : tensor<100x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
  %g = kiln.weight_ref @gate : tensor<12x64xf32>
  %u = kiln.weight_ref @up : tensor<12x64xf32>
  %d = kiln.weight_ref @down : tensor<64x12xf32>
  %m = kiln.gated_mlp %x, %g, %u, %d {activation = #kiln.activation<silu>} : tensor<?x64xf32>, tensor<12x64xf32>, tensor<12x64xf32>, tensor<64x12xf32> -> tensor<?x64xf32>
  %a = kiln.weight_ref @asym : tensor<64x64xf32>
  %y = kiln.linear %m, %a : tensor<?x64xf32>, tensor<64x64xf32> -> tensor<?x64xf32>
  %nw = kiln.weight_ref @norm : tensor<64xf32>
  %yn = kiln.rms_norm %y, %nw {epsilon = 1.0e-05 : f32} : tensor<?x64xf32>, tensor<64xf32> -> tensor<?x64xf32>
  %pw = kiln.weight_ref @proj : tensor<64x64xbf16>
  %pb = kiln.weight_ref @proj_bias : tensor<64xbf16>
  %yp = kiln.linear %yn, %pw, %pb : tensor<?x64xf32>, tensor<64x64xbf16>, tensor<64xbf16> -> tensor<?x64xf32>
  %ww = kiln.weight_ref @wide : tensor<32x64xf32>
  %yw = kiln.linear %yp, %ww : tensor<?x64xf32>, tensor<32x64xf32> -> tensor<?x32xf32>
  %s = kiln.slice_rows %yp {start = 0 : i64} : tensor<?x64xf32> -> tensor<?x64xf32>
  %l = kiln.lm_head %s, %t : tensor<?x64xf32>, tensor<100x64xf32> -> tensor<?x100xf32>
  return %l : tensor<?x100xf32>
}
