// Budget met: the sensitive attention weight keeps int8, the MLP weights go to int4.
// RUN: kiln-opt %s --kiln-assign-precision="memory-budget=11000" 2>%t.remarks | FileCheck %s --check-prefix=BUDGET
// RUN: FileCheck %s --check-prefix=REMARK < %t.remarks
// The same by average bits: 6 bits on 12352 parameters is 9264 bytes.
// RUN: kiln-opt %s --kiln-assign-precision="bits-per-weight=6" 2>/dev/null | FileCheck %s --check-prefix=BPW
// Units: 0.011MB is 11000 bytes.
// RUN: kiln-opt %s --kiln-assign-precision="memory-budget=0.011MB" 2>/dev/null | FileCheck %s --check-prefix=BUDGET
// A generous budget keeps the exact encodings.
// RUN: kiln-opt %s --kiln-assign-precision="memory-budget=1GB" 2>/dev/null | FileCheck %s --check-prefix=ROOMY
// Overrides are honoured, and apply to matrices only (the norm vector stays f32).
// RUN: kiln-opt %s --kiln-assign-precision="precision=mlp.*=int4_g32" 2>/dev/null | FileCheck %s --check-prefix=OVERRIDE
// An override wins over the budget's choice.
// RUN: kiln-opt %s --kiln-assign-precision="memory-budget=14000 precision=attn.*=bf16" 2>/dev/null | FileCheck %s --check-prefix=BOTH
// No budget and no overrides: nothing changes.
// RUN: kiln-opt %s --kiln-assign-precision 2>/dev/null | FileCheck %s --check-prefix=NOOP

// BUDGET: kiln.weight @attn.q {{.*}} as <int8>
// BUDGET: kiln.weight @mlp.up {{.*}} as <int4, group = 32>
// BUDGET: kiln.weight @mlp.down {{.*}} as <int4, group = 32>
// BUDGET: kiln.weight @norm {{.*}} as <f32>
// REMARK-DAG: remark: int8: 16.4 KB -> 4352 bytes, sensitivity 1.00E-05
// REMARK-DAG: remark: int4_g32: 16.4 KB -> 2304 bytes, sensitivity 1.00E-04
// REMARK-DAG: remark: precision: 4 weights, 49.4 KB -> 9216 bytes (5.97 bits per weight), total sensitivity 3.10E-04, budget 11.0 KB
// BPW: kiln.weight @attn.q {{.*}} as <int8>
// BPW: kiln.weight @mlp.up {{.*}} as <int4, group = 32>
// ROOMY: kiln.weight @attn.q {{.*}} as <f32>
// ROOMY: kiln.weight @mlp.up {{.*}} as <f32>
// OVERRIDE: kiln.weight @attn.q {{.*}} as <f32>
// OVERRIDE: kiln.weight @mlp.up {{.*}} as <int4, group = 32>
// OVERRIDE: kiln.weight @mlp.down {{.*}} as <int4, group = 32>
// OVERRIDE: kiln.weight @norm {{.*}} as <f32>
// BOTH: kiln.weight @attn.q {{.*}} as <bf16>
// BOTH: kiln.weight @mlp.up {{.*}} as <int4, group = 32>
// NOOP: kiln.weight @attn.q {{.*}} as <f32>
// NOOP: kiln.weight @mlp.up {{.*}} as <f32>
// NOOP-NOT: as <int4
module {
  kiln.weight @attn.q : tensor<64x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16384, dtype = "F32"> as #kiln.encoding<f32> {kiln.sensitivity = {int8 = 1.0e-5 : f64, int4_g32 = 5.0e-2 : f64}}
  kiln.weight @mlp.up : tensor<64x64xf32> from #kiln.source<"m.safetensors", offset = 16384, size = 16384, dtype = "F32"> as #kiln.encoding<f32> {kiln.sensitivity = {int8 = 1.0e-6 : f64, int4_g32 = 1.0e-4 : f64}}
  kiln.weight @mlp.down : tensor<64x64xf32> from #kiln.source<"m.safetensors", offset = 32768, size = 16384, dtype = "F32"> as #kiln.encoding<f32> {kiln.sensitivity = {int8 = 1.0e-6 : f64, int4_g32 = 2.0e-4 : f64}}
  kiln.weight @norm : tensor<64xf32> from #kiln.source<"m.safetensors", offset = 49152, size = 256, dtype = "F32"> as #kiln.encoding<f32>
  func.func @stage(%x: tensor<?x64xf32>) -> tensor<?x64xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {
    %n = kiln.weight_ref @norm : tensor<64xf32>
    %h = kiln.rms_norm %x, %n {epsilon = 1.0e-05 : f32} : tensor<?x64xf32>, tensor<64xf32> -> tensor<?x64xf32>
    %q = kiln.weight_ref @attn.q : tensor<64x64xf32>
    %a = kiln.linear %h, %q : tensor<?x64xf32>, tensor<64x64xf32> -> tensor<?x64xf32>
    %u = kiln.weight_ref @mlp.up : tensor<64x64xf32>
    %b = kiln.linear %a, %u : tensor<?x64xf32>, tensor<64x64xf32> -> tensor<?x64xf32>
    %d = kiln.weight_ref @mlp.down : tensor<64x64xf32>
    %c = kiln.linear %b, %d : tensor<?x64xf32>, tensor<64x64xf32> -> tensor<?x64xf32>
    return %c : tensor<?x64xf32>
  }
}
