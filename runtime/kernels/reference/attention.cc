// Reference kernels for attention: rotary embedding and scaled dot-product
// attention, within the inputs (vision) or over the session's KV cache (decoder).
#include <algorithm>
#include <cmath>

#include "kernels/reference/common.h"
#include "kernels/reference/kernels.h"
#include "kv_cache.h"
#include "support/error.h"
#include "thread_pool.h"

namespace kiln::rt::ref {

// Inverse frequencies as transformers computes them in float32
// (modeling_rope_utils.py: _compute_default_rope_parameters and, for "llama3",
// _compute_llama3_parameters).
static void InverseFrequencies(const fb::RopeParams* p, float* inv_freq) {
  const int64_t half = p->head_dim() / 2;
  const float base = static_cast<float>(p->theta());
  const float dim = static_cast<float>(p->head_dim());
  for (int64_t i = 0; i < half; ++i) {
    float exponent = static_cast<float>(2 * i) / dim;
    inv_freq[i] = 1.0f / std::pow(base, exponent);
  }
  if (p->rope_type() != fb::RopeType::Llama3) return;
  const float factor = static_cast<float>(p->factor());
  const float low = static_cast<float>(p->low_freq_factor());
  const float high = static_cast<float>(p->high_freq_factor());
  const float old_len = static_cast<float>(p->original_max_position_embeddings());
  const float low_wavelen = old_len / low;
  const float high_wavelen = old_len / high;
  const float two_pi = 6.28318530717958647692f;
  for (int64_t i = 0; i < half; ++i) {
    float f = inv_freq[i];
    float wavelen = two_pi / f;
    float scaled = wavelen > low_wavelen ? f / factor : f;
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
      float smooth = (old_len / wavelen - low) / (high - low);
      scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
    inv_freq[i] = scaled;
  }
}

// x[t, h * d + i] and x[t, h * d + i + d/2] rotated by positions[t] * inv_freq[i].
kiln_status_t Rope(const KernelArgs& a) {
  const fb::RopeParams* p = a.op->params_as_RopeParams();
  const ActView& x = a.inputs[0];
  const int32_t* pos = a.inputs[1].i32();
  const int64_t heads = p->num_heads(), hd = p->head_dim(), half = hd / 2;
  float* inv_freq = a.scratch;  // half floats
  InverseFrequencies(p, inv_freq);
  const float* in = x.f32();
  float* out = a.output.f32();
  a.pool->For(x.rows, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) {
      const float position = static_cast<float>(pos[t]);
      for (int64_t i = 0; i < half; ++i) {
        float angle = position * inv_freq[i];
        float c = std::cos(angle), s = std::sin(angle);
        for (int64_t h = 0; h < heads; ++h) {
          const float* xr = in + t * x.cols + h * hd;
          float* yr = out + t * x.cols + h * hd;
          float x1 = xr[i], x2 = xr[i + half];
          yr[i] = x1 * c - x2 * s;
          yr[i + half] = x2 * c + x1 * s;
        }
      }
    }
  });
  return KILN_OK;
}

size_t RopeScratch(const fb::Op* op, const WeightView*, int, int64_t, int64_t, int) {
  return op->params_as_RopeParams()->head_dim() / 2;
}

// Softmax-weighted sum over keys [0, n) for one query row of one head.
static void AttendRow(const float* q, const float* keys, const float* vals, int64_t stride, int64_t n,
                      int64_t hd, float scale, float* scores, float* out) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    float s = Dot(q, keys + j * stride, hd) * scale;
    scores[j] = s;
    mx = std::max(mx, s);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
  float inv = 1.0f / sum;
  for (int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    float w = scores[j] * inv;
    const float* v = vals + j * stride;
    for (int64_t i = 0; i < hd; ++i) out[i] += w * v[i];
  }
}

kiln_status_t Attention(const KernelArgs& a) {
  const fb::AttentionParams* p = a.op->params_as_AttentionParams();
  const ActView& q = a.inputs[0];
  const ActView& k = a.inputs[1];
  const ActView& v = a.inputs[2];
  const int64_t heads = p->num_heads(), kv_heads = p->num_kv_heads(), hd = p->head_dim();
  const int64_t group = heads / kv_heads;
  const int64_t rows = q.rows;
  const float scale = p->scale();
  float* out = a.output.f32();

  if (p->cache_layer() < 0) {
    // Within the inputs: every row attends to every row (or the earlier ones).
    const int64_t n = k.rows;
    const int64_t scratch_per_thread = n;
    a.pool->For(rows * heads, 1, [&](int64_t b, int64_t e, int thread) {
      float* scores = a.scratch + thread * scratch_per_thread;
      for (int64_t task = b; task < e; ++task) {
        int64_t t = task / heads, h = task % heads, kvh = h / group;
        int64_t limit = p->causal() ? t + 1 : n;
        AttendRow(q.f32() + t * q.cols + h * hd, k.f32() + kvh * hd, v.f32() + kvh * hd, k.cols, limit, hd,
                  scale, scores, out + t * a.output.cols + h * hd);
      }
    });
    return KILN_OK;
  }

  // Over the KV cache: write the new keys and values at their positions, then each
  // new row attends causally to every cached position up to its own.
  KvCache* kv = a.kv;
  const int32_t* pos = a.inputs[3].i32();
  const int64_t layer = p->cache_layer();
  for (int64_t t = 0; t < rows; ++t) {
    if (pos[t] < 0 || pos[t] >= kv->context)
      return Fail(a.error, KILN_ERROR_CONTEXT_FULL, "position %d is outside the %lld-token context", pos[t],
                  static_cast<long long>(kv->context));
    std::memcpy(kv->K(layer, pos[t]), k.f32() + t * k.cols, static_cast<size_t>(kv->width) * 4);
    std::memcpy(kv->V(layer, pos[t]), v.f32() + t * v.cols, static_cast<size_t>(kv->width) * 4);
  }
  const int64_t scratch_per_thread = kv->context;
  a.pool->For(rows * heads, 1, [&](int64_t b, int64_t e, int thread) {
    float* scores = a.scratch + thread * scratch_per_thread;
    for (int64_t task = b; task < e; ++task) {
      int64_t t = task / heads, h = task % heads, kvh = h / group;
      AttendRow(q.f32() + t * q.cols + h * hd, kv->K(layer, 0) + kvh * hd, kv->V(layer, 0) + kvh * hd, kv->width,
                static_cast<int64_t>(pos[t]) + 1, hd, scale, scores, out + t * a.output.cols + h * hd);
    }
  });
  return KILN_OK;
}

size_t AttentionScratch(const fb::Op* op, const WeightView*, int, int64_t rows, int64_t context, int threads) {
  int64_t n = op->params_as_AttentionParams()->cache_layer() >= 0 ? context : rows;
  return static_cast<size_t>(threads) * static_cast<size_t>(n);
}

}  // namespace kiln::rt::ref
