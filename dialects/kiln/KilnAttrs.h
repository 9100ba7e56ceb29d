//===- KilnAttrs.h - kiln dialect attributes ---------------------*- C++ -*-===//
#ifndef KILN_DIALECTS_KILN_KILNATTRS_H
#define KILN_DIALECTS_KILN_KILNATTRS_H

#include <optional>

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/SmallVector.h"

#include "dialects/kiln/KilnEnums.h.inc"

#include "dialects/kiln/KilnAttrInterfaces.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/kiln/KilnAttrs.h.inc"

namespace kiln {

/// The leaf sources of a weight expression, depth first, operands in order (a
/// source read twice appears twice). The one walk over an expression's leaves:
/// the artifact writer, calibration and the precision report use it.
llvm::SmallVector<SourceAttr> getWeightSources(mlir::Attribute expr);

/// Total bytes of the leaves of a weight expression (a source read twice counts
/// twice): the "source bytes" of the precision report.
uint64_t getWeightSourceBytes(mlir::Attribute expr);

/// Bytes of one element of a safetensors dtype: 4 (F32), 2 (F16, BF16), or 0 for
/// any other.
unsigned safetensorsDtypeBytes(llvm::StringRef dtype);

/// Checks one node of a weight expression (the attribute verifiers, and
/// WeightOp::verify for attributes built without them). `expr` must implement
/// WeightExprAttrInterface; operands are checked as far as this node needs them
/// (their shape and dtype), not recursively.
mlir::LogicalResult verifyWeightExprNode(llvm::function_ref<mlir::InFlightDiagnostic()> emitError,
                                         mlir::Attribute expr);

} // namespace kiln

#endif // KILN_DIALECTS_KILN_KILNATTRS_H
