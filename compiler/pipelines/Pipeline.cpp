//===- Pipeline.cpp - the kiln-compile pipeline ------------------*- C++ -*-===//
#include "compiler/pipelines/Pipeline.h"

#include <cstdlib>
#include <limits>
#include <unistd.h>

#include "codegen/targets/Target.h"
#include "compiler/calibration/Calibration.h"
#include "compiler/importers/hf/HFImporter.h"
#include "compiler/pipelines/Report.h"
#include "dialects/kiln/KilnOps.h"
#include "compiler/serialize/ArtifactWriter.h"
#include "passes/Passes.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Object/ArchiveWriter.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/TargetParser/Triple.h"
#include "llvm/Support/Path.h"

namespace kiln {

namespace {

// A memory budget or a bits-per-weight target: the solver chooses the encodings.
bool hasBudget(const CompileOptions& o) { return !o.memoryBudget.empty() || o.bitsPerWeight > 0; }

} // namespace

bool showProgress(const CompileOptions& options) { return !options.quiet && isatty(2) != 0; }

bool usesGptq(const CompileOptions& options) {
  if (options.quantizer == "auto")
    return hasBudget(options);
  return options.quantizer == "gptq";
}

const char* compilerVersion() { return "kiln-compile " KILN_COMPILER_VERSION; }

namespace {

std::string defaultCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/kiln";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/kiln";
  return ".kiln-cache";
}

bool needsQuantizedEncodings(const CompileOptions& o) {
  if (hasBudget(o))
    return true;
  for (const std::string& p : o.precision) {
    llvm::StringRef label = llvm::StringRef(p).rsplit('=').second;
    if (label.starts_with("int") || label.starts_with("fp8"))
      return true;
  }
  return false;
}

// The calibration inputs: --calibration, else the checkpoint's calibration.jsonl
// (`who` needs them), at most --calibration-samples of them.
mlir::FailureOr<std::vector<calib::Sample>> calibrationSet(mlir::ModuleOp module, const CompileOptions& options,
                                                          llvm::StringRef who) {
  std::string path = options.calibration;
  if (path.empty()) {
    llvm::SmallString<256> p(options.checkpoint);
    llvm::sys::path::append(p, "calibration.jsonl");
    if (!llvm::sys::fs::exists(p))
      return module.emitError(who) << " calibration inputs to measure the model on: give --calibration=FILE.jsonl "
                                      "(lines of {\"image\": ..., \"prompt\": ...}) or put calibration.jsonl in "
                                   << options.checkpoint;
    path = std::string(p);
  }
  auto samples = calib::readCalibrationSet(path);
  if (!samples)
    return module.emitError(llvm::toString(samples.takeError()));
  if (options.calibrationSamples > 0 && samples->size() > static_cast<size_t>(options.calibrationSamples))
    samples->resize(static_cast<size_t>(options.calibrationSamples));
  return std::move(*samples);
}

// Measures sensitivities (and Hessians for GPTQ) and attaches them to the weights.
mlir::LogicalResult calibrateModule(mlir::ModuleOp module, const CompileOptions& options,
                                    HessianTable* hessians) {
  bool budget = hasBudget(options);
  bool gptq = usesGptq(options);
  if (!budget && !gptq)
    return mlir::success();
  auto samples =
      calibrationSet(module, options, budget ? "--memory-budget and --bits-per-weight need" : "--quantizer=gptq needs");
  if (mlir::failed(samples))
    return mlir::failure();
  calib::Options co;
  co.samples = std::move(*samples);
  co.candidates = budget ? calib::defaultCandidates() : std::vector<std::string>{};
  co.collectHessians = gptq;
  co.gptq = gptq;
  co.threads = options.threads;
  co.progress = showProgress(options);

  // Sensitivities are cached by what determines them; Hessians are recomputed.
  calib::Result result;
  std::string cacheDir = options.cacheDir.empty() ? defaultCacheDir() : options.cacheDir;
  std::string key;
  bool cached = false;
  if (budget) {
    auto sourceHash = calib::sourceHash(module);
    if (!sourceHash)
      return module.emitError(llvm::toString(sourceHash.takeError()));
    key = calib::cacheKey(*sourceHash, co);
    cached = calib::loadCache(cacheDir, key, &result);
    if (cached)
      module.emitRemark() << "sensitivities from the cache (" << cacheDir << ")";
  }
  if (!cached || gptq) {
    calib::Options run = co;
    if (cached)
      run.candidates.clear();  // only the Hessians are needed
    calib::Result fresh;
    if (mlir::failed(calib::calibrate(module, run, &fresh)))
      return mlir::failure();
    result.hessians = std::move(fresh.hessians);
    if (!cached) {
      result.sensitivity = std::move(fresh.sensitivity);
      result.scoredPositions = fresh.scoredPositions;
      if (budget)
        calib::saveCache(cacheDir, key, result);
    }
  }
  mlir::Builder b(module.getContext());
  module.walk([&](WeightOp w) {
    auto it = result.sensitivity.find(w.getSymName().str());
    if (it == result.sensitivity.end())
      return;
    llvm::SmallVector<mlir::NamedAttribute> attrs;
    for (const auto& [label, kl] : it->second)
      attrs.push_back(b.getNamedAttr(label, b.getF64FloatAttr(kl)));
    w->setAttr("kiln.sensitivity", b.getDictionaryAttr(attrs));
  });
  if (hessians)
    *hessians = std::move(result.hessians);
  return mlir::success();
}

// The mlir-opt options a tool registered (--mlir-print-ir-after-all, --mlir-timing, ...),
// applied to every pass manager of the pipeline; none when the tool registered none.
void applyToolOptions(mlir::PassManager& pm) {
  if (mlir::succeeded(mlir::applyPassManagerCLOptions(pm)))
    mlir::applyDefaultTimingPassManagerCLOptions(pm);
}

} // namespace

void buildLoweringPipeline(mlir::OpPassManager& pm, const CompileOptions& options) {
  if (options.fuse) {
    // The residual before the norm: add(x, mlp(norm(x))) has the residual x apart from
    // the MLP's input until the norm is folded in.
    auto on = [&](llvm::StringRef name) { return !llvm::is_contained(options.noFusePasses, name); };
    if (on("qkv"))
      pm.addPass(createKilnFuseQkv());
    if (on("gate-up"))
      pm.addPass(createKilnFuseGateUp());
    if (on("activation"))
      pm.addPass(createKilnFuseActivation());
    if (on("residual"))
      pm.addPass(createKilnFuseResidual());
    if (on("norm"))
      pm.addPass(createKilnFuseNorm());
    // After the norm: the q|k|v linear is then rebuilt once more, prologue kept.
    if (on("qkv") && on("rope"))
      pm.addPass(createKilnFuseRope());
  }
  KilnSelectKernelsOptions select;
  select.target = options.target;
  select.cpuFeatures = options.cpuFeatures;
  select.allowPortableOps = options.allowPortableOps;
  select.kernels = options.kernels;
  pm.addPass(createKilnSelectKernels(select));
  if (options.packWeights)
    pm.addPass(createKilnPackWeights());
  KilnPlanMemoryOptions plan;
  plan.maxPrefillTokens = options.maxPrefillTokens;
  plan.kvCache = options.kvCache;
  pm.addPass(createKilnPlanMemory(plan));
}

namespace {

// A copy of `module` lowered so that calibration can run it: for this machine
// (whatever the artifact's target), with row-major weights (calibration swaps weights
// in and out of the loaded copy), unfused (every weight its own op, whose inputs
// calibration observes) and with an f32 KV cache (the measurements are the weights'
// alone). Null on failure.
mlir::OwningOpRef<mlir::ModuleOp> lowerForCalibration(mlir::MLIRContext& context, mlir::ModuleOp module,
                                                      const CompileOptions& options) {
  mlir::OwningOpRef<mlir::ModuleOp> lowered = module.clone();
  mlir::PassManager pm(&context);
  applyToolOptions(pm);
  CompileOptions here = options;
  here.target = "";
  here.cpuFeatures = "";
  here.packWeights = false;
  here.fuse = false;
  here.kvCache = "f32";
  buildLoweringPipeline(pm, here);
  if (mlir::failed(pm.run(*lowered)))
    return {};
  return lowered;
}

mlir::LogicalResult runPruneExperts(mlir::MLIRContext& context, mlir::ModuleOp module, llvm::StringRef prune,
                                    bool merge) {
  mlir::PassManager pm(&context);
  applyToolOptions(pm);
  KilnPruneExpertsOptions o;
  o.prune = prune.str();
  o.merge = merge;
  pm.addPass(createKilnPruneExperts(o));
  return pm.run(module);
}

// --prune-experts: routing statistics from calibration on the router weights, then
// kiln-prune-experts; with `auto`, the largest per-layer count whose held-out accuracy
// stays within --prune-experts-max-loss points of the unpruned model's.
mlir::LogicalResult pruneExperts(mlir::MLIRContext& context, mlir::ModuleOp module, const CompileOptions& options) {
  int64_t most = std::numeric_limits<int64_t>::max(), experts = 0;
  module.walk([&](MoeOp m) {
    experts = std::max<int64_t>(experts, static_cast<int64_t>(m.getGate().size()));
    most = std::min<int64_t>(most, static_cast<int64_t>(m.getGate().size()) - static_cast<int64_t>(m.getTopK()));
  });
  auto arch = module->getAttrOfType<mlir::StringAttr>("kiln.architecture");
  if (experts == 0)
    return module.emitError("--prune-experts: ")
           << (arch ? arch.getValue() : "the model") << " has no mixture-of-experts layers";
  const bool automatic = options.pruneExperts == "auto";
  if (!automatic && !parseCountOrShare(options.pruneExperts))
    return module.emitError("--prune-experts must be a count (2), a fraction (0.25), a percentage (25%) or auto, got '")
           << options.pruneExperts << "'";
  auto samples = calibrationSet(module, options, "--prune-experts needs");
  if (mlir::failed(samples))
    return mlir::failure();
  // auto: every other sample is held out of the statistics to score the candidates.
  std::vector<calib::Sample> stats, heldOut;
  for (size_t i = 0; i < samples->size(); ++i)
    (automatic && i % 2 == 1 ? heldOut : stats).push_back((*samples)[i]);
  if (automatic) {
    if (heldOut.empty())
      return module.emitError("--prune-experts=auto needs at least 2 calibration samples (every other one is held "
                              "out to measure the accuracy)");
    for (const calib::Sample& s : heldOut)
      if (s.answer.empty())
        return module.emitError("--prune-experts=auto scores held-out calibration samples by their answers: "
                                "give every line of the calibration set an \"answer\"");
  }

  mlir::OwningOpRef<mlir::ModuleOp> lowered = lowerForCalibration(context, module, options);
  if (!lowered)
    return mlir::failure();
  calib::Options co;
  co.samples = stats;
  co.collectRouting = true;
  co.collectSimilarity = options.mergeExperts;
  co.threads = options.threads;
  co.progress = showProgress(options);
  calib::Result result;
  if (mlir::failed(calib::calibrate(*lowered, co, &result)))
    return mlir::failure();
  mlir::Builder b(&context);
  module.walk([&](WeightOp w) {
    auto it = result.routing.find(w.getSymName().str());
    if (it == result.routing.end())
      return;
    llvm::SmallVector<mlir::NamedAttribute> stats = {
        b.getNamedAttr("tokens", b.getI64IntegerAttr(it->second.tokens)),
        b.getNamedAttr("selected", b.getDenseI64ArrayAttr(it->second.selected)),
        b.getNamedAttr("mass", b.getDenseF64ArrayAttr(it->second.mass))};
    if (!it->second.similarity.empty())
      stats.push_back(b.getNamedAttr("similarity", b.getDenseF64ArrayAttr(it->second.similarity)));
    w->setAttr("kiln.routing", b.getDictionaryAttr(stats));
  });
  if (!automatic)
    return runPruneExperts(context, module, options.pruneExperts, options.mergeExperts);

  calib::Evaluation base;
  if (mlir::failed(calib::evaluateAnswers(*lowered, heldOut, options.threads, &base)))
    return mlir::failure();
  lowered = nullptr;
  int64_t chosen = 0;
  for (int64_t n = most; n >= 1 && chosen == 0; --n) {
    mlir::OwningOpRef<mlir::ModuleOp> candidate = module.clone();
    mlir::OwningOpRef<mlir::ModuleOp> low;
    {
      // The candidates' own remarks would repeat for every count tried.
      mlir::ScopedDiagnosticHandler quiet(&context, [](mlir::Diagnostic& d) {
        return mlir::success(d.getSeverity() == mlir::DiagnosticSeverity::Remark);
      });
      if (mlir::failed(runPruneExperts(context, *candidate, std::to_string(n), options.mergeExperts)))
        return mlir::failure();
      low = lowerForCalibration(context, *candidate, options);
      if (!low)
        return mlir::failure();
    }
    calib::Evaluation e;
    if (mlir::failed(calib::evaluateAnswers(*low, heldOut, options.threads, &e)))
      return mlir::failure();
    bool within = base.accuracy() - e.accuracy() <= options.pruneExpertsMaxLoss;
    module.emitRemark() << llvm::formatv(
        "--prune-experts=auto: {0} of {1} experts per layer pruned: held-out accuracy {2:F1}% ({3}/{4}; unpruned "
        "{5:F1}%), answer NLL {6:F4} (unpruned {7:F4}){8}",
        n, experts, e.accuracy(), e.correct, e.samples, base.accuracy(), e.answerNll, base.answerNll,
        within ? ": chosen" : "");
    if (within)
      chosen = n;
  }
  if (chosen == 0) {
    module.emitRemark() << "--prune-experts=auto: no pruning keeps the held-out accuracy within "
                        << options.pruneExpertsMaxLoss << " points: every expert kept";
    return mlir::success();
  }
  return runPruneExperts(context, module, std::to_string(chosen), options.mergeExperts);
}

} // namespace

mlir::OwningOpRef<mlir::ModuleOp> importAndLower(mlir::MLIRContext& context,
                                                 const CompileOptions& options, bool lower,
                                                 HessianTable* hessians) {
  auto target = parseTarget(options.target, options.cpuFeatures);
  if (!target) {
    mlir::emitError(mlir::UnknownLoc::get(&context)) << llvm::toString(target.takeError());
    return {};
  }
  if (options.quantizer != "auto" && options.quantizer != "rtn" && options.quantizer != "gptq") {
    mlir::emitError(mlir::UnknownLoc::get(&context))
        << "--quantizer must be auto, rtn or gptq, got '" << options.quantizer << "'";
    return {};
  }
  hf::ImportOptions importOptions;
  importOptions.promptTemplate = options.promptTemplate;
  importOptions.chatTemplate = options.chatTemplate;
  mlir::OwningOpRef<mlir::ModuleOp> module =
      hf::importCheckpoint(&context, options.checkpoint, importOptions);
  if (!module || !lower)
    return module;

  if (!options.visualTokens.empty()) {
    mlir::PassManager pm(&context);
    applyToolOptions(pm);
    KilnPruneVisualTokensOptions o;
    o.keep = options.visualTokens;
    o.score = options.visualTokenScore;
    o.positions = options.visualTokenPositions;
    pm.addPass(createKilnPruneVisualTokens(o));
    if (mlir::failed(pm.run(*module)))
      return {};
  }
  if (!options.pruneExperts.empty() && mlir::failed(pruneExperts(context, *module, options)))
    return {};
  bool precision = needsQuantizedEncodings(options) || !options.precision.empty();
  if (precision) {
    // Calibration runs the model here: it needs a lowered copy, which it makes
    // itself, for this machine (whatever the artifact's target) and with row-major
    // weights (calibration swaps weights in and out of the loaded copy).
    {
      mlir::OwningOpRef<mlir::ModuleOp> lowered = lowerForCalibration(context, *module, options);
      if (!lowered)
        return {};
      if (mlir::failed(calibrateModule(*lowered, options, hessians)))
        return {};
      // Carry the measurements over to the module being compiled.
      llvm::StringMap<mlir::Attribute> sens;
      lowered->walk([&](WeightOp w) {
        if (auto a = w->getAttr("kiln.sensitivity"))
          sens[w.getSymName()] = a;
      });
      module->walk([&](WeightOp w) {
        auto it = sens.find(w.getSymName());
        if (it != sens.end())
          w->setAttr("kiln.sensitivity", it->second);
      });
    }
    mlir::PassManager pm(&context);
    applyToolOptions(pm);
    KilnAssignPrecisionOptions assign;
    assign.memoryBudget = options.memoryBudget;
    assign.bitsPerWeight = options.bitsPerWeight;
    assign.precision = options.precision;
    pm.addPass(createKilnAssignPrecision(assign));
    if (mlir::failed(pm.run(*module)))
      return {};
  }
  mlir::PassManager pm(&context);
  applyToolOptions(pm);
  buildLoweringPipeline(pm, options);
  if (mlir::failed(pm.run(*module)))
    return {};
  return module;
}

KernelLibraryPaths kernelLibraryPaths(llvm::StringRef artifact) {
  KernelLibraryPaths p;
  llvm::SmallString<256> base(artifact);
  llvm::sys::path::replace_extension(base, "");
  p.archive = (base + ".kernels.a").str();
  p.header = (base + ".kernels.h").str();
  std::string stem = llvm::sys::path::filename(base).str();
  for (char& c : stem)
    if (!llvm::isAlnum(c))
      c = '_';
  p.symbol = "kiln_kernels_" + stem;
  return p;
}

namespace {

// Writes the static library of generated kernels and the header declaring its
// kiln_kernel_library_t.
mlir::LogicalResult writeKernelLibrary(mlir::ModuleOp module, llvm::StringRef artifact, const Target& target,
                                       const std::vector<uint8_t>& object) {
  KernelLibraryPaths paths = kernelLibraryPaths(artifact);
  llvm::StringRef name = llvm::sys::path::filename(paths.archive);
  std::vector<llvm::NewArchiveMember> members;
  members.emplace_back(llvm::MemoryBufferRef(
      llvm::StringRef(reinterpret_cast<const char*>(object.data()), object.size()), "kernels.o"));
  const bool apple = llvm::Triple(target.triple).isOSBinFormatMachO();
  if (llvm::Error e = llvm::writeArchive(paths.archive, members, llvm::SymtabWritingMode::NormalSymtab,
                                         apple ? llvm::object::Archive::K_DARWIN : llvm::object::Archive::K_GNU,
                                         /*Deterministic=*/true, /*Thin=*/false))
    return module.emitError("writing the kernel library '") << paths.archive << "': " << llvm::toString(std::move(e));
  std::error_code ec;
  llvm::raw_fd_ostream h(paths.header, ec);
  if (ec)
    return module.emitError("writing '") << paths.header << "': " << ec.message();
  const std::string guard = llvm::StringRef(paths.symbol).upper() + "_H_";
  h << "/* The kernels kiln-compile generated for " << llvm::sys::path::filename(artifact) << " (" << target.triple
    << "): link " << name << " and pass\n * &" << paths.symbol
    << " in kiln_model_options_t.kernels when loading that artifact. */\n"
    << "#ifndef " << guard << "\n#define " << guard << "\n\n#include \"kiln/kiln.h\"\n\n"
    << "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n"
    << "extern const kiln_kernel_library_t " << paths.symbol << ";\n\n"
    << "#ifdef __cplusplus\n}\n#endif\n\n#endif\n";
  h.close();
  if (h.has_error())
    return module.emitError("writing '") << paths.header << "': " << h.error().message();
  return mlir::success();
}


} // namespace

mlir::LogicalResult emitArtifact(mlir::ModuleOp module, const CompileOptions& options,
                                 llvm::StringRef output, const HessianTable* hessians) {
  auto target = parseTarget(options.target, options.cpuFeatures);
  if (!target)
    return module.emitError() << llvm::toString(target.takeError());
  ArtifactOptions artifact;
  std::vector<uint8_t> library;
  if (options.kernelLibrary) {
    artifact.kernelLibrary = true;
    artifact.kernelLibrarySymbol = kernelLibraryPaths(output).symbol;
    artifact.kernelLibraryObject = &library;
  }
  artifact.targetTriple = target->triple;
  // The writer derives the required CPU features from the bound kernels.
  artifact.requiredCpuFeatures = 0;
  artifact.compilerVersion = compilerVersion();
  artifact.progress = showProgress(options);
  if (usesGptq(options) && hessians)
    artifact.hessians = *hessians;
  if (mlir::failed(writeArtifact(module, output, artifact)))
    return mlir::failure();
  if (options.kernelLibrary) {
    // The artifact is useless without its library: remove it when that fails.
    mlir::LogicalResult written =
        library.empty() ? module.emitError("--emit=static-library: no op of this model is bound to a generated "
                                           "kernel on ")
                              << target->triple
                        : writeKernelLibrary(module, output, *target, library);
    if (mlir::failed(written)) {
      llvm::sys::fs::remove(output);
      return mlir::failure();
    }
  }
  if (!options.report.empty())
    return writePrecisionReport(module, options, output, options.report);
  return mlir::success();
}

mlir::LogicalResult emitTieredArtifact(mlir::MLIRContext& context, const CompileOptions& options,
                                       const std::vector<uint64_t>& budgets, llvm::StringRef output) {
  auto target = parseTarget(options.target, options.cpuFeatures);
  std::vector<std::vector<uint8_t>> tiers;
  mlir::OwningOpRef<mlir::ModuleOp> first;
  for (size_t k = 0; k < budgets.size(); ++k) {
    CompileOptions tier = options;
    tier.memoryBudget = std::to_string(budgets[k]);
    HessianTable hessians;
    mlir::OwningOpRef<mlir::ModuleOp> module = importAndLower(context, tier, /*lower=*/true, &hessians);
    if (!module)
      return mlir::failure();
    if (!target)
      return module->emitError() << llvm::toString(target.takeError());
    ArtifactOptions artifact;
    artifact.targetTriple = target->triple;
    artifact.compilerVersion = compilerVersion();
    artifact.progress = showProgress(tier);
    if (usesGptq(tier))
      artifact.hessians = hessians;
    std::vector<uint8_t> bytes;
    if (mlir::failed(writeArtifactToMemory(*module, artifact, &bytes)))
      return mlir::failure();
    mlir::emitRemark(module->getLoc()) << "tier " << k << ": weight budget " << budgets[k] << " bytes, "
                                       << bytes.size() << " bytes on its own";
    tiers.push_back(std::move(bytes));
    if (!first)
      first = std::move(module);
  }
  return writeTieredArtifact(*first, output, tiers, budgets);
}

} // namespace kiln
