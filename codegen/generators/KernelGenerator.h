//===- KernelGenerator.h - kernels generated for one model -------*- C++ -*-===//
//
// The kernel generator: for every op of a lowered kiln module bound to a
// `generated` kernel (formats/kernels.def), a micro-kernel specialised to the op's
// static shapes and the target's CPU features, built in MLIR (scf loops, vector
// and arith ops on raw pointers of the LLVM dialect), lowered to the LLVM dialect,
// translated to LLVM IR and compiled in-process by LLVM's TargetMachine into one
// relocatable ELF object: the artifact's code segment. The functions follow the
// micro-kernel ABI of runtime/kernels/ukernel.h (the family's parameter struct, a
// tile range), so the runtime's op runners call them like the built-in kernels.
//
//   model module --buildKernelModule--> kernels (MLIR)  [--emit=kernels-mlir]
//                --lowerKernelModule--> LLVM dialect
//                --compileKernels-----> LLVM IR          [--emit=kernels-llvm]
//                                       object / asm     [--emit=kernels-asm]
//
//===----------------------------------------------------------------------===//
#ifndef KILN_CODEGEN_GENERATORS_KERNELGENERATOR_H
#define KILN_CODEGEN_GENERATORS_KERNELGENERATOR_H

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/targets/Target.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/raw_ostream.h"

namespace kiln {

/// The module attribute kiln-select-kernels records its target in, and reading it
/// back ("triple" and "features", a featureList string).
constexpr const char* kTargetAttrName = "kiln.target";
void setModuleTarget(mlir::ModuleOp module, const Target& target);
/// The module's target; the host's (as parseTarget("")) when it has none.
llvm::Expected<Target> moduleTarget(mlir::ModuleOp module);

/// The attribute naming an op's generated function.
constexpr const char* kSymbolAttrName = "kiln.symbol";
/// Further functions of a fused op (its norm prologue, its rotary embedding): an
/// array of names, written to Op.symbols.
constexpr const char* kSymbolsAttrName = "kiln.symbols";

/// Whether the generator can emit code for `target` (its architecture is known to
/// the LLVM this compiler links, and the target is not `portable`).
bool canGenerate(const Target& target);

/// Whether the generator emits the kernel of `op` (bound to the generated kernel
/// `kernelName`) on `target`; when not, `why` says why. Kernel selection asks before
/// it binds a generated kernel.
bool generatorSupports(mlir::Operation* op, llvm::StringRef kernelName, const Target& target, std::string* why);

/// Builds the kernel module of `model` for `target`: one function per distinct
/// specialisation, named after the kernel grammar with its shape; every op bound to
/// a generated kernel gets kiln.symbol naming its function. Ops it cannot generate
/// get an error naming the op and the reason. Returns an empty module when no op
/// is bound to a generated kernel.
mlir::OwningOpRef<mlir::ModuleOp> buildKernelModule(mlir::ModuleOp model, const Target& target);

/// The machine code of a kernel module.
struct GeneratedCode {
  std::vector<uint8_t> object;          // ELF64 relocatable object
  uint16_t machine = 0;                 // ELF e_machine
  uint64_t cpuFeatures = 0;             // kiln::format::CpuFeature bits the code assumes
  std::string triple;
  std::vector<std::string> symbols;     // the functions it defines
};

/// How the object is packaged.
struct KernelObjectOptions {
  /// For a static library linked into an app (kiln-compile --emit=static-library):
  /// any object format of the target (Mach-O for Apple triples), and, when
  /// `tableSymbol` is set, a kiln_kernel_library_t of that name listing the
  /// functions, carrying `hash` (runtime/include/kiln/kiln.h).
  bool library = false;
  std::string tableSymbol;
  uint64_t hash = 0;
};

/// Lowers `kernels` (in place) to the LLVM dialect, translates it to LLVM IR,
/// optimises it and compiles it for `target`. `llvmIr` / `assembly`, when given,
/// receive the optimised IR and the assembly. Fails (with a diagnostic on the
/// module) when lowering fails or the object needs anything from outside itself
/// (an undefined symbol such as memset; for a code segment, writable data or an
/// object format other than ELF).
mlir::LogicalResult compileKernels(mlir::ModuleOp kernels, const Target& target, GeneratedCode* out,
                                   llvm::raw_ostream* llvmIr = nullptr, llvm::raw_ostream* assembly = nullptr,
                                   const KernelObjectOptions& packaging = {});

} // namespace kiln

#endif // KILN_CODEGEN_GENERATORS_KERNELGENERATOR_H
