// Helpers shared by the op runners: parallel tiles with per-thread scratch, the
// matrix product every matmul-like op goes through, and operand checks.
#ifndef KILN_RUNTIME_SRC_OPS_COMMON_H_
#define KILN_RUNTIME_SRC_OPS_COMMON_H_

#include <algorithm>
#include <cstring>

#include "kernels/kernel.h"
#include "support/error.h"
#include "thread_pool.h"

namespace kiln::rt::ops {

inline const char* OpName(const fb::Op* op) { return op->name() != nullptr ? op->name()->c_str() : "<unnamed>"; }

inline kiln_status_t Bad(const OpContext& c, const char* what) {
  return Fail(c.error, KILN_ERROR_INTERNAL, "op '%s' (%s): %s", OpName(c.op), fb::EnumNameOpKind(c.op->kind()), what);
}

// Floats of the int8 activation area for `rows` rows of `k` values (int8 codes,
// 64-byte aligned, then f32 scales).
inline size_t QuantAreaFloats(int64_t rows, int64_t k) {
  return static_cast<size_t>(((rows * k + 63) / 64) * 16 + rows + 16);
}

// The fusions of a matmul op (kiln-fuse-norm, kiln-fuse-residual): the input's
// normalisation (its weight, the layer norm's bias) and a residual added to the
// product, which may be the output's own buffer.
struct MatMulFusion {
  fb::NormKind norm = fb::NormKind::None;
  float epsilon = 0;
  const WeightView* norm_weight = nullptr;
  const WeightView* norm_bias = nullptr;
  const float* residual = nullptr;
  int64_t ldr = 0;
  int32_t activation = -1;  // kiln_uk_activation_t applied to the product (before the residual), -1: none
  // Int8 activations already made (normalised, when the norm is set) for another
  // product of the same rows: used instead of quantising again.
  const int8_t* xq = nullptr;
  const float* xs = nullptr;
  // Gate and up in one product (kiln-fuse-gate-up): the weight's rows interleave
  // `gated_block` gate rows and as many up rows; the epilogue writes act(gate) * up
  // (`activation`) into y's first N / 2 columns. 0: none.
  int64_t gated_block = 0;
  // Scatter (a mixture's experts): y[scatter_rows[m]] += scatter_weights[m] x the
  // product's row m, instead of writing row m. Not with a residual or gated epilogue.
  const int32_t* scatter_rows = nullptr;
  const float* scatter_weights = nullptr;
  // A q|k|v product's rotation (LinearParams.qkv, 1.15): the first `rope_heads` heads
  // of `head_dim` channels (q and k) rotated at `rope_positions` with `rope_inv_freq`,
  // each thread its heads right after their product (ranges of whole heads). 0: none.
  int64_t rope_heads = 0;
  int64_t head_dim = 0;
  const int32_t* rope_positions = nullptr;
  const float* rope_inv_freq = nullptr;
  // A float table added to the product, its row add_rows_from + m to row m (a patch
  // embedding's position embedding). Not with another epilogue.
  const WeightView* add_rows = nullptr;
  int64_t add_rows_from = 0;
  // Gathered float activations (a mixture's tokens): row m of x is row x_rows[m],
  // read where it is (kiln_uk_matmul_params_t.x_rows). Float activations only, no norm
  // prologue, no observer, and only for kernels that read them
  // (UkernelSet::matmul_reads_rows); otherwise the caller copies the rows.
  const int32_t* x_rows = nullptr;
};

// A gated product (MatMulFusion::gated_block) runs each thread's channels in chunks
// whose products ([rows, chunk], at most 256 Ki floats = 1 MB unless one grain needs
// more) stay in the thread's buffer for the epilogue: the whole range at once for a
// decode row, chunks of 512 channels for a prefill of 512 rows (each call computes
// the activations' offset shares again: under 1% of its products). `grain`: the
// ranges' granularity; `n`: the product's channels.
inline int64_t GatedChunk(int64_t rows, int64_t n, int64_t grain) {
  const int64_t fit = rows > 0 ? (int64_t{1} << 18) / rows / grain * grain : n;
  return std::max(grain, std::min(fit, (n + grain - 1) / grain * grain));
}
// The least common multiple of positive a and b (std::lcm's instantiation would be
// exported from libkiln.so: libstdc++'s templates have default visibility).
inline int64_t LeastCommonMultiple(int64_t a, int64_t b) {
  int64_t x = a, y = b;
  while (y != 0) {
    const int64_t r = x % y;
    x = y;
    y = r;
  }
  return a / x * b;
}
inline int64_t GatedGrain(int64_t block) { return LeastCommonMultiple(16, 2 * block); }
inline size_t GatedProductFloats(int64_t rows, int64_t n, int64_t block, int threads) {
  return static_cast<size_t>(threads) * static_cast<size_t>(rows * GatedChunk(rows, n, GatedGrain(block)));
}

// Scratch of MatMul for `rows` rows of `k` values on `threads` threads, with the
// fusions: `norm` (a prologue) and a residual epilogue over `residual_n` output
// channels (0: none). A gated epilogue adds GatedProductFloats.
inline size_t MatMulScratch(const UkernelSet* uk, int64_t rows, int64_t k, int threads, bool norm = false,
                            int64_t residual_n = 0) {
  size_t floats = QuantAreaFloats(rows, k) + static_cast<size_t>(threads) * uk->matmul_scratch(k);
  // The normalised rows (float activations) and, per thread, a row and the norm
  // kernel's scratch (int8 activations: normalised and quantised row by row).
  if (norm) floats += static_cast<size_t>(rows * k) + static_cast<size_t>(threads) * 3 * static_cast<size_t>(k);
  // The products before the residual is added ([rows, N], each thread its channels).
  floats += static_cast<size_t>(rows * residual_n);
  return floats;
}

// The rotary embedding's inverse frequencies ([head_dim / 2]), as transformers computes them.
void InverseFrequencies(const fb::RopeParams* p, float* inv_freq);

// The KV-cache rows of positions pos[0 .. rows) (lower by a sliding window's
// evictions), checked: inside the context, mapped, consecutive.
kiln_status_t KvRows(const OpContext& c, const int32_t* pos, int64_t rows, const int32_t** out);

// y[r, :] = x[r, :] W^T (+ bias) for r < rows, through the kernel's matmul
// micro-kernels; `weight` is the op's weight slot (the observer's tensor index and
// whether int8 activations may apply come from it). Parallel over output channels.
// With `fusion`, x is normalised first (row by row as it is quantised, for int8
// activations) and y = residual + act(x W^T (+ bias)), each thread's channels right
// after their product.
kiln_status_t MatMul(const OpContext& c, int slot, const float* x, int64_t rows, int64_t ldx, const WeightView* bias,
                     float* y, int64_t ldy, float* scratch, const MatMulFusion* fusion = nullptr);

}  // namespace kiln::rt::ops

#endif  // KILN_RUNTIME_SRC_OPS_COMMON_H_
