//===- PruneExperts.cpp - removing rarely used MoE experts --------*- C++ -*-===//
//
// kiln-prune-experts: the experts of each mixture-of-experts layer that received
// the least routing mass on the calibration set leave the model — their router rows,
// their gate/up/down weights and their entries in expert_ids — or, with `merge`, are
// merged into the kept expert whose weights are most similar.
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
  llvm::SmallVector<double> similarity;  // experts x experts, when measured
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
  if (auto sim = dict.getAs<mlir::DenseF64ArrayAttr>("similarity"))
    r.similarity.assign(sim.asArrayRef().begin(), sim.asArrayRef().end());
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
    if (!first.getNormalizeTopK() && !merge) {
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
    if (merge) {
      for (int64_t e = 0; e < experts; ++e)
        for (int64_t f = 0; f < e; ++f)
          if (first.getGate()[e] == first.getGate()[f])
            return router.emitError("kiln-prune-experts: the experts of ")
                   << router.getSymName() << " were merged already (experts " << first.getExpertIds()[f] << " and "
                   << first.getExpertIds()[e] << " share their weights)";
      if (static_cast<int64_t>(routing->similarity.size()) != experts * experts)
        return router.emitError("kiln-prune-experts: merging the experts of ")
               << router.getSymName()
               << " needs their similarity (kiln.routing's similarity, measured by calibration: kiln-compile "
                  "--prune-experts-merge runs it)";
    }

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

    // merge: each pruned expert's nearest kept one (the highest cosine similarity of
    // their weights; ties: the lower expert).
    // An expert without a kept one at least `mergeMinSimilarity` alike is removed.
    llvm::SmallVector<int64_t> nearest(experts, -1), into(experts, -1);
    if (merge)
      for (int64_t e = 0; e < experts; ++e)
        if (pruned[e]) {
          for (int64_t k : keep)
            if (nearest[e] < 0 || routing->similarity[e * experts + k] > routing->similarity[e * experts + nearest[e]])
              nearest[e] = k;
          if (routing->similarity[e * experts + nearest[e]] >= mergeMinSimilarity)
            into[e] = nearest[e];
        }
    // Routing weights that are not renormalised: merging keeps every row (exact), but
    // an expert that cannot merge stays, as removing it would change the others'.
    if (merge && !first.getNormalizeTopK()) {
      for (int64_t e = 0; e < experts; ++e)
        if (pruned[e] && into[e] < 0)
          pruned[e] = false;
      keep.clear();
      for (int64_t e = 0; e < experts; ++e)
        if (!pruned[e])
          keep.push_back(e);
      if (static_cast<int64_t>(keep.size()) == experts) {
        router.emitRemark("kiln-prune-experts: ")
            << router.getSymName()
            << " not pruned: no chosen expert has a kept one alike enough to merge into, and its routing weights are "
               "not renormalised over the chosen experts, so removing one would change the others'";
        return mlir::success();
      }
    }

    // The report's record and the remark, in expert order.
    mlir::Builder b(module.getContext());
    llvm::ArrayRef<int64_t> ids = first.getExpertIds();
    llvm::SmallVector<int64_t> goneIds, goneSelected, goneInto;
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
      goneInto.push_back(into[e] >= 0 ? ids[into[e]] : -1);
      what += llvm::formatv("{0}expert {1} (selected by {2} of {3} tokens, {4} of the gate mass)",
                            what.empty() ? "" : ", ", ids[e], routing->selected[e], routing->tokens,
                            percent(routing->mass[e], totalMass))
                  .str();
      if (into[e] >= 0)
        what += llvm::formatv(" merged into expert {0} (cosine {1:F3})", ids[into[e]],
                              routing->similarity[e * experts + into[e]])
                    .str();
      else if (merge)
        what += llvm::formatv(" removed: the nearest kept expert, {0}, has cosine {1:F3} < {2}", ids[nearest[e]],
                              routing->similarity[e * experts + nearest[e]], static_cast<double>(mergeMinSimilarity))
                    .str();
    }
    bool anyMerged = llvm::any_of(into, [](int64_t k) { return k >= 0; });
    if (auto before = router->getAttrOfType<mlir::DictionaryAttr>("kiln.pruned_experts")) {
      // Pruned twice: the record lists both rounds.
      auto oldIds = before.getAs<mlir::DenseI64ArrayAttr>("expert_ids");
      auto oldSel = before.getAs<mlir::DenseI64ArrayAttr>("selected");
      auto oldMass = before.getAs<mlir::DenseF64ArrayAttr>("mass");
      auto oldInto = before.getAs<mlir::DenseI64ArrayAttr>("merged_into");
      if (oldIds && oldSel && oldMass) {
        goneIds.insert(goneIds.begin(), oldIds.asArrayRef().begin(), oldIds.asArrayRef().end());
        goneSelected.insert(goneSelected.begin(), oldSel.asArrayRef().begin(), oldSel.asArrayRef().end());
        goneMass.insert(goneMass.begin(), oldMass.asArrayRef().begin(), oldMass.asArrayRef().end());
        if (oldInto)
          goneInto.insert(goneInto.begin(), oldInto.asArrayRef().begin(), oldInto.asArrayRef().end());
        else
          goneInto.insert(goneInto.begin(), oldIds.size(), -1);
        anyMerged |= static_cast<bool>(oldInto);
      }
    }
    llvm::SmallVector<mlir::NamedAttribute> record = {
        b.getNamedAttr("expert_ids", b.getDenseI64ArrayAttr(goneIds)),
        b.getNamedAttr("selected", b.getDenseI64ArrayAttr(goneSelected)),
        b.getNamedAttr("mass", b.getDenseF64ArrayAttr(goneMass)),
        b.getNamedAttr("tokens", b.getI64IntegerAttr(routing->tokens))};
    if (anyMerged)
      record.push_back(b.getNamedAttr("merged_into", b.getDenseI64ArrayAttr(goneInto)));
    router->setAttr("kiln.pruned_experts", b.getDictionaryAttr(record));
    // The remark's location names the router.
    router.emitRemark("kiln-prune-experts: pruned ")
        << what << "; kept " << keep.size() << " of " << experts;
    if (merge && mlir::failed(mergeLayer(router, ops, into)))
      return mlir::failure();
    // The experts removed (not merged) lose their router rows and operands.
    keep.clear();
    for (int64_t e = 0; e < experts; ++e)
      if (!pruned[e] || into[e] >= 0)
        keep.push_back(e);
    if (static_cast<int64_t>(keep.size()) == experts)
      return mlir::success();

    // The router keeps the kept experts' rows; its statistics follow them.
    llvm::SmallVector<int64_t> keptIds, keptSelected;
    llvm::SmallVector<double> keptMass;
    for (int64_t e : keep) {
      keptIds.push_back(ids[e]);
      keptSelected.push_back(routing->selected[e]);
      keptMass.push_back(routing->mass[e]);
    }
    llvm::SmallVector<mlir::NamedAttribute> keptStats = {
        b.getNamedAttr("tokens", b.getI64IntegerAttr(routing->tokens)),
        b.getNamedAttr("selected", b.getDenseI64ArrayAttr(keptSelected)),
        b.getNamedAttr("mass", b.getDenseF64ArrayAttr(keptMass))};
    if (!routing->similarity.empty()) {
      llvm::SmallVector<double> sim;
      for (int64_t a : keep)
        for (int64_t c : keep)
          sim.push_back(routing->similarity[a * experts + c]);
      keptStats.push_back(b.getNamedAttr("similarity", b.getDenseF64ArrayAttr(sim)));
    }
    auto oldType = router.getTensorType();
    auto newType = mlir::RankedTensorType::get({static_cast<int64_t>(keep.size()), oldType.getDimSize(1)},
                                               oldType.getElementType());
    router.setSourceAttr(llvm::cast<WeightExprAttrInterface>(keptRows(router, keep)));
    router.setTypeAttr(mlir::TypeAttr::get(newType));
    router->setAttr("kiln.routing", b.getDictionaryAttr(keptStats));
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

  // Each kept expert k that others merge into gets, for gate, up and down, the mean
  // of its group's weights (#kiln.weighted_sum; the routing-mass-weighted mean was
  // measured worse on the demo: docs/pruning.md); the router keeps every row, and a
  // merged expert's row routes to k's weights. Top-k, its renormalisation and the
  // routing weights stay as they were: a token choosing k and an expert merged into
  // it gets k's weights with both routing weights.
  mlir::LogicalResult mergeLayer(WeightOp router, llvm::ArrayRef<MoeOp> ops, llvm::ArrayRef<int64_t> into) {
    MoeOp first = ops.front();
    const int64_t experts = static_cast<int64_t>(into.size());
    mlir::MLIRContext* ctx = router.getContext();
    for (int64_t k = 0; k < experts; ++k) {
      llvm::SmallVector<int64_t> group = {k};
      for (int64_t e = 0; e < experts; ++e)
        if (into[e] == k)
          group.push_back(e);
      if (group.size() == 1)
        continue;
      llvm::SmallVector<double> coeffs(group.size(), 1.0 / static_cast<double>(group.size()));
      for (mlir::OperandRange part : {first.getGate(), first.getUp(), first.getDown()}) {
        WeightOp wk = weightOf(part[k]);  // group[0]: checked below
        llvm::SmallVector<mlir::Attribute> operands;
        for (int64_t e : group) {
          WeightOp we = weightOf(part[e]);
          if (!we)
            return first.emitOpError("kiln-prune-experts: an expert weight of ")
                   << router.getSymName() << " is not a kiln.weight";
          operands.push_back(exprOperand(we));
        }
        wk.setSourceAttr(llvm::cast<WeightExprAttrInterface>(
            WeightedSumAttr::get(ctx, operands, mlir::DenseF64ArrayAttr::get(ctx, coeffs))));
      }
    }
    for (MoeOp m : ops) {
      llvm::SmallVector<mlir::Value> gate, up, down;
      for (int64_t e = 0; e < experts; ++e) {
        int64_t from = into[e] >= 0 ? into[e] : e;
        gate.push_back(m.getGate()[from]);
        up.push_back(m.getUp()[from]);
        down.push_back(m.getDown()[from]);
      }
      m.getGateMutable().assign(gate);
      m.getUpMutable().assign(up);
      m.getDownMutable().assign(down);
    }
    return mlir::success();
  }

  std::optional<CountOrShare> parsed;  // `prune`
};

} // namespace
} // namespace kiln
