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

#include <algorithm>
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
  // The row of the first position a decoder stage writes, set by the session before
  // each one: the rows follow on from it (row_scratch: [max_prefill] for them), and the
  // positions are RoPE's only, which skip where a sliding window evicted some or
  // visual tokens keep their original positions. < 0: not set (refused).
  int32_t* row_scratch = nullptr;
  int64_t first_row = -1;
  // Spans (INT8/INT4, kiln_uk_attention_params_t.kv_span): > 0, the keys of `span`
  // rows (= group) share a scale per channel, computed when the span's last row is
  // written; until then the span's keys and values are read at full precision from
  // `open_k`/`open_v` ([layers][span][width] f32, row r at slot r % span: the rows
  // of the span being filled as the session wrote them, or decoded from the cache
  // after a reuse that ended inside a complete span). `stage_k`/`stage_v`
  // ([span + the longest prefill step][width]) hold the exact rows of a call that
  // crosses spans.
  int64_t span = 0;
  float* open_k = nullptr;
  float* open_v = nullptr;
  float* stage_k = nullptr;
  float* stage_v = nullptr;

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
  // The exact rows a call's attention reads (kiln_uk_attention_params_t kr, vr,
  // kv_exact_from); null without spans.
  struct Exact {
    const float* k = nullptr;
    const float* v = nullptr;
    int64_t from = 0;
  };
  // Writes the keys and values of rows [first, first + n) of a layer (row t's at
  // k + t * ld, v + t * ld): values encoded per row; with spans the keys of every span
  // completed encoded per channel, the span being filled kept at full precision, and
  // *exact set to the rows the attention reads exactly.
  void Append(int64_t layer, int64_t first, int64_t n, const float* k, const float* v, int64_t ld,
              Exact* exact) const;
  // The rows the attention of rows [first, first + n) reads exactly once Append wrote
  // them (what Append sets *exact to).
  Exact ExactOf(int64_t layer, int64_t first, int64_t n) const {
    if (span == 0 || n <= 0) return Exact();
    const int64_t from = first / span * span, end = (first + n - 1) / span * span;
    Exact e;
    e.k = end != from ? stage_k : open_k + layer * span * width;
    e.v = end != from ? stage_v : open_v + layer * span * width;
    e.from = from;
    return e;
  }
  // Rows [from - from % span, from) of the open rows decoded from the cache (the span
  // of row `from` is complete in it).
  void DecodeOpen(int64_t from) const;
  // The rows to copy for the first n of a block of 2^shift rows: whole spans (their
  // keys' scales fill the slots of all their rows).
  int64_t SpanEnd(int64_t n, int32_t shift) const {
    if (span == 0) return n;
    return std::min((n + span - 1) / span * span, int64_t{1} << shift);
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
