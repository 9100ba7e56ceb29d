// The KV cache of a session: keys and values of every decoder layer,
// [layers][rows][kv_heads * head_dim] in the cache's encoding (f32, f16, or int8 /
// int4 codes with one f32 scale per group, formats/kv_codec.h), codes and scales in
// one contiguous region each for keys and for values. Unpaged, position p of a layer
// is row p (rows = the context). Paged, the rows are a pool's blocks of 2^block_shift
// positions and position p is in row blocks[p >> block_shift] * 2^block_shift +
// p % 2^block_shift (KvPool, kv_pool.h). After a sliding window evicted positions,
// "position" below means the row's index in that order (the session's rows), which
// the position the model sees exceeds by `evicted`.
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
  int64_t context = 0;  // positions a session may fill
  int64_t rows = 0;     // rows per layer: the context, or the pool's blocks x their positions
  int64_t width = 0;    // kv_heads * head_dim
  uint8_t encoding = format::kEncF32;
  uint32_t group = 0;
  const int32_t* blocks = nullptr;  // paged: the session's block table
  int32_t block_shift = 0;
  int64_t mapped = 0;  // positions with a row: the context, or the blocks held x their positions
  // A sliding window evicted this many positions before the ones written now: position
  // p is written at row p - evicted (row_scratch: [max_prefill] for those rows).
  int64_t evicted = 0;
  int32_t* row_scratch = nullptr;

  uint64_t row_bytes() const { return format::KvRowBytes(encoding, static_cast<uint64_t>(width)); }
  uint64_t row_scales() const { return format::KvRowScales(encoding, static_cast<uint64_t>(width), group); }
  // The row of position `pos` (through the block table when paged).
  int64_t Phys(int64_t pos) const {
    if (blocks == nullptr) return pos;
    return (static_cast<int64_t>(blocks[pos >> block_shift]) << block_shift) + (pos & ((int64_t{1} << block_shift) - 1));
  }
  uint64_t row(int64_t layer, int64_t r) const { return static_cast<uint64_t>(layer * rows + r); }
  // Row r (physical) of a layer.
  uint8_t* K(int64_t layer, int64_t r) const { return keys + row(layer, r) * row_bytes(); }
  uint8_t* V(int64_t layer, int64_t r) const { return values + row(layer, r) * row_bytes(); }
  float* KS(int64_t layer, int64_t r) const { return key_scales + row(layer, r) * row_scales(); }
  float* VS(int64_t layer, int64_t r) const { return value_scales + row(layer, r) * row_scales(); }
  // Encodes one position's keys and values (width floats each) into the cache.
  void Write(int64_t layer, int64_t pos, const float* k, const float* v) const {
    const int64_t r = Phys(pos);
    format::EncodeKvRow(encoding, group, k, static_cast<uint64_t>(width), K(layer, r),
                        row_scales() > 0 ? KS(layer, r) : nullptr);
    format::EncodeKvRow(encoding, group, v, static_cast<uint64_t>(width), V(layer, r),
                        row_scales() > 0 ? VS(layer, r) : nullptr);
  }
  // Copies rows [from, from + n) of every layer of `src` (this cache, or another of
  // the same encoding and width) to rows [to, to + n) of this one.
  void CopyRows(const KvCache& src, int64_t from, int64_t to, int64_t n) const;
  // Gives the pages of rows [from, from + n) of every layer back to the system
  // (platform DiscardPages): their contents are no longer needed.
  void DiscardRows(int64_t from, int64_t n) const;
  // Bytes per token over every layer, keys and values, codes and scales.
  uint64_t token_bytes() const {
    return 2 * static_cast<uint64_t>(layers) * (row_bytes() + 4 * row_scales());
  }
  uint64_t bytes() const { return token_bytes() * static_cast<uint64_t>(rows); }
};

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SRC_KV_CACHE_H_
