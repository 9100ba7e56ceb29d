// kv_codec.h — the bytes of an encoded KV cache row (formats/ukernel_abi.h,
// kiln_uk_attention_params_t): how the runtime writes keys and values into the cache
// and how the reference attention reads them back. Header-only, C++17.
//
// A row is the keys (or values) of one position of one layer: `width` = kv_heads *
// head_dim elements. F32 and F16 store the elements; INT8 and INT4 store codes with
// one f32 scale per `group` elements (symmetric: x = code * scale, scale = max|x| /
// 127 or / 7, codes rounded to nearest, ties away from zero). INT4 packs a group of g
// elements into g / 2 bytes: byte i = (code[i] + 8) | (code[i + g / 2] + 8) << 4, so a
// vector kernel reads the first half of a group from the low nibbles of g / 2
// consecutive bytes and the second half from their high nibbles.
//
// Spans (kiln_uk_attention_params_t.kv_span): a session's INT8/INT4 cache whose group
// is a power of two quantises keys per channel, as KIVI does: the keys of a span of
// `group` consecutive positions share one scale per element of the row
// (EncodeKeySpan, written when the span's last position is), stored in the span's
// rows' scale slots (group rows x width / group slots = width scales); values keep
// their per-row groups. Until its span is complete a position's keys and values are
// read at full precision.
#ifndef KILN_FORMATS_KV_CODEC_H_
#define KILN_FORMATS_KV_CODEC_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats/encoding.h"
#include "formats/numeric.h"

namespace kiln::format {

// Whether `encoding` can hold a KV cache with groups of `group` elements of rows of
// heads of `head_dim` elements (INT8/INT4 need a group dividing head_dim, even for
// INT4; F32/F16 take group 0).
inline bool KvEncodingValid(uint8_t encoding, uint32_t group, uint32_t head_dim) {
  switch (encoding) {
    case kEncF32:
    case kEncF16: return group == 0;
    case kEncINT8: return group > 0 && head_dim % group == 0;
    case kEncINT4: return group > 0 && group % 2 == 0 && head_dim % group == 0;
    default: return false;
  }
}

// Bytes of the codes of one row, and scales per row.
inline uint64_t KvRowBytes(uint8_t encoding, uint64_t width) {
  switch (encoding) {
    case kEncF32: return 4 * width;
    case kEncF16: return 2 * width;
    case kEncINT8: return width;
    case kEncINT4: return width / 2;
    default: return 0;
  }
}
inline uint64_t KvRowScales(uint8_t encoding, uint64_t width, uint32_t group) {
  return (encoding == kEncINT8 || encoding == kEncINT4) && group > 0 ? width / group : 0;
}

// The group size kiln-compile picks for a quantised cache of heads of head_dim: 32
// when it divides head_dim (the vector kernels' unit), else the whole head.
inline uint32_t KvDefaultGroup(uint8_t encoding, uint32_t head_dim) {
  if (encoding != kEncINT8 && encoding != kEncINT4) return 0;
  return head_dim % 32 == 0 ? 32 : head_dim;
}

// The code of x times `inv` (qmax / max|x|) for a symmetric quantiser of `qmax`,
// rounded to nearest, ties away from zero; a NaN becomes code 0 (never converted to an
// integer).
inline int KvCode(float x, float inv, float qmax) {
  const float r = std::round(x * inv);
  return r == r ? static_cast<int>(std::clamp(r, -qmax, qmax)) : 0;
}

// Packs the codes of a row of `width` elements (code(i) for element i) as `encoding`
// stores them: INT8 one byte each, INT4 two per byte within each group.
template <class Code>
inline void PackKvCodes(uint8_t encoding, uint32_t group, uint64_t width, void* codes, Code code) {
  if (encoding == kEncINT8) {
    int8_t* c = static_cast<int8_t*>(codes);
    for (uint64_t i = 0; i < width; ++i) c[i] = static_cast<int8_t>(code(i));
    return;
  }
  const uint32_t half = group / 2;
  for (uint64_t g0 = 0; g0 < width; g0 += group) {
    uint8_t* c = static_cast<uint8_t*>(codes) + g0 / 2;
    for (uint32_t i = 0; i < half; ++i)
      c[i] = static_cast<uint8_t>((code(g0 + i) + 8) | ((code(g0 + i + half) + 8) << 4));
  }
}

// Keys per channel (kiln_uk_attention_params_t.kv_span, INT8/INT4): the keys of `span`
// consecutive positions (rows x + t * ldx, `width` floats each) get one symmetric
// scale per element of the row, max|x| over the span / 127 or / 7, written to
// scales[0, width); row t's codes go to codes + t * KvRowBytes (packed as rows are).
inline void EncodeKeySpan(uint8_t encoding, uint32_t group, const float* x, uint64_t ldx, uint64_t span,
                          uint64_t width, uint8_t* codes, float* scales) {
  const float qmax = encoding == kEncINT8 ? 127.0f : 7.0f;
  for (uint64_t e = 0; e < width; ++e) {  // max|x| per channel first, the scales last
    float amax = 0.0f;
    for (uint64_t t = 0; t < span; ++t) amax = std::max(amax, std::fabs(x[t * ldx + e]));
    scales[e] = amax;
  }
  const uint64_t row_bytes = KvRowBytes(encoding, width);
  for (uint64_t t = 0; t < span; ++t)
    PackKvCodes(encoding, group, width, codes + t * row_bytes, [&](uint64_t e) {
      return KvCode(x[t * ldx + e], scales[e] > 0.0f ? qmax / scales[e] : 0.0f, qmax);
    });
  for (uint64_t e = 0; e < width; ++e) scales[e] /= qmax;
}

// Encodes `width` floats into `codes` (KvRowBytes) and `scales` (KvRowScales).
inline void EncodeKvRow(uint8_t encoding, uint32_t group, const float* x, uint64_t width, void* codes,
                        float* scales) {
  switch (encoding) {
    case kEncF32: std::memcpy(codes, x, 4 * width); return;
    case kEncF16: {
      uint16_t* h = static_cast<uint16_t*>(codes);
      for (uint64_t i = 0; i < width; ++i) h[i] = numeric::F32ToF16(x[i]);
      return;
    }
    case kEncINT8:
    case kEncINT4: {
      // Infinities make their group's scale infinite.
      const float qmax = encoding == kEncINT8 ? 127.0f : 7.0f;
      for (uint64_t g0 = 0; g0 < width; g0 += group) {
        float amax = 0.0f;
        for (uint32_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[g0 + i]));
        scales[g0 / group] = amax / qmax;
        const float inv = amax > 0.0f ? qmax / amax : 0.0f;
        PackKvCodes(encoding, group, group, static_cast<uint8_t*>(codes) + KvRowBytes(encoding, g0),
                    [&](uint64_t i) { return KvCode(x[g0 + i], inv, qmax); });
      }
      return;
    }
    default: return;
  }
}

// Elements [first, first + n) of an INT8/INT4 row (first and n multiples of the group)
// as floats: codes times one scale per group (scales[e / group]) or, kPerElement, one
// per element (scales[e]: a span's keys).
template <bool kPerElement>
inline void DecodeKvCodes(uint8_t encoding, uint32_t group, const void* codes, const float* scales, uint64_t first,
                          uint64_t n, float* out) {
  const uint32_t half = group / 2;
  for (uint64_t g0 = 0; g0 < n; g0 += group) {
    const uint64_t e0 = first + g0;
    const float* s = kPerElement ? scales + e0 : scales + e0 / group;
    auto scale = [&](uint32_t i) { return kPerElement ? s[i] : s[0]; };
    if (encoding == kEncINT8) {
      const int8_t* c = static_cast<const int8_t*>(codes) + e0;
      for (uint32_t i = 0; i < group; ++i) out[g0 + i] = static_cast<float>(c[i]) * scale(i);
      continue;
    }
    const uint8_t* c = static_cast<const uint8_t*>(codes) + e0 / 2;
    for (uint32_t i = 0; i < half; ++i) {
      out[g0 + i] = static_cast<float>((c[i] & 15) - 8) * scale(i);
      out[g0 + i + half] = static_cast<float>((c[i] >> 4) - 8) * scale(i + half);
    }
  }
}

// Elements [first, first + n) of an encoded row (first and n multiples of the group)
// as floats.
inline void DecodeKvSpan(uint8_t encoding, uint32_t group, const void* codes, const float* scales, uint64_t first,
                         uint64_t n, float* out) {
  switch (encoding) {
    case kEncF32: std::memcpy(out, static_cast<const float*>(codes) + first, 4 * n); return;
    case kEncF16: {
      const uint16_t* h = static_cast<const uint16_t*>(codes) + first;
      for (uint64_t i = 0; i < n; ++i) out[i] = numeric::F16ToF32(h[i]);
      return;
    }
    case kEncINT8:
    case kEncINT4: DecodeKvCodes<false>(encoding, group, codes, scales, first, n, out); return;
    default: return;
  }
}

// Elements [first, first + n) of a key row of a span (EncodeKeySpan) as floats:
// `span_scales` are the span's, one per element of the row.
inline void DecodeKeySpanRow(uint8_t encoding, uint32_t group, const void* codes, const float* span_scales,
                             uint64_t first, uint64_t n, float* out) {
  DecodeKvCodes<true>(encoding, group, codes, span_scales, first, n, out);
}

}  // namespace kiln::format

#endif  // KILN_FORMATS_KV_CODEC_H_
