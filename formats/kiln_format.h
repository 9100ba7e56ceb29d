// kiln_format.h — constants of the .kiln artifact shared by the compiler's writer
// and the runtime's reader. Plain C++17, no dependencies.
#ifndef KILN_FORMATS_KILN_FORMAT_H_
#define KILN_FORMATS_KILN_FORMAT_H_

#include <cstdint>

namespace kiln::format {

// Schema version: major * 1000 + minor. A runtime reads every minor version of its
// major (fields it does not know are ignored); a newer major is rejected.
constexpr uint32_t kSchemaMajor = 1;
constexpr uint32_t kSchemaMinor = 0;
constexpr uint32_t kSchemaVersion = kSchemaMajor * 1000 + kSchemaMinor;

// Data segments and every tensor in them start at multiples of this.
constexpr uint64_t kAlignment = 64;

// The FlatBuffer header is size-prefixed: [u32 size][u32 root][ "KILN" ]...
constexpr char kFileIdentifier[4] = {'K', 'I', 'L', 'N'};
constexpr uint64_t kMaxHeaderBytes = 1ull << 30;  // well under the 2 GB FlatBuffer limit

// required_cpu_features bits.
enum CpuFeature : uint64_t {
  kCpuX86Avx2 = 1ull << 0,
  kCpuX86Fma = 1ull << 1,
  kCpuX86Avx512F = 1ull << 2,
  kCpuX86Avx512Bw = 1ull << 3,
  kCpuX86Avx512Vnni = 1ull << 4,
  kCpuArmNeon = 1ull << 8,
  kCpuArmFp16 = 1ull << 9,
  kCpuArmDotProd = 1ull << 10,
  kCpuArmI8mm = 1ull << 11,
  kCpuArmSve = 1ull << 12,
  kCpuArmSme = 1ull << 13,
  kCpuArmSme2 = 1ull << 14,
};
constexpr uint64_t kKnownCpuFeatures = 0x1full | (0x7full << 8);

// Names of the feature bits, for tools and error messages.
inline const char* CpuFeatureName(uint64_t bit) {
  switch (bit) {
    case kCpuX86Avx2: return "avx2";
    case kCpuX86Fma: return "fma";
    case kCpuX86Avx512F: return "avx512f";
    case kCpuX86Avx512Bw: return "avx512bw";
    case kCpuX86Avx512Vnni: return "avx512vnni";
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
#define KILN_KERNEL(id, name, op, encodings) kKernel_##name = id,
#include "formats/kernels.def"
#undef KILN_KERNEL
};

struct KernelInfo {
  uint32_t id;
  const char* name;
  uint16_t op_kind;      // kiln::fb::OpKind value
  uint32_t encodings;    // bit set of accepted weight encodings
};

}  // namespace kiln::format

#endif  // KILN_FORMATS_KILN_FORMAT_H_
