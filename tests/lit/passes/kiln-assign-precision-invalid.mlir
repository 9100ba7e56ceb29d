// RUN: kiln-opt %s --kiln-assign-precision="memory-budget=1000" -verify-diagnostics
// RUN: not kiln-opt %s --kiln-assign-precision="memory-budget=lots" 2>&1 | FileCheck %s --check-prefix=SIZE
// RUN: not kiln-opt %s --kiln-assign-precision="precision=.*=int3" 2>&1 | FileCheck %s --check-prefix=LABEL

// SIZE: error: kiln-assign-precision: memory budget 'lots' is not a size (e.g. 1.2GB, 800MB, 512MiB)
// LABEL: error: kiln-assign-precision: override '.*=int3': unknown encoding 'int3'

// The smallest encodings need 2304 bytes (int4) + 256 (the f32 vector): infeasible.
// expected-error @below {{kiln-assign-precision: the memory budget of 1000 bytes cannot be met: the smallest encodings the weights allow need 2560 bytes (2560 bytes, 4.92 bits per weight); give --memory-budget=2560 or more}}
module {
  kiln.weight @w : tensor<64x64xf32> from #kiln.source<"m.safetensors", offset = 0, size = 16384, dtype = "F32"> as #kiln.encoding<f32> {kiln.sensitivity = {int8 = 1.0e-5 : f64, int4_g32 = 1.0e-3 : f64}}
  kiln.weight @v : tensor<64xf32> from #kiln.source<"m.safetensors", offset = 16384, size = 256, dtype = "F32"> as #kiln.encoding<f32>
}
