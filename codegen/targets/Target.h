//===- Target.h - compilation targets ----------------------------*- C++ -*-===//
#ifndef KILN_CODEGEN_TARGETS_TARGET_H
#define KILN_CODEGEN_TARGETS_TARGET_H

#include <cstdint>
#include <string>

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace kiln {

enum class TargetArch { X86_64, AArch64 };

/// A target triple and the CPU features the generated code may assume.
struct Target {
  std::string triple;
  TargetArch arch;
  uint64_t features = 0; // kiln::format::CpuFeature bits
  /// Generate kernels for the target (false for `portable`: reference kernels only).
  bool generate = true;
};

/// The build host (x86_64-linux-gnu or aarch64-linux-gnu) with the features every
/// CPU of its architecture has.
Target hostTarget();

/// The CPU features of the machine the compiler runs on (LLVM's host detection:
/// cpuid on x86, the OS on Arm), as kiln::format::CpuFeature bits.
uint64_t detectHostFeatures();

/// Parses a target: "" or "host" (the machine the compiler runs on, with every CPU
/// feature it detects), "portable" (the host's architecture with baseline features
/// only: the reference kernels, any CPU), or a triple ("aarch64-linux-android",
/// "x86_64-linux-gnu", "arm64-apple-ios", ...; baseline features). `features`
/// ("+dotprod,+i8mm", "-avx512f") adds to or removes from those.
llvm::Expected<Target> parseTarget(llvm::StringRef triple, llvm::StringRef features);

/// "neon,dotprod" style list of a feature bit set.
std::string featureList(uint64_t features);

} // namespace kiln

#endif // KILN_CODEGEN_TARGETS_TARGET_H
