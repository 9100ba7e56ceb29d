//===- Pipeline.h - the kiln-compile pipeline --------------------*- C++ -*-===//
//
// checkpoint -> import -> select kernels -> plan memory -> artifact, shared by
// kiln-compile and the tests.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_PIPELINES_PIPELINE_H
#define KILN_COMPILER_PIPELINES_PIPELINE_H

#include <string>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/Pass/PassManager.h"

namespace kiln {

struct CompileOptions {
  std::string checkpoint;
  std::string target;       // triple; "" = host
  std::string cpuFeatures;  // "+dotprod,+i8mm"
  std::string promptTemplate;
  int64_t maxPrefillTokens = 512;
};

/// The compiler's version string (recorded in artifacts).
const char* compilerVersion();

/// Adds the lowering passes (kernel selection, memory planning) to `pm`.
void buildLoweringPipeline(mlir::OpPassManager& pm, const CompileOptions& options);

/// Imports the checkpoint and runs the lowering pipeline. Null on failure (the
/// diagnostics say why).
mlir::OwningOpRef<mlir::ModuleOp> importAndLower(mlir::MLIRContext& context,
                                                 const CompileOptions& options, bool lower);

/// Writes the artifact of a lowered module to `output`.
mlir::LogicalResult emitArtifact(mlir::ModuleOp module, const CompileOptions& options,
                                 llvm::StringRef output);

} // namespace kiln

#endif // KILN_COMPILER_PIPELINES_PIPELINE_H
