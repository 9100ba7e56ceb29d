// Runners of the ops built on a matrix product with a stored weight: linear, the LM
// head, the gated MLP, mixture of experts, patch embedding and embedding lookup.
#include <cmath>
#include <cstdlib>

#include "kv_cache.h"
#include "ops/common.h"
#include "ops/ops.h"

namespace kiln::rt::ops {

namespace {

// Rows from which a matrix product gives each thread one range of channels (see
// MatMul).
constexpr int64_t kWholeRangeRows = 16;

// The normalisation of a fusion as micro-kernel parameters (and its function).
void (*NormOf(const OpContext& c, const MatMulFusion& f, int64_t k,
              kiln_uk_norm_params_t* np))(const kiln_uk_norm_params_t*, int64_t, int64_t, float*) {
  *np = {};
  np->cols = k;
  np->epsilon = f.epsilon;
  np->weight = f.norm_weight->uk();
  if (f.norm_bias != nullptr) np->bias = f.norm_bias->uk();
  return f.norm == fb::NormKind::Layer ? c.uk->layer_norm : c.uk->rms_norm;
}

// Int8 activations of `rows` rows of x ([rows, k], row stride ldx) into xq/xs: each
// row normalised first by `norm`'s prologue when given (into the thread's 3 k floats
// of `norm_rows`, then quantised from there: the normalised activations never go to
// memory in f32). With `gather`, row r of the result is row gather[r] of x (a mixture
// of experts' tokens, gathered as they are quantised).
void Quantize(const OpContext& c, const float* x, int64_t rows, int64_t ldx, int64_t k, const MatMulFusion* norm,
              int8_t* xq, float* xs, float* norm_rows, const int32_t* gather = nullptr) {
  const UkernelSet* uk = c.uk;
  if (norm == nullptr && gather == nullptr) {
    kiln_uk_quant_rows_params_t q = {x, ldx, k, xq, xs};
    c.pool->For(rows, 1, [&](int64_t r0, int64_t r1, int) { uk->quant_rows(&q, r0, r1); });
    return;
  }
  if (norm == nullptr) {
    c.pool->For(rows, 1, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) {
        kiln_uk_quant_rows_params_t q = {x + gather[r] * ldx, ldx, k, xq + r * k, xs + r};
        uk->quant_rows(&q, 0, 1);
      }
    });
    return;
  }
  kiln_uk_norm_params_t np;
  auto norm_fn = NormOf(c, *norm, k, &np);
  c.pool->For(rows, 1, [&](int64_t r0, int64_t r1, int t) {
    float* row = norm_rows + t * 3 * k;
    for (int64_t r = r0; r < r1; ++r) {
      kiln_uk_norm_params_t one = np;
      one.x = x + (gather != nullptr ? gather[r] : r) * ldx;
      one.y = row;
      norm_fn(&one, 0, 1, row + k);
      kiln_uk_quant_rows_params_t q = {row, k, k, xq + r * k, xs + r};
      uk->quant_rows(&q, 0, 1);
    }
  });
}

// Rows [0, rows) of x (contiguous, k values each) normalised into y, with 2 k floats
// of `per_thread` scratch per thread.
void NormalizeRows(const OpContext& c, const MatMulFusion& f, const float* x, int64_t rows, int64_t k, float* y,
                   float* per_thread) {
  kiln_uk_norm_params_t np;
  auto fn = NormOf(c, f, k, &np);
  np.x = x;
  np.y = y;
  c.pool->For(rows, 1, [&](int64_t b, int64_t e, int t) { fn(&np, b, e, per_thread + t * 2 * k); });
}

// Whether the product with weight `slot` of `op` takes int8 per-token activations.
bool Int8Activations(const fb::Op* op, const WeightView* w, int slot) {
  const format::OpInfo* info = format::FindOp(static_cast<uint32_t>(op->kind()));
  return w[slot].int8_activations && info != nullptr && format::HasSlot(info->int8_act_weights, static_cast<uint32_t>(slot));
}
bool Int8Activations(const OpContext& c, int slot) { return Int8Activations(c.op, c.weights, slot); }

// Whether a gated MLP over gathered rows (a mixture's tokens) copies them, without an
// observer: int8 activations for both gate and up gather as they quantise, float ones
// are read in place by kernels that read rows; the rest (int8 for one of the two, or a
// kernel that reads contiguous rows only) copies. ScratchMoe reserves room for the copy
// only where this holds for some expert when the session is made; a copy that finds no
// room (an observer's, a calibration override's, an older artifact's generated kernel
// that reads contiguous rows only) goes to the heap (GatedMlpRows).
bool GatherCopies(const UkernelSet* uk, bool gate_a8, bool up_a8) {
  return !(gate_a8 && up_a8) && !(!gate_a8 && !up_a8 && uk->matmul_reads_rows);
}

}  // namespace

kiln_status_t MatMul(const OpContext& c, int slot, const float* x, int64_t rows, int64_t ldx, const WeightView* bias,
                     float* y, int64_t ldy, float* scratch, const MatMulFusion* fusion) {
  const WeightView& w = c.weights[slot];
  const int64_t n = w.rows, k = w.cols;
  const bool a8 = Int8Activations(c, slot);
  const UkernelSet* uk = c.uk;
  const int threads = c.pool->num_threads();
  // Scratch: the int8 activations, the kernels' per-thread scratch, then the fusions'
  // (MatMulScratch).
  float* per_thread = scratch + QuantAreaFloats(rows, k);
  const size_t stride = uk->matmul_scratch(k);
  // Activations made for another product of these rows already hold the norm.
  const bool shared = a8 && fusion != nullptr && fusion->xq != nullptr;
  bool norm = fusion != nullptr && fusion->norm != fb::NormKind::None && !shared;
  float* normed = per_thread + static_cast<size_t>(threads) * stride;
  float* norm_rows = normed + (norm ? rows * k : 0);
  float* products = norm_rows + (norm ? static_cast<int64_t>(threads) * 3 * k : 0);

  // Prologue: the input's normalisation. Float activations (and an observer, which sees
  // what is multiplied): the normalised rows first. Int8 activations: row by row as
  // they are quantised.
  if (norm && ldx != k) return Bad(c, "a normalised input must be contiguous");
  if (norm && (!a8 || c.observer != nullptr)) {
    NormalizeRows(c, *fusion, x, rows, k, normed, norm_rows);
    x = normed;
    norm = false;
  }
  const int32_t* x_rows = fusion != nullptr ? fusion->x_rows : nullptr;
  if (x_rows != nullptr && (a8 || fusion->norm != fb::NormKind::None || c.observer != nullptr || !uk->matmul_reads_rows))
    return Bad(c, "gathered rows need float activations and a kernel that reads them");
  if (c.observer != nullptr) c.observer(c.observer_user, c.op->weights()->Get(slot), x, rows, ldx, k);
  if (rows == 0) return KILN_OK;
  kiln_uk_matmul_params_t p = {};
  p.x = x;
  p.ldx = ldx;
  p.x_rows = x_rows;
  p.M = rows;
  p.N = n;
  p.K = k;
  p.w = w.uk();
  kiln_uk_weight_t b;
  if (bias != nullptr) {
    b = bias->uk();
    p.bias = &b;
  }

  // Epilogue, by the thread that computed the product of its channel range, right
  // after it: the activation of the product, then y = residual + product (the products
  // in their own buffer, since y may be the residual's). One call of the micro-kernel
  // per range, as without an epilogue: smaller ranges would re-read the activations.
  const float* residual = fusion != nullptr ? fusion->residual : nullptr;
  const int32_t act = fusion != nullptr ? fusion->activation : -1;
  const int64_t gated = fusion != nullptr ? fusion->gated_block : 0;
  const int32_t* scatter = fusion != nullptr ? fusion->scatter_rows : nullptr;
  if (gated > 0 && (residual != nullptr || scatter != nullptr || act < 0 || n % 2 != 0))
    return Bad(c, "a gated product's epilogue does not fit");
  if (scatter != nullptr && residual != nullptr) return Bad(c, "a scattered product takes no residual");
  const WeightView* add_rows = fusion != nullptr ? fusion->add_rows : nullptr;
  const int64_t add_from = fusion != nullptr ? fusion->add_rows_from : 0;
  if (add_rows != nullptr && (residual != nullptr || scatter != nullptr || gated > 0 || act >= 0 || add_from < 0 ||
                              add_rows->rows - add_from < rows || add_rows->cols != n ||
                              format::IsQuantized(add_rows->spec.id)))
    return Bad(c, "an added table's epilogue does not fit");
  p.y = residual != nullptr || scatter != nullptr ? products : y;
  p.ldy = residual != nullptr || scatter != nullptr ? n : ldy;
  const int64_t rope_heads = fusion != nullptr ? fusion->rope_heads : 0;
  const int64_t head_dim = fusion != nullptr ? fusion->head_dim : 0;
  if (rope_heads > 0 && (head_dim < 2 || head_dim % 2 != 0 || rope_heads * head_dim > n || residual != nullptr ||
                         scatter != nullptr || gated > 0 || add_rows != nullptr || act >= 0))
    return Bad(c, "a q|k|v product's rotation does not fit");
  // Ranges of whole panels (the generated W4A8/W8A8 kernels' layouts: 16 channels;
  // int4_p128k4's SME2 kernels step through 128 and would compute a cut panel twice),
  // gated of whole pairs of gate and up blocks (256 channels for the default block: the
  // scratch is sized for that grain), rotated of whole heads too.
  const int64_t panel = w.layout == format::kLayoutInt4P128K4 ? 128 : 16;
  const int64_t grain = gated > 0 ? GatedGrain(gated) : rope_heads > 0 ? LeastCommonMultiple(panel, head_dim) : panel;
  const int64_t chunk = gated > 0 ? GatedChunk(rows, n, grain) : 0;
  // Ranges per thread: with many rows (prefill, a vision encoder) one range of whole
  // grains per thread, since every call of the micro-kernel reads all the rows'
  // activations (the int8 kernels first sum each row's groups) and its epilogue walks
  // every row of its channels: the pool's 4 chunks per thread made a SigLIP encoder's
  // W8A8 linears 1.14x slower (2 threads). With a row or a few (decode) the pool's
  // chunks balance the load. A gated product goes chunk by chunk anyway.
  const bool whole_ranges = rows >= kWholeRangeRows && gated == 0;
  auto run = [&](kiln_uk_matmul_fn fn, int64_t n0, int64_t n1, int t) {
    if (gated > 0) {
      // Chunk by chunk into the thread's [rows, chunk] buffer: y points `c0` channels
      // before it, so that the kernel's channel c0 lands at its start (the address
      // is computed as an integer: the kernel only stores to [c0, c1)).
      float* buf = products + static_cast<size_t>(t) * static_cast<size_t>(rows * chunk);
      for (int64_t c0 = n0; c0 < n1; c0 += chunk) {
        const int64_t c1 = std::min(n1, c0 + chunk);
        kiln_uk_matmul_params_t pc = p;
        pc.y = reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(buf) - static_cast<uintptr_t>(c0) * sizeof(float));
        pc.ldy = chunk;
        fn(&pc, c0, c1, per_thread + t * stride);
        // Channels [j, j + 2 len) hold len of gate, then the same len of up: output
        // channels [j / 2, j / 2 + len). The last pair may be shorter than the block.
        for (int64_t m = 0; m < rows; ++m)
          for (int64_t j = c0; j < c1; j += 2 * gated) {
            const int64_t len = std::min(gated, (n - j) / 2);
            float* prod = buf + m * chunk + (j - c0);
            kiln_uk_eltwise_params_t e = {prod, prod + len, y + m * ldy + j / 2, act};
            uk->gated_act(&e, 0, len);
          }
      }
      return;
    }
    fn(&p, n0, n1, per_thread + t * stride);
    if (rope_heads > 0) {
      // The q and k heads of [n0, n1), rotated in place.
      const int64_t h0 = n0 / head_dim, h1 = std::min(n1 / head_dim, rope_heads);
      if (h1 > h0) {
        kiln_uk_rope_params_t r = {y + h0 * head_dim, y + h0 * head_dim, ldy, fusion->rope_positions,
                                   fusion->rope_inv_freq, h1 - h0, head_dim};
        uk->rope(&r, 0, rows);
      }
      return;
    }
    if (add_rows != nullptr) {
      // y[m] += table[add_from + m], this thread's channels, decoded 64 at a time.
      float decoded[64];
      for (int64_t m = 0; m < rows; ++m)
        for (int64_t j0 = n0; j0 < n1; j0 += 64) {
          const int64_t len = std::min<int64_t>(64, n1 - j0);
          format::DecodeFloatElements(add_rows->spec.id, add_rows->data, static_cast<uint64_t>((add_from + m) * n + j0),
                                      static_cast<uint64_t>(len), decoded);
          float* out = y + m * ldy + j0;
          for (int64_t j = 0; j < len; ++j) out[j] += decoded[j];
        }
      return;
    }
    if (scatter != nullptr) {
      // y[scatter[m]] += weight[m] x product[m], this thread's channels (a row appears
      // once: a token chooses an expert at most once).
      for (int64_t m = 0; m < rows; ++m) {
        const float* prod = p.y + m * p.ldy;
        float* out = y + static_cast<int64_t>(scatter[m]) * ldy;
        const float w = fusion->scatter_weights[m];
        for (int64_t j = n0; j < n1; ++j) out[j] += w * prod[j];
      }
      return;
    }
    if (residual == nullptr && act < 0) return;
    for (int64_t m = 0; m < rows; ++m) {
      float* prod = p.y + m * p.ldy;
      if (act >= 0) {
        kiln_uk_eltwise_params_t e = {prod + n0, nullptr, prod + n0, act};
        uk->act(&e, 0, n1 - n0);
      }
      if (residual == nullptr) continue;
      const float* r = residual + m * fusion->ldr;
      float* out = y + m * ldy;
      for (int64_t j = n0; j < n1; ++j) out[j] = r[j] + prod[j];
    }
  };

  if (a8) {
    if (shared) {
      p.xq = fusion->xq;
      p.xs = fusion->xs;
    } else {
      int8_t* xq = reinterpret_cast<int8_t*>(scratch);
      float* xs = reinterpret_cast<float*>(xq + ((rows * k + 63) / 64) * 64);
      Quantize(c, x, rows, ldx, k, norm ? fusion : nullptr, xq, xs, norm_rows);
      p.xq = xq;
      p.xs = xs;
    }
    c.pool->For(n, whole_ranges ? c.pool->RangePerThread(n, grain) : grain,
                [&](int64_t n0, int64_t n1, int t) { run(uk->matmul_a8, n0, n1, t); });
    return KILN_OK;
  }
  const int64_t grains = (n + grain - 1) / grain;
  c.pool->For(grains, whole_ranges ? c.pool->RangePerThread(grains, 1) : 1, [&](int64_t b0, int64_t b1, int t) {
    run(uk->matmul_f32, b0 * grain, std::min(n, b1 * grain), t);
  });
  return KILN_OK;
}

namespace {

bool MatIn(const OpContext& c, int64_t k) { return c.inputs[0].cols == k && c.output.rows == c.inputs[0].rows; }

int NormWeights(fb::NormKind norm) { return norm == fb::NormKind::Rms ? 1 : norm == fb::NormKind::Layer ? 2 : 0; }

// The fusions of a matmul op: the norm prologue of its parameters, whose weights are
// the op's last, and a residual (input 1). False when the operands do not fit them.
bool FusionOf(const OpContext& c, fb::NormKind norm, float epsilon, MatMulFusion* f, bool input1_residual = true) {
  const int nw = NormWeights(norm);
  if (nw > 0) {
    if (c.num_weights < nw + 1) return false;
    f->norm = norm;
    f->epsilon = epsilon;
    f->norm_weight = &c.weights[c.num_weights - nw];
    f->norm_bias = nw == 2 ? &c.weights[c.num_weights - 1] : nullptr;
    if (f->norm_weight->rows != c.inputs[0].cols) return false;
  }
  if (c.num_inputs > 1 && input1_residual) {
    const ActView& r = c.inputs[1];
    if (r.rows != c.output.rows || r.cols != c.output.cols) return false;
    f->residual = r.f32();
    f->ldr = r.cols;
  }
  return true;
}

}  // namespace

namespace {

// Floats after MatMul's scratch for a q|k|v epilogue's inverse frequencies.
size_t QkvEpilogueFloats(const fb::LinearParams* lp) {
  const fb::QkvEpilogueParams* q = lp != nullptr ? lp->qkv() : nullptr;
  return q != nullptr ? (q->head_dim() / 2 + 15) / 16 * 16 : 0;
}

}  // namespace

// With a q|k|v epilogue (1.15): q and k rotated per thread range, then k and v
// written into the KV cache at the positions (input 1).
kiln_status_t RunLinear(const OpContext& c) {
  const ActView& x = c.inputs[0];
  const fb::LinearParams* lp = c.op->params_as_LinearParams();
  const fb::NormKind norm = lp != nullptr ? lp->norm() : fb::NormKind::None;
  const fb::QkvEpilogueParams* qkv = lp != nullptr ? lp->qkv() : nullptr;
  MatMulFusion f;
  if (!FusionOf(c, norm, lp != nullptr ? lp->norm_epsilon() : 0.0f, &f, qkv == nullptr) ||
      !MatIn(c, c.weights[0].cols) || c.output.cols != c.weights[0].rows)
    return Bad(c, "operands do not fit");
  if (lp != nullptr && lp->has_activation()) f.activation = static_cast<int32_t>(lp->activation());
  const bool has_bias = c.num_weights - NormWeights(norm) > 1;
  const int32_t* kv_rows = nullptr;
  float* inv_freq = c.scratch + (c.scratch_floats - QkvEpilogueFloats(lp));
  const int64_t heads = qkv != nullptr ? qkv->num_heads() : 0, kv_heads = qkv != nullptr ? qkv->num_kv_heads() : 0,
                hd = qkv != nullptr ? qkv->head_dim() : 0;
  if (qkv != nullptr) {
    // Defence in depth behind the verifier.
    if (c.num_inputs < 2 || c.inputs[1].rows < x.rows || c.output.cols != (heads + 2 * kv_heads) * hd ||
        (qkv->rope() != nullptr && (qkv->rope()->num_heads() != heads + kv_heads || qkv->rope()->head_dim() != hd)))
      return Bad(c, "a q|k|v epilogue's operands do not fit");
    const int32_t* pos = c.inputs[1].i32();
    if (qkv->cache_layer() >= 0)
      if (kiln_status_t st = KvRows(c, pos, x.rows, &kv_rows); st != KILN_OK) return st;
    if (const fb::RopeParams* rp = qkv->rope()) {
      InverseFrequencies(rp, inv_freq);
      f.rope_heads = heads + kv_heads;
      f.head_dim = hd;
      f.rope_positions = pos;
      f.rope_inv_freq = inv_freq;
    }
  }
  float* y = c.output.f32();
  if (kiln_status_t st = MatMul(c, 0, x.f32(), x.rows, x.cols, has_bias ? &c.weights[1] : nullptr, y, c.output.cols,
                                c.scratch, &f);
      st != KILN_OK)
    return st;
  if (kv_rows != nullptr && x.rows > 0) {
    KvCache::Exact exact;
    c.kv->Append(qkv->cache_layer(), kv_rows[0], x.rows, y + heads * hd, y + (heads + kv_heads) * hd, c.output.cols,
                 &exact);
  }
  return KILN_OK;
}

size_t ScratchLinear(const fb::Op* op, const WeightView* w, int, int64_t rows, int64_t, int threads) {
  const fb::LinearParams* lp = op->params_as_LinearParams();
  const bool norm = lp != nullptr && lp->norm() != fb::NormKind::None;
  const bool residual = op->inputs() != nullptr && op->inputs()->size() > 1 && (lp == nullptr || lp->qkv() == nullptr);
  return MatMulScratch(FindKernel(op->kernel())->uk, rows, w[0].cols, threads, norm, residual ? w[0].rows : 0) +
         QkvEpilogueFloats(lp);
}

kiln_status_t RunLmHead(const OpContext& c) {
  const ActView& x = c.inputs[0];
  if (!MatIn(c, c.weights[0].cols) || c.output.cols != c.weights[0].rows) return Bad(c, "operands do not fit");
  return MatMul(c, 0, x.f32(), x.rows, x.cols, nullptr, c.output.f32(), c.output.cols, c.scratch);
}

size_t ScratchLmHead(const fb::Op* op, const WeightView* w, int, int64_t rows, int64_t, int threads) {
  return MatMulScratch(FindKernel(op->kernel())->uk, rows, w[0].cols, threads);
}

namespace {

fb::ActivationKind ActivationOf(const fb::Op* op) {
  if (const fb::GatedMlpParams* g = op->params_as_GatedMlpParams()) return g->activation();
  return op->params_as_MoeParams()->activation();
}

size_t GatedMlpScratchFloats(const UkernelSet* uk, int64_t rows, int64_t hidden, int64_t inter, int threads,
                             bool norm = false, bool residual = false, int64_t gate_up_block = 0,
                             bool gather = false);

// down(act(gate(x)) * up(x)) for `rows` rows of x into y, the weights in slots
// gate, gate + stride, gate + 2 * stride; with `fusion`, x normalised first (once,
// for gate and up) and the residual added by the down projection. Scratch: the
// normalised rows, 2 * rows * I floats, then MatMul's.
kiln_status_t GatedMlpRows(const OpContext& c, int gate, int stride, const float* x, int64_t rows, int64_t ldx,
                           float* y, int64_t ldy, float* scratch, const MatMulFusion* fusion = nullptr,
                           int64_t gate_up_block = 0, const int32_t* gather = nullptr) {
  // Fused, weight `gate` holds gate and up (2 I rows) and `gate + 1` is down.
  const int64_t inter = gate_up_block > 0 ? c.weights[gate].rows / 2 : c.weights[gate].rows;
  const int64_t hidden = c.weights[gate].cols;
  const bool norm = fusion != nullptr && fusion->norm != fb::NormKind::None;
  if (norm && gather != nullptr) return Bad(c, "gathered rows take no norm prologue");
  // Gate and up read the same rows: normalise (and quantise) them once.
  const bool gate_a8 = Int8Activations(c, gate), up_a8 = gate_up_block > 0 ? gate_a8 : Int8Activations(c, gate + stride);
  float* xn = scratch;  // the normalised rows (float activations); gathered ones: below
  int8_t* xq = reinterpret_cast<int8_t*>(xn + (norm ? rows * hidden : 0));
  float* xs = reinterpret_cast<float*>(xq + ((rows * hidden + 63) / 64) * 64);
  float* g = reinterpret_cast<float*>(xq) + QuantAreaFloats(rows, hidden);
  float* u = g + rows * inter;
  float* mm = u + (gate_up_block > 0 ? 0 : rows * inter);
  MatMulFusion in, out;
  if (fusion != nullptr) {
    in.norm = fusion->norm;
    in.epsilon = fusion->epsilon;
    in.norm_weight = fusion->norm_weight;
    in.norm_bias = fusion->norm_bias;
    out.residual = fusion->residual;
    out.ldr = fusion->ldr;
    out.scatter_rows = fusion->scatter_rows;
    out.scatter_weights = fusion->scatter_weights;
  }
  // A copy of gathered rows that the scratch has no room for.
  struct Heap {
    float* p = nullptr;
    ~Heap() { std::free(p); }
  } heap;
  if (gate_a8 && up_a8 && c.observer == nullptr) {
    // Gathered (a mixture's tokens) as they are quantised: no copy of the rows.
    Quantize(c, x, rows, ldx, hidden, norm ? &in : nullptr, xq, xs, mm, gather);
    in.xq = xq;
    in.xs = xs;
  } else if (gather != nullptr && !gate_a8 && !up_a8 && c.observer == nullptr && c.uk->matmul_reads_rows) {
    // Float activations: the kernels read the chosen rows where they are.
    in.x_rows = gather;
  } else if (gather != nullptr) {
    // An observer (which sees what is multiplied), a kernel that reads contiguous rows
    // only (hand-written, or generated before schema 1.17), or int8 activations for
    // one of gate and up only: the chosen rows are copied, to the end of the session's
    // scratch when it has room past what this product uses (ScratchMoe reserved it),
    // else to the heap.
    const size_t used = static_cast<size_t>(scratch - c.scratch) +
                        GatedMlpScratchFloats(c.uk, rows, hidden, inter, c.pool->num_threads(), false,
                                              /*residual (scatter)=*/true);
    const size_t copy = static_cast<size_t>(rows * hidden);
    if (used <= c.scratch_floats && c.scratch_floats - used >= copy) {
      xn = c.scratch + (c.scratch_floats - copy);
    } else {
      heap.p = static_cast<float*>(std::malloc(copy * sizeof(float)));
      if (heap.p == nullptr)
        return Fail(c.error, KILN_ERROR_OUT_OF_MEMORY, "op '%s': no memory to copy %lld gathered rows", OpName(c.op),
                    static_cast<long long>(rows));
      xn = heap.p;
    }
    c.pool->For(rows, 16, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r)
        std::memcpy(xn + r * hidden, x + static_cast<int64_t>(gather[r]) * ldx, static_cast<size_t>(hidden) * 4);
    });
    x = xn;
    ldx = hidden;
  } else if (norm && !gate_a8 && !up_a8) {
    if (ldx != hidden) return Bad(c, "a normalised input must be contiguous");
    NormalizeRows(c, in, x, rows, hidden, xn, mm);
    x = xn;
    ldx = hidden;
    in = MatMulFusion();
  }
  if (gate_up_block > 0) {
    // One product of the interleaved gate/up weight, its epilogue act(gate) * up into g.
    in.gated_block = gate_up_block;
    in.activation = static_cast<int32_t>(ActivationOf(c.op));
    if (kiln_status_t st = MatMul(c, gate, x, rows, ldx, nullptr, g, inter, mm, &in); st != KILN_OK) return st;
    return MatMul(c, gate + 1, g, rows, inter, nullptr, y, ldy, mm, &out);
  }
  if (kiln_status_t st = MatMul(c, gate, x, rows, ldx, nullptr, g, inter, mm, &in); st != KILN_OK) return st;
  if (kiln_status_t st = MatMul(c, gate + stride, x, rows, ldx, nullptr, u, inter, mm, &in); st != KILN_OK)
    return st;
  kiln_uk_eltwise_params_t p = {g, u, g, static_cast<int32_t>(ActivationOf(c.op))};
  const UkernelSet* uk = c.uk;
  c.pool->For(rows * inter, 4096, [&](int64_t b, int64_t e, int) { uk->gated_act(&p, b, e); });
  return MatMul(c, gate + 2 * stride, g, rows, inter, nullptr, y, ldy, mm, &out);
}

size_t GatedMlpScratchFloats(const UkernelSet* uk, int64_t rows, int64_t hidden, int64_t inter, int threads,
                             bool norm, bool residual, int64_t gate_up_block, bool gather) {
  // Fused: no up products; the gate/up product's chunks per thread instead.
  const bool fused = gate_up_block > 0;
  return static_cast<size_t>((norm || gather ? rows * hidden : 0) + (fused ? 1 : 2) * rows * inter) +
         QuantAreaFloats(rows, hidden) +
         std::max({MatMulScratch(uk, rows, std::max(hidden, inter), threads, norm, residual ? hidden : 0),
                   fused ? MatMulScratch(uk, rows, hidden, threads, norm) +
                               GatedProductFloats(rows, 2 * inter, gate_up_block, threads)
                         : 0,
                   static_cast<size_t>(threads) * 3 * static_cast<size_t>(hidden)});
}

}  // namespace

kiln_status_t RunGatedMlp(const OpContext& c) {
  const ActView& x = c.inputs[0];
  const fb::GatedMlpParams* gp = c.op->params_as_GatedMlpParams();
  MatMulFusion f;
  if (!FusionOf(c, gp->norm(), gp->norm_epsilon(), &f) || !MatIn(c, c.weights[0].cols) || c.output.cols != x.cols)
    return Bad(c, "operands do not fit");
  return GatedMlpRows(c, 0, 1, x.f32(), x.rows, x.cols, c.output.f32(), c.output.cols, c.scratch, &f,
                      static_cast<int64_t>(gp->gate_up_block()));
}

size_t ScratchGatedMlp(const fb::Op* op, const WeightView* w, int, int64_t rows, int64_t, int threads) {
  const fb::GatedMlpParams* gp = op->params_as_GatedMlpParams();
  const bool fused = gp->gate_up_block() > 0;
  return GatedMlpScratchFloats(FindKernel(op->kernel())->uk, rows, w[0].cols, fused ? w[0].rows / 2 : w[0].rows,
                               threads, gp->norm() != fb::NormKind::None,
                               op->inputs() != nullptr && op->inputs()->size() > 1,
                               static_cast<int64_t>(gp->gate_up_block()));
}

// Mixtral's sparse MoE block: softmax over the router logits, top-k, renormalise,
// and the chosen experts' gated MLPs weighted and summed.
kiln_status_t RunMoe(const OpContext& c) {
  const ActView& x = c.inputs[0];
  const fb::MoeParams* p = c.op->params_as_MoeParams();
  const int64_t rows = x.rows, hidden = x.cols;
  const int64_t experts = static_cast<int64_t>(p->expert_ids()->size());
  const int64_t k = p->top_k();
  if (!MatIn(c, c.weights[0].cols) || c.output.cols != hidden) return Bad(c, "operands do not fit");

  float* logits = c.scratch;                                          // rows * experts
  float* route_w = logits + rows * experts;                           // rows * k
  int32_t* route_e = reinterpret_cast<int32_t*>(route_w + rows * k);  // rows * k
  int32_t* sel_rows = route_e + rows * k;                             // rows
  float* sel_w = reinterpret_cast<float*>(sel_rows + rows);           // rows
  float* mlp = sel_w + rows;                                          // GatedMlpScratchFloats

  if (kiln_status_t st = MatMul(c, 0, x.f32(), rows, hidden, nullptr, logits, experts, mlp); st != KILN_OK) return st;
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
  // The sum starts from the fused residual (input 1; possibly y's own buffer), else 0.
  float* y = c.output.f32();
  if (c.num_inputs > 1) {
    const ActView& r = c.inputs[1];
    if (r.rows != rows || r.cols != hidden) return Bad(c, "operands do not fit");
    // memmove: a damaged memory plan may overlap the two in part.
    if (r.f32() != y) std::memmove(y, r.f32(), static_cast<size_t>(rows * hidden) * 4);
  } else {
    std::memset(y, 0, static_cast<size_t>(rows * hidden) * 4);
  }
  // Each expert's tokens are gathered as its gate/up product quantises them (copied
  // for float activations), and its down product adds routing weight x output to
  // their rows of y in its epilogue, thread by thread: no per-expert copies of the
  // tokens or of the outputs.
  MatMulFusion scatter;
  scatter.scatter_rows = sel_rows;
  scatter.scatter_weights = sel_w;
  for (int64_t e = 0; e < experts; ++e) {
    int64_t n = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < k; ++j)
        if (route_e[r * k + j] == e) {
          sel_rows[n] = static_cast<int32_t>(r);
          sel_w[n] = route_w[r * k + j];
          ++n;
        }
    if (n == 0) continue;
    if (kiln_status_t st = GatedMlpRows(c, static_cast<int>(1 + e), static_cast<int>(experts), x.f32(), n, hidden, y,
                                        hidden, mlp, &scatter, 0, sel_rows);
        st != KILN_OK)
      return st;
  }
  return KILN_OK;
}

size_t ScratchMoe(const fb::Op* op, const WeightView* w, int, int64_t rows, int64_t, int threads) {
  const fb::MoeParams* p = op->params_as_MoeParams();
  const UkernelSet* uk = FindKernel(op->kernel())->uk;
  int64_t experts = static_cast<int64_t>(p->expert_ids()->size()), k = p->top_k();
  int64_t hidden = w[0].cols, inter = w[1].rows;
  // Expert e's gate, up and down are weights 1 + e, 1 + e + experts, 1 + e + 2 experts.
  bool copies = false;
  for (int64_t e = 0; e < experts; ++e)
    copies |= GatherCopies(uk, Int8Activations(op, w, static_cast<int>(1 + e)),
                           Int8Activations(op, w, static_cast<int>(1 + e + experts)));
  return static_cast<size_t>(rows * experts + 2 * rows * k + 2 * rows) +
         std::max(GatedMlpScratchFloats(uk, rows, hidden, inter, threads, false, /*residual (scatter)=*/true, 0,
                                        copies),
                  MatMulScratch(uk, rows, hidden, threads));
}

// Stride-p convolution without padding: patches as rows of (c, ky, kx) values
// (im2col), times the kernel viewed as [D, C * p * p]. With a class token (1.14) row 0
// is the class embedding plus the position table's row 0, and the patches follow.
kiln_status_t RunPatchEmbed(const OpContext& c) {
  const ActView& px = c.inputs[0];  // [C, H * W], extra = W
  const WeightView& w = c.weights[0];
  const fb::PatchEmbedParams* pp = c.op->params_as_PatchEmbedParams();
  const int64_t p = pp->patch_size();
  const bool cls = pp->class_token();
  const int64_t channels = px.rows, width = px.extra;
  if (width < 1 || p < 1) return Bad(c, "operands do not fit");
  const int64_t height = px.cols / width;
  const int64_t patches = (height / p) * (width / p), kdim = channels * p * p, first = cls ? 1 : 0;
  if (w.cols != kdim || c.output.rows != patches + first || c.output.cols != w.rows)
    return Bad(c, "operands do not fit");
  // Weights: the kernel, an optional bias [D], an optional position table [>= rows,
  // D] (kiln-fuse-residual) added in the epilogue, then with a class token its
  // embedding [D].
  const WeightView* bias = nullptr;
  const WeightView* class_embedding = cls ? &c.weights[c.num_weights - 1] : nullptr;
  MatMulFusion f;
  for (int i = 1; i < c.num_weights - first; ++i) {
    const WeightView& v = c.weights[i];
    const bool table = v.shape != nullptr && v.shape->size() == 2;
    if (table && (v.rows < patches + first || v.cols != w.rows)) return Bad(c, "operands do not fit");
    (table ? f.add_rows : bias) = &v;
  }
  if (cls && (f.add_rows == nullptr || class_embedding->rows * class_embedding->cols != w.rows))
    return Bad(c, "a class token needs a position table and an embedding of the hidden size");
  f.add_rows_from = first;
  float* cols = c.scratch;  // patches * kdim
  kiln_uk_im2col_params_t ip = {px.f32(), channels, height, width, p, cols};
  const UkernelSet* uk = c.uk;
  c.pool->For(patches, 1, [&](int64_t b, int64_t e, int) { uk->im2col(&ip, b, e); });
  float* y = c.output.f32();
  if (cls) {
    // Row 0: the class embedding plus the table's row 0, decoded 64 at a time.
    float decoded[64];
    for (int64_t j0 = 0; j0 < w.rows; j0 += 64) {
      const uint64_t len = static_cast<uint64_t>(std::min<int64_t>(64, w.rows - j0));
      format::DecodeFloatElements(class_embedding->spec.id, class_embedding->data, static_cast<uint64_t>(j0), len,
                                  y + j0);
      format::DecodeFloatElements(f.add_rows->spec.id, f.add_rows->data, static_cast<uint64_t>(j0), len, decoded);
      for (uint64_t j = 0; j < len; ++j) y[j0 + j] += decoded[j];
    }
  }
  return MatMul(c, 0, cols, patches, kdim, bias, y + first * c.output.cols, c.output.cols,
                cols + patches * kdim, &f);
}

size_t ScratchPatchEmbed(const fb::Op* op, const WeightView* w, int, int64_t rows, int64_t, int threads) {
  const int64_t kdim = w[0].cols;
  return static_cast<size_t>(rows * kdim) + MatMulScratch(FindKernel(op->kernel())->uk, rows, kdim, threads);
}

kiln_status_t RunEmbedding(const OpContext& c) {
  const ActView& ids = c.inputs[0];
  const WeightView& table = c.weights[0];
  const int64_t placeholder = c.op->params_as_EmbeddingParams()->placeholder_id();
  if (c.output.rows != ids.rows || c.output.cols != table.cols) return Bad(c, "operands do not fit");
  for (int64_t t = 0; t < ids.rows; ++t) {
    int64_t id = ids.i32()[t];
    if (id != placeholder && (id < 0 || id >= table.rows))
      return Fail(c.error, KILN_ERROR_INPUT_TOKENS, "token id %lld at position %lld is outside the vocabulary [0, %lld)",
                  static_cast<long long>(id), static_cast<long long>(t), static_cast<long long>(table.rows));
  }
  kiln_uk_gather_params_t p = {ids.i32(), placeholder, nullptr, c.output.f32(), c.output.cols, table.cols, table.uk()};
  const UkernelSet* uk = c.uk;
  c.pool->For(ids.rows, 16, [&](int64_t b, int64_t e, int) { uk->gather(&p, b, e, nullptr); });
  return KILN_OK;
}

size_t ScratchEmbedding(const fb::Op*, const WeightView*, int, int64_t, int64_t, int) { return 0; }

}  // namespace kiln::rt::ops
