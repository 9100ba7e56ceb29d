// The KV cache of a session: keys and values of every decoder layer,
// [layers][context][kv_heads * head_dim] in the cache's encoding (f32, f16, or int8 /
// int4 codes with one f32 scale per group, formats/kv_codec.h), codes and scales in
// one contiguous block each for keys and for values.
#ifndef KILN_RUNTIME_SRC_KV_CACHE_H_
#define KILN_RUNTIME_SRC_KV_CACHE_H_

#include <cstdint>

#include "formats/kv_codec.h"

namespace kiln::rt {

struct KvCache {
  uint8_t* keys = nullptr;  // codes
  uint8_t* values = nullptr;
  float* key_scales = nullptr;  // INT8/INT4 only
  float* value_scales = nullptr;
  int64_t layers = 0;
  int64_t context = 0;  // positions per layer
  int64_t width = 0;    // kv_heads * head_dim
  uint8_t encoding = format::kEncF32;
  uint32_t group = 0;

  uint64_t row_bytes() const { return format::KvRowBytes(encoding, static_cast<uint64_t>(width)); }
  uint64_t row_scales() const { return format::KvRowScales(encoding, static_cast<uint64_t>(width), group); }
  uint64_t row(int64_t layer, int64_t pos) const { return static_cast<uint64_t>(layer * context + pos); }
  uint8_t* K(int64_t layer, int64_t pos) const { return keys + row(layer, pos) * row_bytes(); }
  uint8_t* V(int64_t layer, int64_t pos) const { return values + row(layer, pos) * row_bytes(); }
  float* KS(int64_t layer, int64_t pos) const { return key_scales + row(layer, pos) * row_scales(); }
  float* VS(int64_t layer, int64_t pos) const { return value_scales + row(layer, pos) * row_scales(); }
  // Encodes one position's keys and values (width floats each) into the cache.
  void Write(int64_t layer, int64_t pos, const float* k, const float* v) const {
    format::EncodeKvRow(encoding, group, k, static_cast<uint64_t>(width), K(layer, pos),
                        row_scales() > 0 ? KS(layer, pos) : nullptr);
    format::EncodeKvRow(encoding, group, v, static_cast<uint64_t>(width), V(layer, pos),
                        row_scales() > 0 ? VS(layer, pos) : nullptr);
  }
  // Bytes per token over every layer, keys and values, codes and scales.
  uint64_t token_bytes() const {
    return 2 * static_cast<uint64_t>(layers) * (row_bytes() + 4 * row_scales());
  }
  uint64_t bytes() const { return token_bytes() * static_cast<uint64_t>(context); }
};

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SRC_KV_CACHE_H_
