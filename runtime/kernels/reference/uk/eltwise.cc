// Reference micro-kernels: normalisations, element-wise ops and rotary embedding.
#include <algorithm>

#include "formats/kv_codec.h"
#include "kernels/reference/uk/common.h"

using namespace kiln;
using namespace kiln::uk;

extern "C" {

// LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w, in f32.
void kiln_uk_rmsnorm_f32_f32_wfloat_ref_portable(const kiln_uk_norm_params_t* p, int64_t row_begin,
                                                 int64_t row_end, float* scratch) {
  const int64_t n = p->cols;
  float* w = scratch;
  DecodeElements(p->weight, 0, n, w);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* xr = p->x + r * n;
    float* yr = p->y + r * n;
    float ss = Dot(xr, xr, n);
    float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + p->epsilon);
    for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

// torch.nn.LayerNorm: (x - mean) / sqrt(biased var + eps) * w + b.
void kiln_uk_layernorm_f32_f32_wfloat_ref_portable(const kiln_uk_norm_params_t* p, int64_t row_begin,
                                                   int64_t row_end, float* scratch) {
  const int64_t n = p->cols;
  float* w = scratch;
  float* bias = w + n;
  DecodeElements(p->weight, 0, n, w);
  DecodeElements(p->bias, 0, n, bias);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* xr = p->x + r * n;
    float* yr = p->y + r * n;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += xr[i];
    float mean = static_cast<float>(sum / static_cast<double>(n));
    double var = 0;
    for (int64_t i = 0; i < n; ++i) {
      double d = xr[i] - mean;
      var += d * d;
    }
    float inv = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(n) + p->epsilon));
    for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] - mean) * inv * w[i] + bias[i];
  }
}

void kiln_uk_add_f32_f32_f32_ref_portable(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) p->y[i] = p->a[i] + p->b[i];
}

void kiln_uk_mul_f32_f32_f32_ref_portable(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) p->y[i] = p->a[i] * p->b[i];
}

void kiln_uk_act_f32_f32_ref_portable(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) p->y[i] = Activate(p->activation, p->a[i]);
}

void kiln_uk_gatedact_f32_f32_f32_ref_portable(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) p->y[i] = Activate(p->activation, p->a[i]) * p->b[i];
}

// x[t, h * d + i] and x[t, h * d + i + d/2] rotated by positions[t] * inv_freq[i].
void kiln_uk_rope_f32_f32_ref_portable(const kiln_uk_rope_params_t* p, int64_t row_begin, int64_t row_end) {
  const int64_t hd = p->head_dim, half = hd / 2;
  for (int64_t t = row_begin; t < row_end; ++t) {
    const float position = static_cast<float>(p->positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      float angle = position * p->inv_freq[i];
      float c = std::cos(angle), s = std::sin(angle);
      for (int64_t h = 0; h < p->heads; ++h) {
        const float* xr = p->x + t * p->ld + h * hd;
        float* yr = p->y + t * p->ld + h * hd;
        float x1 = xr[i], x2 = xr[i + half];
        yr[i] = x1 * c - x2 * s;
        yr[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

}  // extern "C"

namespace {

// Head kvh of key (`key`) or value position j for a query at position `at`: in place
// (f32), or decoded into `row`; with spans (kv_span), exact from kr / vr when j is in
// the query's own span, a key of an earlier span with its span's per-channel scales.
const float* KvHead(const kiln_uk_attention_params_t* p, bool key, int64_t j, int64_t at, int64_t kvh, float* row) {
  const int64_t hd = p->head_dim, span = p->kv_span;
  if (span > 0 && j >= at - at % span) return (key ? p->kr : p->vr) + (j - p->kv_exact_from) * p->ldkv + kvh * hd;
  auto phys = [&](int64_t i) {  // paged: the block's physical row
    if (p->kv_blocks == nullptr) return i;
    const int64_t mask = (int64_t{1} << p->kv_block_shift) - 1;
    return (static_cast<int64_t>(p->kv_blocks[i >> p->kv_block_shift]) << p->kv_block_shift) + (i & mask);
  };
  const int64_t r = phys(j);
  if (p->kv_encoding == format::kEncF32) return (key ? p->k : p->v) + r * p->ldkv + kvh * hd;
  const uint8_t enc = static_cast<uint8_t>(p->kv_encoding);
  const uint64_t row_bytes = format::KvRowBytes(enc, static_cast<uint64_t>(p->ldkv));
  const uint64_t row_scales = format::KvRowScales(enc, static_cast<uint64_t>(p->ldkv), p->kv_group);
  const uint8_t* codes = static_cast<const uint8_t*>(key ? p->kc : p->vc) + r * row_bytes;
  const float* scales = key ? p->ks : p->vs;
  if (key && span > 0)
    format::DecodeKeySpanRow(enc, static_cast<uint32_t>(p->kv_group), codes, scales + phys(j - j % span) * row_scales,
                             static_cast<uint64_t>(kvh * hd), static_cast<uint64_t>(hd), row);
  else
    format::DecodeKvSpan(enc, static_cast<uint32_t>(p->kv_group), codes, scales + r * row_scales,
                         static_cast<uint64_t>(kvh * hd), static_cast<uint64_t>(hd), row);
  return row;
}

}  // namespace

extern "C" {

// Softmax-weighted sum of values over keys [0, limit) for each (row, head) task, the
// keys and values read from an encoded KV cache as they decode.
void kiln_uk_attention_f32_f32_f32_ref_portable(const kiln_uk_attention_params_t* p, int64_t task_begin,
                                                int64_t task_end, float* scores) {
  const int64_t hd = p->head_dim, group = p->heads / p->kv_heads;
  float* row = scores + p->n_keys;  // one decoded head of an encoded cache
  for (int64_t task = task_begin; task < task_end; ++task) {
    const int64_t t = task / p->heads, h = task % p->heads, kvh = h / group;
    const int64_t n = p->positions != nullptr ? static_cast<int64_t>(p->positions[t]) + 1
                      : p->causal             ? t + 1
                                              : p->n_keys;
    const float* q = p->q + t * p->ldq + h * hd;
    float* out = p->y + t * p->ldy + h * hd;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      float s = Dot(q, KvHead(p, true, j, n - 1, kvh, row), hd) * p->scale;
      scores[j] = s;
      mx = std::max(mx, s);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
    float inv = 1.0f / sum;
    for (int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      float w = scores[j] * inv;
      const float* v = KvHead(p, false, j, n - 1, kvh, row);
      for (int64_t i = 0; i < hd; ++i) out[i] += w * v[i];
    }
  }
}

}  // extern "C"
