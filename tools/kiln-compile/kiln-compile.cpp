//===- kiln-compile.cpp - Kiln compiler driver -------------------*- C++ -*-===//
//
// kiln-compile CHECKPOINT_DIR --emit=ir          print the imported kiln IR
//
//===----------------------------------------------------------------------===//

#include "compiler/importers/hf/HFImporter.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/raw_ostream.h"

namespace cl = llvm::cl;

static cl::OptionCategory kilnCategory("kiln-compile options");

static cl::opt<std::string> checkpointDir(cl::Positional, cl::desc("<checkpoint directory>"),
                                          cl::Required, cl::cat(kilnCategory));

enum class EmitKind { IR };
static cl::opt<EmitKind> emit("emit", cl::desc("What to produce"),
                              cl::values(clEnumValN(EmitKind::IR, "ir", "the imported kiln IR")),
                              cl::Required, cl::cat(kilnCategory));

static cl::opt<bool> showRemarks("remarks",
                                 cl::desc("Print the decisions the compiler makes (remarks)"),
                                 cl::init(false), cl::cat(kilnCategory));

static cl::opt<std::string> promptTemplate(
    "prompt-template",
    cl::desc("Prompt template: llava, llava-chatml, idefics3, plain (default: the architecture's)"),
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

int main(int argc, char** argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  cl::HideUnrelatedOptions(kilnCategory);
  cl::ParseCommandLineOptions(argc, argv,
                              "Kiln: compile a Hugging Face checkpoint for phones\n");

  mlir::MLIRContext context;
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

  kiln::hf::ImportOptions options;
  options.promptTemplate = promptTemplate;
  mlir::OwningOpRef<mlir::ModuleOp> module =
      kiln::hf::importCheckpoint(&context, checkpointDir, options);
  if (!module || failedAny)
    return 1;

  switch (emit) {
  case EmitKind::IR:
    module->print(llvm::outs());
    llvm::outs() << "\n";
    break;
  }
  return 0;
}
