//===- Target.cpp - compilation targets --------------------------*- C++ -*-===//
#include "codegen/targets/Target.h"

#include "formats/kiln_format.h"
#include "llvm/ADT/SmallVector.h"
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

llvm::Expected<Target> parseTarget(llvm::StringRef tripleArg, llvm::StringRef features) {
  // No triple: the build host's architecture; features are still checked against it.
  const std::string triple = tripleArg.empty() ? hostTarget().triple : tripleArg.str();
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
                                       "aarch64-linux-android, x86_64-linux-gnu)");
  }
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
                                     "unknown CPU feature '" + item + "' for " + triple);
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
