// Verification of a .kiln artifact before any use: structure (the FlatBuffer
// verifier) and meaning (indices, offsets, sizes, shapes, op arity and parameters,
// kernel ids, CPU features). A verified artifact can be executed without any
// further bounds checks on what the file declares.
#ifndef KILN_RUNTIME_SRC_VERIFY_H_
#define KILN_RUNTIME_SRC_VERIFY_H_

#include <cstddef>
#include <cstdint>

#include "formats/kiln_generated.h"
#include "kiln/kiln.h"
#include "support/allocator.h"

namespace kiln::rt {

// Verifies the artifact in [data, data + size). `data` must be 64-byte aligned.
// `cpu_features` are the kiln::format::CpuFeature bits of this CPU. With
// `for_this_cpu` false, nothing is held against this CPU or this runtime's
// architecture (CPU features, kernels built for another ISA, the code segment's
// machine): the artifact is verified for the device it was built for.
// Scratch memory comes from `allocator`.
// A tiered artifact (formats/tiers.h): the root header describes tier 0 and lists the
// tiers; tier k > 0 is verified with `tier` k, its header read at the offset the root's
// table gives (out of range: KILN_ERROR_INVALID_ARGUMENT).
kiln_status_t VerifyArtifact(const uint8_t* data, size_t size, uint64_t cpu_features,
                             Allocator* allocator, const fb::Model** out_model, kiln_error_t* error,
                             bool for_this_cpu = true, uint32_t tier = 0);

// The tiers the root header of a verified artifact lists (1 when it has no table).
uint32_t TierCount(const fb::Model* root);

// Largest values the runtime accepts, so that no declared size can make it
// allocate absurd amounts of memory or overflow arithmetic.
constexpr int64_t kMaxDim = int64_t{1} << 26;
constexpr int64_t kMaxVocab = int64_t{1} << 22;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxRows = int64_t{1} << 20;
constexpr uint64_t kMaxArenaBytes = uint64_t{1} << 36;

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_SRC_VERIFY_H_
