//===- KilnDialect.cpp - kiln dialect ----------------------------*- C++ -*-===//
#include "dialects/kiln/KilnDialect.h"

#include "dialects/kiln/KilnAttrs.h"
#include "dialects/kiln/KilnOps.h"

using namespace mlir;
using namespace kiln;

#include "dialects/kiln/KilnDialect.cpp.inc"

void KilnDialect::initialize() {
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "dialects/kiln/KilnOps.cpp.inc"
      >();
}
