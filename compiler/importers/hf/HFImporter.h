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
  /// Prompt template override ("" = the architecture's default): a built-in chat
  /// template's name (llava, llava-chatml, idefics3) or plain. Kept as an alias of
  /// chatTemplate.
  std::string promptTemplate;
  /// The chat template: "" (the checkpoint's chat_template.jinja, chat_template.json
  /// or tokenizer_config.json "chat_template", else the architecture's built-in), a
  /// built-in name (llava, llava-chatml, idefics3, chatml), "none", or a file (a
  /// .jinja template or a JSON file with "chat_template").
  std::string chatTemplate;
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
