//===- KernelRegistry.cpp - kernels the compiler can bind ops to -*- C++ -*-===//
#include "codegen/selection/KernelRegistry.h"

#include "dialects/kiln/KilnOps.h"
#include "llvm/ADT/TypeSwitch.h"

namespace kiln {

llvm::ArrayRef<format::KernelInfo> allKernels() {
  static const format::KernelInfo kKernels[] = {
#define KILN_KERNEL(id, name, op, encodings)                                                      \
  {id, #name, static_cast<uint16_t>(fb::OpKind::op), encodings},
#include "formats/kernels.def"
#undef KILN_KERNEL
  };
  return kKernels;
}

const format::KernelInfo* kernelByName(llvm::StringRef name) {
  for (const format::KernelInfo& k : allKernels())
    if (name == k.name)
      return &k;
  return nullptr;
}

std::optional<fb::OpKind> opKindOf(mlir::Operation* op) {
  return llvm::TypeSwitch<mlir::Operation*, std::optional<fb::OpKind>>(op)
      .Case<EmbeddingOp>([](auto) { return fb::OpKind::Embedding; })
      .Case<MergeImageTokensOp>([](auto) { return fb::OpKind::MergeImageTokens; })
      .Case<LinearOp>([](auto) { return fb::OpKind::Linear; })
      .Case<LmHeadOp>([](auto) { return fb::OpKind::LmHead; })
      .Case<AddOp>([](auto) { return fb::OpKind::Add; })
      .Case<MulOp>([](auto) { return fb::OpKind::Mul; })
      .Case<ActivationOp>([](auto) { return fb::OpKind::Activation; })
      .Case<GatedMlpOp>([](auto) { return fb::OpKind::GatedMlp; })
      .Case<MoeOp>([](auto) { return fb::OpKind::Moe; })
      .Case<RmsNormOp>([](auto) { return fb::OpKind::RmsNorm; })
      .Case<LayerNormOp>([](auto) { return fb::OpKind::LayerNorm; })
      .Case<RopeOp>([](auto) { return fb::OpKind::Rope; })
      .Case<AttentionOp>([](auto) { return fb::OpKind::Attention; })
      .Case<PatchEmbedOp>([](auto) { return fb::OpKind::PatchEmbed; })
      .Case<ClassTokenOp>([](auto) { return fb::OpKind::ClassToken; })
      .Case<PositionEmbeddingOp>([](auto) { return fb::OpKind::PositionEmbedding; })
      .Case<SliceRowsOp>([](auto) { return fb::OpKind::SliceRows; })
      .Case<ConcatOp>([](auto) { return fb::OpKind::Concat; })
      .Case<PixelShuffleOp>([](auto) { return fb::OpKind::PixelShuffle; })
      .Default([](auto) { return std::nullopt; });
}

fb::Encoding toFbEncoding(unsigned encodingKind) {
  switch (static_cast<EncodingKind>(encodingKind)) {
  case EncodingKind::f32: return fb::Encoding::F32;
  case EncodingKind::f16: return fb::Encoding::F16;
  case EncodingKind::bf16: return fb::Encoding::BF16;
  case EncodingKind::fp8_e4m3: return fb::Encoding::FP8_E4M3;
  case EncodingKind::fp8_e5m2: return fb::Encoding::FP8_E5M2;
  case EncodingKind::int8: return fb::Encoding::INT8;
  case EncodingKind::int4: return fb::Encoding::INT4;
  }
  return fb::Encoding::F32;
}

} // namespace kiln
