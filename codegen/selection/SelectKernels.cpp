//===- SelectKernels.cpp - bind ops to kernels -------------------*- C++ -*-===//
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
    setModuleTarget(module, tgt);
    const std::string targetName = tgt.triple + (tgt.features ? " (" + featureList(tgt.features) + ")" : "");
    mlir::SymbolTable symbols(module);
    bool failedAny = false;
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
          encodingNames.push_back(stringifyEncodingKind(enc.getKind()).str());
        }
        // Of the kernels that run this op kind, read these encodings and need no
        // CPU feature the target lacks: the most specialised one (the most CPU
        // features used), the first in table order among equals.
        // Kernels generated for the op (codegen/generators) rank above the portable
        // ones and below hand-written kernels for the target's features.
        const format::KernelInfo* chosen = nullptr;
        auto rank = [](const format::KernelInfo& k) {
          return 2 * llvm::popcount(k.cpu_features) + (llvm::StringRef(k.isa) == "generated" ? 1 : 0);
        };
        for (const format::KernelInfo& k : allKernels()) {
          if (k.op_kind != static_cast<uint16_t>(*kind) || (needed & ~k.encodings) != 0 ||
              (k.cpu_features & ~tgt.features) != 0)
            continue;
          std::string why;
          if (llvm::StringRef(k.isa) == "generated" && !generatorSupports(op, k.name, tgt, &why))
            continue;
          if (!chosen || rank(k) > rank(*chosen))
            chosen = &k;
        }
        if (!chosen) {
          op->emitOpError("has no kernel for weight encoding(s) ")
              << llvm::join(encodingNames, ", ") << " on target '" << targetName << "'";
          failedAny = true;
          return;
        }
        op->setAttr("kiln.kernel", mlir::StringAttr::get(op->getContext(), chosen->name));
        mlir::InFlightDiagnostic remark = op->emitRemark("bound to ") << chosen->name << " (" << chosen->isa;
        if (chosen->cpu_features)
          remark << ", needs " << featureList(chosen->cpu_features);
        remark << ")";
        if (llvm::StringRef(chosen->isa) == "portable")
          remark << ": portable reference kernel, no generated kernel for " << targetName;
      });
    });
    if (failedAny)
      signalPassFailure();
  }
};

} // namespace
} // namespace kiln
