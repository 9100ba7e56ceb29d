//===- OpTable.cpp - the artifact's op table seen from the dialect -*- C++ -*-===//
#include "passes/OpTable.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/StringMap.h"

namespace kiln {
namespace {

const llvm::StringMap<const format::OpInfo*>& table() {
  static const llvm::StringMap<const format::OpInfo*> map = [] {
    llvm::StringMap<const format::OpInfo*> m;
    size_t n;
    const format::OpInfo* ops = format::AllOps(&n);
    for (size_t i = 0; i < n; ++i)
      m[ops[i].mlir_name] = &ops[i];
    return m;
  }();
  return map;
}

} // namespace

const format::OpInfo* opInfo(mlir::Operation* op) {
  auto it = table().find(op->getName().getStringRef());
  return it == table().end() ? nullptr : it->second;
}

int weightSlot(mlir::Operation* op, unsigned operandIndex) {
  if (!op->getOperand(operandIndex).getDefiningOp<WeightRefOp>())
    return -1;
  int slot = 0;
  for (unsigned i = 0; i < operandIndex; ++i)
    slot += op->getOperand(i).getDefiningOp<WeightRefOp>() ? 1 : 0;
  return slot;
}

bool isQuantizableWeightOperand(mlir::Operation* op, unsigned operandIndex) {
  const format::OpInfo* info = opInfo(op);
  int slot = weightSlot(op, operandIndex);
  return info && slot >= 0 && format::HasSlot(info->quantizable_weights, static_cast<uint32_t>(slot));
}

std::string checkOpTable(mlir::MLIRContext* context) {
  for (const auto& entry : table())
    if (!mlir::RegisteredOperationName::lookup(entry.getKey(), context))
      return ("formats/ops.def names '" + entry.getKey() + "', which the kiln dialect does not define").str();
  auto* dialect = context->getOrLoadDialect<KilnDialect>();
  for (mlir::RegisteredOperationName name : context->getRegisteredOperations()) {
    if (&name.getDialect() != dialect)
      continue;
    llvm::StringRef n = name.getStringRef();
    if (n == WeightOp::getOperationName() || n == WeightRefOp::getOperationName())
      continue;
    if (!table().count(n))
      return ("kiln op '" + n + "' has no row in formats/ops.def").str();
  }
  return "";
}

} // namespace kiln
