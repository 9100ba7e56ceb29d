// Shape rules of the ops, one Shape<Kind> per row of formats/ops.def (as the runners
// are one Run<Kind> per row): what the verifier checks of an op's operands, weights,
// output and parameters before any session runs it. The op table declares them, so
// an op without a rule does not link.
#ifndef KILN_RUNTIME_SRC_OPS_SHAPES_H_
#define KILN_RUNTIME_SRC_OPS_SHAPES_H_

#include <cstdint>
#include <cstdio>

#include "formats/kiln_generated.h"
#include "kiln/kiln.h"

namespace kiln::rt {

// Row symbols: which run-time row count a dynamic (-1) first dimension stands for.
// Two dynamic row counts are equal only when they carry the same symbol.
constexpr int kSymStatic = 0;  // d[0] is the static row count
constexpr int kSymTokens = 1;  // the tokens of a prefill chunk (input_ids, positions, hidden states)
constexpr int kSymImage = 2;   // the image-feature rows of a prefill chunk (its image tokens)
constexpr int kSymFirstFree = 3;

// Shape of a value as the verifier reasons about it: dims, -1 = dynamic rows whose
// run-time count is named by `sym`.
struct Dims {
  int rank = 0;
  int64_t d[4] = {0, 0, 0, 0};
  int sym = kSymStatic;
};

// Same number of rows at run time: equal static counts, or the same symbol.
inline bool SameRows(const Dims& a, const Dims& b) { return a.d[0] == b.d[0] && a.sym == b.sym; }

// "12", "tokens", "image rows", "dynamic #3": for messages.
inline const char* RowsName(const Dims& d, char* buf, size_t n) {
  if (d.sym == kSymStatic)
    snprintf(buf, n, "%lld", static_cast<long long>(d.d[0]));
  else if (d.sym == kSymTokens)
    snprintf(buf, n, "tokens");
  else if (d.sym == kSymImage)
    snprintf(buf, n, "image rows");
  else
    snprintf(buf, n, "dynamic #%d", d.sym);
  return buf;
}

inline const char* OpName(const fb::Op* op) { return op->name() != nullptr ? op->name()->c_str() : "<unnamed>"; }

// What a shape rule sees of one op: its operands as the current stage binds them,
// its weights' shapes, its output, the text config a KV-cache binding must match,
// and where failures are reported. The verifier has checked arity, parameter table
// type, value and tensor indices before.
struct ShapeCheck {
  const fb::Model* model;
  const fb::Op* op;
  Dims out;                // the output's dims, rows as the executor gives them
  const Dims* stage_dims;  // per value: dims where this stage reads it
  int ni, nw;
  int64_t layers, kv_heads, head_dim;
  kiln_error_t* error;

  const Dims& in(int i) const { return stage_dims[op->inputs()->Get(i)]; }
  fb::DType indt(int i) const { return model->values()->Get(op->inputs()->Get(i))->dtype(); }
  Dims w(int i) const {
    Dims d;
    const fb::Tensor* t = model->tensors()->Get(op->weights()->Get(i));
    d.rank = static_cast<int>(t->shape()->size());
    for (int k = 0; k < d.rank && k < 4; ++k) d.d[k] = t->shape()->Get(k);
    return d;
  }
  // Same rows at run time (-1 == -1 alone says nothing: prefill's tokens and image
  // rows are different numbers).
  bool rows_eq(const Dims& a, const Dims& b) const { return SameRows(a, b); }
  // Every op but the patch embedding reads 1-D ids or 2-D activations.
  bool mat(const Dims& d) const { return d.rank == 2; }
  bool f32in(int i) const { return indt(i) == fb::DType::F32; }

  kiln_status_t OpBad(const char* what) const;
  kiln_status_t ShapeBad(const char* what) const;
};

namespace ops {

#define KILN_OP(kind, id, mlir, in_min, in_max, w_min, w_max, params, in_place, quant, act8) \
  kiln_status_t Shape##kind(const ShapeCheck& c);
#include "formats/ops.def"
#undef KILN_OP

using ShapeRule = kiln_status_t (*)(const ShapeCheck& c);

// The rule of an op kind of formats/ops.def, or null.
ShapeRule ShapeRuleOf(fb::OpKind kind);

}  // namespace ops
}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SRC_OPS_SHAPES_H_
