//===- HFImporter.h - Hugging Face checkpoint importer ------------*- C++ -*-===//
//
// Turns a Hugging Face checkpoint directory (config.json, *.safetensors [+ index],
// tokenizer.json, preprocessor_config.json, generation_config.json) into a kiln
// dialect module. Only headers are read: every weight becomes a kiln.weight that
// references its bytes in the source file.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_IMPORTERS_HF_HFIMPORTER_H
#define KILN_COMPILER_IMPORTERS_HF_HFIMPORTER_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/StringRef.h"

namespace kiln::hf {

struct ImportOptions {
  /// Prompt template override ("" = the architecture's default).
  std::string promptTemplate;
};

/// Imports the checkpoint in `directory`. Failures are reported as MLIR
/// diagnostics naming the file, tensor or key, and yield a null module.
mlir::OwningOpRef<mlir::ModuleOp> importCheckpoint(mlir::MLIRContext* context,
                                                   llvm::StringRef directory,
                                                   const ImportOptions& options = {});

/// Registers the dialects the importer creates.
void registerImporterDialects(mlir::MLIRContext* context);

} // namespace kiln::hf

#endif // KILN_COMPILER_IMPORTERS_HF_HFIMPORTER_H
