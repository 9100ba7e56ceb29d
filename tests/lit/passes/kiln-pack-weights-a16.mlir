// RUN: kiln-opt %s --kiln-select-kernels="target=x86_64-linux-gnu cpu-features=+avx2,+fma,+f16c" --kiln-pack-weights | FileCheck %s
// RUN: kiln-opt %s --kiln-select-kernels="target=aarch64-linux-android" --kiln-pack-weights | FileCheck %s
// RUN: kiln-opt %s --kiln-select-kernels="target=x86_64-linux-gnu cpu-features=+avx2,+fma,+f16c,+avx512f,+avx512bw,+avx512vl,+avx512vnni" --kiln-pack-weights | FileCheck %s
// RUN: kiln-opt %s --kiln-select-kernels=target=portable --kiln-pack-weights | FileCheck %s --check-prefix=PORTABLE

// kiln-pack-weights with float activations (W8A16, W4A16, fp8): int8 weights of the
// generated matmuls are stored int8_p16k4 and symmetric int4 ones int4_p16k8, as
// with int8 activations; fp8 ones panel16 (codes column by column, the row scales
// after them). An int4 table tied to the LM head is packed for the head (the
// generated gather reads int4_p16k8); an int8 table tied to the head stays row
// major (the gather reads int8 row major only), and so does int4 with zero points.
// CHECK-LABEL: kiln.weight @w8
// CHECK-SAME: layout <int8_p16k4>
// CHECK-LABEL: kiln.weight @w4
// CHECK-SAME: layout <int4_p16k8>
// CHECK-LABEL: kiln.weight @fp8
// CHECK-SAME: layout <panel16>
// CHECK-LABEL: kiln.weight @asym
// CHECK-NOT: layout
// CHECK-LABEL: kiln.weight @tied4
// CHECK-SAME: layout <int4_p16k8>
// CHECK-LABEL: kiln.weight @tied8
// CHECK-NOT: layout
// CHECK-LABEL: func.func
// PORTABLE-NOT: layout <

kiln.weight @w8 : tensor<64x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16384, dtype = "F32"> as #kiln.encoding<int8>
kiln.weight @w4 : tensor<64x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16384, dtype = "F32"> as #kiln.encoding<int4, group = 32>
kiln.weight @fp8 : tensor<64x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16384, dtype = "F32"> as #kiln.encoding<fp8_e4m3>
kiln.weight @asym : tensor<64x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16384, dtype = "F32"> as #kiln.encoding<int4, group = 32, asym>
kiln.weight @tied4 : tensor<100x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 25600, dtype = "F32"> as #kiln.encoding<int4, group = 32>
kiln.weight @tied8 : tensor<100x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 25600, dtype = "F32"> as #kiln.encoding<int8>
func.func @stage(%ids: tensor<?xi32>) -> tensor<?x100xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
  %t4 = kiln.weight_ref @tied4 : tensor<100x64xf32>
  %t8 = kiln.weight_ref @tied8 : tensor<100x64xf32>
  %x4 = kiln.embedding %t4, %ids : tensor<100x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
  %x8 = kiln.embedding %t8, %ids : tensor<100x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
  %x = kiln.add %x4, %x8 : tensor<?x64xf32>
  %a = kiln.weight_ref @w8 : tensor<64x64xf32>
  %ya = kiln.linear %x, %a : tensor<?x64xf32>, tensor<64x64xf32> -> tensor<?x64xf32>
  %b = kiln.weight_ref @w4 : tensor<64x64xf32>
  %yb = kiln.linear %ya, %b : tensor<?x64xf32>, tensor<64x64xf32> -> tensor<?x64xf32>
  %c = kiln.weight_ref @fp8 : tensor<64x64xf32>
  %yc = kiln.linear %yb, %c : tensor<?x64xf32>, tensor<64x64xf32> -> tensor<?x64xf32>
  %d = kiln.weight_ref @asym : tensor<64x64xf32>
  %yd = kiln.linear %yc, %d : tensor<?x64xf32>, tensor<64x64xf32> -> tensor<?x64xf32>
  %l4 = kiln.lm_head %yd, %t4 : tensor<?x64xf32>, tensor<100x64xf32> -> tensor<?x100xf32>
  %l8 = kiln.lm_head %yd, %t8 : tensor<?x64xf32>, tensor<100x64xf32> -> tensor<?x100xf32>
  %l = kiln.add %l4, %l8 : tensor<?x100xf32>
  return %l : tensor<?x100xf32>
}
