// RUN: kiln-opt %s --kiln-plan-memory | FileCheck %s --check-prefix=F32
// RUN: kiln-opt %s --kiln-plan-memory=kv-cache=f16 | FileCheck %s --check-prefix=F16
// RUN: kiln-opt %s --kiln-plan-memory=kv-cache=int8 | FileCheck %s --check-prefix=INT8
// RUN: kiln-opt %s --kiln-plan-memory=kv-cache=int4 | FileCheck %s --check-prefix=INT4
// RUN: kiln-opt %s --kiln-plan-memory=kv-cache=int8 | kiln-opt | FileCheck %s --check-prefix=INT8
// RUN: not kiln-opt %s --kiln-plan-memory=kv-cache=int2 2>&1 | FileCheck %s --check-prefix=BAD

// The KV cache's encoding is recorded on the module: one scale per 32 channels when
// head_dim (64 here) is a multiple of 32.
// F32: kiln.kv_cache = #kiln.kv_cache<f32>
// F16: kiln.kv_cache = #kiln.kv_cache<f16>
// INT8: kiln.kv_cache = #kiln.kv_cache<int8, group = 32>
// INT4: kiln.kv_cache = #kiln.kv_cache<int4, group = 32>
// BAD: error: kiln-plan-memory: kv-cache must be f32, f16, int8 or int4, got 'int2'
module attributes {kiln.text = #kiln.text_config<vocab_size = 512, hidden_size = 256, num_layers = 2, num_heads = 4,
                                                 num_kv_heads = 2, head_dim = 64, max_position_embeddings = 2048>} {
}
