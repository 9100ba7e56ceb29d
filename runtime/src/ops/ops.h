// Op runners: one Run<Kind> and one Scratch<Kind> per row of formats/ops.def. A
// runner reads the op's parameters, checks its operands (defence in depth behind the
// verifier), splits the work into tile ranges over the thread pool and calls the
// micro-kernels of the kernel the op is bound to.
#ifndef KILN_RUNTIME_SRC_OPS_OPS_H_
#define KILN_RUNTIME_SRC_OPS_OPS_H_

#include "kernels/kernel.h"

namespace kiln::rt::ops {

#define KILN_OP(kind, id, mlir, in_min, in_max, w_min, w_max, params, in_place, quant, act8) \
  kiln_status_t Run##kind(const OpContext& c);                                              \
  size_t Scratch##kind(const fb::Op* op, const WeightView* w, int nw, int64_t rows, int64_t context, int threads);
#include "formats/ops.def"
#undef KILN_OP

}  // namespace kiln::rt::ops

#endif  // KILN_RUNTIME_SRC_OPS_OPS_H_
