//===- Pipeline.h - the kiln-compile pipeline --------------------*- C++ -*-===//
//
// checkpoint -> import -> [calibrate -> assign precision] -> select kernels ->
// plan memory -> artifact (+ precision report), shared by kiln-compile and tests.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_PIPELINES_PIPELINE_H
#define KILN_COMPILER_PIPELINES_PIPELINE_H

#include <map>
#include <string>
#include <vector>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/Pass/PassManager.h"

namespace kiln {

/// The fusion passes, kiln-fuse-NAME, in pipeline order.
inline constexpr const char* kFusionPasses[] = {"qkv", "rope", "gate-up", "activation", "residual", "norm"};

struct CompileOptions {
  std::string checkpoint;
  std::string target;       // triple; "" = host
  std::string cpuFeatures;  // "+dotprod,+i8mm"
  std::string allowPortableOps;  // regex over op names that may run portable kernels on a CPU target
  std::string kernels = "generated";  // generated | hand-written: which kernels rank first where both qualify
  bool packWeights = true;       // kiln-pack-weights: packed layouts for the kernels that read them
  bool fuse = true;              // kiln-fuse-qkv, -gate-up, -activation, -residual, -norm (--no-fuse: none)
  std::vector<std::string> noFusePasses;  // of kFusionPasses: skipped (--no-fuse-pass)
  std::string promptTemplate;
  std::string chatTemplate;      // hf::ImportOptions::chatTemplate
  int64_t maxPrefillTokens = 512;
  std::string kvCache = "int8";  // kiln-plan-memory kv-cache: f32 | f16 | int8 | int4 (docs/performance.md)

  // Precision (docs/precision.md).
  std::string memoryBudget;               // "1.2GB"; "" = none
  double bitsPerWeight = 0;               // 0 = none
  std::vector<std::string> precision;     // "REGEX=ENCODING" overrides
  std::string calibration;                // JSONL or directory; "" = <checkpoint>/calibration.jsonl
  int calibrationSamples = 0;             // 0 = all
  std::string quantizer = "auto";         // "auto" (gptq under a budget, else rtn), "rtn" or "gptq"
  std::string cacheDir;                   // "" = $XDG_CACHE_HOME/kiln or ~/.cache/kiln
  std::string report;                     // precision report (.json; .svg beside it)

  // Expert pruning (docs/pruning.md): "" none, "auto", or kiln-prune-experts' prune
  // ("2", "0.25", "25%").
  std::string pruneExperts;
  double pruneExpertsMaxLoss = 1.0;       // auto: held-out accuracy points it may lose
  bool mergeExperts = false;              // merge pruned experts into their nearest kept one
  // Visual-token pruning: "" none, else kiln-prune-visual-tokens' keep ("72", "0.5", "50%").
  std::string visualTokens;
  std::string visualTokenScore = "distinct";
  std::string visualTokenPositions = "original";  // or "consecutive": kiln-prune-visual-tokens{positions}
  int threads = 0;
  bool quiet = false;  // --quiet: no progress on a terminal
  /// --emit=static-library: generated kernels go to <output stem>.kernels.a (and its
  /// header, .kernels.h) instead of the artifact's code segment.
  bool kernelLibrary = false;
};

/// The static library and header kiln-compile --emit=static-library writes beside
/// `artifact` (model.kiln -> model.kernels.a, model.kernels.h), and the C name of the
/// kiln_kernel_library_t it defines (kiln_kernels_model).
struct KernelLibraryPaths {
  std::string archive, header, symbol;
};
KernelLibraryPaths kernelLibraryPaths(llvm::StringRef artifact);

/// Whether weights are rounded with GPTQ: --quantizer=gptq, or auto with a memory
/// budget or bits-per-weight target (calibration runs for the budget anyway).
bool usesGptq(const CompileOptions& options);

/// Whether long steps draw their progress: stderr is a terminal and not --quiet.
bool showProgress(const CompileOptions& options);

/// The compiler's version string (recorded in artifacts).
const char* compilerVersion();

/// Adds the lowering passes (kernel selection, memory planning) to `pm`.
void buildLoweringPipeline(mlir::OpPassManager& pm, const CompileOptions& options);

/// Imports the checkpoint, chooses precisions (when a budget or overrides are
/// given) and runs the lowering pipeline. Null on failure (the diagnostics say why).
/// GPTQ's calibration Hessians by weight name, handed from calibration to emission.
using HessianTable = std::map<std::string, std::vector<double>>;

mlir::OwningOpRef<mlir::ModuleOp> importAndLower(mlir::MLIRContext& context,
                                                 const CompileOptions& options, bool lower,
                                                 HessianTable* hessians = nullptr);

/// Writes the artifact of a lowered module to `output` (and the precision report
/// when asked for).
mlir::LogicalResult emitArtifact(mlir::ModuleOp module, const CompileOptions& options,
                                 llvm::StringRef output, const HessianTable* hessians = nullptr);

/// kiln-compile --tiers: compiles the checkpoint once per weight budget (`budgets`,
/// largest first; each as --memory-budget) and writes one artifact holding every tier
/// (formats/tiers.h) to `output`.
mlir::LogicalResult emitTieredArtifact(mlir::MLIRContext& context, const CompileOptions& options,
                                       const std::vector<uint64_t>& budgets, llvm::StringRef output);

} // namespace kiln

#endif // KILN_COMPILER_PIPELINES_PIPELINE_H
