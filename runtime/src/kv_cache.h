// The KV cache of a session: keys and values of every decoder layer, f32,
// [layers][context][kv_heads * head_dim], one contiguous block each.
#ifndef KILN_RUNTIME_SRC_KV_CACHE_H_
#define KILN_RUNTIME_SRC_KV_CACHE_H_

#include <cstdint>

namespace kiln::rt {

struct KvCache {
  float* keys = nullptr;
  float* values = nullptr;
  int64_t layers = 0;
  int64_t context = 0;  // positions per layer
  int64_t width = 0;    // kv_heads * head_dim

  float* K(int64_t layer, int64_t pos) const { return keys + (layer * context + pos) * width; }
  float* V(int64_t layer, int64_t pos) const { return values + (layer * context + pos) * width; }
  uint64_t bytes() const { return static_cast<uint64_t>(2 * layers * context * width) * sizeof(float); }
};

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SRC_KV_CACHE_H_
