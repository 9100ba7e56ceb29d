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

// A number of things out of a total, as the pruning passes take it: a count ("2"), a
// fraction of the total ("0.25") or a percentage ("25%"), rounded down.
struct CountOrShare {
  int64_t count = -1;     // >= 0: this many
  double fraction = -1;   // in [0, 1]: this share
  int64_t of(int64_t total) const;
};
// nullopt if `text` is none of those.
std::optional<CountOrShare> parseCountOrShare(llvm::StringRef text);

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

} // namespace kiln

#endif // KILN_PASSES_PASSES_H
