//===- Weights.cpp - reading and rewriting the weights of a module -*- C++ -*-===//
#include "passes/Weights.h"

#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseSet.h"

namespace kiln {

WeightOp weightOf(mlir::Value v) {
  auto ref = v ? v.getDefiningOp<WeightRefOp>() : WeightRefOp();
  if (!ref)
    return nullptr;
  return mlir::SymbolTable::lookupNearestSymbolFrom<WeightOp>(ref, ref.getNameAttr());
}

mlir::Attribute exprOperand(WeightOp w) {
  if (SourceAttr s = w.getPlainSource(); s && s.getShape().empty())
    return SourceAttr::get(w.getContext(), s.getFile(), s.getOffset(), s.getSize(), s.getDtype(),
                           w.getTensorType().getShape());
  return w.getSource();
}

void eraseDeadWeightRefs(mlir::ModuleOp module) {
  module.walk([&](WeightRefOp r) {
    if (r->use_empty())
      r.erase();
  });
}

void eraseUnreadWeights(mlir::ModuleOp module) {
  llvm::DenseSet<mlir::StringAttr> read;
  module.walk([&](WeightRefOp r) { read.insert(r.getNameAttr().getAttr()); });
  for (WeightOp w : llvm::make_early_inc_range(module.getOps<WeightOp>()))
    if (!read.count(w.getSymNameAttr()))
      w.erase();
}

} // namespace kiln
