//===- kiln-compile.cpp - Kiln compiler driver -------------------*- C++ -*-===//
//
//   kiln-compile CHECKPOINT_DIR -o model.kiln [--target TRIPLE]   the artifact
//   kiln-compile CHECKPOINT_DIR --emit=ir                         imported kiln IR
//   kiln-compile CHECKPOINT_DIR --emit=planned-ir                 after lowering
//   kiln-compile CHECKPOINT_DIR -o model.kiln --emit=static-library  + model.kernels.a/.h
//   kiln-compile CHECKPOINT_DIR --emit=kernels-mlir|kernels-llvm|kernels-asm
//                                                                 the generated kernels
//   kiln-compile --from-ir PLANNED.mlir -o model.kiln             the artifact of lowered IR
//
//===----------------------------------------------------------------------===//

#include "mlir/Pass/PassManager.h"
#include "mlir/Support/Timing.h"
#include <algorithm>
#include <functional>
#include <initializer_list>
#include <memory>

#include "codegen/generators/KernelGenerator.h"
#include "compiler/importers/hf/ChatTemplate.h"
#include "compiler/pipelines/Pipeline.h"
#include "formats/tiers.h"
#include "passes/Passes.h"
#include "dialects/kiln/KilnDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include <cerrno>
#include <cstring>
#include <sys/stat.h>
#include <unistd.h>

#include "llvm/ADT/SmallString.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

namespace cl = llvm::cl;

static cl::OptionCategory kilnCategory("kiln-compile options");

static cl::opt<std::string> checkpointDir(cl::Positional,
                                          cl::desc("<checkpoint directory, its config.json, or a lowered .mlir module>"),
                                          cl::Optional, cl::cat(kilnCategory));
static cl::opt<std::string> fromIr(
    "from-ir",
    cl::desc("Write the artifact of kiln IR that is already lowered (as --emit=planned-ir prints it, "
             "possibly transformed by kiln-opt) instead of compiling a checkpoint; takes -o, --target "
             "and --cpu-features (those the IR was lowered for) and --report. Ops are named by their "
             "locations: emit the IR with --mlir-print-debuginfo to keep them"),
    cl::value_desc("file.mlir"), cl::init(""), cl::cat(kilnCategory));
static cl::opt<std::string> outputPath("o", cl::desc("Output artifact (.kiln), or the file for --emit=ir, planned-ir, kernels-* (default: stdout)"),
                                       cl::value_desc("file"), cl::init(""),
                                       cl::cat(kilnCategory));

enum class EmitKind { Artifact, StaticLibrary, IR, PlannedIR, KernelsMLIR, KernelsLLVM, KernelsAsm };
static cl::opt<EmitKind> emit(
    "emit", cl::desc("What to produce"),
    cl::values(clEnumValN(EmitKind::Artifact, "artifact", "the .kiln artifact (needs -o)"),
               clEnumValN(EmitKind::StaticLibrary, "static-library",
                          "the artifact (-o model.kiln) with its generated kernels in a static library beside it "
                          "(model.kernels.a, model.kernels.h) instead of in the file: for platforms that do not "
                          "let apps load code (iOS)"),
               clEnumValN(EmitKind::IR, "ir", "the imported kiln IR"),
               clEnumValN(EmitKind::PlannedIR, "planned-ir",
                          "kiln IR after kernel selection and memory planning"),
               clEnumValN(EmitKind::KernelsMLIR, "kernels-mlir",
                          "the generated kernels in MLIR (scf, vector, arith on LLVM pointers)"),
               clEnumValN(EmitKind::KernelsLLVM, "kernels-llvm", "the generated kernels in optimised LLVM IR"),
               clEnumValN(EmitKind::KernelsAsm, "kernels-asm", "the generated kernels' assembly")),
    cl::init(EmitKind::Artifact), cl::cat(kilnCategory));

static cl::opt<std::string> target("target",
                                   cl::desc("host (default: this machine and the CPU features it "
                                            "detects), portable (reference kernels, any CPU), or a "
                                            "triple, e.g. aarch64-linux-android"),
                                   cl::init(""), cl::cat(kilnCategory));
static cl::opt<std::string> cpuFeatures("cpu-features",
                                        cl::desc("CPU features to assume, e.g. +dotprod,+i8mm"),
                                        cl::init(""), cl::cat(kilnCategory));
static cl::opt<std::string> allowPortableOps(
    "allow-portable-ops",
    cl::desc("Ops (a regex matching the whole op name, e.g. 'model.layers.*mlp') that may run a portable "
             "reference kernel on a CPU target where no generated or hand-written kernel reads them"),
    cl::init(""), cl::cat(kilnCategory));
static cl::opt<std::string> kernelsChoice(
    "kernels",
    cl::desc("generated (default): kernels generated for the model wherever the generator serves the op "
             "(hand-written ones only where it cannot, with a remark); hand-written: hand-written kernels for "
             "the target's CPU features where they exist, generated ones elsewhere (for comparisons)"),
    cl::init("generated"), cl::cat(kilnCategory));
static cl::opt<bool> noPackWeights(
    "no-pack-weights",
    cl::desc("Store every weight row major, also those the bound kernels read packed (larger inner loops; for "
             "comparisons)"),
    cl::init(false), cl::cat(kilnCategory));
static cl::opt<bool> noFuse(
    "no-fuse",
    cl::desc("Run no fusion pass (kiln-fuse-qkv, -rope, -gate-up, -activation, -residual, -norm): one kernel per "
             "imported op, for comparisons and debugging"),
    cl::init(false), cl::cat(kilnCategory));
static cl::list<std::string> noFusePass(
    "no-fuse-pass",
    cl::desc("Skip one fusion pass (qkv, rope, gate-up, activation, residual or norm; repeatable or comma-separated; "
             "rope needs qkv), "
             "to measure what it brings"),
    cl::CommaSeparated, cl::cat(kilnCategory));
static cl::opt<int64_t> maxPrefillTokens(
    "max-prefill-tokens", cl::desc("Tokens one prefill step processes (longer prompts are chunked)"),
    cl::init(512), cl::cat(kilnCategory));
static cl::opt<std::string> kvCache(
    "kv-cache",
    cl::desc("Encoding of the KV cache: int8 (default), int4, f16 or f32 (exact). int8 and int4: values one scale "
             "per 32 channels of a position, keys one per channel over 32 positions, the 32 being filled kept "
             "exact; a session may choose another (kiln-run --kv-cache)"),
    cl::init("int8"), cl::cat(kilnCategory));
static cl::opt<bool> quiet("quiet",
                           cl::desc("Draw no progress (calibration, sensitivity, weights: what, how many of how "
                                    "many, time left), which a terminal otherwise shows"),
                           cl::init(false), cl::cat(kilnCategory));
static cl::opt<bool> showRemarks("remarks",
                                 cl::desc("Print the decisions the compiler makes (remarks)"),
                                 cl::init(false), cl::cat(kilnCategory));
static cl::opt<std::string> memoryBudget(
    "memory-budget", cl::desc("Bytes the weights may take: 1.2GB, 800MB, 512MiB (chooses a precision per weight)"),
    cl::init(""), cl::cat(kilnCategory));
static cl::opt<std::string> tiersOption(
    "tiers", cl::desc("Weight budgets of several precision tiers in one artifact, e.g. 1.2GB,800MB,500MB: the "
                      "runtime loads the largest that fits its memory budget (or the one asked for)"),
    cl::init(""), cl::cat(kilnCategory));
static cl::opt<double> bitsPerWeight("bits-per-weight",
                                     cl::desc("Average bits per weight, scales included (instead of a budget)"),
                                     cl::init(0.0), cl::cat(kilnCategory));
static cl::list<std::string> precisionOverrides(
    "precision", cl::desc("REGEX=ENCODING: the encoding of every weight whose whole name the regex matches "
                          "(not a search; repeatable, the first matching one decides), e.g. "
                          "'vision_tower.*=bf16' or '.*mlp.*=int4_g32'; one that decides no weight is warned about"),
    cl::cat(kilnCategory));
static cl::opt<std::string> calibration(
    "calibration", cl::desc("Calibration inputs: a JSONL file of {\"image\", \"prompt\"} lines or a directory "
                            "holding one (default: the checkpoint's calibration.jsonl)"),
    cl::init(""), cl::cat(kilnCategory));
static cl::opt<int> calibrationSamples("calibration-samples", cl::desc("Use at most N calibration samples"),
                                       cl::init(0), cl::cat(kilnCategory));
static cl::opt<std::string> quantizer("quantizer",
                                      cl::desc("Rounding of quantised weights: rtn (round to nearest), gptq "
                                               "(error-compensated with the calibration Hessians) or auto (gptq "
                                               "with --memory-budget or --bits-per-weight, else rtn)"),
                                      cl::init("auto"), cl::cat(kilnCategory));
static cl::opt<std::string> cacheDir("cache-dir", cl::desc("Where measured sensitivities are cached"),
                                     cl::init(""), cl::cat(kilnCategory));
static cl::opt<std::string> report("report",
                                   cl::desc("Write the precision report here (.json, and a .svg chart beside it)"),
                                   cl::init(""), cl::cat(kilnCategory));
static cl::opt<std::string> pruneExperts(
    "prune-experts",
    cl::desc("Remove the experts of each mixture-of-experts layer that calibration shows are least used: a count "
             "per layer (2), a fraction (0.25) or a percentage (25%) of its experts, or auto (the most whose "
             "held-out calibration accuracy stays within --prune-experts-max-loss)"),
    cl::init(""), cl::cat(kilnCategory));
static cl::opt<double> pruneExpertsMaxLoss(
    "prune-experts-max-loss",
    cl::desc("--prune-experts=auto: accuracy points the pruned model may lose on the held-out calibration samples"),
    cl::init(1.0), cl::cat(kilnCategory));
static cl::opt<bool> pruneExpertsMerge(
    "prune-experts-merge",
    cl::desc("--prune-experts: merge each pruned expert into the kept expert whose weights are most similar "
             "(cosine at least 0.5; else it is removed) instead of removing it: the kept expert's weights become the "
             "mean of the group and the pruned expert's router row routes to them, so the artifact shrinks as much"),
    cl::init(false), cl::cat(kilnCategory));
static cl::opt<std::string> visualTokens(
    "visual-tokens",
    cl::desc("Image tokens each image keeps after the projector: a count (72), a fraction (0.5) or a percentage "
             "(50%) of them; the best-scoring ones reach the decoder, in their order"),
    cl::init(""), cl::cat(kilnCategory));
static cl::opt<std::string> visualTokenScore(
    "visual-token-score", cl::desc("How --visual-tokens ranks image tokens: distinct (unlike the image's mean "
                                   "token; the default) or norm (L2 norm)"),
    cl::init("distinct"), cl::cat(kilnCategory));
static cl::opt<std::string> visualTokenPositions(
    "visual-token-positions",
    cl::desc("RoPE positions of the image tokens --visual-tokens keeps: original (the default: each at the position "
             "it has unpruned, the text after the image too) or consecutive (for a model trained with pruned "
             "pictures so)"),
    cl::init("original"), cl::cat(kilnCategory));
static cl::opt<int> threads("calibration-threads", cl::desc("Threads for calibration (default: every CPU)"), cl::init(0),
                            cl::cat(kilnCategory));

static cl::opt<std::string> chatTemplate(
    "chat-template",
    cl::desc("Chat template: a file (.jinja, or .json with \"chat_template\"), a built-in (llava, llava-chatml, "
             "idefics3, chatml) or none (default: the checkpoint's chat_template.jinja, chat_template.json or "
             "tokenizer_config.json, else the architecture's built-in)"),
    cl::init(""), cl::cat(kilnCategory));
static cl::opt<std::string> promptTemplate(
    "prompt-template",
    cl::desc("The built-in template older runtimes apply, and an alias of --chat-template for it: llava, "
             "llava-chatml, idefics3, plain (default: the architecture's)"),
    cl::init(""), cl::cat(kilnCategory));

static const char* severityName(mlir::DiagnosticSeverity s) {
  switch (s) {
  case mlir::DiagnosticSeverity::Error: return "error";
  case mlir::DiagnosticSeverity::Warning: return "warning";
  case mlir::DiagnosticSeverity::Remark: return "remark";
  case mlir::DiagnosticSeverity::Note: return "note";
  }
  return "diagnostic";
}

// Messages already name their file; a NameLoc (tensor or layer) is worth printing.
static void printDiagnostic(llvm::raw_ostream& os, mlir::Diagnostic& diag, int indent) {
  os.indent(indent) << severityName(diag.getSeverity()) << ": ";
  if (auto name = llvm::dyn_cast<mlir::NameLoc>(diag.getLocation()))
    os << name.getName().getValue() << ": ";
  os << diag.str() << "\n";
  for (mlir::Diagnostic& note : diag.getNotes())
    printDiagnostic(os, note, indent + 2);
}

// An output the compile will write: it must not exist as anything but a regular
// file (a device node, FIFO or symlink would be replaced, or block), and its
// directory must take new files. Checked for every output before any is written,
// so that a bad --report does not fail the compile after the artifact is written.
static bool checkOutput(llvm::StringRef option, llvm::StringRef path, bool replacedByRename) {
  auto fail = [&](const llvm::Twine& why) {
    llvm::errs() << "kiln-compile: error: " << option << " '" << path << "': " << why << "\n";
    return false;
  };
  struct stat st;
  if (::lstat(path.str().c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode))
      return fail("exists and is not a regular file; refusing to replace it");
    // The artifact replaces the file by a rename (the directory's permission);
    // the report is opened for writing (the file's).
    if (!replacedByRename && ::access(path.str().c_str(), W_OK) != 0)
      return fail("cannot be written: " + llvm::Twine(std::strerror(errno)));
  } else if (errno != ENOENT) {
    return fail("cannot be written: " + llvm::Twine(std::strerror(errno)));
  }
  llvm::SmallString<256> dir(path);
  llvm::sys::path::remove_filename(dir);
  if (dir.empty())
    dir = ".";
  struct stat ds;
  if (::stat(dir.c_str(), &ds) != 0)
    return fail("its directory '" + dir + "' " + (errno == ENOENT ? "does not exist" : std::strerror(errno)));
  if (!S_ISDIR(ds.st_mode))
    return fail("'" + dir + "' is not a directory");
  if ((replacedByRename || ::lstat(path.str().c_str(), &st) != 0) &&
      ::access(dir.c_str(), W_OK | X_OK) != 0)
    return fail("cannot create files in '" + dir + "': " + std::strerror(errno));
  return true;
}

int main(int argc, char** argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  // --mlir-print-debuginfo (hidden): --emit=planned-ir with the ops' names (their
  // locations), which an artifact written back with --from-ir keeps.
  mlir::registerAsmPrinterCLOptions();
  // mlir-opt's pass manager options (hidden), applied to every pass manager of the
  // pipeline: --mlir-print-ir-after-all, --mlir-print-ir-after=kiln-fuse-qkv,
  // --mlir-timing, ...
  // The pipeline's passes, so that --mlir-print-ir-after=<kiln pass> can name them.
  kiln::registerKilnFuseQkv();
  kiln::registerKilnFuseGateUp();
  kiln::registerKilnFuseActivation();
  kiln::registerKilnFuseResidual();
  kiln::registerKilnFuseNorm();
  kiln::registerKilnAssignPrecision();
  kiln::registerKilnSelectKernels();
  kiln::registerKilnPackWeights();
  kiln::registerKilnPlanMemory();
  mlir::registerPassManagerCLOptions();
  mlir::registerDefaultTimingManagerCLOptions();
  cl::HideUnrelatedOptions(kilnCategory);
  cl::SetVersionPrinter([](llvm::raw_ostream& os) {
    os << kiln::compilerVersion() << " (LLVM " << LLVM_VERSION_STRING << ")\n";
  });
  // Usage errors exit 2, as in the other tools (LLVM's parser would exit 1).
  if (!cl::ParseCommandLineOptions(argc, argv, "Kiln: compile a Hugging Face checkpoint for phones\n", &llvm::errs()))
    return 2;

  // A file where the checkpoint goes: a .mlir module is --from-ir's input (as
  // iree-compile takes one); a checkpoint's config.json stands for its directory.
  if (!checkpointDir.empty()) {
    struct stat st;
    if (::stat(checkpointDir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      llvm::StringRef given(checkpointDir.getValue());
      if (given.ends_with(".mlir") && fromIr.empty()) {
        fromIr = given.str();
        checkpointDir = "";
      } else if (llvm::sys::path::filename(given) == "config.json") {
        llvm::StringRef dir = llvm::sys::path::parent_path(given);
        checkpointDir = dir.empty() ? std::string(".") : dir.str();
      } else {
        llvm::errs() << "kiln-compile: error: '" << given
                     << "' is a file, not a checkpoint directory: give the directory that holds config.json "
                        "(or the config.json itself), or a lowered .mlir module\n";
        return 2;
      }
    }
  }
  if (fromIr.empty() == checkpointDir.empty()) {
    llvm::errs() << "kiln-compile: error: give a checkpoint directory or --from-ir FILE.mlir (one of them)\n";
    return 2;
  }
  if (!fromIr.empty()) {
    // Precision, calibration and lowering happened when the IR was produced.
    for (cl::Option* o : std::initializer_list<cl::Option*>{
             &emit, &maxPrefillTokens, &kvCache, &memoryBudget, &bitsPerWeight, &tiersOption,
             static_cast<cl::Option*>(std::addressof(precisionOverrides)),
             &calibration, &calibrationSamples, &quantizer, &cacheDir, &threads, &promptTemplate, &chatTemplate, &pruneExperts,
             &pruneExpertsMaxLoss, &pruneExpertsMerge, &visualTokens, &visualTokenScore, &visualTokenPositions})
      if (o->getNumOccurrences() > 0) {
        llvm::errs() << "kiln-compile: error: --" << o->ArgStr
                     << " applies to compiling a checkpoint, not to --from-ir\n";
        return 2;
      }
  }
  const bool writesArtifact = emit == EmitKind::Artifact || emit == EmitKind::StaticLibrary;
  if (writesArtifact && outputPath.empty()) {
    llvm::errs() << "kiln-compile: error: give the output artifact with -o FILE, or --emit=ir\n";
    return 2;
  }
  if (emit == EmitKind::StaticLibrary && target == "portable") {
    llvm::errs() << "kiln-compile: error: --emit=static-library needs a target with generated kernels, not "
                    "--target=portable\n";
    return 2;
  }
  if (maxPrefillTokens < 1) {
    llvm::errs() << "kiln-compile: error: --max-prefill-tokens must be positive\n";
    return 2;
  }
  if (!llvm::is_contained(llvm::ArrayRef<llvm::StringRef>{"f32", "f16", "int8", "int4"}, kvCache.getValue())) {
    llvm::errs() << "kiln-compile: error: --kv-cache must be f32, f16, int8 or int4, got '" << kvCache << "'\n";
    return 2;
  }
  if (!memoryBudget.empty() && !kiln::parseByteSize(memoryBudget)) {
    llvm::errs() << "kiln-compile: error: --memory-budget '" << memoryBudget
                 << "' is not a size (e.g. 1.2GB, 800MB, 512MiB)\n";
    return 2;
  }
  if (bitsPerWeight.getNumOccurrences() > 0 && !(bitsPerWeight > 0)) {
    llvm::errs() << "kiln-compile: error: --bits-per-weight must be positive\n";
    return 2;
  }
  std::vector<uint64_t> tierBudgets;
  if (!tiersOption.empty()) {
    llvm::SmallVector<llvm::StringRef> parts;
    llvm::StringRef(tiersOption).split(parts, ',');
    for (llvm::StringRef part : parts) {
      std::optional<uint64_t> b = kiln::parseByteSize(part.trim());
      if (!b || *b == 0) {
        llvm::errs() << "kiln-compile: error: --tiers: '" << part << "' is not a size (e.g. 1.2GB, 800MB, 512MiB)\n";
        return 2;
      }
      tierBudgets.push_back(*b);
    }
    std::sort(tierBudgets.begin(), tierBudgets.end(), std::greater<uint64_t>());
    if (std::adjacent_find(tierBudgets.begin(), tierBudgets.end()) != tierBudgets.end() || tierBudgets.size() < 2 ||
        tierBudgets.size() > kiln::format::kMaxTiers) {
      llvm::errs() << "kiln-compile: error: --tiers takes 2 to " << kiln::format::kMaxTiers
                   << " different weight budgets, got '" << tiersOption << "'\n";
      return 2;
    }
    if (!memoryBudget.empty() || bitsPerWeight > 0 || emit != EmitKind::Artifact || !report.empty()) {
      llvm::errs() << "kiln-compile: error: --tiers replaces --memory-budget and --bits-per-weight, and writes an "
                      "artifact (no --emit other than artifact, no --report)\n";
      return 2;
    }
  }
  if (!memoryBudget.empty() && bitsPerWeight > 0) {
    llvm::errs() << "kiln-compile: error: give --memory-budget or --bits-per-weight, not both\n";
    return 2;
  }
  // The templates the runtime implements (runtime/src/session.cc).
  if (!promptTemplate.empty() && promptTemplate != "llava" && promptTemplate != "llava-chatml" &&
      promptTemplate != "idefics3" && promptTemplate != "plain") {
    llvm::errs() << "kiln-compile: error: unknown --prompt-template '" << promptTemplate
                 << "' (llava, llava-chatml, idefics3, plain)\n";
    return 2;
  }
  if (!chatTemplate.empty() && chatTemplate != "none" && kiln::hf::builtinChatTemplate(chatTemplate).empty() &&
      !llvm::sys::fs::is_regular_file(chatTemplate)) {
    llvm::errs() << "kiln-compile: error: --chat-template '" << chatTemplate
                 << "': neither a file nor a built-in template (llava, llava-chatml, idefics3, chatml, none)\n";
    return 2;
  }

  // Every output, before any work (exit 1: the file system, not the options, is at fault).
  if (writesArtifact && !checkOutput("-o", outputPath, /*replacedByRename=*/true))
    return 1;
  // The text emits (IR, kernels) go to -o when given, else to stdout; the file is
  // removed again unless the compile succeeds.
  std::unique_ptr<llvm::ToolOutputFile> textFile;
  llvm::raw_ostream* text = &llvm::outs();
  if (!writesArtifact && !outputPath.empty()) {
    if (!checkOutput("-o", outputPath, /*replacedByRename=*/false))
      return 1;
    std::error_code ec;
    textFile = std::make_unique<llvm::ToolOutputFile>(outputPath, ec, llvm::sys::fs::OF_None);
    if (ec) {
      llvm::errs() << "kiln-compile: error: -o '" << outputPath << "': " << ec.message() << "\n";
      return 1;
    }
    text = &textFile->os();
  }
  auto textDone = [&] {
    if (textFile)
      textFile->keep();
    return 0;
  };
  if (emit == EmitKind::StaticLibrary) {
    kiln::KernelLibraryPaths lib = kiln::kernelLibraryPaths(outputPath);
    if (!checkOutput("--emit=static-library", lib.archive, false) ||
        !checkOutput("--emit=static-library", lib.header, false))
      return 1;
  }
  if (!report.empty() && writesArtifact) {
    llvm::SmallString<256> svg(report.getValue());
    llvm::sys::path::replace_extension(svg, "svg");
    if (!checkOutput("--report", report, false) || !checkOutput("--report (chart)", svg, false))
      return 1;
  }
  // Calibration inputs are read, not written: a FIFO there would block forever.
  if (!calibration.empty()) {
    struct stat st;
    if (::stat(calibration.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
      llvm::errs() << "kiln-compile: error: --calibration '" << calibration
                   << "' is neither a regular file nor a directory\n";
      return 1;
    }
  }

  mlir::MLIRContext context;
  context.printOpOnDiagnostic(false);  // messages name the weight or op already
  bool failedAny = false;
  mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic& diag) {
    if (diag.getSeverity() == mlir::DiagnosticSeverity::Error)
      failedAny = true;
    if (diag.getSeverity() == mlir::DiagnosticSeverity::Remark && !showRemarks)
      return mlir::success();
    llvm::errs() << "kiln-compile: ";
    printDiagnostic(llvm::errs(), diag, 0);
    return mlir::success();
  });

  kiln::CompileOptions options;
  options.checkpoint = checkpointDir;
  options.target = target;
  options.cpuFeatures = cpuFeatures;
  options.allowPortableOps = allowPortableOps;
  options.kernels = kernelsChoice;
  options.packWeights = !noPackWeights;
  options.fuse = !noFuse;
  for (const std::string& name : noFusePass) {
    if (!llvm::is_contained(kiln::kFusionPasses, name)) {
      llvm::errs() << "kiln-compile: --no-fuse-pass=" << name
                   << ": not a fusion pass (qkv, rope, gate-up, activation, residual, norm)\n";
      return 2;
    }
    options.noFusePasses.push_back(name);
  }
  options.promptTemplate = promptTemplate;
  options.chatTemplate = chatTemplate;
  options.maxPrefillTokens = maxPrefillTokens;
  options.kvCache = kvCache;
  options.memoryBudget = memoryBudget;
  options.bitsPerWeight = bitsPerWeight;
  options.precision.assign(precisionOverrides.begin(), precisionOverrides.end());
  options.calibration = calibration;
  options.calibrationSamples = calibrationSamples;
  options.quantizer = quantizer;
  options.cacheDir = cacheDir;
  options.report = report;
  options.threads = threads;
  options.quiet = quiet;
  options.pruneExperts = pruneExperts;
  options.pruneExpertsMaxLoss = pruneExpertsMaxLoss;
  options.mergeExperts = pruneExpertsMerge;
  if (pruneExperts.getNumOccurrences() > 0 && pruneExperts != "auto" && !kiln::parseCountOrShare(pruneExperts)) {
    llvm::errs() << "kiln-compile: error: --prune-experts must be a count (2), a fraction (0.25), a percentage (25%) "
                    "or auto, got '"
                 << pruneExperts << "'\n";
    return 2;
  }
  if (pruneExpertsMaxLoss.getNumOccurrences() > 0 && (pruneExperts != "auto" || !(pruneExpertsMaxLoss >= 0))) {
    llvm::errs() << "kiln-compile: error: --prune-experts-max-loss takes a non-negative number of points and goes "
                    "with --prune-experts=auto\n";
    return 2;
  }
  if (pruneExpertsMerge && pruneExperts.empty()) {
    llvm::errs() << "kiln-compile: error: --prune-experts-merge goes with --prune-experts (how many experts to merge)\n";
    return 2;
  }
  options.visualTokens = visualTokens;
  options.visualTokenScore = visualTokenScore;
  if (visualTokens.getNumOccurrences() > 0 && !kiln::parseCountOrShare(visualTokens)) {
    llvm::errs() << "kiln-compile: error: --visual-tokens must be a count (72), a fraction (0.5) or a percentage "
                    "(50%), got '"
                 << visualTokens << "'\n";
    return 2;
  }
  if (visualTokenScore != "distinct" && visualTokenScore != "norm") {
    llvm::errs() << "kiln-compile: error: --visual-token-score must be distinct or norm, got '" << visualTokenScore
                 << "'\n";
    return 2;
  }
  if (visualTokenScore.getNumOccurrences() > 0 && visualTokens.empty()) {
    llvm::errs() << "kiln-compile: error: --visual-token-score goes with --visual-tokens\n";
    return 2;
  }
  options.visualTokenPositions = visualTokenPositions;
  if (visualTokenPositions != "consecutive" && visualTokenPositions != "original") {
    llvm::errs() << "kiln-compile: error: --visual-token-positions must be consecutive or original, got '"
                 << visualTokenPositions << "'\n";
    return 2;
  }
  if (visualTokenPositions.getNumOccurrences() > 0 && visualTokens.empty()) {
    llvm::errs() << "kiln-compile: error: --visual-token-positions goes with --visual-tokens\n";
    return 2;
  }
  options.kernelLibrary = emit == EmitKind::StaticLibrary;
  if (!report.empty() && !writesArtifact) {
    llvm::errs() << "kiln-compile: error: --report goes with -o (the artifact)\n";
    return 2;
  }

  if (!tierBudgets.empty())
    return mlir::failed(kiln::emitTieredArtifact(context, options, tierBudgets, outputPath)) || failedAny ? 1 : 0;

  kiln::HessianTable hessians;
  mlir::OwningOpRef<mlir::ModuleOp> module;
  if (!fromIr.empty()) {
    context.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
    module = mlir::parseSourceFile<mlir::ModuleOp>(fromIr, &context);  // verified
    if (!module || failedAny)
      return 1;
    if (auto ckpt = (*module)->getAttrOfType<mlir::StringAttr>("kiln.checkpoint"))
      options.checkpoint = ckpt.str();  // for the report
  } else {
    module = kiln::importAndLower(context, options, /*lower=*/emit != EmitKind::IR, &hessians);
  }
  if (!module || failedAny)
    return 1;

  switch (emit) {
  case EmitKind::IR:
  case EmitKind::PlannedIR:
    module->print(*text);
    *text << "\n";
    return textDone();
  case EmitKind::KernelsMLIR:
  case EmitKind::KernelsLLVM:
  case EmitKind::KernelsAsm: {
    llvm::Expected<kiln::Target> tgt = kiln::moduleTarget(*module);
    if (!tgt) {
      llvm::errs() << "kiln-compile: error: " << llvm::toString(tgt.takeError()) << "\n";
      return 1;
    }
    mlir::OwningOpRef<mlir::ModuleOp> kernels = kiln::buildKernelModule(*module, *tgt);
    if (!kernels || failedAny)
      return 1;
    if (kernels->getBody()->empty())
      llvm::errs() << "kiln-compile: note: no op is bound to a generated kernel on target " << tgt->triple
                   << (tgt->generate ? "" : " (portable)") << "\n";
    if (emit == EmitKind::KernelsMLIR) {
      kernels->print(*text);
      *text << "\n";
      return textDone();
    }
    if (kernels->getBody()->empty())
      return textDone();
    kiln::GeneratedCode code;
    if (mlir::failed(kiln::compileKernels(*kernels, *tgt, &code, emit == EmitKind::KernelsLLVM ? text : nullptr,
                                          emit == EmitKind::KernelsAsm ? text : nullptr)) ||
        failedAny)
      return 1;
    return textDone();
  }
  case EmitKind::Artifact:
  case EmitKind::StaticLibrary:
    if (mlir::failed(kiln::emitArtifact(*module, options, outputPath, &hessians)) || failedAny)
      return 1;
    return 0;
  }
  return 0;
}
