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

// Scratch of MatMul for `rows` rows of `k` values on `threads` threads.
inline size_t MatMulScratch(const UkernelSet* uk, int64_t rows, int64_t k, int threads) {
  return QuantAreaFloats(rows, k) + static_cast<size_t>(threads) * uk->matmul_scratch(k);
}

// y[r, :] = x[r, :] W^T (+ bias) for r < rows, through the kernel's matmul
// micro-kernels; `weight` is the op's weight slot (the observer's tensor index and
// whether int8 activations may apply come from it). Parallel over output channels.
kiln_status_t MatMul(const OpContext& c, int slot, const float* x, int64_t rows, int64_t ldx, const WeightView* bias,
                     float* y, int64_t ldy, float* scratch);

}  // namespace kiln::rt::ops

#endif  // KILN_RUNTIME_SRC_OPS_COMMON_H_
