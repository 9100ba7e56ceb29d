// Runs a stage of a verified artifact: every op through its kernel, operands
// resolved to the arena, the weights and the bound stage inputs and outputs.
#include <algorithm>
#include <chrono>

#include "formats/kiln_format.h"
#include "model.h"
#include "support/error.h"

namespace kiln::rt {
namespace {

int64_t RowElements(const fb::Value* v) {
  int64_t n = 1;
  for (uint32_t k = 1; k < v->shape()->size(); ++k) n *= v->shape()->Get(k);
  return n;
}

// Rows an op's output gets from its inputs; static outputs keep their shape, but for
// the visual tokens a session keeps (fewer than planned when it asks so).
int64_t OutputRows(const kiln_session_t* s, const fb::Op* op, const fb::Value* out, const int64_t* rows) {
  if (op->kind() == fb::OpKind::SelectTokens) return std::min<int64_t>(out->shape()->Get(0), s->image_tokens);
  if (out->shape()->Get(0) >= 0) return out->shape()->Get(0);
  uint32_t first = op->inputs()->Get(0);
  return rows[first];
}

const char* OpName(const fb::Op* op) { return op->name() != nullptr ? op->name()->c_str() : "<unnamed>"; }

}  // namespace

kiln_status_t RunStage(kiln_session_t* s, const fb::Stage* stage, const Binding* inputs, int num_inputs,
                       Binding output, kiln_error_t* error) {
  const fb::Model* m = s->model->fb;
  const auto* values = m->values();
  int64_t* rows = s->value_rows.data();
  if (static_cast<int>(stage->inputs()->size()) != num_inputs)
    return Fail(error, KILN_ERROR_INTERNAL, "stage %s bound with %d inputs", fb::EnumNameStageKind(stage->kind()),
                num_inputs);
  void* input_ptr[8] = {};
  for (int i = 0; i < num_inputs; ++i) {
    uint32_t v = stage->inputs()->Get(i);
    const fb::Value* val = values->Get(v);
    if (inputs[i].rows < 0 || inputs[i].rows > val->max_rows())
      return Fail(error, KILN_ERROR_INTERNAL, "stage %s input %d: %lld rows exceed the planned %lld",
                  fb::EnumNameStageKind(stage->kind()), i, static_cast<long long>(inputs[i].rows),
                  static_cast<long long>(val->max_rows()));
    rows[v] = inputs[i].rows;
    input_ptr[i] = inputs[i].data;
  }
  uint32_t out_value = stage->outputs()->Get(0);

  auto view_of = [&](uint32_t v) {
    const fb::Value* val = values->Get(v);
    ActView a;
    a.rows = rows[v];
    a.cols = RowElements(val);
    if (val->shape()->size() == 3) {  // pixels [C, H, W]
      a.extra = val->shape()->Get(2);
    }
    switch (val->kind()) {
      case fb::ValueKind::Arena: a.data = s->arena + val->arena_offset(); break;
      case fb::ValueKind::StageOutput: a.data = output.data; break;
      case fb::ValueKind::StageInput:
        for (int i = 0; i < num_inputs; ++i)
          if (stage->inputs()->Get(i) == v) a.data = input_ptr[i];
        break;
    }
    return a;
  };

  ActView in_views[64];
  const Vec<const UkernelSet*>& generated = s->model->op_uk[static_cast<int>(stage->kind())];
  Vec<OpTime>& times = s->op_time[static_cast<int>(stage->kind())];
  OpTime* timing = s->profile_ops && times.size() == stage->ops()->size() ? times.data() : nullptr;
  for (uint32_t op_index = 0; op_index < stage->ops()->size(); ++op_index) {
    const fb::Op* op = stage->ops()->Get(op_index);
    const KernelEntry* kernel = FindKernel(op->kernel());  // verified at load
    int ni = static_cast<int>(op->inputs()->size());
    for (int i = 0; i < ni; ++i) in_views[i] = view_of(op->inputs()->Get(i));
    const fb::Value* out = values->Get(op->output());
    int64_t out_rows = OutputRows(s, op, out, rows);
    if (out_rows > out->max_rows())
      return Fail(error, KILN_ERROR_INTERNAL, "op '%s': %lld rows exceed the planned %lld", OpName(op),
                  static_cast<long long>(out_rows), static_cast<long long>(out->max_rows()));
    // The stage output is a session buffer of output.rows rows (the verifier gives a
    // dynamic stage output the stage's token rows): never write more.
    if (op->output() == out_value && out_rows > output.rows)
      return Fail(error, KILN_ERROR_INTERNAL, "op '%s': %lld rows exceed the %lld-row stage output buffer",
                  OpName(op), static_cast<long long>(out_rows), static_cast<long long>(output.rows));
    rows[op->output()] = out_rows;
    OpContext ctx;
    ctx.op = op;
    ctx.inputs = in_views;
    ctx.num_inputs = ni;
    int nw = op->weights() ? static_cast<int>(op->weights()->size()) : 0;
    WeightView wv[1 + 3 * 64];
    if (nw > static_cast<int>(sizeof(wv) / sizeof(wv[0])))
      return Fail(error, KILN_ERROR_UNSUPPORTED, "op '%s' has more weights than this runtime supports", OpName(op));
    for (int i = 0; i < nw; ++i) wv[i] = s->model->weights[op->weights()->Get(i)];
    ctx.weights = nw > 0 ? wv : nullptr;
    ctx.num_weights = nw;
    ctx.output = view_of(op->output());
    ctx.pool = s->pool;
    ctx.scratch = s->scratch;
    ctx.scratch_floats = s->scratch_floats;
    ctx.kv = &s->kv;
    ctx.selected_rows = s->image_rows;
    ctx.uk = op_index < generated.size() && generated[op_index] != nullptr ? generated[op_index] : kernel->uk;
    ctx.observer = s->observer;
    ctx.observer_user = s->observer_user;
    ctx.error = error;
    const auto t0 = timing != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    const kiln_status_t st = kernel->run(ctx);
    if (timing != nullptr) {
      timing[op_index].calls += 1;
      timing[op_index].ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    if (st != KILN_OK) return st;
  }
  return KILN_OK;
}

}  // namespace kiln::rt
