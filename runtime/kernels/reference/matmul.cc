// Reference kernels built on a matrix product with a stored weight: linear, the LM
// head, embedding lookup, the gated MLP, mixture of experts and patch embedding.
#include <algorithm>

#include "kernels/reference/common.h"
#include "kernels/reference/kernels.h"
#include "support/error.h"
#include "thread_pool.h"

namespace kiln::rt::ref {

// Integer dot product of an int8 activation row with row `n` of an int8 or int4
// weight, dequantised: int8: float(acc) * sx * sw; int4: sx * sum over groups of
// float(acc_g) * s_g, groups in order (docs/precision.md).
static float DotInt8(const int8_t* xq, float sx, const WeightView& w, int64_t n) {
  const int64_t k = w.cols;
  if (w.spec.id == format::kEncINT8) {
    const int8_t* q = reinterpret_cast<const int8_t*>(w.data) + n * k;
    int32_t acc = 0;
    for (int64_t i = 0; i < k; ++i) acc += static_cast<int32_t>(xq[i]) * static_cast<int32_t>(q[i]);
    float sw;
    std::memcpy(&sw, w.data + w.rows * k + 4 * n, 4);
    return static_cast<float>(acc) * sx * sw;
  }
  // int4
  const format::Int4View v =
      format::Int4View::Of(w.spec, w.data, static_cast<uint64_t>(w.rows), static_cast<uint64_t>(k));
  const int64_t group = w.spec.group, groups = k / group;
  float sum = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    const int32_t z = v.zero(n, g);
    int32_t acc = 0;
    for (int64_t i = g * group; i < (g + 1) * group; ++i)
      acc += static_cast<int32_t>(xq[i]) * (static_cast<int32_t>(v.code(n, i)) - z);
    sum += static_cast<float>(acc) * v.scale(n, g);
  }
  return sum * sx;
}

void MatMulT(const float* x, int64_t rows, int64_t ldx, const WeightView& w, const WeightView* bias, float* y,
             int64_t ldy, ThreadPool* pool, float* scratch) {
  const int64_t n = w.rows, k = w.cols;
  const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
  if (w.int8_activations) {
    // Dynamic per-token int8: q = rint(x / s), s = absmax / 127 (1 for a zero row).
    int8_t* xq = reinterpret_cast<int8_t*>(scratch + static_cast<size_t>(pool->num_threads()) * kRowBlock * k);
    float* xs = reinterpret_cast<float*>(xq + ((rows * k + 63) / 64) * 64);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * ldx;
      float absmax = 0.0f;
      for (int64_t i = 0; i < k; ++i) absmax = std::max(absmax, std::fabs(xr[i]));
      float s = absmax > 0.0f ? absmax / 127.0f : 1.0f;
      xs[r] = s;
      for (int64_t i = 0; i < k; ++i) {
        float q = std::nearbyint(xr[i] / s);
        xq[r * k + i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, q)));
      }
    }
    pool->For(n, 8, [&](int64_t n0, int64_t n1, int) {
      for (int64_t j = n0; j < n1; ++j) {
        float b = 0.0f;
        if (bias != nullptr) DecodeElements(*bias, j, 1, &b);
        for (int64_t r = 0; r < rows; ++r) {
          float v = DotInt8(xq + r * k, xs[r], w, j);
          y[r * ldy + j] = bias != nullptr ? v + b : v;
        }
      }
    });
    return;
  }
  pool->For(blocks, 1, [&](int64_t b0, int64_t b1, int thread) {
    float* wbuf = scratch + static_cast<size_t>(thread) * kRowBlock * k;
    float bvals[kRowBlock];
    for (int64_t blk = b0; blk < b1; ++blk) {
      int64_t n0 = blk * kRowBlock, n1 = std::min(n, n0 + kRowBlock);
      const float* wrow[kRowBlock];
      for (int64_t j = n0; j < n1; ++j) wrow[j - n0] = WeightRow(w, j, wbuf + (j - n0) * k);
      if (bias != nullptr) DecodeElements(*bias, n0, n1 - n0, bvals);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        float* yr = y + r * ldy;
        for (int64_t j = n0; j < n1; ++j) {
          float v = Dot(xr, wrow[j - n0], k);
          yr[j] = bias != nullptr ? v + bvals[j - n0] : v;
        }
      }
    }
  });
}

kiln_status_t Linear(const KernelArgs& a) {
  const ActView& x = a.inputs[0];
  MatMulT(x.f32(), x.rows, x.cols, a.weights[0], a.num_weights > 1 ? &a.weights[1] : nullptr, a.output.f32(),
          a.output.cols, a.pool, a.scratch);
  return KILN_OK;
}

size_t LinearScratch(const fb::Op*, const WeightView* w, int, int64_t rows, int64_t, int threads) {
  return WeightScratch(w[0].cols, threads, rows);
}

kiln_status_t Embedding(const KernelArgs& a) {
  const ActView& ids = a.inputs[0];
  const WeightView& table = a.weights[0];
  int64_t placeholder = a.op->params_as_EmbeddingParams()->placeholder_id();
  for (int64_t t = 0; t < ids.rows; ++t) {
    int64_t id = ids.i32()[t];
    float* out = a.output.f32() + t * a.output.cols;
    if (id == placeholder) {
      std::memset(out, 0, static_cast<size_t>(a.output.cols) * 4);
      continue;
    }
    if (id < 0 || id >= table.rows)
      return Fail(a.error, KILN_ERROR_INPUT_TOKENS, "token id %lld at position %lld is outside the vocabulary [0, %lld)",
                  static_cast<long long>(id), static_cast<long long>(t), static_cast<long long>(table.rows));
    const float* row = WeightRow(table, id, out);
    if (row != out) std::memcpy(out, row, static_cast<size_t>(table.cols) * 4);
  }
  return KILN_OK;
}

// down(act(gate(x)) * up(x)) for `rows` rows of x, into y (row stride ldy).
// scratch: 2 * rows * I floats, then the MatMulT scratch.
static void GatedMlpRows(const float* x, int64_t rows, int64_t ldx, const WeightView& gate, const WeightView& up,
                         const WeightView& down, fb::ActivationKind act, float* y, int64_t ldy, ThreadPool* pool,
                         float* scratch) {
  const int64_t inter = gate.rows;
  float* g = scratch;
  float* u = g + rows * inter;
  float* mm = u + rows * inter;
  MatMulT(x, rows, ldx, gate, nullptr, g, inter, pool, mm);
  MatMulT(x, rows, ldx, up, nullptr, u, inter, pool, mm);
  int64_t total = rows * inter;
  pool->For(total, 4096, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) g[i] = Activate(act, g[i]) * u[i];
  });
  MatMulT(g, rows, inter, down, nullptr, y, ldy, pool, mm);
}

static size_t GatedMlpScratchFloats(int64_t rows, int64_t hidden, int64_t inter, int threads) {
  return static_cast<size_t>(2 * rows * inter) + WeightScratch(std::max(hidden, inter), threads, rows);
}

kiln_status_t GatedMlp(const KernelArgs& a) {
  const ActView& x = a.inputs[0];
  GatedMlpRows(x.f32(), x.rows, x.cols, a.weights[0], a.weights[1], a.weights[2],
               a.op->params_as_GatedMlpParams()->activation(), a.output.f32(), a.output.cols, a.pool, a.scratch);
  return KILN_OK;
}

size_t GatedMlpScratch(const fb::Op*, const WeightView* w, int, int64_t rows, int64_t, int threads) {
  return GatedMlpScratchFloats(rows, w[0].cols, w[0].rows, threads);
}

// Mixtral's sparse MoE block: softmax over the router logits, top-k, renormalise,
// and the chosen experts' gated MLPs weighted and summed.
kiln_status_t Moe(const KernelArgs& a) {
  const ActView& x = a.inputs[0];
  const fb::MoeParams* p = a.op->params_as_MoeParams();
  const int64_t rows = x.rows, hidden = x.cols;
  const int64_t experts = static_cast<int64_t>(p->expert_ids()->size());
  const int64_t k = p->top_k();
  const WeightView& router = a.weights[0];
  const int64_t inter = a.weights[1].rows;

  float* logits = a.scratch;                         // rows * experts
  float* route_w = logits + rows * experts;          // rows * k
  int32_t* route_e = reinterpret_cast<int32_t*>(route_w + rows * k);  // rows * k
  int32_t* sel_rows = route_e + rows * k;            // rows
  float* sel_w = reinterpret_cast<float*>(sel_rows + rows);  // rows
  float* xe = sel_w + rows;                          // rows * hidden
  float* ye = xe + rows * hidden;                    // rows * hidden
  float* mlp = ye + rows * hidden;                   // GatedMlpScratchFloats

  MatMulT(x.f32(), rows, hidden, router, nullptr, logits, experts, a.pool, mlp);
  for (int64_t r = 0; r < rows; ++r) {
    float* l = logits + r * experts;
    float mx = l[0];
    for (int64_t e = 1; e < experts; ++e) mx = std::max(mx, l[e]);
    float sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += (l[e] = std::exp(l[e] - mx));
    for (int64_t e = 0; e < experts; ++e) l[e] /= sum;
    // top-k by probability (ties: lower expert index, as torch.topk on CPU)
    float chosen_sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; ++e) {
        bool taken = false;
        for (int64_t q = 0; q < j; ++q) taken |= route_e[r * k + q] == e;
        if (!taken && (best < 0 || l[e] > l[best])) best = e;
      }
      route_e[r * k + j] = static_cast<int32_t>(best);
      route_w[r * k + j] = l[best];
      chosen_sum += l[best];
    }
    if (p->normalize_top_k())
      for (int64_t j = 0; j < k; ++j) route_w[r * k + j] /= chosen_sum;
  }
  float* y = a.output.f32();
  std::memset(y, 0, static_cast<size_t>(rows * hidden) * 4);
  for (int64_t e = 0; e < experts; ++e) {
    int64_t n = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < k; ++j)
        if (route_e[r * k + j] == e) {
          sel_rows[n] = static_cast<int32_t>(r);
          sel_w[n] = route_w[r * k + j];
          std::memcpy(xe + n * hidden, x.f32() + r * hidden, static_cast<size_t>(hidden) * 4);
          ++n;
        }
    if (n == 0) continue;
    GatedMlpRows(xe, n, hidden, a.weights[1 + e], a.weights[1 + experts + e], a.weights[1 + 2 * experts + e],
                 p->activation(), ye, hidden, a.pool, mlp);
    for (int64_t i = 0; i < n; ++i) {
      float* dst = y + static_cast<int64_t>(sel_rows[i]) * hidden;
      const float* src = ye + i * hidden;
      for (int64_t h = 0; h < hidden; ++h) dst[h] += sel_w[i] * src[h];
    }
  }
  (void)inter;
  return KILN_OK;
}

size_t MoeScratch(const fb::Op* op, const WeightView* w, int, int64_t rows, int64_t, int threads) {
  const fb::MoeParams* p = op->params_as_MoeParams();
  int64_t experts = static_cast<int64_t>(p->expert_ids()->size()), k = p->top_k();
  int64_t hidden = w[0].cols, inter = w[1].rows;
  return static_cast<size_t>(rows * experts + 2 * rows * k + 2 * rows + 2 * rows * hidden) +
         std::max(GatedMlpScratchFloats(rows, hidden, inter, threads), WeightScratch(hidden, threads, rows));
}

// Stride-p convolution without padding: every patch, flattened as (c, ky, kx),
// against every kernel row.
kiln_status_t PatchEmbed(const KernelArgs& a) {
  const ActView& px = a.inputs[0];  // [C, H * W], extra = W
  const WeightView& w = a.weights[0];
  const int64_t p = a.op->params_as_PatchEmbedParams()->patch_size();
  const int64_t channels = px.rows, width = px.extra, height = px.cols / width;
  const int64_t gw = width / p, patches = (height / p) * gw;
  const int64_t kdim = channels * p * p, dim = w.rows;
  float* wfull = a.scratch;  // dim * kdim
  a.pool->For(dim, 8, [&](int64_t b, int64_t e, int) {
    for (int64_t d = b; d < e; ++d) {
      const float* row = WeightRow(w, d, wfull + d * kdim);
      if (row != wfull + d * kdim) std::memcpy(wfull + d * kdim, row, static_cast<size_t>(kdim) * 4);
    }
  });
  float bias_buf[1];
  (void)bias_buf;
  float* patch_bufs = wfull + dim * kdim;  // threads * kdim
  float* bias = patch_bufs + static_cast<int64_t>(a.pool->num_threads()) * kdim;  // dim
  if (a.num_weights > 1) DecodeElements(a.weights[1], 0, dim, bias);
  a.pool->For(patches, 1, [&](int64_t b, int64_t e, int thread) {
    float* buf = patch_bufs + thread * kdim;
    for (int64_t q = b; q < e; ++q) {
      int64_t py = q / gw, pxx = q % gw;
      for (int64_t c = 0; c < channels; ++c)
        for (int64_t ky = 0; ky < p; ++ky)
          std::memcpy(buf + (c * p + ky) * p, px.f32() + c * px.cols + (py * p + ky) * width + pxx * p,
                      static_cast<size_t>(p) * 4);
      float* out = a.output.f32() + q * dim;
      for (int64_t d = 0; d < dim; ++d) {
        float v = Dot(buf, wfull + d * kdim, kdim);
        out[d] = a.num_weights > 1 ? v + bias[d] : v;
      }
    }
  });
  return KILN_OK;
}

size_t PatchEmbedScratch(const fb::Op*, const WeightView* w, int, int64_t, int64_t, int threads) {
  int64_t kdim = w[0].cols;
  return static_cast<size_t>(w[0].rows * kdim + threads * kdim + w[0].rows);
}

}  // namespace kiln::rt::ref
