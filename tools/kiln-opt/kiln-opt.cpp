//===- kiln-opt.cpp - kiln IR optimiser driver -------------------*- C++ -*-===//
//
// Like mlir-opt: parses kiln IR, runs the passes named on the command line and
// prints the result. Registers the kiln dialect and the upstream dialects the
// pipeline uses, and every pass of passes/Passes.td, the test-only ones
// (--kiln-test-*, library KilnTestPasses) included.
//
//===----------------------------------------------------------------------===//

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectRegistry.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

#include "dialects/kiln/KilnDialect.h"
#include "passes/Passes.h"

int main(int argc, char** argv) {
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) {
    os << "kiln-opt " << KILN_VERSION << " (LLVM " << LLVM_VERSION_STRING << ")\n";
  });
  mlir::registerTransformsPasses();
  kiln::registerKilnPasses();

  mlir::DialectRegistry registry;
  registry.insert<kiln::KilnDialect, mlir::func::FuncDialect, mlir::arith::ArithDialect,
                  mlir::tensor::TensorDialect>();

  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "Kiln optimiser driver\n", registry));
}
