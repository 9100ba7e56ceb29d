//===- SelectKernels.cpp - bind ops to kernels -------------------*- C++ -*-===//
#include <set>

#include "codegen/generators/KernelGenerator.h"
#include "codegen/selection/KernelRegistry.h"
#include "codegen/targets/Target.h"
#include "dialects/kiln/KilnOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/SymbolTable.h"
#include "passes/Encoding.h"
#include "passes/OpTable.h"
#include "passes/Passes.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/bit.h"
#include "llvm/Support/Regex.h"

namespace kiln {
#define GEN_PASS_DEF_KILNSELECTKERNELS
#include "passes/Passes.h.inc"

namespace {

struct SelectKernelsPass : impl::KilnSelectKernelsBase<SelectKernelsPass> {
  using KilnSelectKernelsBase::KilnSelectKernelsBase;

  void runOnOperation() override {
    mlir::ModuleOp module = getOperation();
    // The kernel table and the dialect must agree before anything is bound.
    if (std::string mismatch = checkOpTable(module.getContext()); !mismatch.empty()) {
      module.emitError("kiln-select-kernels: ") << mismatch;
      return signalPassFailure();
    }
    auto parsed = parseTarget(target, cpuFeatures);
    if (!parsed) {
      module.emitError("kiln-select-kernels: ") << llvm::toString(parsed.takeError());
      return signalPassFailure();
    }
    const Target& tgt = *parsed;
    if (kernels != "hand-written" && kernels != "generated") {
      module.emitError("kiln-select-kernels: kernels '") << kernels << "' is not generated or hand-written";
      return signalPassFailure();
    }
    const bool generatedFirst = kernels == "generated";
    setModuleTarget(module, tgt);
    llvm::Regex allowPortable("^(" + allowPortableOps + ")$");
    std::string regexError;
    if (!allowPortableOps.empty() && !allowPortable.isValid(regexError)) {
      module.emitError("kiln-select-kernels: allow-portable-ops '") << allowPortableOps << "': " << regexError;
      return signalPassFailure();
    }
    const std::string targetName = tgt.triple + (tgt.features ? " (" + featureList(tgt.features) + ")" : "");
    mlir::SymbolTable symbols(module);
    bool failedAny = false;
    std::set<std::string> refusedOps;
    module.walk([&](mlir::func::FuncOp fn) {
      if (!fn->hasAttr("kiln.stage"))
        return;
      fn.walk([&](mlir::Operation* op) {
        std::optional<fb::OpKind> kind = opKindOf(op);
        if (!kind)
          return;
        // The weight encodings this op reads.
        uint32_t needed = 0;
        llvm::SmallVector<std::string> encodingNames;
        for (mlir::Value operand : op->getOperands()) {
          auto ref = operand.getDefiningOp<WeightRefOp>();
          if (!ref)
            continue;
          auto weight = symbols.lookup<WeightOp>(ref.getName());
          if (!weight)
            continue; // the verifier reports dangling references
          EncodingAttr enc = weight.getEncoding();
          needed |= format::EncodingBit(encodingSpec(enc).id);
          std::string encName = stringifyEncodingKind(enc.getKind()).str();
          if (!llvm::is_contained(encodingNames, encName))
            encodingNames.push_back(encName);
        }
        // Of the kernels that run this op kind, read these encodings and need no
        // CPU feature the target lacks: the most specialised one (the most CPU
        // features used), the first in table order among equals.
        // Kernels generated for the op (codegen/generators) rank above the portable
        // ones and below hand-written kernels for the target's features, or above
        // every other kernel with kernels=generated (the default).
        const format::KernelInfo* chosen = nullptr;
        auto rank = [&](const format::KernelInfo& k) {
          const bool generated = llvm::StringRef(k.isa) == "generated";
          return (generatedFirst && generated ? 1000 : 0) + 2 * llvm::popcount(k.cpu_features) + (generated ? 1 : 0);
        };
        std::vector<std::string> notGenerated;  // why no generated kernel serves the op
        // Why each faster kernel of the kind did not qualify (for the no-fallback rule).
        bool hasFaster = false;
        std::vector<std::string> refused;
        for (const format::KernelInfo& k : allKernels()) {
          if (k.op_kind != static_cast<uint16_t>(*kind))
            continue;
          const bool portable = llvm::StringRef(k.isa) == "portable";
          hasFaster |= !portable;
          std::string why;
          if ((needed & ~k.encodings) != 0)
            why = "does not read " + llvm::join(encodingNames, ", ");
          else if ((k.cpu_features & ~tgt.features) != 0)
            why = "needs " + featureList(k.cpu_features & ~tgt.features);
          else if (!portable && llvm::StringRef(k.isa) == "generated" && !generatorSupports(op, k.name, tgt, &why))
            ;
          if (!why.empty()) {
            if (!portable)
              refused.push_back(std::string(k.name) + ": " + why);
            if (llvm::StringRef(k.isa) == "generated")
              notGenerated.push_back(std::string(k.name) + ": " + why);
            continue;
          }
          if (!chosen || rank(k) > rank(*chosen))
            chosen = &k;
        }
        if (!chosen) {
          op->emitOpError("has no kernel for weight encoding(s) ")
              << llvm::join(encodingNames, ", ") << " on target '" << targetName << "'";
          failedAny = true;
          return;
        }
        const bool portableChosen = llvm::StringRef(chosen->isa) == "portable";
        const bool fallback = portableChosen && tgt.generate && hasFaster;
        std::string opName = op->getName().getStringRef().str();
        if (auto nl = llvm::dyn_cast<mlir::NameLoc>(op->getLoc()))
          opName = nl.getName().str();
        const bool allowed = !allowPortableOps.empty() && allowPortable.match(opName);
        if (fallback && !allowed) {
          failedAny = true;
          if (!refusedOps.insert(opName).second)
            return; // the same op in another stage: reported once
          op->emitOpError("'") << opName << "' has no generated or hand-written kernel on target '" << targetName
                               << "' (" << llvm::join(refused, "; ")
                               << "); --allow-portable-ops=REGEX lets ops whose names match run the portable "
                                  "reference kernel";
          return;
        }
        op->setAttr("kiln.kernel", mlir::StringAttr::get(op->getContext(), chosen->name));
        mlir::InFlightDiagnostic remark = op->emitRemark("bound to ") << chosen->name << " (" << chosen->isa;
        if (chosen->cpu_features)
          remark << ", needs " << featureList(chosen->cpu_features);
        remark << ")";
        if (fallback)
          remark << ": portable reference kernel, allowed by allow-portable-ops (" << llvm::join(refused, "; ")
                 << ")";
        else if (portableChosen)
          remark << ": portable reference kernel, no generated kernel for " << targetName;
        else if (generatedFirst && llvm::StringRef(chosen->isa) != "generated")
          remark << ": hand-written, no generated kernel serves it ("
                 << (notGenerated.empty() ? std::string("the generator has none for its kind")
                                          : llvm::join(notGenerated, "; "))
                 << ")";
      });
    });
    if (failedAny)
      signalPassFailure();
  }
};

} // namespace
} // namespace kiln
