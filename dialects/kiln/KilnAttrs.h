//===- KilnAttrs.h - kiln dialect attributes ---------------------*- C++ -*-===//
#ifndef KILN_DIALECTS_KILN_KILNATTRS_H
#define KILN_DIALECTS_KILN_KILNATTRS_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"

#include "dialects/kiln/KilnEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/kiln/KilnAttrs.h.inc"

#endif // KILN_DIALECTS_KILN_KILNATTRS_H
