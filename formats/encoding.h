// encoding.h — the storage encodings of weights: sizes, byte layout and
// dequantisation, shared by the compiler (quantiser, size accounting) and the runtime
// (kernels). Header-only C++17, no dependencies. The definitions are those of
// docs/precision.md and of the NumPy reference tests/models/kiln_models/quant.py.
//
// A weight is viewed as [rows, cols] (rows = first dimension). Its bytes are
//   codes   rows*cols elements: fp8/int8 one byte each; int4 two per byte (element 2k
//           in the low nibble of byte k, 2k+1 in the high nibble)
//   scales  fp8, int8: f32 per row; int4: f16 per (row, group)
//   zeros   int4 asymmetric: u8 per (row, group)
#ifndef KILN_FORMATS_ENCODING_H_
#define KILN_FORMATS_ENCODING_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats/numeric.h"

namespace kiln::format {

// Mirrors kiln::fb::Encoding (formats/kiln.fbs); kept as plain integers here so that
// this header needs no generated code.
enum EncodingId : uint8_t {
  kEncF32 = 0,
  kEncF16 = 1,
  kEncBF16 = 2,
  kEncFp8E4M3 = 3,
  kEncFp8E5M2 = 4,
  kEncInt8 = 5,
  kEncInt4 = 6,
};

struct EncodingSpec {
  uint8_t id = kEncF32;
  uint32_t group = 0;     // int4 only
  bool symmetric = true;  // int4 only
};

inline bool IsQuantized(uint8_t id) { return id >= kEncFp8E4M3; }

// Bytes of a [rows, cols] weight; 0 when the encoding cannot hold that shape
// (int4 needs cols divisible by the group size). Overflow is the caller's concern
// (the runtime verifier bounds rows and cols first).
inline uint64_t StorageBytes(const EncodingSpec& e, uint64_t rows, uint64_t cols) {
  uint64_t n = rows * cols;
  switch (e.id) {
    case kEncF32: return 4 * n;
    case kEncF16:
    case kEncBF16: return 2 * n;
    case kEncFp8E4M3:
    case kEncFp8E5M2:
    case kEncInt8: return n + 4 * rows;
    case kEncInt4: {
      if (e.group == 0 || cols % e.group != 0) return 0;
      uint64_t groups = rows * (cols / e.group);
      return n / 2 + 2 * groups + (e.symmetric ? 0 : groups);
    }
    default: return 0;
  }
}

// ---- fp8 ----

inline float Fp8ToF32(uint8_t code, bool e4m3) {
  const int man_bits = e4m3 ? 3 : 2, exp_bits = e4m3 ? 4 : 5, bias = e4m3 ? 7 : 15;
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int e = (code >> man_bits) & ((1 << exp_bits) - 1);
  const int m = code & ((1 << man_bits) - 1);
  if (e4m3 && e == 15 && m == 7) return NAN;
  if (!e4m3 && e == 31) return m ? NAN : sign * INFINITY;
  const float frac = static_cast<float>(m) / static_cast<float>(1 << man_bits);
  if (e == 0) return sign * frac * std::ldexp(1.0f, 1 - bias);
  return sign * (1.0f + frac) * std::ldexp(1.0f, e - bias);
}

// Nearest fp8 code of x (ties to the even code), saturating at the largest finite
// value; -0 and values that round to zero give code 0.
inline uint8_t F32ToFp8(float x, bool e4m3) {
  const uint8_t max_code = e4m3 ? 0x7E : 0x7B;  // 448, 57344
  float a = std::fabs(x);
  if (std::isnan(a)) a = 0.0f;
  // Positive codes are ordered by value: binary search for the first >= a.
  int lo = 0, hi = max_code;
  if (a >= Fp8ToF32(max_code, e4m3)) {
    lo = hi = max_code;
  } else {
    while (hi - lo > 1) {
      int mid = (lo + hi) / 2;
      if (Fp8ToF32(static_cast<uint8_t>(mid), e4m3) >= a) hi = mid;
      else lo = mid;
    }
    float vlo = Fp8ToF32(static_cast<uint8_t>(lo), e4m3), vhi = Fp8ToF32(static_cast<uint8_t>(hi), e4m3);
    if (a <= vlo) {
      hi = lo;
    } else {
      float dlo = a - vlo, dhi = vhi - a;
      lo = hi = (dhi < dlo || (dhi == dlo && (hi & 1) == 0)) ? hi : lo;
    }
  }
  uint8_t code = static_cast<uint8_t>(lo);
  return (x < 0 && code != 0) ? static_cast<uint8_t>(code | 0x80) : code;
}

// ---- dequantisation ----

// Decodes row `row` of a [rows, cols] weight stored as `e` at `data` into out[cols].
inline void DecodeRow(const EncodingSpec& e, const uint8_t* data, uint64_t rows, uint64_t cols, uint64_t row,
                      float* out) {
  switch (e.id) {
    case kEncF32:
      std::memcpy(out, data + 4 * row * cols, 4 * cols);
      return;
    case kEncF16: {
      const uint8_t* p = data + 2 * row * cols;
      for (uint64_t i = 0; i < cols; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = numeric::F16ToF32(h);
      }
      return;
    }
    case kEncBF16: {
      const uint8_t* p = data + 2 * row * cols;
      for (uint64_t i = 0; i < cols; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = numeric::Bf16ToF32(h);
      }
      return;
    }
    case kEncFp8E4M3:
    case kEncFp8E5M2: {
      const bool e4m3 = e.id == kEncFp8E4M3;
      float scale;
      std::memcpy(&scale, data + rows * cols + 4 * row, 4);
      const uint8_t* c = data + row * cols;
      for (uint64_t i = 0; i < cols; ++i) out[i] = Fp8ToF32(c[i], e4m3) * scale;
      return;
    }
    case kEncInt8: {
      float scale;
      std::memcpy(&scale, data + rows * cols + 4 * row, 4);
      const int8_t* q = reinterpret_cast<const int8_t*>(data + row * cols);
      for (uint64_t i = 0; i < cols; ++i) out[i] = static_cast<float>(q[i]) * scale;
      return;
    }
    case kEncInt4: {
      const uint64_t groups_per_row = cols / e.group;
      const uint8_t* codes = data;  // packed over the whole matrix
      const uint8_t* scales = data + rows * cols / 2;
      const uint8_t* zeros = scales + 2 * rows * groups_per_row;
      for (uint64_t g = 0; g < groups_per_row; ++g) {
        uint16_t sh;
        std::memcpy(&sh, scales + 2 * (row * groups_per_row + g), 2);
        const float s = numeric::F16ToF32(sh);
        const float z = e.symmetric ? 8.0f : static_cast<float>(zeros[row * groups_per_row + g]);
        for (uint64_t i = g * e.group; i < (g + 1) * e.group; ++i) {
          uint64_t idx = row * cols + i;
          uint8_t byte = codes[idx / 2];
          uint8_t c = (idx & 1) ? (byte >> 4) : (byte & 0xF);
          out[i] = (static_cast<float>(c) - z) * s;
        }
      }
      return;
    }
    default:
      std::memset(out, 0, 4 * cols);
      return;
  }
}

}  // namespace kiln::format

#endif  // KILN_FORMATS_ENCODING_H_
