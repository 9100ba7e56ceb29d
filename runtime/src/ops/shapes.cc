// The shape rules of the ops (ops/shapes.h), one per row of formats/ops.def.
#include "ops/shapes.h"

#include <cmath>

#include "formats/kiln_format.h"
#include "support/error.h"

namespace kiln::rt {

kiln_status_t ShapeCheck::OpBad(const char *what) const {
  return rt::Fail(error, KILN_ERROR_ARTIFACT_OP, "op '%s' (%s): %s", OpName(op), fb::EnumNameOpKind(op->kind()), what);
}

kiln_status_t ShapeCheck::ShapeBad(const char *what) const {
  return rt::Fail(error, KILN_ERROR_ARTIFACT_SHAPE, "op '%s' (%s): %s", OpName(op), fb::EnumNameOpKind(op->kind()),
                  what);
}

namespace ops {

kiln_status_t ShapeEmbedding(const ShapeCheck &c) {
  Dims t = c.w(0);
  if (c.in(0).rank != 1 || c.indt(0) != fb::DType::I32 || t.rank != 2 || !c.mat(c.out) || !c.rows_eq(c.out, c.in(0)) ||
      c.out.d[1] != t.d[1])
    return c.ShapeBad("expects ids [T], table [V, H] and output [T, H]");
  return KILN_OK;
}

kiln_status_t ShapeMergeImageTokens(const ShapeCheck &c) {
  if (!c.mat(c.in(0)) || c.in(1).rank != 1 || c.indt(1) != fb::DType::I32 || !c.mat(c.in(2)) || !c.f32in(0) ||
      !c.f32in(2) || !c.rows_eq(c.in(1), c.in(0)) || c.in(2).d[1] != c.in(0).d[1] || c.out.rank != 2 ||
      !c.rows_eq(c.out, c.in(0)) || c.out.d[1] != c.in(0).d[1])
    return c.ShapeBad("expects embeds [T, H], ids [T], image [N, H] and output [T, H]");
  return KILN_OK;
}

namespace {

// The fusions of a matmul op (schema 1.5): a norm prologue whose weights are the op's
// last `norm_weights` (each [K]), and a residual (input 1) of the output's shape.
// `input1_residual` false: input 1 is no residual (a q|k|v epilogue's positions).
kiln_status_t ShapeFusions(const ShapeCheck &c, fb::NormKind norm, float epsilon, int *norm_weights,
                           bool input1_residual = true) {
  *norm_weights = norm == fb::NormKind::Rms ? 1 : norm == fb::NormKind::Layer ? 2 : 0;
  if (norm > fb::NormKind::MAX) return c.OpBad("unknown norm kind");
  if (*norm_weights > 0) {
    if (!(epsilon > 0.0f) || !std::isfinite(epsilon)) return c.OpBad("norm_epsilon must be positive");
    if (c.nw < *norm_weights + 1) return c.OpBad("missing norm weights");
    for (int i = c.nw - *norm_weights; i < c.nw; ++i)
      if (c.w(i).rank != 1 || c.w(i).d[0] != c.in(0).d[1]) return c.ShapeBad("norm weight and bias must be [K]");
  }
  if (input1_residual && c.ni > 1 &&
      (!c.mat(c.in(1)) || !c.f32in(1) || !c.rows_eq(c.in(1), c.out) || c.in(1).d[1] != c.out.d[1]))
    return c.ShapeBad("the residual must have the output's shape");
  return KILN_OK;
}

kiln_status_t QkvEpilogueBad(const ShapeCheck &c, const fb::QkvEpilogueParams *q);

// A product of input [R, K] and weight 0 [N, K] into output [R, N].
kiln_status_t ShapeProduct(const ShapeCheck &c) {
  Dims wt = c.w(0);
  if (!c.mat(c.in(0)) || !c.f32in(0) || wt.rank != 2 || c.in(0).d[1] != wt.d[1] || !c.mat(c.out) ||
      !c.rows_eq(c.out, c.in(0)) || c.out.d[1] != wt.d[0])
    return c.ShapeBad("expects input [R, K], weight [N, K] and output [R, N]");
  return KILN_OK;
}

}  // namespace

kiln_status_t ShapeLinear(const ShapeCheck &c) {
  if (kiln_status_t st = ShapeProduct(c); st != KILN_OK) return st;
  const Dims wt = c.w(0);
  const fb::LinearParams *lp = c.op->params_as_LinearParams();
  if (lp && lp->has_activation() && lp->activation() > fb::ActivationKind::MAX) return c.OpBad("unknown activation");
  int norm_weights = 0;
  const fb::QkvEpilogueParams *qkv = lp ? lp->qkv() : nullptr;
  if (kiln_status_t st = ShapeFusions(c, lp ? lp->norm() : fb::NormKind::None, lp ? lp->norm_epsilon() : 0.0f,
                                      &norm_weights, qkv == nullptr);
      st != KILN_OK)
    return st;
  if (qkv != nullptr) {  // 1.15: input 1 the positions
    if (kiln_status_t st = QkvEpilogueBad(c, qkv); st != KILN_OK) return st;
    if (lp->has_activation()) return c.OpBad("a q|k|v epilogue takes no activation");
    if (c.ni != 2 || c.in(1).rank != 1 || c.indt(1) != fb::DType::I32 || !c.rows_eq(c.in(1), c.in(0)))
      return c.ShapeBad("a q|k|v epilogue needs positions [R] as input 1");
    if (c.out.d[1] != static_cast<int64_t>(qkv->num_heads() + 2 * qkv->num_kv_heads()) * qkv->head_dim())
      return c.ShapeBad("a q|k|v epilogue's output must be [R, (heads + 2 kv_heads) * head_dim]");
  }
  const int own = c.nw - norm_weights;
  if (own < 1 || own > 2) return c.OpBad("expects a weight, an optional bias and the norm's weights");
  if (own == 2 && (c.w(1).rank != 1 || c.w(1).d[0] != wt.d[0])) return c.ShapeBad("bias must be [N]");
  return KILN_OK;
}
kiln_status_t ShapeLmHead(const ShapeCheck &c) { return ShapeProduct(c); }

kiln_status_t ShapeAdd(const ShapeCheck &c) {
  if (!c.mat(c.in(0)) || !c.f32in(0) || !c.f32in(1) || c.in(1).rank != 2 || !c.rows_eq(c.in(0), c.in(1)) ||
      c.in(0).d[1] != c.in(1).d[1] || !c.mat(c.out) || !c.rows_eq(c.out, c.in(0)) || c.out.d[1] != c.in(0).d[1]) {
    char a[32], b[32];
    return Fail(c.error, KILN_ERROR_ARTIFACT_SHAPE,
                "op '%s' (%s): operands and output must have the same shape "
                "(rows: %s and %s)",
                OpName(c.op), fb::EnumNameOpKind(c.op->kind()), RowsName(c.in(0), a, sizeof(a)),
                RowsName(c.in(1), b, sizeof(b)));
  }
  return KILN_OK;
}

kiln_status_t ShapeMul(const ShapeCheck &c) { return ShapeAdd(c); }

kiln_status_t ShapeActivation(const ShapeCheck &c) {
  if (c.op->params_as_ActivationParams()->kind() > fb::ActivationKind::MAX) return c.OpBad("unknown activation");
  if (!c.mat(c.in(0)) || !c.f32in(0) || !c.mat(c.out) || !c.rows_eq(c.out, c.in(0)) || c.out.d[1] != c.in(0).d[1])
    return c.ShapeBad("output must have the input's shape");
  return KILN_OK;
}

kiln_status_t ShapeGatedMlp(const ShapeCheck &c) {
  const fb::GatedMlpParams *p = c.op->params_as_GatedMlpParams();
  if (p->activation() > fb::ActivationKind::MAX) return c.OpBad("unknown activation");
  // Fused (1.9): gate and up are one [2I, H] weight of their rows interleaved.
  const bool fused = p->gate_up_block() > 0;
  // Blocks beyond 256 rows buy nothing and would size the thread's product buffers.
  if (p->gate_up_block() > 256) return c.OpBad("gate_up_block above 256");
  if (c.nw < (fused ? 2 : 3)) return c.OpBad(fused ? "expects gate/up, down and the norm's weights"
                                                    : "expects gate, up, down and the norm's weights");
  Dims g = c.w(0), u = fused ? c.w(0) : c.w(1), d = c.w(fused ? 1 : 2);
  int64_t h = c.in(0).d[1];
  const int64_t inter = fused ? g.d[0] / 2 : g.d[0];
  if (!c.mat(c.in(0)) || !c.f32in(0) || g.rank != 2 || u.rank != 2 || d.rank != 2 || g.d[1] != h || u.d[1] != h ||
      u.d[0] != g.d[0] || (fused && g.d[0] % 2 != 0) || d.d[0] != h || d.d[1] != inter || !c.mat(c.out) ||
      !c.rows_eq(c.out, c.in(0)) || c.out.d[1] != h)
    return c.ShapeBad(fused ? "expects gate/up [2I, H], down [H, I] and output [R, H]"
                            : "expects gate/up [I, H], down [H, I] and output [R, H]");
  int norm_weights = 0;
  if (kiln_status_t st = ShapeFusions(c, p->norm(), p->norm_epsilon(), &norm_weights); st != KILN_OK) return st;
  if (c.nw != (fused ? 2 : 3) + norm_weights)
    return c.OpBad(fused ? "expects gate/up, down and the norm's weights" : "expects gate, up, down and the norm's weights");
  return KILN_OK;
}

kiln_status_t ShapeMoe(const ShapeCheck &c) {
  const fb::MoeParams *p = c.op->params_as_MoeParams();
  if (p->expert_ids() == nullptr) return c.OpBad("expert_ids missing");
  int64_t e = p->expert_ids()->size();
  if (e < 1 || c.nw != 1 + 3 * e) return c.OpBad("weights must be the router and gate/up/down per expert");
  if (p->top_k() < 1 || p->top_k() > e) return c.OpBad("top_k out of range");
  if (p->activation() > fb::ActivationKind::MAX) return c.OpBad("unknown activation");
  int64_t h = c.in(0).d[1];
  Dims r = c.w(0);
  if (!c.mat(c.in(0)) || !c.f32in(0) || r.rank != 2 || r.d[0] != e || r.d[1] != h || !c.mat(c.out) ||
      !c.rows_eq(c.out, c.in(0)) || c.out.d[1] != h)
    return c.ShapeBad("expects router [E, H] and output [R, H]");
  for (int64_t x = 0; x < e; ++x) {
    Dims g = c.w(1 + x), u = c.w(1 + e + x), d = c.w(1 + 2 * e + x);
    if (g.rank != 2 || u.rank != 2 || d.rank != 2 || g.d[1] != h || u.d[1] != h || u.d[0] != g.d[0] || d.d[0] != h ||
        d.d[1] != g.d[0])
      return c.ShapeBad("an expert's gate/up/down weights do not fit");
  }
  int norm_weights = 0;
  return ShapeFusions(c, fb::NormKind::None, 0.0f, &norm_weights);
}

kiln_status_t ShapeRmsNorm(const ShapeCheck &c) {
  float eps = c.op->params_as_NormParams()->epsilon();
  if (!(eps > 0.0f) || !std::isfinite(eps)) return c.OpBad("epsilon must be positive");
  if (!c.mat(c.in(0)) || !c.f32in(0) || !c.mat(c.out) || !c.rows_eq(c.out, c.in(0)) || c.out.d[1] != c.in(0).d[1])
    return c.ShapeBad("output must have the input's shape");
  for (int i = 0; i < c.nw; ++i)
    if (c.w(i).rank != 1 || c.w(i).d[0] != c.in(0).d[1]) return c.ShapeBad("weight and bias must be [H]");
  return KILN_OK;
}

kiln_status_t ShapeLayerNorm(const ShapeCheck &c) { return ShapeRmsNorm(c); }

namespace {

// The rotary parameters of a Rope op, or of a QkvAttention's rope.
kiln_status_t RopeParamsBad(const ShapeCheck &c, const fb::RopeParams *p) {
  if (p->num_heads() < 1 || p->head_dim() < 2 || p->head_dim() % 2 != 0 || p->head_dim() > 4096 ||
      !(p->theta() > 0.0) || !std::isfinite(p->theta()) || p->rope_type() > fb::RopeType::MAX)
    return c.OpBad("invalid rotary parameters");
  if (p->rope_type() == fb::RopeType::Llama3 &&
      (!(p->factor() > 0.0) || !(p->low_freq_factor() > 0.0) || !(p->high_freq_factor() > p->low_freq_factor()) ||
       p->original_max_position_embeddings() < 1))
    return c.OpBad("invalid llama3 rope scaling");
  return KILN_OK;
}

// Whether nh query heads sharing nkv key/value heads of hd channels are valid.
bool HeadsValid(int64_t nh, int64_t nkv, int64_t hd) { return nh >= 1 && nkv >= 1 && nh % nkv == 0 && hd >= 1 && hd <= 4096; }

// A KV-cache binding (cache_layer >= 0) of nkv heads of hd channels, against the text config.
kiln_status_t CacheBindingBad(const ShapeCheck &c, int32_t cache_layer, int64_t nkv, int64_t hd, bool causal) {
  if (cache_layer >= 0 && (cache_layer >= c.layers || nkv != c.kv_heads || hd != c.head_dim || !causal))
    return c.OpBad("KV-cache binding does not match the text config");
  return KILN_OK;
}

// A fused rope (a QkvAttention's, 1.5, or a q|k|v epilogue's, 1.15): q and k side by side.
kiln_status_t FusedRopeBad(const ShapeCheck &c, const fb::RopeParams *r, int64_t nh, int64_t nkv, int64_t hd) {
  if (r->num_heads() != nh + nkv || r->head_dim() != hd)
    return c.OpBad("invalid rotary parameters (they rotate q and k: num_heads + num_kv_heads heads)");
  return RopeParamsBad(c, r);
}

// The heads, scale and KV-cache binding of an Attention or QkvAttention op.
kiln_status_t AttentionParamsBad(const ShapeCheck &c, const fb::AttentionParams *p) {
  const int64_t nh = p->num_heads(), nkv = p->num_kv_heads(), hd = p->head_dim();
  if (!HeadsValid(nh, nkv, hd) || !(p->scale() > 0.0f) || !std::isfinite(p->scale()))
    return c.OpBad("invalid attention parameters");
  return CacheBindingBad(c, p->cache_layer(), nkv, hd, p->causal());
}

// The q|k|v epilogue of a Linear (1.15): heads, its KV-cache binding, its rope.
kiln_status_t QkvEpilogueBad(const ShapeCheck &c, const fb::QkvEpilogueParams *q) {
  const int64_t nh = q->num_heads(), nkv = q->num_kv_heads(), hd = q->head_dim();
  if (!HeadsValid(nh, nkv, hd)) return c.OpBad("invalid q|k|v epilogue heads");
  if (kiln_status_t st = CacheBindingBad(c, q->cache_layer(), nkv, hd, /*causal=*/true); st != KILN_OK) return st;
  if (q->cache_layer() < 0 && q->rope() == nullptr) return c.OpBad("a q|k|v epilogue with neither rope nor KV cache");
  return q->rope() != nullptr ? FusedRopeBad(c, q->rope(), nh, nkv, hd) : KILN_OK;
}

}  // namespace

kiln_status_t ShapeRope(const ShapeCheck &c) {
  const fb::RopeParams *p = c.op->params_as_RopeParams();
  if (kiln_status_t st = RopeParamsBad(c, p); st != KILN_OK) return st;
  if (!c.mat(c.in(0)) || !c.f32in(0) || c.in(1).rank != 1 || c.indt(1) != fb::DType::I32 ||
      !c.rows_eq(c.in(1), c.in(0)) || c.in(0).d[1] != static_cast<int64_t>(p->num_heads()) * p->head_dim() ||
      !c.mat(c.out) || !c.rows_eq(c.out, c.in(0)) || c.out.d[1] != c.in(0).d[1])
    return c.ShapeBad("expects input [T, heads * head_dim], positions [T]");
  return KILN_OK;
}

kiln_status_t ShapeAttention(const ShapeCheck &c) {
  const fb::AttentionParams *p = c.op->params_as_AttentionParams();
  if (kiln_status_t st = AttentionParamsBad(c, p); st != KILN_OK) return st;
  const int64_t nh = p->num_heads(), nkv = p->num_kv_heads(), hd = p->head_dim();
  const bool cached = p->cache_layer() >= 0;
  if (cached && c.ni != 4) return c.OpBad("KV-cache binding does not match the text config");
  if (!cached && c.ni != 3) return c.OpBad("positions without a KV cache");
  for (int i = 0; i < 3; ++i)
    if (!c.mat(c.in(i)) || !c.f32in(i) || !c.rows_eq(c.in(i), c.in(0))) return c.ShapeBad("q, k, v must be [T, width]");
  if (c.in(0).d[1] != nh * hd || c.in(1).d[1] != nkv * hd || c.in(2).d[1] != nkv * hd || !c.mat(c.out) ||
      !c.rows_eq(c.out, c.in(0)) || c.out.d[1] != nh * hd)
    return c.ShapeBad("q [T, heads * head_dim], k/v [T, kv_heads * head_dim]");
  if (cached && (c.in(3).rank != 1 || c.indt(3) != fb::DType::I32 || !c.rows_eq(c.in(3), c.in(0))))
    return c.ShapeBad("positions must be [T]");
  return KILN_OK;
}

kiln_status_t ShapeQkvAttention(const ShapeCheck &c) {
  const fb::AttentionParams *p = c.op->params_as_AttentionParams();
  if (kiln_status_t st = AttentionParamsBad(c, p); st != KILN_OK) return st;
  const int64_t nh = p->num_heads(), nkv = p->num_kv_heads(), hd = p->head_dim();
  const bool cached = p->cache_layer() >= 0;
  if (p->kv_written() && p->rope() != nullptr)
    return c.OpBad("kv_written: the producing Linear rotates q and k, so the op has no rope");
  if (const fb::RopeParams *r = p->rope())
    if (kiln_status_t st = FusedRopeBad(c, r, nh, nkv, hd); st != KILN_OK) return st;
  if (c.ni != ((cached || p->rope() != nullptr) ? 2 : 1)) return c.OpBad("positions needed by, and only by, a KV cache or a rope");
  if (!c.mat(c.in(0)) || !c.f32in(0) || c.in(0).d[1] != (nh + 2 * nkv) * hd || !c.mat(c.out) ||
      !c.rows_eq(c.out, c.in(0)) || c.out.d[1] != nh * hd)
    return c.ShapeBad("q|k|v [T, (heads + 2 kv_heads) * head_dim], output [T, heads * head_dim]");
  if (c.ni == 2 && (c.in(1).rank != 1 || c.indt(1) != fb::DType::I32 || !c.rows_eq(c.in(1), c.in(0))))
    return c.ShapeBad("positions must be [T]");
  return KILN_OK;
}

kiln_status_t ShapePatchEmbed(const ShapeCheck &c) {
  const fb::PatchEmbedParams* pp = c.op->params_as_PatchEmbedParams();
  uint32_t p = pp->patch_size();
  const bool cls = pp->class_token();  // 1.14: row 0 the class embedding, the patches after it
  Dims px = c.in(0), wt = c.w(0);
  if (px.rank != 3 || !c.f32in(0) || p < 1 || wt.rank != 4 || wt.d[1] != px.d[0] || wt.d[2] != p || wt.d[3] != p ||
      px.d[1] % p != 0 || px.d[2] % p != 0 || !c.mat(c.out) || c.out.sym != kSymStatic ||
      c.out.d[0] != (px.d[1] / p) * (px.d[2] / p) + (cls ? 1 : 0) || c.out.d[1] != wt.d[0])
    return c.ShapeBad(cls ? "expects pixels [C, H, W], kernel [D, C, p, p], output [1 + (H/p)(W/p), D]"
                          : "expects pixels [C, H, W], kernel [D, C, p, p], output [(H/p)(W/p), D]");
  // Then an optional bias [D], an optional position table [>= rows, D] (1.9) and, with
  // a class token, its embedding [D] after the table (1.14), in that order.
  const int last_table = cls ? c.nw - 2 : c.nw - 1;
  // The epilogue decodes the tables it adds as floats.
  auto float_weight = [&](int i) {
    const fb::Encoding e = c.model->tensors()->Get(c.op->weights()->Get(i))->encoding();
    return e == fb::Encoding::F32 || e == fb::Encoding::F16 || e == fb::Encoding::BF16;
  };
  if (cls && (c.nw < 3 || c.w(c.nw - 2).rank != 2 || c.w(c.nw - 1).rank != 1 || c.w(c.nw - 1).d[0] != wt.d[0]))
    return c.ShapeBad("a class token needs a position table [>= 1 + patches, D] and then its embedding [D]");
  for (int i = 1; i < (cls ? c.nw - 1 : c.nw); ++i) {
    const Dims w = c.w(i);
    if (w.rank == 1 && i == 1) {
      if (w.d[0] != wt.d[0]) return c.ShapeBad("bias must be [D]");
    } else if (w.rank == 2 && i == last_table) {
      if (w.d[1] != wt.d[0] || w.d[0] < c.out.d[0]) return c.ShapeBad("the position table must be [>= rows, D]");
      if (!float_weight(i)) return c.ShapeBad("the position table must be f32, f16 or bf16");
    } else {
      return c.ShapeBad("expects the kernel, an optional bias [D] and an optional position table [>= patches, D]");
    }
  }
  if (cls && !float_weight(c.nw - 1)) return c.ShapeBad("the class embedding must be f32, f16 or bf16");
  return KILN_OK;
}

kiln_status_t ShapeClassToken(const ShapeCheck &c) {
  if (!c.mat(c.in(0)) || !c.f32in(0) || c.in(0).sym != kSymStatic || c.in(0).d[0] < 1 || c.w(0).rank != 1 ||
      c.w(0).d[0] != c.in(0).d[1] || !c.mat(c.out) || c.out.sym != kSymStatic || c.out.d[0] != c.in(0).d[0] + 1 ||
      c.out.d[1] != c.in(0).d[1])
    return c.ShapeBad("expects [P, D] and class embedding [D], output [P + 1, D]");
  return KILN_OK;
}

kiln_status_t ShapePositionEmbedding(const ShapeCheck &c) {
  if (!c.mat(c.in(0)) || !c.f32in(0) || c.in(0).sym != kSymStatic || c.in(0).d[0] < 1 || c.w(0).rank != 2 ||
      c.w(0).d[1] != c.in(0).d[1] || c.in(0).d[0] > c.w(0).d[0] || !c.mat(c.out) || !c.rows_eq(c.out, c.in(0)) ||
      c.out.d[1] != c.in(0).d[1])
    return c.ShapeBad("expects [P, D] and a table of at least P rows");
  return KILN_OK;
}

kiln_status_t ShapeSliceRows(const ShapeCheck &c) {
  int64_t start = c.op->params_as_SliceRowsParams()->start();
  if (!c.mat(c.in(0)) || !c.f32in(0) || c.in(0).sym != kSymStatic || c.in(0).d[0] < 1 || !c.mat(c.out) ||
      c.out.sym != kSymStatic || c.out.d[0] < 1 || c.out.d[1] != c.in(0).d[1] || start < 0 || start > c.in(0).d[0] ||
      c.out.d[0] > c.in(0).d[0] - start)
    return c.ShapeBad("row range outside the input");
  return KILN_OK;
}

kiln_status_t ShapeSelectTokens(const ShapeCheck &c) {
  const fb::SelectTokensParams* p = c.op->params_as_SelectTokensParams();
  if (!c.mat(c.in(0)) || !c.f32in(0) || c.in(0).sym != kSymStatic || c.in(0).d[0] != static_cast<int64_t>(p->tokens()) ||
      p->keep() < 1 || p->keep() > p->tokens() || !c.mat(c.out) || c.out.sym != kSymStatic ||
      c.out.d[0] != static_cast<int64_t>(p->keep()) || c.out.d[1] != c.in(0).d[1] ||
      (p->score() != fb::TokenScore::Norm && p->score() != fb::TokenScore::Distinct))
    return c.ShapeBad("expects [tokens, D] -> [keep, D] with 1 <= keep <= tokens and a known score");
  return KILN_OK;
}

kiln_status_t ShapeConcat(const ShapeCheck &c) {
  int64_t width = 0;
  for (int i = 0; i < c.ni; ++i) {
    if (!c.mat(c.in(i)) || !c.f32in(i) || c.in(i).sym != kSymStatic || !c.rows_eq(c.in(i), c.in(0)) || c.in(i).d[0] < 1)
      return c.ShapeBad("inputs must be [R, C_i] with equal static R");
    width += c.in(i).d[1];
  }
  if (!c.mat(c.out) || !c.rows_eq(c.out, c.in(0)) || c.out.d[1] != width)
    return c.ShapeBad("output must be [R, sum C_i]");
  return KILN_OK;
}

kiln_status_t ShapePixelShuffle(const ShapeCheck &c) {
  int64_t r = c.op->params_as_PixelShuffleParams()->scale_factor();
  int64_t seq = c.in(0).d[0], side = 0;
  while ((side + 1) * (side + 1) <= seq) ++side;
  if (!c.mat(c.in(0)) || !c.f32in(0) || c.in(0).sym != kSymStatic || seq < 1 || side * side != seq || r < 1 ||
      side % r != 0 || !c.mat(c.out) || c.out.sym != kSymStatic || c.out.d[0] != seq / (r * r) ||
      c.out.d[1] != c.in(0).d[1] * r * r)
    return c.ShapeBad("expects a square patch grid divisible by scale_factor");
  return KILN_OK;
}

ShapeRule ShapeRuleOf(fb::OpKind kind) {
  switch (static_cast<uint32_t>(kind)) {
#define KILN_OP(kind, id, mlir, in_min, in_max, w_min, w_max, params, in_place, quant, act8) \
  case id:                                                                                   \
    return Shape##kind;
#include "formats/ops.def"
#undef KILN_OP
  }
  return nullptr;
}

}  // namespace ops
}  // namespace kiln::rt
