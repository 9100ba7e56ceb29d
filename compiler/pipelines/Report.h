//===- Report.h - the precision report ---------------------------*- C++ -*-===//
//
// What kiln-compile decided for every weight — encoding, bytes, measured
// sensitivity of each candidate — as JSON, and an SVG chart beside it (same name,
// .svg) that shows per-layer precision, bytes and sensitivity at a glance.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_PIPELINES_REPORT_H
#define KILN_COMPILER_PIPELINES_REPORT_H

#include "compiler/pipelines/Pipeline.h"
#include "mlir/IR/BuiltinOps.h"

namespace kiln {

mlir::LogicalResult writePrecisionReport(mlir::ModuleOp module, const CompileOptions& options,
                                         llvm::StringRef artifactPath, llvm::StringRef reportPath);

} // namespace kiln

#endif // KILN_COMPILER_PIPELINES_REPORT_H
