// The kernel table of the runtime: for every kernel id of formats/kernels.def, the
// op runner that executes ops bound to it and the micro-kernels (kernels/ukernel.h)
// that runner calls. Runners (runtime/src/ops) read the op's parameters from the
// artifact, check the operands, split the work into tile ranges across the thread
// pool and hand each micro-kernel a plain-C parameter struct.
#ifndef KILN_RUNTIME_KERNELS_KERNEL_H_
#define KILN_RUNTIME_KERNELS_KERNEL_H_

#include <cstddef>
#include <cstdint>

#include "formats/contract.h"
#include "formats/encoding.h"
#include "formats/kiln_generated.h"
#include "kernels/ukernel.h"
#include "kiln/kiln.h"

namespace kiln::rt {

class ThreadPool;
struct KvCache;

// A weight, viewed as [rows, cols] (cols = the product of all but the first dim).
struct WeightView {
  const uint8_t* data = nullptr;
  fb::Encoding encoding = fb::Encoding::F32;
  format::EncodingSpec spec;   // encoding, int4 group size and symmetry
  bool int8_activations = false;  // W8A8 / W4A8: activations quantised per token
  bool overridden = false;        // replaced through kiln_calib_override_weight
  uint8_t layout = 0;             // formats/encoding.h LayoutId
  int64_t rows = 0;
  int64_t cols = 0;
  const flatbuffers::Vector<int64_t>* shape = nullptr;

  kiln_uk_weight_t uk() const {
    kiln_uk_weight_t w;
    w.data = data;
    w.rows = rows;
    w.cols = cols;
    w.encoding = spec.id;
    w.symmetric = spec.symmetric ? 1 : 0;
    w.int8_activations = int8_activations ? 1 : 0;
    w.layout = layout;
    w.group = spec.group;
    return w;
  }
};

// An activation: [rows, cols] (rank-1 values have cols = 1; the pixel input of a
// vision encoder is [channels, height * width] with `extra` = width).
struct ActView {
  void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t extra = 0;
  float* f32() const { return static_cast<float*>(data); }
  int32_t* i32() const { return static_cast<int32_t*>(data); }
};

// The micro-kernels one kernel id runs with (null: the family is not used by the
// kernel's op kind).
struct UkernelSet {
  kiln_uk_matmul_fn matmul_f32 = nullptr;
  kiln_uk_matmul_fn matmul_a8 = nullptr;
  size_t (*matmul_scratch)(int64_t k) = nullptr;  // floats per thread
  void (*quant_rows)(const kiln_uk_quant_rows_params_t*, int64_t, int64_t) = nullptr;
  void (*rms_norm)(const kiln_uk_norm_params_t*, int64_t, int64_t, float*) = nullptr;
  void (*layer_norm)(const kiln_uk_norm_params_t*, int64_t, int64_t, float*) = nullptr;
  void (*add)(const kiln_uk_eltwise_params_t*, int64_t, int64_t) = nullptr;
  void (*mul)(const kiln_uk_eltwise_params_t*, int64_t, int64_t) = nullptr;
  void (*act)(const kiln_uk_eltwise_params_t*, int64_t, int64_t) = nullptr;
  void (*gated_act)(const kiln_uk_eltwise_params_t*, int64_t, int64_t) = nullptr;
  void (*rope)(const kiln_uk_rope_params_t*, int64_t, int64_t) = nullptr;
  void (*attention)(const kiln_uk_attention_params_t*, int64_t, int64_t, float*) = nullptr;
  // Attention over a KV cache `attention` does not read: the fastest built-in kernel
  // on this CPU that reads encoded caches, and whether it reads the given one (null:
  // every valid one; else the reference does).
  void (*attention_kv)(const kiln_uk_attention_params_t*, int64_t, int64_t, float*) = nullptr;
  int (*attention_kv_supported)(const kiln_uk_attention_params_t*) = nullptr;
  // The one KV-cache encoding `attention` reads (a generated kernel: the artifact's),
  // or -1: every one `attention_kv_supported` accepts (the built-in kernels).
  int attention_reads_kv = -1;
  // Whether `attention` reads paged caches (kv_blocks): the built-in kernels and the
  // generated ones of schema 1.7 and later.
  bool attention_reads_blocks = true;
  // Whether a generated `attention` reads quantised caches with spans (kv_span > 0)
  // rather than without: those of schema 1.8 and later. The built-in kernels read both.
  bool attention_reads_spans = false;
  // Whether `matmul_f32` reads gathered rows (kiln_uk_matmul_params_t.x_rows): the
  // reference and the generated kernels of schema 1.17 and later.
  bool matmul_reads_rows = true;
  void (*gather)(const kiln_uk_gather_params_t*, int64_t, int64_t, float*) = nullptr;
  void (*im2col)(const kiln_uk_im2col_params_t*, int64_t, int64_t) = nullptr;
};

// Called with the exact activations a matrix product multiplies by weight `tensor`
// ([rows, k], row stride ld), before it runs: the calibration seam
// (kiln/kiln_calibration.h). Float activations only.
using WeightInputObserver = void (*)(void* user, uint32_t tensor, const float* x, int64_t rows, int64_t ld,
                                     int64_t k);

// What an op runner receives.
struct OpContext {
  const fb::Op* op = nullptr;
  const ActView* inputs = nullptr;
  int num_inputs = 0;
  const WeightView* weights = nullptr;
  int num_weights = 0;
  ActView output;
  ThreadPool* pool = nullptr;
  // Scratch for the op, sized by the runner's scratch function at session creation.
  float* scratch = nullptr;
  size_t scratch_floats = 0;
  KvCache* kv = nullptr;
  // SelectTokens: receives the kept rows' indices, ascending (the session's, for the
  // positions of visual tokens kept at their original ones); may be null.
  int32_t* selected_rows = nullptr;
  const UkernelSet* uk = nullptr;
  WeightInputObserver observer = nullptr;
  void* observer_user = nullptr;
  kiln_error_t* error = nullptr;
};

using OpRunner = kiln_status_t (*)(const OpContext& c);

// Scratch an op needs, in floats, for `rows` rows, a KV context of `context`
// positions and `threads` threads.
using ScratchFn = size_t (*)(const fb::Op* op, const WeightView* weights, int num_weights, int64_t rows,
                             int64_t context, int threads);

struct KernelEntry {
  uint32_t id;
  const char* name;
  fb::OpKind op_kind;
  uint32_t encodings;     // accepted weight encodings, bit set of format::EncodingBit
  uint64_t cpu_features;  // format::CpuFeature bits the kernel needs
  OpRunner run;
  ScratchFn scratch;
  const UkernelSet* uk;
  // isa "generated": the op's runner calls the function the op names in the
  // artifact's code segment (BindGeneratedUkernel), with `uk` for the rest.
  bool generated;
};

// Puts generated function `fn` into the family of `set` that ops of `kind` run
// (RoPE: set->rope). False when the kind has no generated family.
bool BindGeneratedUkernel(fb::OpKind kind, void* fn, UkernelSet* set);

// Puts a further generated function of a fused op (Op.symbols) into the family its
// name's prefix names (kiln_uk_rmsnorm_ -> rms_norm, ...), when ops of `kind` may
// call that family (a norm prologue of Linear and GatedMlp, a Linear's activation;
// the rope of QkvAttention). False otherwise. With `fn` null only checks.
bool BindFusedUkernel(fb::OpKind kind, const char* symbol, void* fn, UkernelSet* set);
// The name prefix of the generated functions an op kind calls (the compiler names each
// function after its family, kiln_uk_<family>_...: one calling convention each), or
// null for kinds without generated kernels. The verifier checks an op's symbol against
// it, so that a corrupt header cannot bind a function of another signature.
const char* GeneratedSymbolPrefix(fb::OpKind kind);

// The kernel with this id, or null.
const KernelEntry* FindKernel(uint32_t id);

// Every kernel this runtime has.
const KernelEntry* AllKernels(size_t* count);

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_KERNELS_KERNEL_H_
