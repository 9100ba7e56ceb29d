// Reference kernels for normalisations, element-wise ops and data movement.
#include <algorithm>
#include <cmath>

#include "kernels/reference/common.h"
#include "kernels/reference/kernels.h"
#include "support/error.h"
#include "thread_pool.h"

namespace kiln::rt::ref {

// LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w, in f32.
kiln_status_t RmsNorm(const KernelArgs& a) {
  const ActView& x = a.inputs[0];
  const int64_t n = x.cols;
  float eps = a.op->params_as_NormParams()->epsilon();
  float* w = a.scratch;  // n
  DecodeElements(a.weights[0], 0, n, w);
  a.pool->For(x.rows, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x.f32() + r * n;
      float* yr = a.output.f32() + r * n;
      float ss = Dot(xr, xr, n);
      float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
      for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
    }
  });
  return KILN_OK;
}

size_t NormScratch(const fb::Op*, const WeightView* w, int nw, int64_t, int64_t, int) {
  return static_cast<size_t>(nw) * static_cast<size_t>(w[0].rows);
}

// torch.nn.LayerNorm: (x - mean) / sqrt(biased var + eps) * w + b.
kiln_status_t LayerNorm(const KernelArgs& a) {
  const ActView& x = a.inputs[0];
  const int64_t n = x.cols;
  float eps = a.op->params_as_NormParams()->epsilon();
  float* w = a.scratch;
  float* bias = w + n;
  DecodeElements(a.weights[0], 0, n, w);
  DecodeElements(a.weights[1], 0, n, bias);
  a.pool->For(x.rows, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x.f32() + r * n;
      float* yr = a.output.f32() + r * n;
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += xr[i];
      float mean = static_cast<float>(sum / static_cast<double>(n));
      double var = 0;
      for (int64_t i = 0; i < n; ++i) {
        double d = xr[i] - mean;
        var += d * d;
      }
      float inv = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(n) + eps));
      for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] - mean) * inv * w[i] + bias[i];
    }
  });
  return KILN_OK;
}

kiln_status_t Add(const KernelArgs& a) {
  const float* x = a.inputs[0].f32();
  const float* y = a.inputs[1].f32();
  float* o = a.output.f32();
  int64_t n = a.inputs[0].rows * a.inputs[0].cols;
  a.pool->For(n, 16384, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) o[i] = x[i] + y[i];
  });
  return KILN_OK;
}

kiln_status_t Mul(const KernelArgs& a) {
  const float* x = a.inputs[0].f32();
  const float* y = a.inputs[1].f32();
  float* o = a.output.f32();
  int64_t n = a.inputs[0].rows * a.inputs[0].cols;
  a.pool->For(n, 16384, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) o[i] = x[i] * y[i];
  });
  return KILN_OK;
}

kiln_status_t Activation(const KernelArgs& a) {
  const float* x = a.inputs[0].f32();
  float* o = a.output.f32();
  fb::ActivationKind kind = a.op->params_as_ActivationParams()->kind();
  int64_t n = a.inputs[0].rows * a.inputs[0].cols;
  a.pool->For(n, 8192, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) o[i] = Activate(kind, x[i]);
  });
  return KILN_OK;
}

// LLaVA / Idefics3: rows whose id is the image token take the image features in order.
kiln_status_t MergeImageTokens(const KernelArgs& a) {
  const ActView& embeds = a.inputs[0];
  const int32_t* ids = a.inputs[1].i32();
  const ActView& image = a.inputs[2];
  int64_t image_id = a.op->params_as_MergeImageTokensParams()->image_token_id();
  int64_t count = 0;
  for (int64_t t = 0; t < embeds.rows; ++t) count += ids[t] == image_id;
  if (count != image.rows)
    return Fail(a.error, KILN_ERROR_INPUT_TOKENS, "the prompt has %lld image tokens but the image gives %lld features",
                static_cast<long long>(count), static_cast<long long>(image.rows));
  const size_t row_bytes = static_cast<size_t>(embeds.cols) * 4;
  int64_t next = 0;
  for (int64_t t = 0; t < embeds.rows; ++t) {
    float* out = a.output.f32() + t * embeds.cols;
    const float* src = ids[t] == image_id ? image.f32() + (next++) * image.cols : embeds.f32() + t * embeds.cols;
    if (src != out) std::memmove(out, src, row_bytes);
  }
  return KILN_OK;
}

kiln_status_t ClassToken(const KernelArgs& a) {
  const ActView& x = a.inputs[0];
  DecodeElements(a.weights[0], 0, x.cols, a.output.f32());
  std::memmove(a.output.f32() + x.cols, x.f32(), static_cast<size_t>(x.rows * x.cols) * 4);
  return KILN_OK;
}

kiln_status_t PositionEmbedding(const KernelArgs& a) {
  const ActView& x = a.inputs[0];
  const WeightView& table = a.weights[0];
  a.pool->For(x.rows, 1, [&](int64_t b, int64_t e, int thread) {
    float* row = a.scratch + thread * x.cols;
    for (int64_t r = b; r < e; ++r) {
      DecodeElements(table, r * table.cols, x.cols, row);
      const float* xr = x.f32() + r * x.cols;
      float* yr = a.output.f32() + r * x.cols;
      for (int64_t i = 0; i < x.cols; ++i) yr[i] = xr[i] + row[i];
    }
  });
  return KILN_OK;
}

size_t PositionEmbeddingScratch(const fb::Op*, const WeightView* w, int, int64_t, int64_t, int threads) {
  return static_cast<size_t>(threads) * static_cast<size_t>(w[0].cols);
}

kiln_status_t SliceRows(const KernelArgs& a) {
  const ActView& x = a.inputs[0];
  int64_t start = a.op->params_as_SliceRowsParams()->start();
  std::memmove(a.output.f32(), x.f32() + start * x.cols, static_cast<size_t>(a.output.rows * x.cols) * 4);
  return KILN_OK;
}

kiln_status_t Concat(const KernelArgs& a) {
  int64_t offset = 0;
  for (int i = 0; i < a.num_inputs; ++i) {
    const ActView& x = a.inputs[i];
    for (int64_t r = 0; r < x.rows; ++r)
      std::memcpy(a.output.f32() + r * a.output.cols + offset, x.f32() + r * x.cols, static_cast<size_t>(x.cols) * 4);
    offset += x.cols;
  }
  return KILN_OK;
}

// Idefics3Connector.pixel_shuffle: out[h2 * (s/r) + w2][(hr * r + wr) * D + d]
//   = x[(h2 * r + hr) * s + w2 * r + wr][d].
kiln_status_t PixelShuffle(const KernelArgs& a) {
  const ActView& x = a.inputs[0];
  const int64_t r = a.op->params_as_PixelShuffleParams()->scale_factor();
  int64_t side = 0;
  while ((side + 1) * (side + 1) <= x.rows) ++side;
  const int64_t d = x.cols, g = side / r;
  for (int64_t h2 = 0; h2 < g; ++h2)
    for (int64_t w2 = 0; w2 < g; ++w2) {
      float* out = a.output.f32() + (h2 * g + w2) * a.output.cols;
      for (int64_t hr = 0; hr < r; ++hr)
        for (int64_t wr = 0; wr < r; ++wr)
          std::memcpy(out + (hr * r + wr) * d, x.f32() + ((h2 * r + hr) * side + w2 * r + wr) * d,
                      static_cast<size_t>(d) * 4);
    }
  return KILN_OK;
}

}  // namespace kiln::rt::ref
