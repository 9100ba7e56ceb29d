//===- PackWeights.cpp - packed weight layouts for the bound kernels -*- C++ -*-===//
//
// kiln-pack-weights: gives a weight the packed layout its kernels read when every
// op that reads it is bound to such a kernel (formats/kiln_format.h
// KernelReadsLayout is the rule the runtime verifier applies too).
//
//===----------------------------------------------------------------------===//
#include "codegen/generators/KernelGenerator.h"
#include "codegen/selection/KernelRegistry.h"
#include "dialects/kiln/KilnOps.h"
#include "mlir/IR/SymbolTable.h"
#include "passes/Encoding.h"
#include "passes/Passes.h"
#include "llvm/ADT/DenseMap.h"

namespace kiln {
#define GEN_PASS_DEF_KILNPACKWEIGHTS
#include "passes/Passes.h.inc"

namespace {

// Whether `op` (bound to a kernel) reads its weight slot `slot` in `layout`.
bool readsLayout(mlir::Operation* op, uint32_t slot, uint8_t layout, bool int8Activations, uint64_t cpuFeatures) {
  auto name = op->getAttrOfType<mlir::StringAttr>("kiln.kernel");
  const format::KernelInfo* info = name ? kernelByName(name.getValue()) : nullptr;
  if (!info)
    return false;
  return format::KernelReadsLayout(layout, llvm::StringRef(info->isa) == "generated", info->encodings,
                                   info->op_kind, slot, int8Activations, cpuFeatures);
}

struct PackWeightsPass : impl::KilnPackWeightsBase<PackWeightsPass> {
  void runOnOperation() override {
    mlir::ModuleOp module = getOperation();
    // The CPU features the generated code assumes (none without a target).
    uint64_t cpuFeatures = 0;
    if (llvm::Expected<Target> target = moduleTarget(module))
      cpuFeatures = target->features;
    else
      llvm::consumeError(target.takeError());
    // Every (op, weight slot) that reads each weight.
    llvm::DenseMap<mlir::StringAttr, llvm::SmallVector<std::pair<mlir::Operation*, uint32_t>>> readers;
    module.walk([&](mlir::Operation* op) {
      uint32_t slot = 0;
      for (mlir::Value operand : op->getOperands())
        if (auto ref = operand.getDefiningOp<WeightRefOp>())
          readers[ref.getNameAttr().getAttr()].push_back({op, slot++});
    });
    mlir::MLIRContext* ctx = module.getContext();
    for (WeightOp w : module.getOps<WeightOp>()) {
      auto it = readers.find(w.getSymNameAttr());
      if (it == readers.end() || it->second.empty())
        continue;
      mlir::RankedTensorType type = w.getTensorType();
      // Vectors (norm weights, biases) stay row major, whatever slot they fill.
      if (type.getRank() < 2)
        continue;
      const uint64_t rows = type.getDimSize(0), cols = rows ? type.getNumElements() / rows : 0;
      const bool a8 = w.getEncoding().getActivation() == ActivationMode::Int8PerToken;
      // The layouts are the matmuls': a table only gathers read stays row major.
      bool matmulReader = false;
      for (auto [op, slot] : it->second)
        matmulReader |= llvm::isa<LinearOp, LmHeadOp, GatedMlpOp, MoeOp, PatchEmbedOp>(op);
      if (!matmulReader)
        continue;
      // The first packed layout that holds the weight and every reader reads.
      for (auto [layout, kind] : {std::pair{format::kLayoutInt4P128K4, LayoutKind::int4_p128k4},
                                  std::pair{format::kLayoutInt4P16K16, LayoutKind::int4_p16k16},
                                  std::pair{format::kLayoutInt4P16K8, LayoutKind::int4_p16k8},
                                  std::pair{format::kLayoutInt8P16K4, LayoutKind::int8_p16k4},
                                  std::pair{format::kLayoutPanel16, LayoutKind::panel16}}) {
        if (!format::LayoutFits(layout, encodingSpec(w.getEncoding()), rows, cols))
          continue;
        bool all = true;
        for (auto [op, slot] : it->second)
          all = all && readsLayout(op, slot, layout, a8, cpuFeatures);
        if (all) {
          w.setLayoutAttr(LayoutKindAttr::get(ctx, kind));
          break;
        }
      }
    }
  }
};

} // namespace
} // namespace kiln
