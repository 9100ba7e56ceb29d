// The kernel interface: what every kernel (reference or generated) receives, and
// the table the runtime dispatches through.
#ifndef KILN_RUNTIME_KERNELS_KERNEL_H_
#define KILN_RUNTIME_KERNELS_KERNEL_H_

#include <cstddef>
#include <cstdint>

#include "formats/encoding.h"
#include "formats/contract.h"
#include "formats/kiln_generated.h"
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
  int64_t rows = 0;
  int64_t cols = 0;
  const flatbuffers::Vector<int64_t>* shape = nullptr;
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

struct KernelArgs {
  const fb::Op* op = nullptr;
  const ActView* inputs = nullptr;
  int num_inputs = 0;
  const WeightView* weights = nullptr;
  int num_weights = 0;
  ActView output;
  ThreadPool* pool = nullptr;
  // Scratch for the op (sized by ScratchFloats at session creation), split by the
  // kernel among threads as it sees fit.
  float* scratch = nullptr;
  size_t scratch_floats = 0;
  KvCache* kv = nullptr;
  kiln_error_t* error = nullptr;
};

using KernelFn = kiln_status_t (*)(const KernelArgs& args);

// Scratch an op needs, in floats, for `rows` rows, a KV context of `context`
// positions and `threads` threads.
using ScratchFn = size_t (*)(const fb::Op* op, const WeightView* weights, int num_weights,
                             int64_t rows, int64_t context, int threads);

struct KernelEntry {
  uint32_t id;
  const char* name;
  fb::OpKind op_kind;
  uint32_t encodings;  // accepted weight encodings, bit set of format::EncodingBit
  uint64_t cpu_features;  // format::CpuFeature bits the kernel needs
  KernelFn fn;
  ScratchFn scratch;   // may be null: no scratch
};

// The kernel with this id, or null.
const KernelEntry* FindKernel(uint32_t id);

// Every kernel this runtime has.
const KernelEntry* AllKernels(size_t* count);

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_KERNELS_KERNEL_H_
