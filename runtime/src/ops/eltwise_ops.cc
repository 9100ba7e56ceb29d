// Runners of normalisations, element-wise ops, rotary embedding, attention and data
// movement.
#include <algorithm>
#include <cmath>

#include "kv_cache.h"
#include "ops/common.h"
#include "ops/ops.h"
#include "support/sort.h"

namespace kiln::rt::ops {
namespace {

bool SameShape(const ActView& a, const ActView& b) { return a.rows == b.rows && a.cols == b.cols; }

template <typename Fn>
void Rows(const OpContext& c, int64_t rows, int64_t grain, size_t per_thread, Fn&& fn) {
  c.pool->For(rows, grain, [&](int64_t b, int64_t e, int t) { fn(b, e, c.scratch + t * per_thread); });
}

kiln_status_t Norm(const OpContext& c, void (*uk)(const kiln_uk_norm_params_t*, int64_t, int64_t, float*)) {
  const ActView& x = c.inputs[0];
  if (!SameShape(x, c.output)) return Bad(c, "output must have the input's shape");
  kiln_uk_norm_params_t p = {};
  p.x = x.f32();
  p.y = c.output.f32();
  p.cols = x.cols;
  p.epsilon = c.op->params_as_NormParams()->epsilon();
  p.weight = c.weights[0].uk();
  if (c.num_weights > 1) p.bias = c.weights[1].uk();
  Rows(c, x.rows, 1, static_cast<size_t>(2 * x.cols), [&](int64_t b, int64_t e, float* s) { uk(&p, b, e, s); });
  return KILN_OK;
}

size_t NormScratchFloats(const WeightView* w, int threads) {
  return static_cast<size_t>(threads) * 2 * static_cast<size_t>(w[0].rows);
}

kiln_status_t Binary(const OpContext& c, void (*uk)(const kiln_uk_eltwise_params_t*, int64_t, int64_t)) {
  const ActView &x = c.inputs[0], &y = c.inputs[1];
  if (!SameShape(x, y) || !SameShape(x, c.output)) return Bad(c, "operands and output must have the same shape");
  kiln_uk_eltwise_params_t p = {x.f32(), y.f32(), c.output.f32(), 0};
  c.pool->For(x.rows * x.cols, 16384, [&](int64_t b, int64_t e, int) { uk(&p, b, e); });
  return KILN_OK;
}

}  // namespace

kiln_status_t RunRmsNorm(const OpContext& c) { return Norm(c, c.uk->rms_norm); }
size_t ScratchRmsNorm(const fb::Op*, const WeightView* w, int, int64_t, int64_t, int threads) {
  return NormScratchFloats(w, threads);
}
kiln_status_t RunLayerNorm(const OpContext& c) { return Norm(c, c.uk->layer_norm); }
size_t ScratchLayerNorm(const fb::Op*, const WeightView* w, int, int64_t, int64_t, int threads) {
  return NormScratchFloats(w, threads);
}

kiln_status_t RunAdd(const OpContext& c) { return Binary(c, c.uk->add); }
size_t ScratchAdd(const fb::Op*, const WeightView*, int, int64_t, int64_t, int) { return 0; }
kiln_status_t RunMul(const OpContext& c) { return Binary(c, c.uk->mul); }
size_t ScratchMul(const fb::Op*, const WeightView*, int, int64_t, int64_t, int) { return 0; }

kiln_status_t RunActivation(const OpContext& c) {
  const ActView& x = c.inputs[0];
  if (!SameShape(x, c.output)) return Bad(c, "output must have the input's shape");
  kiln_uk_eltwise_params_t p = {x.f32(), nullptr, c.output.f32(),
                                static_cast<int32_t>(c.op->params_as_ActivationParams()->kind())};
  const UkernelSet* uk = c.uk;
  c.pool->For(x.rows * x.cols, 8192, [&](int64_t b, int64_t e, int) { uk->act(&p, b, e); });
  return KILN_OK;
}
size_t ScratchActivation(const fb::Op*, const WeightView*, int, int64_t, int64_t, int) { return 0; }

// Inverse frequencies as transformers computes them in float32
// (modeling_rope_utils.py: _compute_default_rope_parameters and, for "llama3",
// _compute_llama3_parameters).
void InverseFrequencies(const fb::RopeParams* p, float* inv_freq) {
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

kiln_status_t RunRope(const OpContext& c) {
  const fb::RopeParams* rp = c.op->params_as_RopeParams();
  const ActView& x = c.inputs[0];
  const int64_t heads = rp->num_heads(), hd = rp->head_dim();
  if (c.inputs[1].rows < x.rows || heads * hd > x.cols || !SameShape(x, c.output))
    return Bad(c, "positions or widths do not fit the input");
  float* inv_freq = c.scratch;  // head_dim / 2 floats
  InverseFrequencies(rp, inv_freq);
  kiln_uk_rope_params_t p = {x.f32(), c.output.f32(), x.cols, c.inputs[1].i32(), inv_freq, heads, hd};
  const UkernelSet* uk = c.uk;
  c.pool->For(x.rows, 1, [&](int64_t b, int64_t e, int) { uk->rope(&p, b, e); });
  return KILN_OK;
}
size_t ScratchRope(const fb::Op* op, const WeightView*, int, int64_t, int64_t, int) {
  return op->params_as_RopeParams()->head_dim() / 2;
}

kiln_status_t KvRows(const OpContext& c, const int32_t* pos, int64_t rows, const int32_t** out) {
  KvCache* kv = c.kv;
  // The rows follow on from the one the session gave (KvCache::first_row): the
  // positions are RoPE's, which a sliding window's eviction or visual tokens at their
  // original positions make skip.
  if (kv->first_row < 0)
    return Fail(c.error, KILN_ERROR_INTERNAL, "the session gave no KV row for these positions");
  int32_t* row = kv->row_scratch;
  for (int64_t t = 0; t < rows; ++t) row[t] = static_cast<int32_t>(kv->first_row + t);
  for (int64_t t = 0; t < rows; ++t) {
    if (row[t] < 0 || row[t] >= kv->context)
      return Fail(c.error, KILN_ERROR_CONTEXT_FULL, "position %d (row %d) is outside the %lld-token context", pos[t],
                  row[t], static_cast<long long>(kv->context));
    if (row[t] >= kv->mapped)  // the session maps blocks before it runs a stage
      return Fail(c.error, KILN_ERROR_INTERNAL, "position %d has no KV block (%lld positions mapped)", pos[t],
                  static_cast<long long>(kv->mapped));
  }
  *out = row;
  return KILN_OK;
}

namespace {

// softmax(q k^T * scale) v for `rows` query rows (row stride ldq) over keys and
// values of row stride ldkv: within them (no KV cache), or written into the KV cache
// at `pos` first (unless `written`: the producing Linear's q|k|v epilogue wrote them).
// `scratch` is the attention's part of the op's scratch.
kiln_status_t Attend(const OpContext& c, const fb::AttentionParams* ap, const float* q, int64_t ldq, const float* k,
                     const float* v, int64_t ldkv, int64_t rows, const int32_t* pos, float* scratch,
                     bool written = false) {
  const int64_t heads = ap->num_heads();
  kiln_uk_attention_params_t p = {};
  p.q = q;
  p.ldq = ldq;
  p.y = c.output.f32();
  p.ldy = c.output.cols;
  p.heads = heads;
  p.kv_heads = ap->num_kv_heads();
  p.head_dim = ap->head_dim();
  p.scale = ap->scale();
  size_t per_thread;
  if (ap->cache_layer() < 0) {
    // Within the inputs: every row attends to every row (or the earlier ones).
    p.k = k;
    p.v = v;
    p.ldkv = ldkv;
    p.n_keys = rows;
    p.causal = ap->causal() ? 1 : 0;
    per_thread = KILN_UK_ATTENTION_SCRATCH(rows, p.head_dim, 0);
  } else {
    // Over the KV cache: write the new keys and values at their positions, then
    // each new row attends causally to every cached position up to its own.
    KvCache* kv = c.kv;
    const int64_t layer = ap->cache_layer();
    const int32_t* row = pos;
    if (kiln_status_t st = KvRows(c, pos, rows, &row); st != KILN_OK) return st;
    KvCache::Exact exact;
    if (rows > 0 && !written) kv->Append(layer, row[0], rows, k, v, ldkv, &exact);
    if (rows > 0 && written) exact = kv->ExactOf(layer, row[0], rows);
    p.ldkv = kv->width;
    p.n_keys = kv->context;
    p.positions = row;
    p.kv_encoding = kv->encoding;
    p.kv_blocks = kv->blocks;
    p.kv_block_shift = kv->block_shift;
    p.kv_span = static_cast<int32_t>(kv->span);
    p.kv_exact_from = exact.from;
    p.kr = exact.k;
    p.vr = exact.v;
    if (kv->encoding == format::kEncF32) {
      p.k = reinterpret_cast<const float*>(kv->K(layer, 0));
      p.v = reinterpret_cast<const float*>(kv->V(layer, 0));
    } else {
      p.kv_group = static_cast<int32_t>(kv->group);
      p.kc = kv->K(layer, 0);
      p.vc = kv->V(layer, 0);
      if (kv->row_scales() > 0) {
        p.ks = kv->KS(layer, 0);
        p.vs = kv->VS(layer, 0);
      }
    }
    per_thread = KILN_UK_ATTENTION_SCRATCH(kv->context, p.head_dim, 1);
  }
  const UkernelSet* uk = c.uk;
  // A cache the op's own kernel does not read (a generated kernel reads the
  // artifact's encoding; a session may have chosen another): the fastest built-in
  // kernel that reads it.
  auto* attend = uk->attention;
  if (ap->cache_layer() >= 0) {
    const bool builtin = uk->attention_kv_supported == nullptr || uk->attention_kv_supported(&p) != 0;
    if ((uk->attention_reads_kv >= 0 ? uk->attention_reads_kv != p.kv_encoding : !builtin) ||
        (p.kv_blocks != nullptr && !uk->attention_reads_blocks) ||
        (uk->attention_reads_kv >= 0 && p.kv_group > 0 && (p.kv_span > 0) != uk->attention_reads_spans))
      attend = builtin ? uk->attention_kv : kiln_uk_attention_f32_f32_f32_ref_portable;
  }
  // All keys in the inputs and no mask (a vision encoder): one range of tasks per
  // thread. The kernels prepare each head of a call's range once (the generated ones
  // transpose its keys and pack its values), so the pool's 4 chunks per thread
  // prepared every head 4 times per thread: the SigLIP encoder's attention ran 1.24x
  // slower (2 threads). Causal or over a KV cache, rows differ in work: the pool's
  // chunks balance them.
  const int64_t grain = ap->cache_layer() < 0 && !ap->causal() ? c.pool->RangePerThread(rows * heads, 1) : 1;
  c.pool->For(rows * heads, grain, [&](int64_t b, int64_t e, int t) { attend(&p, b, e, scratch + t * per_thread); });
  return KILN_OK;
}

size_t AttentionScratch(const fb::AttentionParams* p, int64_t rows, int64_t context, int threads) {
  const bool cached = p->cache_layer() >= 0;
  return static_cast<size_t>(threads) * KILN_UK_ATTENTION_SCRATCH(cached ? context : rows, p->head_dim(), cached);
}

// Floats before the attention's scratch in a fused attention's: the rope's inverse
// frequencies, 64-byte aligned.
size_t RopeAreaFloats(const fb::AttentionParams* p) { return (p->head_dim() / 2 + 15) / 16 * 16; }

}  // namespace

kiln_status_t RunAttention(const OpContext& c) {
  const fb::AttentionParams* ap = c.op->params_as_AttentionParams();
  const ActView &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  const int64_t heads = ap->num_heads(), kv_heads = ap->num_kv_heads(), hd = ap->head_dim(), rows = q.rows;
  // Defence in depth behind the verifier: q, k, v (and positions) of one row count.
  if (k.rows != rows || v.rows != rows || (c.num_inputs > 3 && c.inputs[3].rows < rows) || c.output.rows != rows ||
      q.cols < heads * hd || k.cols < kv_heads * hd || v.cols != k.cols || c.output.cols < heads * hd ||
      (ap->cache_layer() >= 0 && c.num_inputs < 4))
    return Bad(c, "q, k, v and output rows or widths differ");
  return Attend(c, ap, q.f32(), q.cols, k.f32(), v.f32(), k.cols, rows,
                ap->cache_layer() >= 0 ? c.inputs[3].i32() : nullptr, c.scratch);
}
size_t ScratchAttention(const fb::Op* op, const WeightView*, int, int64_t rows, int64_t context, int threads) {
  return AttentionScratch(op->params_as_AttentionParams(), rows, context, threads);
}

// Attention over one [T, (heads + 2 kv_heads) * head_dim] input (kiln-fuse-qkv): q
// and k rotated in place first when the op has a rope, then attention reading q, k
// and v from their columns.
kiln_status_t RunQkvAttention(const OpContext& c) {
  const fb::AttentionParams* ap = c.op->params_as_AttentionParams();
  const ActView& qkv = c.inputs[0];
  const int64_t heads = ap->num_heads(), kv_heads = ap->num_kv_heads(), hd = ap->head_dim(), rows = qkv.rows;
  const int32_t* pos = c.num_inputs > 1 ? c.inputs[1].i32() : nullptr;
  if (qkv.cols != (heads + 2 * kv_heads) * hd || c.output.rows != rows || c.output.cols != heads * hd ||
      (c.num_inputs > 1 && c.inputs[1].rows < rows) || ((ap->cache_layer() >= 0 || ap->rope()) && pos == nullptr))
    return Bad(c, "q|k|v, positions and output rows or widths differ");
  float* q = qkv.f32();
  if (ap->kv_written() && ap->rope() != nullptr) return Bad(c, "kv_written with a rope");
  if (const fb::RopeParams* rp = ap->rope()) {
    float* inv_freq = c.scratch;
    InverseFrequencies(rp, inv_freq);
    kiln_uk_rope_params_t p = {q, q, qkv.cols, pos, inv_freq, heads + kv_heads, hd};
    const UkernelSet* uk = c.uk;
    c.pool->For(rows, 1, [&](int64_t b, int64_t e, int) { uk->rope(&p, b, e); });
  }
  return Attend(c, ap, q, qkv.cols, q + heads * hd, q + (heads + kv_heads) * hd, qkv.cols, rows, pos,
                c.scratch + RopeAreaFloats(ap), ap->kv_written());
}
size_t ScratchQkvAttention(const fb::Op* op, const WeightView*, int, int64_t rows, int64_t context, int threads) {
  const fb::AttentionParams* p = op->params_as_AttentionParams();
  return RopeAreaFloats(p) + AttentionScratch(p, rows, context, threads);
}

kiln_status_t RunPositionEmbedding(const OpContext& c) {
  const ActView& x = c.inputs[0];
  const WeightView& table = c.weights[0];
  if (!SameShape(x, c.output) || x.rows > table.rows || x.cols != table.cols) return Bad(c, "operands do not fit");
  kiln_uk_gather_params_t p = {nullptr, -1, x.f32(), c.output.f32(), c.output.cols, x.cols, table.uk()};
  const UkernelSet* uk = c.uk;
  Rows(c, x.rows, 1, static_cast<size_t>(x.cols), [&](int64_t b, int64_t e, float* s) { uk->gather(&p, b, e, s); });
  return KILN_OK;
}
size_t ScratchPositionEmbedding(const fb::Op*, const WeightView* w, int, int64_t, int64_t, int threads) {
  return static_cast<size_t>(threads) * static_cast<size_t>(w[0].cols);
}

// Data movement: copies, no arithmetic.

kiln_status_t RunClassToken(const OpContext& c) {
  const ActView& x = c.inputs[0];
  if (c.output.rows != x.rows + 1 || c.output.cols != x.cols || c.weights[0].rows != x.cols)
    return Bad(c, "operands do not fit");
  std::memmove(c.output.f32() + x.cols, x.f32(), static_cast<size_t>(x.rows * x.cols) * 4);
  format::DecodeFloatElements(c.weights[0].spec.id, c.weights[0].data, 0, static_cast<uint64_t>(x.cols),
                              c.output.f32());
  return KILN_OK;
}
size_t ScratchClassToken(const fb::Op*, const WeightView*, int, int64_t, int64_t, int) { return 0; }

// LLaVA / Idefics3: rows whose id is the image token take the image features in order.
kiln_status_t RunMergeImageTokens(const OpContext& c) {
  const ActView& embeds = c.inputs[0];
  const int32_t* ids = c.inputs[1].i32();
  const ActView& image = c.inputs[2];
  int64_t image_id = c.op->params_as_MergeImageTokensParams()->image_token_id();
  if (c.inputs[1].rows < embeds.rows || image.cols != embeds.cols || !SameShape(embeds, c.output))
    return Bad(c, "ids, embeddings and image features do not fit");
  int64_t count = 0;
  for (int64_t t = 0; t < embeds.rows; ++t) count += ids[t] == image_id;
  if (count != image.rows)
    return Fail(c.error, KILN_ERROR_INPUT_TOKENS, "the prompt has %lld image tokens but the image gives %lld features",
                static_cast<long long>(count), static_cast<long long>(image.rows));
  const size_t row_bytes = static_cast<size_t>(embeds.cols) * 4;
  int64_t next = 0;
  for (int64_t t = 0; t < embeds.rows; ++t) {
    float* out = c.output.f32() + t * embeds.cols;
    const float* src = ids[t] == image_id ? image.f32() + (next++) * image.cols : embeds.f32() + t * embeds.cols;
    if (src != out) std::memmove(out, src, row_bytes);
  }
  return KILN_OK;
}
size_t ScratchMergeImageTokens(const fb::Op*, const WeightView*, int, int64_t, int64_t, int) { return 0; }

kiln_status_t RunSliceRows(const OpContext& c) {
  const ActView& x = c.inputs[0];
  int64_t start = c.op->params_as_SliceRowsParams()->start();
  if (start > x.rows || c.output.rows > x.rows - start || c.output.cols != x.cols)
    return Bad(c, "row range outside the input");
  std::memmove(c.output.f32(), x.f32() + start * x.cols, static_cast<size_t>(c.output.rows * x.cols) * 4);
  return KILN_OK;
}
size_t ScratchSliceRows(const fb::Op*, const WeightView*, int, int64_t, int64_t, int) { return 0; }

kiln_status_t RunConcat(const OpContext& c) {
  int64_t width = 0;
  for (int i = 0; i < c.num_inputs; ++i) {
    if (c.inputs[i].rows != c.output.rows) return Bad(c, "inputs with different row counts");
    width += c.inputs[i].cols;
  }
  if (width != c.output.cols) return Bad(c, "inputs do not fill the output's columns");
  int64_t offset = 0;
  for (int i = 0; i < c.num_inputs; ++i) {
    const ActView& x = c.inputs[i];
    for (int64_t r = 0; r < x.rows; ++r)
      std::memcpy(c.output.f32() + r * c.output.cols + offset, x.f32() + r * x.cols, static_cast<size_t>(x.cols) * 4);
    offset += x.cols;
  }
  return KILN_OK;
}
size_t ScratchConcat(const fb::Op*, const WeightView*, int, int64_t, int64_t, int) { return 0; }

// Idefics3Connector.pixel_shuffle: out[h2 * (s/r) + w2][(hr * r + wr) * D + d]
//   = x[(h2 * r + hr) * s + w2 * r + wr][d].
kiln_status_t RunPixelShuffle(const OpContext& c) {
  const ActView& x = c.inputs[0];
  const int64_t r = c.op->params_as_PixelShuffleParams()->scale_factor();
  int64_t side = 0;
  while ((side + 1) * (side + 1) <= x.rows) ++side;
  const int64_t d = x.cols, g = r > 0 ? side / r : 0;
  if (r < 1 || side * side != x.rows || side % r != 0 || c.output.rows != g * g || c.output.cols != d * r * r)
    return Bad(c, "expects a square patch grid divisible by scale_factor");
  for (int64_t h2 = 0; h2 < g; ++h2)
    for (int64_t w2 = 0; w2 < g; ++w2) {
      float* out = c.output.f32() + (h2 * g + w2) * c.output.cols;
      for (int64_t hr = 0; hr < r; ++hr)
        for (int64_t wr = 0; wr < r; ++wr)
          std::memcpy(out + (hr * r + wr) * d, x.f32() + ((h2 * r + hr) * side + w2 * r + wr) * d,
                      static_cast<size_t>(d) * 4);
    }
  return KILN_OK;
}
size_t ScratchPixelShuffle(const fb::Op*, const WeightView*, int, int64_t, int64_t, int) { return 0; }

// Visual-token pruning: each row's score, then the output's rows (the planned `keep`,
// or fewer when the session keeps fewer) are the best-scoring input rows in their
// original order (ties: the earlier row).
kiln_status_t RunSelectTokens(const OpContext& c) {
  const ActView& x = c.inputs[0];
  const fb::SelectTokensParams* p = c.op->params_as_SelectTokensParams();
  const int64_t n = x.rows, d = x.cols, keep = c.output.rows;
  if (n != static_cast<int64_t>(p->tokens()) || keep < 1 || keep > n || c.output.cols != d)
    return Bad(c, "expects [tokens, D] and keeps 1 to tokens rows");
  float* score = c.scratch;                                   // n
  int32_t* order = reinterpret_cast<int32_t*>(c.scratch + n);  // n
  if (p->score() == fb::TokenScore::Distinct) {
    // The mean row, in the output's first row until the rows are copied.
    float* mean = c.output.f32();
    for (int64_t j = 0; j < d; ++j) {
      double m = 0;
      for (int64_t r = 0; r < n; ++r) m += x.f32()[r * d + j];
      mean[j] = static_cast<float>(m / static_cast<double>(n));
    }
    double mm = 0;
    for (int64_t j = 0; j < d; ++j) mm += static_cast<double>(mean[j]) * mean[j];
    for (int64_t r = 0; r < n; ++r) {
      const float* row = x.f32() + r * d;
      double dot = 0, rr = 0;
      for (int64_t j = 0; j < d; ++j) {
        dot += static_cast<double>(row[j]) * mean[j];
        rr += static_cast<double>(row[j]) * row[j];
      }
      double den = std::sqrt(rr * mm);
      score[r] = static_cast<float>(den > 0 ? 1.0 - dot / den : 0.0);
    }
  } else {
    for (int64_t r = 0; r < n; ++r) {
      double rr = 0;
      for (int64_t j = 0; j < d; ++j) rr += static_cast<double>(x.f32()[r * d + j]) * x.f32()[r * d + j];
      score[r] = static_cast<float>(std::sqrt(rr));
    }
  }
  // A NaN score (non-finite features) ranks last: the order stays a strict one.
  for (int64_t r = 0; r < n; ++r) {
    if (std::isnan(score[r])) score[r] = -INFINITY;
    order[r] = static_cast<int32_t>(r);
  }
  // The best `keep` first (ties: the earlier row), then those back in row order.
  Sort(order, order + n, [&](int32_t a, int32_t b) { return score[a] != score[b] ? score[a] > score[b] : a < b; });
  Sort(order, order + keep, [](int32_t a, int32_t b) { return a < b; });
  for (int64_t k = 0; k < keep; ++k)
    std::memcpy(c.output.f32() + k * d, x.f32() + static_cast<int64_t>(order[k]) * d, static_cast<size_t>(d) * 4);
  if (c.selected_rows != nullptr) std::memcpy(c.selected_rows, order, static_cast<size_t>(keep) * sizeof(int32_t));
  return KILN_OK;
}
size_t ScratchSelectTokens(const fb::Op* op, const WeightView*, int, int64_t, int64_t, int) {
  return 2 * static_cast<size_t>(op->params_as_SelectTokensParams()->tokens());
}

}  // namespace kiln::rt::ops
