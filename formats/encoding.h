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

// The encoding ids of formats/encodings.def (kEncF32, kEncINT4, ...), kept as plain
// integers here so that this header needs no generated code.
enum EncodingId : uint8_t {
#define KILN_ENCODING(name, id, label, bits, quantized) kEnc##name = id,
#include "formats/encodings.def"
#undef KILN_ENCODING
};
constexpr uint8_t kNumEncodings = 0
#define KILN_ENCODING(name, id, label, bits, quantized) +1
#include "formats/encodings.def"
#undef KILN_ENCODING
    ;
// The label of an encoding id ("f32", "int4", ...), or null.
inline const char* EncodingName(uint8_t id) {
  switch (id) {
#define KILN_ENCODING(name, id, label, bits, quantized) \
  case id: return #label;
#include "formats/encodings.def"
#undef KILN_ENCODING
    default: return nullptr;
  }
}

// Bit of an encoding in the kernel tables' sets of accepted weight encodings.
constexpr uint32_t EncodingBit(uint8_t id) { return 1u << id; }

struct EncodingSpec {
  uint8_t id = kEncF32;
  uint32_t group = 0;     // int4 only
  bool symmetric = true;  // int4 only
};

inline bool IsQuantized(uint8_t id) {
  switch (id) {
#define KILN_ENCODING(name, id, label, bits, quantized) \
  case id: return quantized != 0;
#include "formats/encodings.def"
#undef KILN_ENCODING
    default: return false;
  }
}

// Byte offsets of an int4 weight's scales and zero points (see Int4View).
inline uint64_t Int4ScalesOffset(uint64_t rows, uint64_t cols) { return rows * cols / 2; }
inline uint64_t Int4ZerosOffset(uint64_t rows, uint64_t cols, uint64_t group) {
  return Int4ScalesOffset(rows, cols) + 2 * rows * (cols / group);
}

// Bytes of a [rows, cols] weight; 0 when the encoding cannot hold that shape
// (int4 needs cols divisible by the group size). Overflow is the caller's concern
// (the runtime verifier bounds rows and cols first).
inline uint64_t StorageBytes(const EncodingSpec& e, uint64_t rows, uint64_t cols) {
  uint64_t n = rows * cols;
  switch (e.id) {
    case kEncF32: return 4 * n;
    case kEncF16:
    case kEncBF16: return 2 * n;
    case kEncFP8_E4M3:
    case kEncFP8_E5M2:
    case kEncINT8: return n + 4 * rows;
    case kEncINT4: {
      if (e.group == 0 || cols % e.group != 0) return 0;
      uint64_t groups = rows * (cols / e.group);
      return Int4ZerosOffset(rows, cols, e.group) + (e.symmetric ? 0 : groups);
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

// ---- float encodings ----

// n elements of a float encoding (f32, f16, bf16), starting at element `first`, as
// f32. Other encodings give zeros.
inline void DecodeFloatElements(uint8_t id, const uint8_t* data, uint64_t first, uint64_t n, float* out) {
  switch (id) {
    case kEncF32:
      std::memcpy(out, data + 4 * first, 4 * n);
      return;
    case kEncF16:
    case kEncBF16:
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * (first + i), 2);
        out[i] = id == kEncF16 ? numeric::F16ToF32(h) : numeric::Bf16ToF32(h);
      }
      return;
    default:
      std::memset(out, 0, 4 * n);
      return;
  }
}

// n f32 values stored in a float encoding (round to nearest even). False for the
// quantised encodings (compiler/quantization owns those).
inline bool EncodeFloatElements(uint8_t id, const float* in, uint64_t n, uint8_t* out) {
  switch (id) {
    case kEncF32:
      std::memcpy(out, in, 4 * n);
      return true;
    case kEncF16:
    case kEncBF16:
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h = id == kEncF16 ? numeric::F32ToF16(in[i]) : numeric::F32ToBf16(in[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return true;
    default:
      return false;
  }
}

// ---- int4: the byte layout, written once ----
//
// [codes: rows*cols/2 bytes, element i (row-major) in byte i/2, the low nibble for
// even i, the high nibble for odd i][scales: f16 per (row, group), row-major]
// [zeros: u8 per (row, group), asymmetric only]. A code c stands for (c - z) * s,
// z = 8 when symmetric.
struct Int4View {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  const uint8_t* zeros = nullptr;  // null when symmetric
  uint64_t cols = 0;
  uint64_t group = 0;
  uint64_t groups_per_row = 0;

  // `data` holds a [rows, cols] int4 weight of `spec` (group divides cols).
  static Int4View Of(const EncodingSpec& spec, const uint8_t* data, uint64_t rows, uint64_t cols) {
    Int4View v;
    v.codes = data;
    v.scales = data + Int4ScalesOffset(rows, cols);
    v.zeros = spec.symmetric ? nullptr : data + Int4ZerosOffset(rows, cols, spec.group);
    v.cols = cols;
    v.group = spec.group;
    v.groups_per_row = cols / spec.group;
    return v;
  }
  static uint8_t Code(const uint8_t* codes, uint64_t index) {
    uint8_t b = codes[index >> 1];
    return (index & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xF);
  }
  static void SetCode(uint8_t* codes, uint64_t index, uint8_t c) {
    uint8_t& b = codes[index >> 1];
    b = (index & 1) ? static_cast<uint8_t>((b & 0x0F) | ((c & 0xF) << 4)) : static_cast<uint8_t>((b & 0xF0) | (c & 0xF));
  }
  uint8_t code(uint64_t row, uint64_t col) const { return Code(codes, row * cols + col); }
  float scale(uint64_t row, uint64_t g) const {
    uint16_t h;
    std::memcpy(&h, scales + 2 * (row * groups_per_row + g), 2);
    return numeric::F16ToF32(h);
  }
  int32_t zero(uint64_t row, uint64_t g) const { return zeros ? zeros[row * groups_per_row + g] : 8; }
};

// ---- layouts: how a weight's bytes are arranged (kiln.fbs Layout) ----
//
// kLayoutRowMajor: the bytes above. Value 1 (int4_p4k32, schema 1.2) is retired:
// neither written nor read.
//
// kLayoutPanel16: a float weight (f32, f16, bf16) or an fp8 one (E4M3, E5M2) for the
// generated matmuls with float activations: rows in panels of 16 (the last panel
// holds the rows left over), each panel column by column: for k = 0 .. cols - 1 the
// panel's elements (fp8: codes) of column k, so that one column of a panel is one or
// a few vector loads; fp8's f32 row scales follow in row order, as in row major.
// Same bytes as row major.
//
// kLayoutInt4P16K8: a symmetric int4 weight for the generated matmuls that multiply
// a panel of output channels by one activation row at a time: with int8 activations
// as outer products of 4-element dot products (VPDPBUSD, SDOT by element), with float
// activations each column's codes taken by a shift and a mask. Same bytes as row
// major:
//   codes   rows in panels of 16 (the last panel holds the rows left over); a panel
//           is, for each step of 8 columns in order, each of its rows' 4 bytes:
//           byte i holds column 8s + i in the low nibble and 8s + 4 + i in the high
//           nibble, the codes c as stored row major (0..15), so that `bytes & 0x0F`
//           and `bytes >> 4` are a panel's two 4-column dot-product operands;
//   scales  f16 per (row, group) in the same panels: for each group, the panel's rows;
//   no zero points (symmetric only). Needs the group a multiple of 8.
//
// kLayoutInt4P128K4: a symmetric int4 weight for the generated SME2 matmuls with
// int8 activations, whose codes a table lookup (LUTI4 from ZT0) expands to the signed
// values c - 8 of two vectors at a time, whatever the vector length. Same bytes as row
// major:
//   codes   rows in panels of 128 (the last panel holds the rows left over); a panel
//           is, for each step of 4 columns in order, each of its rows' 4 codes, two a
//           byte, the first in the low nibble: byte 2 i + j of row r of a panel step
//           holds columns 4s + 2j (low) and 4s + 2j + 1 (high), so that a panel
//           step's nibbles in order are its rows' 4-column dot-product operands;
//   scales  f16 per (row, group) in the same panels: for each group, the panel's rows;
//   no zero points (symmetric only). Needs the group a multiple of 4.
//
// kLayoutInt4P16K16: a symmetric int4 weight for the generated matmuls with int8
// activations on Arm with the int8 matrix multiply (i8mm), which multiply 2 x 8 blocks
// of activations by 8 x 2 blocks of weights (SMMLA): a channel pair's codes of 8
// columns are one operand, so no zips. Same bytes as row major:
//   codes   rows in panels of 16 (every panel whole: rows a multiple of 16); a panel
//           is, for each step of 16 columns in order, its 8 channel pairs' 16 bytes:
//           bytes 0-7 row 2j of the panel, 8-15 row 2j + 1, byte i of a row holding
//           column 16s + i in the low nibble and 16s + 8 + i in the high nibble, the
//           codes c as stored row major (0..15), so that `bytes & 0x0F` and
//           `bytes >> 4` are the pair's operands of columns 16s..16s+7 and
//           16s+8..16s+15;
//   scales  f16 per (row, group) in the same panels: for each group, the panel's rows;
//   no zero points (symmetric only). Needs the group a multiple of 16.
//
// kLayoutInt8P16K4: an int8 weight for the same kernels (int8 or float activations).
// Same bytes as row major:
//   codes   rows in panels of 16 (the last panel holds the rows left over); a panel
//           is, for each step of 4 columns in order, each of its rows' 4 codes;
//   scales  f32 per row, in row order after the codes (as row major).
//   Needs cols a multiple of 4.
enum LayoutId : uint8_t {
  kLayoutRowMajor = 0,
  kLayoutPanel16 = 2,
  kLayoutInt4P16K8 = 3,
  kLayoutInt8P16K4 = 4,
  kLayoutInt4P128K4 = 5,
  kLayoutInt4P16K16 = 6,
};
constexpr uint64_t kPanel16Rows = 16, kP16K8Rows = 16, kP16K8Step = 8, kP16K4Step = 4;
constexpr uint64_t kP128K4Rows = 128, kP128K4Step = 4;
constexpr uint64_t kP16K16Rows = 16, kP16K16Step = 16;

inline const char* LayoutName(uint8_t id) {
  switch (id) {
    case kLayoutRowMajor: return "row_major";
    case kLayoutPanel16: return "panel16";
    case kLayoutInt4P16K8: return "int4_p16k8";
    case kLayoutInt8P16K4: return "int8_p16k4";
    case kLayoutInt4P128K4: return "int4_p128k4";
    case kLayoutInt4P16K16: return "int4_p16k16";
    default: return nullptr;
  }
}

// Whether a [rows, cols] weight of `e` can be stored in `layout`.
inline bool LayoutFits(uint8_t layout, const EncodingSpec& e, uint64_t rows, uint64_t cols) {
  switch (layout) {
    case kLayoutRowMajor: return true;
    case kLayoutPanel16:
      return (e.id == kEncF32 || e.id == kEncF16 || e.id == kEncBF16 || e.id == kEncFP8_E4M3 ||
              e.id == kEncFP8_E5M2) &&
             rows > 0 && cols > 0;
    case kLayoutInt4P16K8:
      return e.id == kEncINT4 && e.symmetric && rows > 0 && cols > 0 && e.group != 0 && e.group % kP16K8Step == 0 &&
             cols % e.group == 0;
    case kLayoutInt8P16K4: return e.id == kEncINT8 && rows > 0 && cols > 0 && cols % kP16K4Step == 0;
    case kLayoutInt4P128K4:
      return e.id == kEncINT4 && e.symmetric && rows > 0 && cols > 0 && e.group != 0 && e.group % kP128K4Step == 0 &&
             cols % e.group == 0;
    case kLayoutInt4P16K16:
      return e.id == kEncINT4 && e.symmetric && rows > 0 && rows % kP16K16Rows == 0 && cols > 0 && e.group != 0 &&
             e.group % kP16K16Step == 0 && cols % e.group == 0;
    default: return false;
  }
}

// Where (row, unit) of a weight whose rows are in panels of `panel` lies, counted in
// units, when each row has `units` of them: panel by panel, unit by unit, the
// panel's rows.
inline uint64_t PanelOffset(uint64_t panel, uint64_t rows, uint64_t units, uint64_t row, uint64_t unit) {
  const uint64_t first = row / panel * panel;
  const uint64_t height = rows - first < panel ? rows - first : panel;
  return first * units + unit * height + (row - first);
}

// Rearranges a row-major float weight of `element_bytes` per element into panel16
// (`pack`) or back (`!pack`). `out` must not overlap `in`.
inline void RepackPanel16(bool pack, uint64_t element_bytes, const uint8_t* in, uint64_t rows, uint64_t cols,
                          uint8_t* out) {
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t k = 0; k < cols; ++k) {
      const uint64_t packed = element_bytes * PanelOffset(kPanel16Rows, rows, cols, r, k);
      const uint64_t plain = element_bytes * (r * cols + k);
      std::memcpy(out + (pack ? packed : plain), in + (pack ? plain : packed), element_bytes);
    }
}

// Moves row `r`'s f16 group scales of an int4 weight between row-major order and
// panels of `panel_rows` (for each group, the panel's rows), the scales' order in every
// int4 panel layout: to panels when `pack`, back when `!pack`.
inline void RepackInt4ScalesRow(bool pack, uint64_t panel_rows, const uint8_t* in, uint64_t rows, uint64_t cols,
                                uint64_t groups, uint64_t r, uint8_t* out) {
  for (uint64_t g = 0; g < groups; ++g) {
    const uint64_t packed = Int4ScalesOffset(rows, cols) + 2 * PanelOffset(panel_rows, rows, groups, r, g);
    const uint64_t plain = Int4ScalesOffset(rows, cols) + 2 * (r * groups + g);
    std::memcpy(out + (pack ? packed : plain), in + (pack ? plain : packed), 2);
  }
}

// Rearranges a row-major int4 weight (symmetric, LayoutFits) into int4_p16k8
// (`pack`) or back (`!pack`). `out` must not overlap `in`; both hold
// StorageBytes(e, rows, cols).
inline void RepackInt4P16K8(bool pack, const EncodingSpec& e, const uint8_t* in, uint64_t rows, uint64_t cols,
                            uint8_t* out) {
  const uint64_t steps = cols / kP16K8Step;
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t s = 0; s < steps; ++s) {
      const uint64_t at = 4 * PanelOffset(kP16K8Rows, rows, steps, r, s);
      for (uint64_t i = 0; i < 4; ++i) {
        const uint64_t lo = r * cols + s * kP16K8Step + i, hi = lo + 4;
        if (pack) {
          out[at + i] = static_cast<uint8_t>(Int4View::Code(in, lo) | (Int4View::Code(in, hi) << 4));
        } else {
          Int4View::SetCode(out, lo, in[at + i] & 0xF);
          Int4View::SetCode(out, hi, in[at + i] >> 4);
        }
      }
    }
    RepackInt4ScalesRow(pack, kP16K8Rows, in, rows, cols, cols / e.group, r, out);
  }
}

// Rearranges a row-major int4 weight (symmetric, LayoutFits) into int4_p128k4
// (`pack`) or back (`!pack`). `out` must not overlap `in`; both hold
// StorageBytes(e, rows, cols).
inline void RepackInt4P128K4(bool pack, const EncodingSpec& e, const uint8_t* in, uint64_t rows, uint64_t cols,
                             uint8_t* out) {
  const uint64_t steps = cols / kP128K4Step;
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t s = 0; s < steps; ++s) {
      const uint64_t at = kP128K4Step * PanelOffset(kP128K4Rows, rows, steps, r, s);  // in codes
      for (uint64_t i = 0; i < kP128K4Step; ++i) {
        const uint64_t plain = r * cols + s * kP128K4Step + i;
        if (pack)
          Int4View::SetCode(out, at + i, Int4View::Code(in, plain));
        else
          Int4View::SetCode(out, plain, Int4View::Code(in, at + i));
      }
    }
    RepackInt4ScalesRow(pack, kP128K4Rows, in, rows, cols, cols / e.group, r, out);
  }
}

// Rearranges a row-major int4 weight (symmetric, LayoutFits) into int4_p16k16
// (`pack`) or back (`!pack`). `out` must not overlap `in`; both hold
// StorageBytes(e, rows, cols).
inline void RepackInt4P16K16(bool pack, const EncodingSpec& e, const uint8_t* in, uint64_t rows, uint64_t cols,
                             uint8_t* out) {
  const uint64_t steps = cols / kP16K16Step;
  for (uint64_t r = 0; r < rows; ++r) {
    const uint64_t panel = r / kP16K16Rows, pr = r % kP16K16Rows;
    for (uint64_t s = 0; s < steps; ++s) {
      // The panel's steps of 8 pairs x 16 bytes; the row's 8 bytes in its pair.
      const uint64_t at = panel * kP16K16Rows * cols / 2 + s * 8 * kP16K16Step + (pr / 2) * 16 + (pr % 2) * 8;
      for (uint64_t i = 0; i < 8; ++i) {
        const uint64_t lo = r * cols + s * kP16K16Step + i, hi = lo + 8;
        if (pack) {
          out[at + i] = static_cast<uint8_t>(Int4View::Code(in, lo) | (Int4View::Code(in, hi) << 4));
        } else {
          Int4View::SetCode(out, lo, in[at + i] & 0xF);
          Int4View::SetCode(out, hi, in[at + i] >> 4);
        }
      }
    }
    RepackInt4ScalesRow(pack, kP16K16Rows, in, rows, cols, cols / e.group, r, out);
  }
}

// Rearranges a row-major int8 weight (LayoutFits) into int8_p16k4 (`pack`) or back
// (`!pack`). `out` must not overlap `in`; both hold StorageBytes(e, rows, cols).
inline void RepackInt8P16K4(bool pack, const uint8_t* in, uint64_t rows, uint64_t cols, uint8_t* out) {
  const uint64_t steps = cols / kP16K4Step;
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t s = 0; s < steps; ++s) {
      const uint64_t packed = kP16K4Step * PanelOffset(kPanel16Rows, rows, steps, r, s);
      const uint64_t plain = r * cols + s * kP16K4Step;
      std::memcpy(out + (pack ? packed : plain), in + (pack ? plain : packed), kP16K4Step);
    }
  std::memcpy(out + rows * cols, in + rows * cols, 4 * rows);  // the scales
}

// Rearranges a row-major weight of `e` (LayoutFits) into `layout` (`pack`) or back
// (`!pack`). `out` must not overlap `in`; both hold StorageBytes(e, rows, cols).
inline void RepackLayout(bool pack, uint8_t layout, const EncodingSpec& e, const uint8_t* in, uint64_t rows,
                         uint64_t cols, uint8_t* out) {
  switch (layout) {
    case kLayoutInt4P16K8: RepackInt4P16K8(pack, e, in, rows, cols, out); return;
    case kLayoutInt8P16K4: RepackInt8P16K4(pack, in, rows, cols, out); return;
    case kLayoutInt4P128K4: RepackInt4P128K4(pack, e, in, rows, cols, out); return;
    case kLayoutInt4P16K16: RepackInt4P16K16(pack, e, in, rows, cols, out); return;
    case kLayoutPanel16:
      if (e.id == kEncFP8_E4M3 || e.id == kEncFP8_E5M2) {
        RepackPanel16(pack, 1, in, rows, cols, out);
        std::memcpy(out + rows * cols, in + rows * cols, 4 * rows);  // the row scales
      } else {
        RepackPanel16(pack, StorageBytes(e, 1, 1), in, rows, cols, out);
      }
      return;
    default: std::memcpy(out, in, StorageBytes(e, rows, cols)); return;
  }
}

// ---- dequantisation ----

// Decodes row `row` of a [rows, cols] weight stored as `e` at `data` into out[cols].
inline void DecodeRow(const EncodingSpec& e, const uint8_t* data, uint64_t rows, uint64_t cols, uint64_t row,
                      float* out) {
  switch (e.id) {
    case kEncF32:
    case kEncF16:
    case kEncBF16:
      DecodeFloatElements(e.id, data, row * cols, cols, out);
      return;
    case kEncFP8_E4M3:
    case kEncFP8_E5M2: {
      const bool e4m3 = e.id == kEncFP8_E4M3;
      float scale;
      std::memcpy(&scale, data + rows * cols + 4 * row, 4);
      const uint8_t* c = data + row * cols;
      for (uint64_t i = 0; i < cols; ++i) out[i] = Fp8ToF32(c[i], e4m3) * scale;
      return;
    }
    case kEncINT8: {
      float scale;
      std::memcpy(&scale, data + rows * cols + 4 * row, 4);
      const int8_t* q = reinterpret_cast<const int8_t*>(data + row * cols);
      for (uint64_t i = 0; i < cols; ++i) out[i] = static_cast<float>(q[i]) * scale;
      return;
    }
    case kEncINT4: {
      const Int4View v = Int4View::Of(e, data, rows, cols);
      for (uint64_t g = 0; g < v.groups_per_row; ++g) {
        const float s = v.scale(row, g);
        const float z = static_cast<float>(v.zero(row, g));
        for (uint64_t i = g * e.group; i < (g + 1) * e.group; ++i)
          out[i] = (static_cast<float>(v.code(row, i)) - z) * s;
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
