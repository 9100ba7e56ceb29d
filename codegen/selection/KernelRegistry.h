//===- KernelRegistry.h - kernels the compiler can bind ops to ---*- C++ -*-===//
#ifndef KILN_CODEGEN_SELECTION_KERNELREGISTRY_H
#define KILN_CODEGEN_SELECTION_KERNELREGISTRY_H

#include <cstdint>
#include <optional>

#include "formats/kiln_format.h"
#include "formats/kiln_generated.h"
#include "mlir/IR/Operation.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

namespace kiln {

/// Every kernel of formats/kernels.def.
llvm::ArrayRef<format::KernelInfo> allKernels();
const format::KernelInfo* kernelByName(llvm::StringRef name);

/// The artifact op kind of a kiln dialect op (nullopt: not an executable op, such
/// as kiln.weight_ref).
std::optional<fb::OpKind> opKindOf(mlir::Operation* op);

} // namespace kiln

#endif // KILN_CODEGEN_SELECTION_KERNELREGISTRY_H
