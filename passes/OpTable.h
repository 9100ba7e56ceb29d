//===- OpTable.h - the artifact's op table seen from the dialect -*- C++ -*-===//
//
// Looks up the row of formats/ops.def that describes a kiln dialect op: its
// artifact kind, arity, in-place rule and which of its weights may be quantised.
// Memory planning, precision assignment, kernel selection and the writer derive
// those facts from here instead of listing op classes themselves.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_PASSES_OPTABLE_H
#define KILN_PASSES_OPTABLE_H

#include "formats/kiln_format.h"
#include "mlir/IR/Operation.h"
#include "llvm/ADT/StringRef.h"

namespace kiln {

/// The ops.def row of an executable kiln op, or null (kiln.weight_ref, func ops).
const format::OpInfo* opInfo(mlir::Operation* op);

/// The weight slot of operand `operandIndex` (its index among the operands defined
/// by kiln.weight_ref, the order the artifact stores them in), or -1 for an
/// activation operand.
int weightSlot(mlir::Operation* op, unsigned operandIndex);

/// Whether operand `operandIndex` of `op` is a weight that may be stored quantised.
bool isQuantizableWeightOperand(mlir::Operation* op, unsigned operandIndex);

/// Checks that every ops.def row names a registered kiln op and every executable
/// kiln op has a row; returns a description of the first mismatch, or "".
std::string checkOpTable(mlir::MLIRContext* context);

} // namespace kiln

#endif // KILN_PASSES_OPTABLE_H
