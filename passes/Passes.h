//===- Passes.h - Kiln passes ------------------------------------*- C++ -*-===//
#ifndef KILN_PASSES_PASSES_H
#define KILN_PASSES_PASSES_H

#include <cstdint>
#include <memory>
#include <optional>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace kiln {

// A byte size as --memory-budget takes it: "1.2GB", "800MB", "512MiB", "123456";
// nullopt if it is not one (or not positive).
std::optional<uint64_t> parseByteSize(llvm::StringRef text);

// How many experts kiln-prune-experts removes per layer: a count ("2"), a fraction
// of the layer's experts ("0.25") or a percentage ("25%"), rounded down.
struct ExpertPruning {
  int64_t count = -1;     // >= 0: this many
  double fraction = -1;   // in [0, 1): this share
  int64_t of(int64_t experts) const;
};
// nullopt if `text` is none of those.
std::optional<ExpertPruning> parseExpertPruning(llvm::StringRef text);

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

} // namespace kiln

#endif // KILN_PASSES_PASSES_H
