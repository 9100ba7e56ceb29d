// RUN: kiln-opt %s --kiln-plan-memory=kv-cache=int8 | FileCheck %s --check-prefix=INT8
// RUN: kiln-opt %s --kiln-plan-memory=kv-cache=int4 | FileCheck %s --check-prefix=INT4

// head_dim 24 is not a multiple of 32: one scale per head.
// INT8: kiln.kv_cache = #kiln.kv_cache<int8, group = 24>
// INT4: kiln.kv_cache = #kiln.kv_cache<int4, group = 24>
module attributes {kiln.text = #kiln.text_config<vocab_size = 512, hidden_size = 96, num_layers = 2, num_heads = 4,
                                                 num_kv_heads = 2, head_dim = 24, max_position_embeddings = 2048>} {
}
