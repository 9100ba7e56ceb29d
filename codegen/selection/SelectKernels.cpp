//===- SelectKernels.cpp - bind ops to kernels -------------------*- C++ -*-===//
#include "codegen/selection/KernelRegistry.h"
#include "dialects/kiln/KilnOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/SymbolTable.h"
#include "passes/Passes.h"
#include "llvm/ADT/StringExtras.h"

namespace kiln {
#define GEN_PASS_DEF_KILNSELECTKERNELS
#include "passes/Passes.h.inc"

namespace {

struct SelectKernelsPass : impl::KilnSelectKernelsBase<SelectKernelsPass> {
  using KilnSelectKernelsBase::KilnSelectKernelsBase;

  void runOnOperation() override {
    mlir::ModuleOp module = getOperation();
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
          needed |= 1u << static_cast<unsigned>(toFbEncoding(static_cast<unsigned>(enc.getKind())));
          encodingNames.push_back(stringifyEncodingKind(enc.getKind()).str());
        }
        const format::KernelInfo* chosen = nullptr;
        for (const format::KernelInfo& k : allKernels()) {
          if (k.op_kind != static_cast<uint16_t>(*kind))
            continue;
          if ((needed & ~k.encodings) != 0)
            continue;
          chosen = &k;
          break;
        }
        if (!chosen) {
          op->emitOpError("has no kernel for weight encoding(s) ")
              << llvm::join(encodingNames, ", ") << " on target '"
              << (target.empty() ? std::string("host") : target) << "'";
          failedAny = true;
          return;
        }
        op->setAttr("kiln.kernel", mlir::StringAttr::get(op->getContext(), chosen->name));
      });
    });
    if (failedAny)
      signalPassFailure();
  }
};

} // namespace
} // namespace kiln
