// The kernel table: every kernel id of formats/kernels.def this runtime implements.
#include "formats/kiln_format.h"
#include "kernels/kernel.h"
#include "kernels/reference/kernels.h"

namespace kiln::rt {
namespace {

// Implementation of each kernel named in kernels.def.
#define KILN_IMPL_ref_embedding ref::Embedding, nullptr
#define KILN_IMPL_ref_merge_image_tokens ref::MergeImageTokens, nullptr
#define KILN_IMPL_ref_linear ref::Linear, ref::LinearScratch
#define KILN_IMPL_ref_lm_head ref::Linear, ref::LinearScratch
#define KILN_IMPL_ref_add ref::Add, nullptr
#define KILN_IMPL_ref_mul ref::Mul, nullptr
#define KILN_IMPL_ref_activation ref::Activation, nullptr
#define KILN_IMPL_ref_gated_mlp ref::GatedMlp, ref::GatedMlpScratch
#define KILN_IMPL_ref_moe ref::Moe, ref::MoeScratch
#define KILN_IMPL_ref_rms_norm ref::RmsNorm, ref::NormScratch
#define KILN_IMPL_ref_layer_norm ref::LayerNorm, ref::NormScratch
#define KILN_IMPL_ref_rope ref::Rope, ref::RopeScratch
#define KILN_IMPL_ref_attention ref::Attention, ref::AttentionScratch
#define KILN_IMPL_ref_patch_embed ref::PatchEmbed, ref::PatchEmbedScratch
#define KILN_IMPL_ref_class_token ref::ClassToken, nullptr
#define KILN_IMPL_ref_position_embedding ref::PositionEmbedding, ref::PositionEmbeddingScratch
#define KILN_IMPL_ref_slice_rows ref::SliceRows, nullptr
#define KILN_IMPL_ref_concat ref::Concat, nullptr
#define KILN_IMPL_ref_pixel_shuffle ref::PixelShuffle, nullptr

const KernelEntry kKernels[] = {
#define KILN_KERNEL(id, name, op, encodings, isa, features) \
  {id, #name, fb::OpKind::op, encodings, features, KILN_IMPL_##name},
#include "formats/kernels.def"
#undef KILN_KERNEL
};

}  // namespace

const KernelEntry* FindKernel(uint32_t id) {
  for (const KernelEntry& k : kKernels)
    if (k.id == id) return &k;
  return nullptr;
}

const KernelEntry* AllKernels(size_t* count) {
  *count = sizeof(kKernels) / sizeof(kKernels[0]);
  return kKernels;
}

}  // namespace kiln::rt
