//===- KilnOps.h - kiln dialect operations -----------------------*- C++ -*-===//
#ifndef KILN_DIALECTS_KILN_KILNOPS_H
#define KILN_DIALECTS_KILN_KILNOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/kiln/KilnAttrs.h"
#include "dialects/kiln/KilnDialect.h"

#define GET_OP_CLASSES
#include "dialects/kiln/KilnOps.h.inc"

#endif // KILN_DIALECTS_KILN_KILNOPS_H
