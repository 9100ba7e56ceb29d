// The portable reference kernels: one per op kind, every weight encoding the
// runtime reads, every CPU. Generated kernels are checked against these.
#ifndef KILN_RUNTIME_KERNELS_REFERENCE_KERNELS_H_
#define KILN_RUNTIME_KERNELS_REFERENCE_KERNELS_H_

#include "kernels/kernel.h"

namespace kiln::rt::ref {

kiln_status_t Embedding(const KernelArgs& a);
kiln_status_t MergeImageTokens(const KernelArgs& a);
kiln_status_t Linear(const KernelArgs& a);
kiln_status_t Add(const KernelArgs& a);
kiln_status_t Mul(const KernelArgs& a);
kiln_status_t Activation(const KernelArgs& a);
kiln_status_t GatedMlp(const KernelArgs& a);
kiln_status_t Moe(const KernelArgs& a);
kiln_status_t RmsNorm(const KernelArgs& a);
kiln_status_t LayerNorm(const KernelArgs& a);
kiln_status_t Rope(const KernelArgs& a);
kiln_status_t Attention(const KernelArgs& a);
kiln_status_t PatchEmbed(const KernelArgs& a);
kiln_status_t ClassToken(const KernelArgs& a);
kiln_status_t PositionEmbedding(const KernelArgs& a);
kiln_status_t SliceRows(const KernelArgs& a);
kiln_status_t Concat(const KernelArgs& a);
kiln_status_t PixelShuffle(const KernelArgs& a);

size_t LinearScratch(const fb::Op*, const WeightView*, int, int64_t, int64_t, int);
size_t GatedMlpScratch(const fb::Op*, const WeightView*, int, int64_t, int64_t, int);
size_t MoeScratch(const fb::Op*, const WeightView*, int, int64_t, int64_t, int);
size_t NormScratch(const fb::Op*, const WeightView*, int, int64_t, int64_t, int);
size_t RopeScratch(const fb::Op*, const WeightView*, int, int64_t, int64_t, int);
size_t AttentionScratch(const fb::Op*, const WeightView*, int, int64_t, int64_t, int);
size_t PatchEmbedScratch(const fb::Op*, const WeightView*, int, int64_t, int64_t, int);
size_t PositionEmbeddingScratch(const fb::Op*, const WeightView*, int, int64_t, int64_t, int);

}  // namespace kiln::rt::ref

#endif  // KILN_RUNTIME_KERNELS_REFERENCE_KERNELS_H_
