//===- Weights.h - reading and rewriting the weights of a module --*- C++ -*-===//
//
// Helpers the passes that rewrite weights share (fusion, pruning): the weight an
// operand reads, weight expressions as operands of #kiln.concat, and the clean-up of
// weights and weight references no op reads any more.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_PASSES_WEIGHTS_H
#define KILN_PASSES_WEIGHTS_H

#include "dialects/kiln/KilnOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace kiln {

/// The weight a value reads (through its kiln.weight_ref), or null.
WeightOp weightOf(mlir::Value v);

/// A weight's expression as an operand of #kiln.concat or #kiln.slice: a plain
/// source states its shape.
mlir::Attribute exprOperand(WeightOp w);

/// Erases the kiln.weight_ref ops whose value nothing reads.
void eraseDeadWeightRefs(mlir::ModuleOp module);

/// Erases the weights no stage reads any more.
void eraseUnreadWeights(mlir::ModuleOp module);

} // namespace kiln

#endif // KILN_PASSES_WEIGHTS_H
