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
      const float qmax = encoding == kEncINT8 ? 127.0f : 7.0f;
      for (uint64_t g0 = 0; g0 < width; g0 += group) {
        float amax = 0.0f;
        for (uint32_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[g0 + i]));
        const float scale = amax / qmax, inv = amax > 0.0f ? qmax / amax : 0.0f;
        scales[g0 / group] = scale;
        // A NaN element becomes code 0 (never converted to an integer); infinities
        // make the group's scale infinite.
        auto code = [&](uint32_t i) {
          const float r = std::round(x[g0 + i] * inv);
          return r == r ? static_cast<int>(std::clamp(r, -qmax, qmax)) : 0;
        };
        if (encoding == kEncINT8) {
          int8_t* c = static_cast<int8_t*>(codes) + g0;
          for (uint32_t i = 0; i < group; ++i) c[i] = static_cast<int8_t>(code(i));
        } else {
          uint8_t* c = static_cast<uint8_t*>(codes) + g0 / 2;
          const uint32_t half = group / 2;
          for (uint32_t i = 0; i < half; ++i)
            c[i] = static_cast<uint8_t>((code(i) + 8) | ((code(i + half) + 8) << 4));
        }
      }
      return;
    }
    default: return;
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
    case kEncINT8: {
      const int8_t* c = static_cast<const int8_t*>(codes) + first;
      for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<float>(c[i]) * scales[(first + i) / group];
      return;
    }
    case kEncINT4: {
      const uint32_t half = group / 2;
      for (uint64_t g0 = 0; g0 < n; g0 += group) {
        const uint8_t* c = static_cast<const uint8_t*>(codes) + (first + g0) / 2;
        const float s = scales[(first + g0) / group];
        for (uint32_t i = 0; i < half; ++i) {
          out[g0 + i] = static_cast<float>((c[i] & 15) - 8) * s;
          out[g0 + i + half] = static_cast<float>((c[i] >> 4) - 8) * s;
        }
      }
      return;
    }
    default: return;
  }
}

}  // namespace kiln::format

#endif  // KILN_FORMATS_KV_CODEC_H_
