//===- PruneVisualTokens.cpp - fewer image tokens for the decoder -*- C++ -*-===//
//
// kiln-prune-visual-tokens: the projector's image tokens are scored and only the
// best reach the decoder (and its KV cache), in their original order.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/KilnOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/Passes.h"

namespace kiln {

#define GEN_PASS_DEF_KILNPRUNEVISUALTOKENS
#include "passes/Passes.h.inc"

namespace {

struct PruneVisualTokensPass : impl::KilnPruneVisualTokensBase<PruneVisualTokensPass> {
  using KilnPruneVisualTokensBase::KilnPruneVisualTokensBase;

  void runOnOperation() override {
    mlir::ModuleOp module = getOperation();
    std::optional<CountOrShare> spec = parseCountOrShare(keep);
    if (!spec) {
      module.emitError("kiln-prune-visual-tokens: keep must be a count (72), a fraction (0.5) or a percentage "
                       "(50%), got '")
          << keep << "'";
      return signalPassFailure();
    }
    if (score != "norm" && score != "distinct") {
      module.emitError("kiln-prune-visual-tokens: score must be norm or distinct, got '") << score << "'";
      return signalPassFailure();
    }
    if (positions != "consecutive" && positions != "original") {
      module.emitError("kiln-prune-visual-tokens: positions must be consecutive or original, got '") << positions
                                                                                                    << "'";
      return signalPassFailure();
    }
    const bool original = positions == "original";
    auto image = module->getAttrOfType<ImageConfigAttr>("kiln.image");
    mlir::func::FuncOp projector;
    for (auto fn : module.getOps<mlir::func::FuncOp>())
      if (auto stage = fn->getAttrOfType<StageKindAttr>("kiln.stage"); stage && stage.getValue() == StageKind::projector)
        projector = fn;
    if (!image || !projector) {
      module.emitError("kiln-prune-visual-tokens: the model takes no images (no projector stage)");
      return signalPassFailure();
    }
    auto ret = llvm::cast<mlir::func::ReturnOp>(projector.getBody().front().getTerminator());
    mlir::Value tokens = ret.getOperand(0);
    // A second pruning selects from the first's input: one selection, of fewer rows.
    auto before = tokens.getDefiningOp<SelectTokensOp>();
    mlir::Value from = before ? before.getInput() : tokens;
    auto type = llvm::cast<mlir::RankedTensorType>(from.getType());
    const int64_t total = type.getDimSize(0);
    const int64_t current = llvm::cast<mlir::RankedTensorType>(tokens.getType()).getDimSize(0);
    const int64_t kept = spec->of(total);
    if (kept < 1) {
      module.emitError("kiln-prune-visual-tokens: keeping '") << keep << "' of " << total
                                                             << " image tokens leaves none";
      return signalPassFailure();
    }
    if (kept >= current) {
      projector.emitRemark("kiln-prune-visual-tokens: all ") << current << " image tokens kept";
      return;
    }
    mlir::OpBuilder b(ret);
    auto resultType = mlir::RankedTensorType::get({kept, type.getDimSize(1)}, type.getElementType());
    mlir::Location loc = mlir::NameLoc::get(b.getStringAttr("multi_modal_projector.select_tokens"), ret.getLoc());
    auto select = b.create<SelectTokensOp>(loc, resultType, from, b.getI64IntegerAttr(kept), b.getStringAttr(score),
                                           original ? b.getUnitAttr() : mlir::UnitAttr());
    ret->setOperand(0, select.getResult());
    if (before && before->use_empty())
      before.erase();
    projector.setType(mlir::FunctionType::get(&getContext(), projector.getArgumentTypes(), {resultType}));
    module->setAttr("kiln.image", ImageConfigAttr::get(&getContext(), image.getImageSize(), image.getChannels(),
                                                       kept, image.getImageTokenId()));
    select.emitRemark("kiln-prune-visual-tokens: keeps ")
        << kept << " of " << total << " image tokens per image, the highest-scoring by " << score
        << ", in their order, at " << (original ? "their original" : "consecutive") << " positions";
  }
};

} // namespace
} // namespace kiln
