//===- ArtifactWriter.h - kiln IR to a .kiln artifact ------------*- C++ -*-===//
//
// Serialises a planned kiln module (kernels selected, memory planned) into the
// .kiln format of formats/kiln.fbs: the FlatBuffer header, then the weights,
// converted to their storage encoding, in 64-byte-aligned segments. Weight bytes
// are read from the source checkpoint the module references. The output file is
// written atomically: it appears complete or not at all.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_SERIALIZE_ARTIFACTWRITER_H
#define KILN_COMPILER_SERIALIZE_ARTIFACTWRITER_H

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringRef.h"

namespace kiln {

struct ArtifactOptions {
  std::string targetTriple;     // recorded in the metadata
  /// CPU features the artifact requires beyond those of its bound kernels (which
  /// the writer adds itself).
  uint64_t requiredCpuFeatures = 0;
  std::string compilerVersion;
  /// Quantised weights: GPTQ when a calibration Hessian ([cols, cols], row-major) is
  /// given for the weight's name, round-to-nearest otherwise.
  std::map<std::string, std::vector<double>> hessians;
  /// Generated kernels go to a static library instead of the file's code segment
  /// (kiln-compile --emit=static-library): the object, defining the
  /// kiln_kernel_library_t `kernelLibrarySymbol`, is returned in
  /// `kernelLibraryObject`; the artifact names its hash.
  bool kernelLibrary = false;
  std::string kernelLibrarySymbol;
  std::vector<uint8_t>* kernelLibraryObject = nullptr;
  /// Draw the weights' progress (what, how many of how many, time left) on stderr.
  bool progress = false;
};

/// As writeArtifact, into memory (for calibration, which runs the model at compile
/// time). The buffer is the exact file contents.
mlir::LogicalResult writeArtifactToMemory(mlir::ModuleOp module, const ArtifactOptions& options,
                                          std::vector<uint8_t>* out);

/// Writes the artifacts `tiers` (complete, in memory, of one model, largest first;
/// compiled for the weight budgets `budgets`) to `path` as one tiered artifact
/// (formats/tiers.h), atomically and verified as writeArtifact does; diagnostics go
/// to `module`.
mlir::LogicalResult writeTieredArtifact(mlir::ModuleOp module, llvm::StringRef path,
                                        const std::vector<std::vector<uint8_t>>& tiers,
                                        const std::vector<uint64_t>& budgets);

/// Writes `module` to `path`. Errors (unreadable weights, an unsupported
/// tokenizer, I/O) are emitted as diagnostics on the module and leave no file.
mlir::LogicalResult writeArtifact(mlir::ModuleOp module, llvm::StringRef path,
                                  const ArtifactOptions& options);

} // namespace kiln

#endif // KILN_COMPILER_SERIALIZE_ARTIFACTWRITER_H
