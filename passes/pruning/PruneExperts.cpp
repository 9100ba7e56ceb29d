//===- PruneExperts.cpp - removing rarely used MoE experts --------*- C++ -*-===//
//
// kiln-prune-experts: the experts of each mixture-of-experts layer that received
// the least routing mass on the calibration set leave the model — their router rows,
// their gate/up/down weights and their entries in expert_ids.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <cmath>
#include <numeric>

#include "dialects/kiln/KilnOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "passes/Passes.h"
#include "passes/Weights.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/FormatVariadic.h"

namespace kiln {

int64_t CountOrShare::of(int64_t total) const {
  if (count >= 0)
    return count;
  // 0.25 of 8 is 2, not 1 (0.25 * 8 may round below 2).
  return static_cast<int64_t>(std::floor(fraction * static_cast<double>(total) + 1e-9));
}

std::optional<CountOrShare> parseCountOrShare(llvm::StringRef text) {
  text = text.trim();
  CountOrShare p;
  if (text.empty())
    return std::nullopt;
  if (text.consume_back("%")) {
    double percent;
    if (text.getAsDouble(percent) || !(percent >= 0) || percent > 100)
      return std::nullopt;
    p.fraction = percent / 100;
    return p;
  }
  if (!text.contains('.') && !text.contains('e') && !text.contains('E')) {
    int64_t n;
    if (text.getAsInteger(10, n) || n < 0)
      return std::nullopt;
    p.count = n;
    return p;
  }
  double f;
  if (text.getAsDouble(f) || !(f >= 0) || f > 1)
    return std::nullopt;
  p.fraction = f;
  return p;
}

#define GEN_PASS_DEF_KILNPRUNEEXPERTS
#include "passes/Passes.h.inc"

namespace {

// kiln.routing of a router with `experts` rows, checked.
struct Routing {
  int64_t tokens = 0;
  llvm::SmallVector<int64_t> selected;
  llvm::SmallVector<double> mass;
};

mlir::FailureOr<Routing> readRouting(WeightOp router, int64_t experts) {
  auto dict = router->getAttrOfType<mlir::DictionaryAttr>("kiln.routing");
  if (!dict)
    return router.emitError("kiln-prune-experts: router ")
           << router.getSymName()
           << " has no routing statistics (kiln.routing, measured by calibration: kiln-compile "
              "--prune-experts runs it)";
  auto tokens = dict.getAs<mlir::IntegerAttr>("tokens");
  auto selected = dict.getAs<mlir::DenseI64ArrayAttr>("selected");
  auto mass = dict.getAs<mlir::DenseF64ArrayAttr>("mass");
  if (!tokens || !selected || !mass)
    return router.emitError("kiln-prune-experts: kiln.routing of ")
           << router.getSymName() << " needs tokens (integer), selected (array<i64>) and mass (array<f64>)";
  if (static_cast<int64_t>(selected.size()) != experts || static_cast<int64_t>(mass.size()) != experts)
    return router.emitError("kiln-prune-experts: kiln.routing of ")
           << router.getSymName() << " has " << selected.size() << " selections and " << mass.size()
           << " masses for " << experts << " experts";
  Routing r;
  r.tokens = tokens.getInt();
  r.selected.assign(selected.asArrayRef().begin(), selected.asArrayRef().end());
  r.mass.assign(mass.asArrayRef().begin(), mass.asArrayRef().end());
  return r;
}

// The rows `keep` (ascending) of `router`'s expression: one slice per run of
// consecutive rows, concatenated when there are several.
mlir::Attribute keptRows(WeightOp router, llvm::ArrayRef<int64_t> keep) {
  mlir::MLIRContext* ctx = router.getContext();
  mlir::Attribute whole = exprOperand(router);
  int64_t cols = router.getTensorType().getDimSize(1);
  llvm::SmallVector<mlir::Attribute> runs;
  for (size_t i = 0; i < keep.size();) {
    size_t j = i + 1;
    while (j < keep.size() && keep[j] == keep[j - 1] + 1)
      ++j;
    runs.push_back(SliceAttr::get(ctx, whole, {keep[i], 0}, {static_cast<int64_t>(j - i), cols}));
    i = j;
  }
  return runs.size() == 1 ? runs[0] : ConcatAttr::get(ctx, 0, runs);
}

std::string percent(double part, double whole) {
  return llvm::formatv("{0:F1}%", whole > 0 ? 100.0 * part / whole : 0.0).str();
}

struct PruneExpertsPass : impl::KilnPruneExpertsBase<PruneExpertsPass> {
  using KilnPruneExpertsBase::KilnPruneExpertsBase;

  void runOnOperation() override {
    mlir::ModuleOp module = getOperation();
    parsed = parseCountOrShare(prune);
    if (!parsed) {
      module.emitError("kiln-prune-experts: prune must be a count (2), a fraction (0.25) or a percentage (25%), got '")
          << prune << "'";
      return signalPassFailure();
    }
    // The MoE ops of every stage, by the router they read (prefill and decode share it).
    llvm::MapVector<WeightOp, llvm::SmallVector<MoeOp>> byRouter;
    module.walk([&](MoeOp m) { byRouter[weightOf(m.getRouter())].push_back(m); });
    for (auto& [router, ops] : byRouter)
      if (!router || mlir::failed(pruneLayer(module, router, ops)))
        return signalPassFailure();
    eraseDeadWeightRefs(module);
    eraseUnreadWeights(module);
  }

  mlir::LogicalResult pruneLayer(mlir::ModuleOp module, WeightOp router, llvm::ArrayRef<MoeOp> ops) {
    MoeOp first = ops.front();
    const int64_t experts = static_cast<int64_t>(first.getGate().size());
    for (MoeOp m : ops)
      if (m.getExpertIds() != first.getExpertIds() || m.getTopK() != first.getTopK())
        return m.emitOpError("kiln-prune-experts: reads router ")
               << router.getSymName() << " with other experts or another top_k than " << first->getLoc();
    const int64_t remove = parsed->of(experts);
    if (remove == 0)
      return mlir::success();
    if (!first.getNormalizeTopK()) {
      router.emitRemark("kiln-prune-experts: ")
          << router.getSymName()
          << " not pruned: its routing weights are not renormalised over the chosen experts, so removing one "
             "would change the others'";
      return mlir::success();
    }
    if (experts - remove < static_cast<int64_t>(first.getTopK()))
      return router.emitError("kiln-prune-experts: pruning ")
             << remove << " of the " << experts << " experts of " << router.getSymName() << " leaves fewer than top_k = "
             << first.getTopK();
    mlir::FailureOr<Routing> routing = readRouting(router, experts);
    if (mlir::failed(routing))
      return mlir::failure();

    // The least mass goes first; ties: fewer selections, then the later expert.
    llvm::SmallVector<int64_t> order(experts);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      if (routing->mass[a] != routing->mass[b])
        return routing->mass[a] < routing->mass[b];
      if (routing->selected[a] != routing->selected[b])
        return routing->selected[a] < routing->selected[b];
      return a > b;
    });
    llvm::SmallVector<bool> pruned(experts, false);
    for (int64_t i = 0; i < remove; ++i)
      pruned[order[i]] = true;
    llvm::SmallVector<int64_t> keep;
    for (int64_t e = 0; e < experts; ++e)
      if (!pruned[e])
        keep.push_back(e);

    // The report's record and the remark, in expert order.
    mlir::Builder b(module.getContext());
    llvm::ArrayRef<int64_t> ids = first.getExpertIds();
    llvm::SmallVector<int64_t> goneIds, goneSelected;
    llvm::SmallVector<double> goneMass;
    double totalMass = 0;
    for (double m : routing->mass)
      totalMass += m;
    std::string what;
    for (int64_t e = 0; e < experts; ++e) {
      if (!pruned[e])
        continue;
      goneIds.push_back(ids[e]);
      goneSelected.push_back(routing->selected[e]);
      goneMass.push_back(routing->mass[e]);
      what += llvm::formatv("{0}expert {1} (selected by {2} of {3} tokens, {4} of the gate mass)",
                            what.empty() ? "" : ", ", ids[e], routing->selected[e], routing->tokens,
                            percent(routing->mass[e], totalMass))
                  .str();
    }
    if (auto before = router->getAttrOfType<mlir::DictionaryAttr>("kiln.pruned_experts")) {
      // Pruned twice: the record lists both rounds.
      auto oldIds = before.getAs<mlir::DenseI64ArrayAttr>("expert_ids");
      auto oldSel = before.getAs<mlir::DenseI64ArrayAttr>("selected");
      auto oldMass = before.getAs<mlir::DenseF64ArrayAttr>("mass");
      if (oldIds && oldSel && oldMass) {
        goneIds.insert(goneIds.begin(), oldIds.asArrayRef().begin(), oldIds.asArrayRef().end());
        goneSelected.insert(goneSelected.begin(), oldSel.asArrayRef().begin(), oldSel.asArrayRef().end());
        goneMass.insert(goneMass.begin(), oldMass.asArrayRef().begin(), oldMass.asArrayRef().end());
      }
    }
    router->setAttr("kiln.pruned_experts",
                    b.getDictionaryAttr({b.getNamedAttr("expert_ids", b.getDenseI64ArrayAttr(goneIds)),
                                         b.getNamedAttr("selected", b.getDenseI64ArrayAttr(goneSelected)),
                                         b.getNamedAttr("mass", b.getDenseF64ArrayAttr(goneMass)),
                                         b.getNamedAttr("tokens", b.getI64IntegerAttr(routing->tokens))}));
    // The remark's location names the router.
    router.emitRemark("kiln-prune-experts: pruned ") << what << "; kept " << keep.size() << " of " << experts;

    // The router keeps the kept experts' rows; its statistics follow them.
    llvm::SmallVector<int64_t> keptIds, keptSelected;
    llvm::SmallVector<double> keptMass;
    for (int64_t e : keep) {
      keptIds.push_back(ids[e]);
      keptSelected.push_back(routing->selected[e]);
      keptMass.push_back(routing->mass[e]);
    }
    auto oldType = router.getTensorType();
    auto newType = mlir::RankedTensorType::get({static_cast<int64_t>(keep.size()), oldType.getDimSize(1)},
                                               oldType.getElementType());
    router.setSourceAttr(llvm::cast<WeightExprAttrInterface>(keptRows(router, keep)));
    router.setTypeAttr(mlir::TypeAttr::get(newType));
    router->setAttr("kiln.routing",
                    b.getDictionaryAttr({b.getNamedAttr("tokens", b.getI64IntegerAttr(routing->tokens)),
                                         b.getNamedAttr("selected", b.getDenseI64ArrayAttr(keptSelected)),
                                         b.getNamedAttr("mass", b.getDenseF64ArrayAttr(keptMass))}));
    module.walk([&](WeightRefOp r) {
      if (r.getName() == router.getSymName())
        r.getResult().setType(newType);
    });

    for (MoeOp m : ops) {
      llvm::SmallVector<mlir::Value> gate, up, down;
      for (int64_t e : keep) {
        gate.push_back(m.getGate()[e]);
        up.push_back(m.getUp()[e]);
        down.push_back(m.getDown()[e]);
      }
      mlir::OpBuilder ob(m);
      auto replacement = ob.create<MoeOp>(m.getLoc(), m.getType(), m.getInput(), m.getResidual(), m.getRouter(),
                                          gate, up, down, m.getTopKAttr(), m.getNormalizeTopKAttr(),
                                          m.getActivationAttr(), ob.getDenseI64ArrayAttr(keptIds));
      replacement->setDiscardableAttrs(m->getDiscardableAttrDictionary());
      m.replaceAllUsesWith(replacement.getResult());
      m.erase();
    }
    return mlir::success();
  }

  std::optional<CountOrShare> parsed;  // `prune`
};

} // namespace
} // namespace kiln
