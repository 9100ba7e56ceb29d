// Helpers shared by the portable reference kernels: weight decoding, dot
// products, activations. Plain C++ written so that compilers vectorise it.
#ifndef KILN_RUNTIME_KERNELS_REFERENCE_COMMON_H_
#define KILN_RUNTIME_KERNELS_REFERENCE_COMMON_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats/encoding.h"
#include "formats/numeric.h"
#include "kernels/kernel.h"

namespace kiln::rt::ref {

// Decodes `n` elements of a float-encoded weight (f32, f16, bf16) starting at
// element `first`: for 1-D weights and tables the kernels read in part. The verifier
// admits only the encodings a kernel lists, and these kernels list floats only.
inline void DecodeElements(const WeightView& w, int64_t first, int64_t n, float* out) {
  format::DecodeFloatElements(w.spec.id, w.data, static_cast<uint64_t>(first), static_cast<uint64_t>(n), out);
}

// Row `row` of a [rows, cols] weight as f32, in any encoding: in place for f32
// weights, else decoded into `scratch` (cols floats).
inline const float* WeightRow(const WeightView& w, int64_t row, float* scratch) {
  if (w.encoding == fb::Encoding::F32) return reinterpret_cast<const float*>(w.data) + row * w.cols;
  format::DecodeRow(w.spec, w.data, static_cast<uint64_t>(w.rows), static_cast<uint64_t>(w.cols),
                    static_cast<uint64_t>(row), scratch);
  return scratch;
}

inline float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float Activate(fb::ActivationKind kind, float x) {
  switch (kind) {
    case fb::ActivationKind::Silu: return x / (1.0f + std::exp(-x));
    case fb::ActivationKind::Gelu: return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case fb::ActivationKind::GeluTanh: {
      const float k = 0.79788456080286536f;  // sqrt(2 / pi)
      return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
    }
    case fb::ActivationKind::QuickGelu: return x / (1.0f + std::exp(-1.702f * x));
    case fb::ActivationKind::Relu: return x > 0.0f ? x : 0.0f;
  }
  return x;
}

// y[r, n] = x[r, :] . W[n, :] (+ b[n]) for r < rows, n < W.rows; y has row stride
// ldy. Parallel over output channels; `scratch` holds WeightScratch(K, rows,
// threads) floats. Weights with int8 activations (W8A8, W4A8) quantise each row of
// x to int8 first and accumulate exactly in integers (docs/precision.md).
constexpr int64_t kRowBlock = 16;
inline size_t WeightScratch(int64_t k, int threads, int64_t rows = 0) {
  // Decoded weight rows per thread, plus (for int8 activations) the quantised rows
  // of x and their scales.
  return static_cast<size_t>(threads) * static_cast<size_t>(kRowBlock * k) +
         static_cast<size_t>(rows * k / 4 + rows + 16);
}
void MatMulT(const float* x, int64_t rows, int64_t ldx, const WeightView& w, const WeightView* bias, float* y,
             int64_t ldy, ThreadPool* pool, float* scratch);

}  // namespace kiln::rt::ref

#endif  // KILN_RUNTIME_KERNELS_REFERENCE_COMMON_H_
