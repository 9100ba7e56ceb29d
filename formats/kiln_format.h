// kiln_format.h — constants of the .kiln artifact shared by the compiler's writer
// and the runtime's reader. Plain C++17, no dependencies.
#ifndef KILN_FORMATS_KILN_FORMAT_H_
#define KILN_FORMATS_KILN_FORMAT_H_

#include <cstddef>
#include <cstdint>

#include "formats/encoding.h"

namespace kiln::format {

// Schema version: major * 1000 + minor. A runtime reads every minor version of its
// major (fields it does not know are ignored); a newer major is rejected.
constexpr uint32_t kSchemaMajor = 1;
// 1: code segment (Model.code, Op.symbol); 2: packed layouts; 3: int4_p16k8 and
// int8_p16k4 (int4_p4k32 retired); 4: SentencePiece-style tokenizers
// (PreTokenizer.Metaspace and its Tokenizer fields) and the NFC normalizer; 5: fused
// ops (LinearParams, norm prologues, residual inputs, attention over one q|k|v input
// with rope, Op.symbols and Op.fused), which older runtimes refuse by their arity or
// parameter kind; 6: the KV cache's encoding (TextConfig.kv_cache_encoding/_group),
// which older runtimes ignore (their caches stay f32); 7: generated attention kernels
// read paged KV caches (kiln_uk_attention_params_t.kv_blocks), nothing else changed;
// 8: generated attention kernels read quantised caches with keys per channel over
// spans and the span being filled at full precision (kiln_uk_attention_params_t.kv_span);
// 9: gate and up as one interleaved weight (GatedMlpParams.gate_up_block); 10: the
// SelectTokens op (visual-token pruning), which older runtimes refuse by its kind;
// 11: int8_p16k4 and int4_p16k8 also for weights multiplied with float activations
// (W8A16, W4A16) and panel16 for fp8, which older runtimes' verifiers refuse
// (KernelReadsLayout), and the CPU feature avxvnni (older runtimes refuse the bit);
// 12: generated attention kernels without a KV cache use the larger per-thread
// scratch of KILN_UK_ATTENTION_SCRATCH (the head's values packed, the transposed keys'
// rows padded); an older runtime allocates less, so 1.12 artifacts need a 1.12 runtime;
// 13: the chat template as fixed pieces (Model.chat; an older runtime ignores it and
// applies the prompt_template it names); 14: a patch embedding with CLIP's class token
// and position embedding in its epilogue (PatchEmbedParams.class_token), which older
// runtimes refuse by its weights and output rows; 15: RoPE and the KV-cache write in
// the q|k|v product's epilogue (LinearParams.qkv, its positions as input 1;
// AttentionParams.kv_written), which older runtimes refuse (input 1 as a residual);
// 16: the layout int4_p128k4 for the generated SME2 W4A8 matmuls, which older
// runtimes refuse as an unknown layout; 17: generated float matmuls read a mixture's
// tokens where they are (kiln_uk_matmul_params_t.x_rows; older artifacts' kernels get
// the rows copied, as before); 18: visual-token pruning with the kept tokens at their
// original RoPE positions (SelectTokensParams.original_positions; an older runtime
// ignores it and runs them at consecutive positions, which such a model answers worse);
// 19: the layout int4_p16k16 for the generated i8mm W4A8 matmuls, which older
// runtimes refuse as an unknown layout
constexpr uint32_t kSchemaMinor = 19;
constexpr uint32_t kSchemaVersion = kSchemaMajor * 1000 + kSchemaMinor;

// The code segment's checksum: FNV-1a over the object's bytes (64-bit). It guards
// against corruption, not tampering: an artifact is as trusted as its source.
inline uint64_t Checksum64(const uint8_t* data, uint64_t size) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint64_t i = 0; i < size; ++i) h = (h ^ data[i]) * 0x100000001B3ull;
  return h;
}

// Data segments and every tensor in them start at multiples of this.
constexpr uint64_t kAlignment = 64;

// The FlatBuffer header is size-prefixed: [u32 size][u32 root][ "KILN" ]...
constexpr char kFileIdentifier[4] = {'K', 'I', 'L', 'N'};
constexpr uint64_t kMaxHeaderBytes = 1ull << 30;  // well under the 2 GB FlatBuffer limit

// Precision tiers one artifact may hold (kiln-compile --tiers, formats/tiers.h).
constexpr size_t kMaxTiers = 16;

// required_cpu_features bits.
enum CpuFeature : uint64_t {
  kCpuX86Avx2 = 1ull << 0,
  kCpuX86Fma = 1ull << 1,
  kCpuX86Avx512F = 1ull << 2,
  kCpuX86Avx512Bw = 1ull << 3,
  kCpuX86Avx512Vnni = 1ull << 4,
  kCpuX86Avx512Vl = 1ull << 5,
  kCpuX86F16c = 1ull << 6,
  kCpuX86AvxVnni = 1ull << 7,  // VEX-encoded VPDPBUSD on 256-bit vectors (schema 1.11)
  kCpuArmNeon = 1ull << 8,
  kCpuArmFp16 = 1ull << 9,
  kCpuArmDotProd = 1ull << 10,
  kCpuArmI8mm = 1ull << 11,
  kCpuArmSve = 1ull << 12,
  kCpuArmSme = 1ull << 13,
  kCpuArmSme2 = 1ull << 14,
};
constexpr uint64_t kKnownCpuFeatures = 0xffull | (0x7full << 8);

// Names of the feature bits, for tools and error messages.
inline const char* CpuFeatureName(uint64_t bit) {
  switch (bit) {
    case kCpuX86Avx2: return "avx2";
    case kCpuX86Fma: return "fma";
    case kCpuX86Avx512F: return "avx512f";
    case kCpuX86Avx512Bw: return "avx512bw";
    case kCpuX86Avx512Vnni: return "avx512vnni";
    case kCpuX86Avx512Vl: return "avx512vl";
    case kCpuX86F16c: return "f16c";
    case kCpuX86AvxVnni: return "avxvnni";
    case kCpuArmNeon: return "neon";
    case kCpuArmFp16: return "fp16";
    case kCpuArmDotProd: return "dotprod";
    case kCpuArmI8mm: return "i8mm";
    case kCpuArmSve: return "sve";
    case kCpuArmSme: return "sme";
    case kCpuArmSme2: return "sme2";
    default: return "unknown";
  }
}

// Kernel ids (formats/kernels.def).
enum KernelId : uint32_t {
#define KILN_KERNEL(id, name, op, encodings, isa, features) kKernel_##name = id,
#include "formats/kernels.def"
#undef KILN_KERNEL
};

// The executable ops of formats/ops.def.
enum OpKindId : uint16_t {
#define KILN_OP(kind, id, mlir, in_min, in_max, w_min, w_max, params, in_place, quant, act8) kOp##kind = id,
#include "formats/ops.def"
#undef KILN_OP
};

struct OpInfo {
  uint16_t kind;
  const char* name;        // "Linear"
  const char* mlir_name;   // "kiln.linear"
  int inputs_min, inputs_max;
  int weights_min, weights_max;
  int in_place;  // the input the output may be written over (ops.def), -1: none
  uint64_t quantizable_weights;  // bit set of weight slots
  uint64_t int8_act_weights;     // bit set of weight slots
};

// Every row of ops.def, in id order.
inline const OpInfo* AllOps(size_t* count) {
  static const OpInfo kOps[] = {
#define KILN_OP(kind, id, mlir, in_min, in_max, w_min, w_max, params, in_place, quant, act8) \
  {id, #kind, mlir, in_min, in_max, w_min, w_max, in_place - 1, quant, act8},
#include "formats/ops.def"
#undef KILN_OP
  };
  *count = sizeof(kOps) / sizeof(kOps[0]);
  return kOps;
}

// The row of an op kind id, or null.
inline const OpInfo* FindOp(uint32_t kind) {
  size_t n;
  const OpInfo* ops = AllOps(&n);
  return kind < n && ops[kind].kind == kind ? &ops[kind] : nullptr;
}

// Whether weight slot `slot` is in a bit set of slots.
inline bool HasSlot(uint64_t slots, uint32_t slot) { return slot < 64 && ((slots >> slot) & 1) != 0; }

struct KernelInfo {
  uint32_t id;
  const char* name;
  uint16_t op_kind;      // formats/ops.def kind id
  uint32_t encodings;    // bit set of accepted weight encodings (EncodingBit)
  const char* isa;       // "portable", ...
  uint64_t cpu_features; // CpuFeature bits the kernel needs
};

// Every row of kernels.def.
inline const KernelInfo* AllKernels(size_t* count) {
  static const KernelInfo kKernels[] = {
#define KILN_KERNEL(id, name, op, encodings, isa, features) {id, #name, kOp##op, encodings, #isa, features},
#include "formats/kernels.def"
#undef KILN_KERNEL
  };
  *count = sizeof(kKernels) / sizeof(kKernels[0]);
  return kKernels;
}

// The row of a kernel id, or null.
inline const KernelInfo* FindKernelInfo(uint32_t id) {
  size_t n;
  const KernelInfo* k = AllKernels(&n);
  for (size_t i = 0; i < n; ++i)
    if (k[i].id == id) return &k[i];
  return nullptr;
}

// Whether a kernel (generated or not, the weight encodings it accepts, its op kind)
// reads weight slot `slot` of its op stored in `layout` (formats/encoding.h LayoutId):
// row major always; int4_p16k8 and int8_p16k4 only the generated matmuls, for a slot
// the op multiplies with int8 per-token activations or, with float activations, a
// matmul weight slot (int4_p16k8 also the generated embedding gather's table);
// panel16 only the generated matmuls with float activations, for a matmul weight slot;
// int4_p128k4 only the generated matmuls of code that assumes SME2 (`cpu_features`),
// int4_p16k16 only those of code that assumes i8mm, each for a slot the op multiplies
// with int8 per-token activations.
inline bool KernelReadsLayout(uint8_t layout, bool generated, uint32_t kernel_encodings, uint16_t op_kind,
                              uint32_t slot, bool int8_activations, uint64_t cpu_features) {
  if (layout == kLayoutRowMajor) return true;
  const OpInfo* op = FindOp(op_kind);
  if (!generated || op == nullptr) return false;
  // The matmul family's weights (not biases, not a mixture's router): with int8
  // activations the slots that take them, with float ones the quantisable slots.
  const bool matmul = op_kind == kOpLinear || op_kind == kOpLmHead || op_kind == kOpGatedMlp ||
                      op_kind == kOpMoe || op_kind == kOpPatchEmbed;
  const bool slot_reads = int8_activations ? HasSlot(op->int8_act_weights, slot)
                                           : matmul && HasSlot(op->quantizable_weights, slot);
  if (layout == kLayoutInt4P16K8) {
    // Also the generated embedding gather, so that a table tied to a W4A8 or W4A16
    // LM head is packed for the head.
    if (op_kind == kOpEmbedding && slot == 0) return (kernel_encodings & EncodingBit(kEncINT4)) != 0;
    return slot_reads && (kernel_encodings & EncodingBit(kEncINT4)) != 0;
  }
  if (layout == kLayoutInt8P16K4) return slot_reads && (kernel_encodings & EncodingBit(kEncINT8)) != 0;
  if (layout == kLayoutInt4P128K4)
    return int8_activations && slot_reads && (kernel_encodings & EncodingBit(kEncINT4)) != 0 &&
           (cpu_features & kCpuArmSme2) != 0;
  if (layout == kLayoutInt4P16K16)
    return int8_activations && slot_reads && (kernel_encodings & EncodingBit(kEncINT4)) != 0 &&
           (cpu_features & kCpuArmI8mm) != 0;
  // panel16: float and fp8 weights multiplied with float activations.
  return layout == kLayoutPanel16 && matmul && !int8_activations && HasSlot(op->quantizable_weights, slot) &&
         (kernel_encodings & (EncodingBit(kEncF32) | EncodingBit(kEncF16) | EncodingBit(kEncBF16) |
                              EncodingBit(kEncFP8_E4M3) | EncodingBit(kEncFP8_E5M2))) != 0;
}

}  // namespace kiln::format

#endif  // KILN_FORMATS_KILN_FORMAT_H_
