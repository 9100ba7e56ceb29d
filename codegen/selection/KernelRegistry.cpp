//===- KernelRegistry.cpp - kernels the compiler can bind ops to -*- C++ -*-===//
#include "codegen/selection/KernelRegistry.h"

#include "formats/contract.h"
#include "passes/OpTable.h"

namespace kiln {

llvm::ArrayRef<format::KernelInfo> allKernels() {
  size_t n;
  const format::KernelInfo* k = format::AllKernels(&n);
  return {k, n};
}

const format::KernelInfo* kernelByName(llvm::StringRef name) {
  for (const format::KernelInfo& k : allKernels())
    if (name == k.name)
      return &k;
  return nullptr;
}

std::optional<fb::OpKind> opKindOf(mlir::Operation* op) {
  const format::OpInfo* info = opInfo(op);
  if (!info)
    return std::nullopt;
  return static_cast<fb::OpKind>(info->kind);
}

} // namespace kiln
