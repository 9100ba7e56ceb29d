//===- KilnOps.cpp - kiln dialect operations ---------------------*- C++ -*-===//
#include "dialects/kiln/KilnOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace kiln;

#define GET_OP_CLASSES
#include "dialects/kiln/KilnOps.cpp.inc"

LogicalResult RmsNormOp::verify() {
  auto inputType = llvm::cast<RankedTensorType>(getInput().getType());
  auto weightType = llvm::cast<RankedTensorType>(getWeight().getType());
  if (inputType.getRank() < 1)
    return emitOpError("input must have rank >= 1");
  if (weightType.getRank() != 1)
    return emitOpError("weight must be 1-D, got rank ") << weightType.getRank();
  int64_t hidden = inputType.getShape().back();
  int64_t weightLen = weightType.getShape().front();
  if (!ShapedType::isDynamic(hidden) && !ShapedType::isDynamic(weightLen) &&
      hidden != weightLen)
    return emitOpError("weight length ")
           << weightLen << " does not match the last dimension of the input ("
           << hidden << ")";
  if (getResult().getType() != inputType)
    return emitOpError("result type ")
           << getResult().getType() << " must equal the input type " << inputType;
  if (!(getEpsilon().convertToFloat() > 0.0f))
    return emitOpError("epsilon must be positive");
  return success();
}
