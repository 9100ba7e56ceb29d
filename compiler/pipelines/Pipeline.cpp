//===- Pipeline.cpp - the kiln-compile pipeline ------------------*- C++ -*-===//
#include "compiler/pipelines/Pipeline.h"

#include "codegen/targets/Target.h"
#include "compiler/importers/hf/HFImporter.h"
#include "formats/writer/ArtifactWriter.h"
#include "passes/Passes.h"

namespace kiln {

const char* compilerVersion() { return "kiln-compile " KILN_COMPILER_VERSION; }

void buildLoweringPipeline(mlir::OpPassManager& pm, const CompileOptions& options) {
  KilnSelectKernelsOptions select;
  select.target = options.target;
  pm.addPass(createKilnSelectKernels(select));
  KilnPlanMemoryOptions plan;
  plan.maxPrefillTokens = options.maxPrefillTokens;
  pm.addPass(createKilnPlanMemory(plan));
}

mlir::OwningOpRef<mlir::ModuleOp> importAndLower(mlir::MLIRContext& context,
                                                 const CompileOptions& options, bool lower) {
  auto target = parseTarget(options.target, options.cpuFeatures);
  if (!target) {
    mlir::emitError(mlir::UnknownLoc::get(&context)) << llvm::toString(target.takeError());
    return {};
  }
  hf::ImportOptions importOptions;
  importOptions.promptTemplate = options.promptTemplate;
  mlir::OwningOpRef<mlir::ModuleOp> module =
      hf::importCheckpoint(&context, options.checkpoint, importOptions);
  if (!module || !lower)
    return module;
  mlir::PassManager pm(&context);
  buildLoweringPipeline(pm, options);
  if (mlir::failed(pm.run(*module)))
    return {};
  return module;
}

mlir::LogicalResult emitArtifact(mlir::ModuleOp module, const CompileOptions& options,
                                 llvm::StringRef output) {
  auto target = parseTarget(options.target, options.cpuFeatures);
  if (!target)
    return module.emitError() << llvm::toString(target.takeError());
  ArtifactOptions artifact;
  artifact.targetTriple = target->triple;
  // The portable reference kernels need no CPU feature; generated kernels will add
  // what they use.
  artifact.requiredCpuFeatures = 0;
  artifact.compilerVersion = compilerVersion();
  return writeArtifact(module, output, artifact);
}

} // namespace kiln
