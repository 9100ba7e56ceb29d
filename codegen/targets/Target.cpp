//===- Target.cpp - compilation targets --------------------------*- C++ -*-===//
#include "codegen/targets/Target.h"

#include "formats/kiln_format.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/TargetParser/Host.h"
#include "llvm/TargetParser/Triple.h"

namespace kiln {

Target hostTarget() {
  llvm::Triple t(llvm::sys::getDefaultTargetTriple());
  Target host;
  host.arch = t.getArch() == llvm::Triple::aarch64 ? TargetArch::AArch64 : TargetArch::X86_64;
  host.triple = host.arch == TargetArch::AArch64 ? "aarch64-linux-gnu" : "x86_64-linux-gnu";
  // Baseline features every CPU of the architecture has.
  host.features = host.arch == TargetArch::AArch64 ? format::kCpuArmNeon : 0;
  return host;
}

uint64_t detectHostFeatures() {
  Target host = hostTarget();
  uint64_t f = host.features;
  const llvm::StringMap<bool, llvm::MallocAllocator> have = llvm::sys::getHostCPUFeatures();
  auto has = [&](llvm::StringRef name) {
    auto it = have.find(name);
    return it != have.end() && it->second;
  };
  if (host.arch == TargetArch::X86_64) {
    static const std::pair<const char*, uint64_t> kX86[] = {
        {"avx2", format::kCpuX86Avx2},         {"fma", format::kCpuX86Fma},
        {"f16c", format::kCpuX86F16c},         {"avx512f", format::kCpuX86Avx512F},
        {"avx512bw", format::kCpuX86Avx512Bw}, {"avx512vl", format::kCpuX86Avx512Vl},
        {"avx512vnni", format::kCpuX86Avx512Vnni}, {"avxvnni", format::kCpuX86AvxVnni}};
    for (const auto& [name, bit] : kX86)
      if (has(name))
        f |= bit;
  } else {
    static const std::pair<const char*, uint64_t> kArm[] = {
        {"fullfp16", format::kCpuArmFp16}, {"dotprod", format::kCpuArmDotProd}, {"i8mm", format::kCpuArmI8mm},
        {"sve", format::kCpuArmSve},       {"sme", format::kCpuArmSme},         {"sme2", format::kCpuArmSme2}};
    for (const auto& [name, bit] : kArm)
      if (has(name))
        f |= bit;
  }
  return f;
}

namespace {

// The architecture and baseline features of a triple.
llvm::Expected<Target> baseTarget(const std::string& triple) {
  llvm::Triple t(triple);
  Target target;
  target.triple = triple;
  switch (t.getArch()) {
  case llvm::Triple::x86_64:
    target.arch = TargetArch::X86_64;
    break;
  case llvm::Triple::aarch64:
    target.arch = TargetArch::AArch64;
    target.features = format::kCpuArmNeon; // Advanced SIMD is mandatory in ARMv8-A
    break;
  default:
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "unsupported target '" + triple +
                                       "': Kiln targets x86_64 and aarch64 (e.g. "
                                       "aarch64-linux-android, x86_64-linux-gnu) and the presets "
                                       "android-arm64-v8.2-dotprod, android-arm64-v9-i8mm, arm-c1-sme2, apple-m4");
  }
  return target;
}

// Named device classes: a triple and the CPU features every such device has
// (docs/cli.md lists them).
struct Preset {
  const char* name;
  const char* triple;
  uint64_t features;
};
constexpr uint64_t kArmV82Dot = format::kCpuArmNeon | format::kCpuArmFp16 | format::kCpuArmDotProd;
const Preset kPresets[] = {
    // Armv8.2-A with the dot-product extension: Cortex-A55/A75/A76/A77/A78, X1.
    {"android-arm64-v8.2-dotprod", "aarch64-linux-android", kArmV82Dot},
    // Armv9-A: Cortex-A510/A710/A715/X2/X3 and later (SVE2 and int8 matrix multiply).
    {"android-arm64-v9-i8mm", "aarch64-linux-android", kArmV82Dot | format::kCpuArmI8mm | format::kCpuArmSve},
    // Armv9.2-A and later with SME2: Arm C1-Ultra/Pro/Premium/Nano (Lumex), whose
    // streaming vector is 512 bits; the kernels run at any streaming length.
    {"arm-c1-sme2", "aarch64-linux-android",
     kArmV82Dot | format::kCpuArmI8mm | format::kCpuArmSve | format::kCpuArmSme | format::kCpuArmSme2},
    // Apple M4 (iPad Pro, iOS): Armv9.2-A with SME2 (512-bit streaming vectors) but no
    // SVE outside streaming mode; iOS forbids loading code, so its kernels go into a
    // static library (kiln-compile --emit=static-library).
    {"apple-m4", "arm64-apple-ios", kArmV82Dot | format::kCpuArmI8mm | format::kCpuArmSme | format::kCpuArmSme2},
};

} // namespace

llvm::Expected<Target> parseTarget(llvm::StringRef tripleArg, llvm::StringRef features) {
  // "" / "host": this machine with what it detects; "portable": its architecture with
  // baseline features; a preset: its triple and features; a triple: that
  // architecture's baseline features.
  const bool host = tripleArg.empty() || tripleArg == "host";
  const bool portable = tripleArg == "portable";
  const Preset* preset = nullptr;
  for (const Preset& p : kPresets)
    if (tripleArg == p.name)
      preset = &p;
  llvm::Expected<Target> parsed = (host || portable) ? llvm::Expected<Target>(hostTarget())
                                                     : baseTarget(preset ? preset->triple : tripleArg.str());
  if (!parsed)
    return parsed.takeError();
  Target target = *parsed;
  if (preset)
    target.features |= preset->features;
  target.generate = !portable;
  if (host)
    target.features = detectHostFeatures();
  // "+a,-b": add or remove, each checked against the architecture.
  llvm::SmallVector<llvm::StringRef> items;
  features.split(items, ',', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef item : items) {
    item = item.trim();
    bool add = !item.consume_front("-");
    item.consume_front("+");
    uint64_t bit = 0;
    for (uint64_t b = 1; b != 0 && bit == 0; b <<= 1)
      if ((b & format::kKnownCpuFeatures) && item == format::CpuFeatureName(b))
        bit = b;
    bool armBit = bit >= format::kCpuArmNeon;
    if (bit == 0 || armBit != (target.arch == TargetArch::AArch64))
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "unknown CPU feature '" + item + "' for " + target.triple);
    target.features = add ? (target.features | bit) : (target.features & ~bit);
  }
  return target;
}

std::string featureList(uint64_t features) {
  llvm::SmallVector<std::string> names;
  for (uint64_t b = 1; b != 0; b <<= 1)
    if (features & b)
      names.push_back(format::CpuFeatureName(b));
  return llvm::join(names, ",");
}

} // namespace kiln
