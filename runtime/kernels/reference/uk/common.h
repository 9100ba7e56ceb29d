// Helpers of the portable reference micro-kernels: weight decoding, the dot
// product, activations. Plain C++ written so that compilers vectorise it; the
// numerics here are the reference every other kernel is measured against.
#ifndef KILN_RUNTIME_KERNELS_REFERENCE_UK_COMMON_H_
#define KILN_RUNTIME_KERNELS_REFERENCE_UK_COMMON_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats/encoding.h"
#include "kernels/ukernel.h"

namespace kiln::uk {

inline format::EncodingSpec SpecOf(const kiln_uk_weight_t& w) {
  format::EncodingSpec s;
  s.id = w.encoding;
  s.group = w.group;
  s.symmetric = w.symmetric != 0;
  return s;
}

// Row `row` of a [rows, cols] weight as f32: in place for f32, else decoded into
// `scratch` (cols floats).
inline const float* WeightRow(const kiln_uk_weight_t& w, int64_t row, float* scratch) {
  if (w.encoding == format::kEncF32) return reinterpret_cast<const float*>(w.data) + row * w.cols;
  format::DecodeRow(SpecOf(w), w.data, static_cast<uint64_t>(w.rows), static_cast<uint64_t>(w.cols),
                    static_cast<uint64_t>(row), scratch);
  return scratch;
}

// n elements of a float-encoded weight from element `first`.
inline void DecodeElements(const kiln_uk_weight_t& w, int64_t first, int64_t n, float* out) {
  format::DecodeFloatElements(w.encoding, w.data, static_cast<uint64_t>(first), static_cast<uint64_t>(n), out);
}

// Eight partial sums, then a fixed tree: the reference's summation order.
inline float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float Activate(int32_t kind, float x) {
  switch (kind) {
    case KILN_UK_SILU: return x / (1.0f + std::exp(-x));
    case KILN_UK_GELU: return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case KILN_UK_GELU_TANH: {
      const float k = 0.79788456080286536f;  // sqrt(2 / pi)
      return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
    }
    case KILN_UK_QUICK_GELU: return x / (1.0f + std::exp(-1.702f * x));
    case KILN_UK_RELU: return x > 0.0f ? x : 0.0f;
  }
  return x;
}

}  // namespace kiln::uk

#endif  // KILN_RUNTIME_KERNELS_REFERENCE_UK_COMMON_H_
