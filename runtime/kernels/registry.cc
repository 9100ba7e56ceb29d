// The kernel table: every kernel id of formats/kernels.def this runtime implements,
// with the runner of its op kind (runtime/src/ops, one per row of formats/ops.def)
// and its micro-kernels.
#include <cstring>
#include "formats/kiln_format.h"
#include "kernels/kernel.h"
#include "ops/ops.h"
#include "platform/platform.h"

namespace kiln::rt {
namespace {

// The portable reference micro-kernels: every op, every encoding, every CPU.
UkernelSet MakePortable() {
  UkernelSet u;
  u.matmul_f32 = kiln_uk_matmul_bias_f32_f32_wany_1x16_ref_portable;
  u.matmul_a8 = kiln_uk_matmul_bias_f32_qai8dx_wq_1x1_ref_portable;
  u.matmul_scratch = kiln_uk_matmul_scratch_ref;
  u.quant_rows = kiln_uk_lhs_quant_qai8dx_f32_ref_portable;
  u.rms_norm = kiln_uk_rmsnorm_f32_f32_wfloat_ref_portable;
  u.layer_norm = kiln_uk_layernorm_f32_f32_wfloat_ref_portable;
  u.add = kiln_uk_add_f32_f32_f32_ref_portable;
  u.mul = kiln_uk_mul_f32_f32_f32_ref_portable;
  u.act = kiln_uk_act_f32_f32_ref_portable;
  u.gated_act = kiln_uk_gatedact_f32_f32_f32_ref_portable;
  u.rope = kiln_uk_rope_f32_f32_ref_portable;
  u.attention = kiln_uk_attention_f32_f32_f32_ref_portable;
  u.attention_kv = kiln_uk_attention_f32_f32_f32_ref_portable;
  u.gather = kiln_uk_gather_f32_wany_ref_portable;
  u.im2col = kiln_uk_im2col_f32_f32_ref_portable;
  return u;
}
const UkernelSet kPortable = MakePortable();

#if defined(KILN_HAVE_X86_AVX512_KERNELS)
// x86-64 AVX-512: the vectorised matmul family, attention, activations, norms, add
// and multiply; the reference for the rest (rope, gathers, im2col).
UkernelSet MakeX86Avx512() {
  UkernelSet u = MakePortable();
  u.matmul_f32 = kiln_uk_matmul_bias_f32_f32_wany_4x4_x86_avx512;
  u.matmul_reads_rows = false;  // contiguous rows only
  u.matmul_a8 = kiln_uk_matmul_bias_f32_qai8dx_wq_4x4_x86_avx512vnni;
  u.matmul_scratch = kiln_uk_matmul_scratch_x86_avx512;
  u.quant_rows = kiln_uk_lhs_quant_qai8dx_f32_x86_avx512;
  u.attention = kiln_uk_attention_f32_f32_f32_x86_avx512;
  u.attention_kv = kiln_uk_attention_f32_f32_f32_x86_avx512;
  u.attention_kv_supported = kiln_uk_attention_kv_supported_x86_avx512;
  u.act = kiln_uk_act_f32_f32_x86_avx512;
  u.gated_act = kiln_uk_gatedact_f32_f32_f32_x86_avx512;
  u.rms_norm = kiln_uk_rmsnorm_f32_f32_wfloat_x86_avx512;
  u.layer_norm = kiln_uk_layernorm_f32_f32_wfloat_x86_avx512;
  u.add = kiln_uk_add_f32_f32_f32_x86_avx512;
  u.mul = kiln_uk_mul_f32_f32_f32_x86_avx512;
  return u;
}
const UkernelSet kX86Avx512 = MakeX86Avx512();
#define KILN_UKERNELS_x86_avx512 (&kX86Avx512)
#else
// Not built for this architecture: the verifier refuses ops bound to these kernels.
#define KILN_UKERNELS_x86_avx512 nullptr
#endif

// Beside a generated kernel (which replaces one family per op, BindGeneratedUkernel):
// the reference, except the activations' int8 quantisation, which runs the fastest
// implementation on this CPU whose codes and scales are the reference's bit for bit,
// and attention over an encoded KV cache, the fastest built-in one on this CPU.
UkernelSet MakeGeneratedHelpers() {
  UkernelSet u = MakePortable();
#if defined(KILN_HAVE_X86_AVX512_KERNELS)
  // The features that file is compiled for (runtime/CMakeLists.txt).
  constexpr uint64_t kAvx512 = format::kCpuX86Avx2 | format::kCpuX86Fma | format::kCpuX86F16c |
                               format::kCpuX86Avx512F | format::kCpuX86Avx512Bw | format::kCpuX86Avx512Vl |
                               format::kCpuX86Avx512Vnni;
  if ((DetectCpuFeatures() & kAvx512) == kAvx512) {
    u.quant_rows = kiln_uk_lhs_quant_qai8dx_f32_x86_avx512;
    u.attention_kv = kiln_uk_attention_f32_f32_f32_x86_avx512;
    u.attention_kv_supported = kiln_uk_attention_kv_supported_x86_avx512;
  }
#endif
#if defined(KILN_HAVE_ARM_NEON_KERNELS)
  u.quant_rows = kiln_uk_lhs_quant_qai8dx_f32_arm_neon;
#endif
  return u;
}
const UkernelSet kGeneratedHelpers = MakeGeneratedHelpers();

// Micro-kernels by the ISA column of kernels.def.
#define KILN_UKERNELS_portable (&kPortable)
#define KILN_UKERNELS_generated (&kGeneratedHelpers)
#define KILN_GENERATED_portable false
#define KILN_GENERATED_x86_avx512 false
#define KILN_GENERATED_generated true

const KernelEntry kKernels[] = {
#define KILN_KERNEL(id, name, op, encodings, isa, features)                                                 \
  {id, #name, fb::OpKind::op, encodings, features, ops::Run##op, ops::Scratch##op, KILN_UKERNELS_##isa,   \
   KILN_GENERATED_##isa},
#include "formats/kernels.def"
#undef KILN_KERNEL
};

}  // namespace

const KernelEntry* FindKernel(uint32_t id) {
  for (const KernelEntry& k : kKernels)
    if (k.id == id) return &k;
  return nullptr;
}

const char* GeneratedSymbolPrefix(fb::OpKind kind) {
  switch (kind) {
    case fb::OpKind::Rope: return "kiln_uk_rope_";
    case fb::OpKind::RmsNorm: return "kiln_uk_rmsnorm_";
    case fb::OpKind::LayerNorm: return "kiln_uk_layernorm_";
    case fb::OpKind::Add: return "kiln_uk_add_";
    case fb::OpKind::Mul: return "kiln_uk_mul_";
    case fb::OpKind::Embedding:
    case fb::OpKind::PositionEmbedding: return "kiln_uk_gather_";
    case fb::OpKind::Attention:
    case fb::OpKind::QkvAttention: return "kiln_uk_attention_";
    case fb::OpKind::Activation: return "kiln_uk_act_";
    case fb::OpKind::Linear:
    case fb::OpKind::LmHead:
    case fb::OpKind::GatedMlp:
    case fb::OpKind::Moe:
    case fb::OpKind::PatchEmbed: return "kiln_uk_matmul_";
    default: return nullptr;
  }
}

bool BindGeneratedUkernel(fb::OpKind kind, void* fn, UkernelSet* set) {
  switch (kind) {
    case fb::OpKind::Rope:
      set->rope = reinterpret_cast<void (*)(const kiln_uk_rope_params_t*, int64_t, int64_t)>(fn);
      return true;
    case fb::OpKind::RmsNorm:
      set->rms_norm = reinterpret_cast<void (*)(const kiln_uk_norm_params_t*, int64_t, int64_t, float*)>(fn);
      return true;
    case fb::OpKind::LayerNorm:
      set->layer_norm = reinterpret_cast<void (*)(const kiln_uk_norm_params_t*, int64_t, int64_t, float*)>(fn);
      return true;
    case fb::OpKind::Add:
      set->add = reinterpret_cast<void (*)(const kiln_uk_eltwise_params_t*, int64_t, int64_t)>(fn);
      return true;
    case fb::OpKind::Mul:
      set->mul = reinterpret_cast<void (*)(const kiln_uk_eltwise_params_t*, int64_t, int64_t)>(fn);
      return true;
    case fb::OpKind::Embedding:
    case fb::OpKind::PositionEmbedding:
      set->gather = reinterpret_cast<void (*)(const kiln_uk_gather_params_t*, int64_t, int64_t, float*)>(fn);
      return true;
    case fb::OpKind::Attention:
    case fb::OpKind::QkvAttention:
      set->attention =
          reinterpret_cast<void (*)(const kiln_uk_attention_params_t*, int64_t, int64_t, float*)>(fn);
      return true;
    case fb::OpKind::Activation:
      set->act = reinterpret_cast<void (*)(const kiln_uk_eltwise_params_t*, int64_t, int64_t)>(fn);
      return true;
    case fb::OpKind::Linear:
    case fb::OpKind::LmHead:
    case fb::OpKind::GatedMlp:
    case fb::OpKind::Moe:
    case fb::OpKind::PatchEmbed:
      // One function for float and int8 activations (it dispatches on xq).
      set->matmul_f32 = reinterpret_cast<kiln_uk_matmul_fn>(fn);
      set->matmul_a8 = reinterpret_cast<kiln_uk_matmul_fn>(fn);
      return true;
    default:
      return false;
  }
}

namespace {

bool StartsWith(const char* s, const char* prefix) { return std::strncmp(s, prefix, std::strlen(prefix)) == 0; }

}  // namespace

bool BindFusedUkernel(fb::OpKind kind, const char* symbol, void* fn, UkernelSet* set) {
  const bool matmul = kind == fb::OpKind::Linear || kind == fb::OpKind::GatedMlp;
  if (matmul && StartsWith(symbol, "kiln_uk_rmsnorm_")) {
    if (fn) set->rms_norm = reinterpret_cast<void (*)(const kiln_uk_norm_params_t*, int64_t, int64_t, float*)>(fn);
    return true;
  }
  if (matmul && StartsWith(symbol, "kiln_uk_layernorm_")) {
    if (fn) set->layer_norm = reinterpret_cast<void (*)(const kiln_uk_norm_params_t*, int64_t, int64_t, float*)>(fn);
    return true;
  }
  if (kind == fb::OpKind::Linear && StartsWith(symbol, "kiln_uk_act_")) {
    if (fn) set->act = reinterpret_cast<void (*)(const kiln_uk_eltwise_params_t*, int64_t, int64_t)>(fn);
    return true;
  }
  // The rope of a QkvAttention (1.5) or of a q|k|v Linear's epilogue (1.15).
  if ((kind == fb::OpKind::QkvAttention || kind == fb::OpKind::Linear) && StartsWith(symbol, "kiln_uk_rope_")) {
    if (fn) set->rope = reinterpret_cast<void (*)(const kiln_uk_rope_params_t*, int64_t, int64_t)>(fn);
    return true;
  }
  return false;
}

const KernelEntry* AllKernels(size_t* count) {
  *count = sizeof(kKernels) / sizeof(kKernels[0]);
  return kKernels;
}

}  // namespace kiln::rt
