//===- AssignPrecision.cpp - per-weight encodings under a budget -*- C++ -*-===//
#include <algorithm>
#include <cmath>
#include <limits>

#include "dialects/kiln/KilnOps.h"
#include "formats/encoding.h"
#include "passes/Encoding.h"
#include "passes/OpTable.h"
#include "formats/byte_size.h"
#include "passes/Passes.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Regex.h"

namespace kiln {

// "1.2GB", "800MB", "512MiB", "123456" -> bytes (formats/byte_size.h).
std::optional<uint64_t> parseByteSize(llvm::StringRef text) { return format::ParseByteSize(text.str()); }

#define GEN_PASS_DEF_KILNASSIGNPRECISION
#include "passes/Passes.h.inc"

namespace {

struct Choice {
  EncodingAttr encoding;
  uint64_t bytes;
  double sensitivity;
};

struct Item {
  WeightOp op;
  uint64_t params;
  std::vector<Choice> choices; // bytes strictly decreasing after pruning
  size_t chosen = 0;
  bool forced = false;         // fixed by a --precision override
};

uint64_t bytesOf(WeightOp w, EncodingAttr e) {
  auto type = w.getTensorType();
  uint64_t rows = static_cast<uint64_t>(type.getDimSize(0));
  uint64_t cols = rows ? static_cast<uint64_t>(type.getNumElements()) / rows : 0;
  return storageBytes(e, rows, cols);
}

std::string human(uint64_t bytes) {
  if (bytes >= 10'000'000)
    return llvm::formatv("{0:F1} MB", bytes / 1e6).str();
  if (bytes >= 10'000)
    return llvm::formatv("{0:F1} KB", bytes / 1e3).str();
  return std::to_string(bytes) + " bytes";
}


// Whether every op that reads `w` has kernels for quantised weights: the matrices
// of linear layers, the LM head, gated MLPs, MoE experts (not the router),
// embedding tables and patch embeddings. Norms, biases, position tables and
// class embeddings stay float.
bool quantizable(WeightOp w, llvm::DenseMap<mlir::Operation*, bool>& memo) {
  auto it = memo.find(w);
  if (it != memo.end())
    return it->second;
  bool ok = w.getTensorType().getRank() >= 2;
  bool used = false;
  mlir::ModuleOp module = w->getParentOfType<mlir::ModuleOp>();
  module.walk([&](WeightRefOp ref) {
    if (!ok || ref.getName() != w.getSymName())
      return;
    for (mlir::OpOperand& use : ref->getUses()) {
      used = true;
      ok &= isQuantizableWeightOperand(use.getOwner(), use.getOperandNumber());
    }
  });
  memo[w] = ok && used;
  return ok && used;
}

struct AssignPrecisionPass : impl::KilnAssignPrecisionBase<AssignPrecisionPass> {
  using KilnAssignPrecisionBase::KilnAssignPrecisionBase;

  void runOnOperation() override {
    mlir::ModuleOp module = getOperation();
    mlir::MLIRContext* ctx = module.getContext();

    // Overrides.
    struct Override {
      llvm::Regex regex;
      std::string pattern;
      EncodingAttr encoding;
      size_t uses = 0;  // weights it decided
    };
    std::vector<Override> overrides;
    overrides.reserve(precision.size());
    for (const std::string& o : precision) {
      auto [pattern, label] = llvm::StringRef(o).rsplit('=');
      std::string error;
      if (label.empty() || pattern.empty()) {
        module.emitError("kiln-assign-precision: override '") << o << "' is not REGEX=ENCODING";
        return signalPassFailure();
      }
      EncodingAttr enc = EncodingAttr::fromLabel(ctx, label, &error);
      if (!enc) {
        module.emitError("kiln-assign-precision: override '") << o << "': " << error;
        return signalPassFailure();
      }
      llvm::Regex regex(("^(" + pattern + ")$").str());
      if (!regex.isValid(error)) {
        module.emitError("kiln-assign-precision: override '") << o << "': invalid regex: " << error;
        return signalPassFailure();
      }
      overrides.push_back({std::move(regex), pattern.str(), enc});
    }

    std::vector<Item> items;
    uint64_t totalParams = 0;
    llvm::DenseMap<mlir::Operation*, bool> memo;
    for (WeightOp w : module.getOps<WeightOp>()) {
      Item item;
      item.op = w;
      item.params = static_cast<uint64_t>(w.getTensorType().getNumElements());
      totalParams += item.params;
      // Overrides to a quantised encoding apply to the weights kernels can read
      // quantised (matrices of matrix products and lookups); the rest (norms,
      // biases, position tables) stay as they are, as llama.cpp keeps them.
      Override* forced = nullptr;
      bool canQuantize = !overrides.empty() && quantizable(w, memo);
      for (Override& o : overrides)
        if (o.regex.match(w.getSymName()) && (canQuantize || !format::IsQuantized(encodingSpec(o.encoding).id))) {
          forced = &o;
          break;
        }
      if (forced) {
        ++forced->uses;
        EncodingAttr enc = forced->encoding;
        uint64_t bytes = bytesOf(w, enc);
        if (bytes == 0) {
          // int4 groups must divide the input dimension: try smaller groups, then
          // int8 (as llama.cpp falls back for rows its type cannot hold).
          for (int64_t g : {64, 32}) {
            if (g >= enc.getGroupSize())
              continue;
            EncodingAttr smaller = EncodingAttr::get(ctx, enc.getKind(), g, enc.getSymmetric(), enc.getActivation());
            if (bytesOf(w, smaller) > 0) {
              enc = smaller;
              break;
            }
          }
          if (bytesOf(w, enc) == 0)
            enc = EncodingAttr::get(ctx, EncodingKind::int8, 0, true, enc.getActivation());
          w.emitWarning() << forced->encoding.getLabel() << " cannot hold its input dimension "
                          << w.getTensorType().getNumElements() / w.getTensorType().getDimSize(0)
                          << " (--precision '" << forced->pattern << "=" << forced->encoding.getLabel()
                          << "'): stored as " << enc.getLabel();
          bytes = bytesOf(w, enc);
        }
        auto dict = w->getAttrOfType<mlir::DictionaryAttr>("kiln.sensitivity");
        double sens = std::numeric_limits<double>::quiet_NaN();
        if (dict)
          if (auto f = dict.getAs<mlir::FloatAttr>(enc.getLabel()))
            sens = f.getValueAsDouble();
        item.choices.push_back({enc, bytes, sens});
        item.forced = true;
        items.push_back(std::move(item));
        continue;
      }
      // The checkpoint's encoding is exact.
      item.choices.push_back({w.getEncoding(), bytesOf(w, w.getEncoding()), 0.0});
      if (auto dict = w->getAttrOfType<mlir::DictionaryAttr>("kiln.sensitivity")) {
        for (mlir::NamedAttribute na : dict) {
          std::string error;
          EncodingAttr enc = EncodingAttr::fromLabel(ctx, na.getName().getValue(), &error);
          auto f = llvm::dyn_cast<mlir::FloatAttr>(na.getValue());
          if (!enc || !f) {
            w.emitOpError("kiln.sensitivity: ") << (enc ? "expected a float" : error);
            return signalPassFailure();
          }
          uint64_t bytes = bytesOf(w, enc);
          if (bytes > 0)
            item.choices.push_back({enc, bytes, f.getValueAsDouble()});
        }
      }
      // Keep only choices that no other choice beats in both bytes and sensitivity.
      std::sort(item.choices.begin(), item.choices.end(), [](const Choice& a, const Choice& b) {
        return a.bytes != b.bytes ? a.bytes > b.bytes : a.sensitivity < b.sensitivity;
      });
      std::vector<Choice> frontier;
      for (const Choice& c : item.choices) {
        bool dominated = false;
        for (const Choice& f : frontier)
          dominated |= f.sensitivity <= c.sensitivity && f.bytes <= c.bytes;
        if (!dominated) {
          while (!frontier.empty() && frontier.back().bytes >= c.bytes && frontier.back().sensitivity >= c.sensitivity)
            frontier.pop_back();
          frontier.push_back(c);
        }
      }
      item.choices = std::move(frontier);
      items.push_back(std::move(item));
    }
    // An override that decided no weight is almost always a typo or a search-style
    // regex (llama-quantize's --tensor-type searches; these match whole names).
    for (const Override& o : overrides)
      if (o.uses == 0)
        module.emitWarning() << "--precision '" << o.pattern << "=" << o.encoding.getLabel()
                             << "' matches no weight it applies to: the regex must match a whole weight name "
                                "(e.g. 'model.layers.*mlp.*'; kiln-compile --emit=ir lists them), the first "
                                "matching override decides, and quantised encodings apply only to the weights "
                                "of matrix products and lookups";
    if (items.empty())
      return;

    // The budget.
    std::optional<uint64_t> budget;
    if (!memoryBudget.empty()) {
      budget = parseByteSize(memoryBudget);
      if (!budget) {
        module.emitError("kiln-assign-precision: memory budget '")
            << memoryBudget << "' is not a size (e.g. 1.2GB, 800MB, 512MiB)";
        return signalPassFailure();
      }
    } else if (bitsPerWeight > 0) {
      budget = static_cast<uint64_t>(bitsPerWeight * static_cast<double>(totalParams) / 8.0);
    }

    auto total = [&]() {
      uint64_t t = 0;
      for (const Item& it : items)
        t += it.choices[it.chosen].bytes;
      return t;
    };
    auto cost = [](const Choice& c) { return std::isnan(c.sensitivity) ? 0.0 : c.sensitivity; };

    if (budget) {
      uint64_t smallest = 0;
      for (Item& it : items) {
        size_t best = 0;
        for (size_t i = 1; i < it.choices.size(); ++i)
          if (it.choices[i].bytes < it.choices[best].bytes)
            best = i;
        smallest += it.choices[best].bytes;
      }
      if (smallest > *budget) {
        module.emitError("kiln-assign-precision: the memory budget of ")
            << human(*budget) << " cannot be met: the smallest encodings the weights allow need "
            << human(smallest) << " (" << smallest << " bytes, "
            << llvm::formatv("{0:F2}", 8.0 * smallest / totalParams).str()
            << " bits per weight); give --memory-budget=" << smallest << " or more";
        return signalPassFailure();
      }
      // Lagrangian relaxation: each weight minimises sensitivity + lambda * bytes;
      // the smallest lambda that meets the budget.
      auto pick = [&](double lambda) {
        for (Item& it : items) {
          size_t best = 0;
          double bestCost = std::numeric_limits<double>::infinity();
          for (size_t i = 0; i < it.choices.size(); ++i) {
            double c = cost(it.choices[i]) + lambda * static_cast<double>(it.choices[i].bytes);
            if (c < bestCost || (c == bestCost && it.choices[i].bytes < it.choices[best].bytes)) {
              bestCost = c;
              best = i;
            }
          }
          it.chosen = best;
        }
      };
      double lo = 0.0, hi = 1e-12;
      pick(0.0);
      if (total() > *budget) {
        pick(hi);
        while (total() > *budget && hi < 1e12) {
          hi *= 4;
          pick(hi);
        }
        for (int iter = 0; iter < 100; ++iter) {
          double mid = 0.5 * (lo + hi);
          pick(mid);
          if (total() > *budget)
            lo = mid;
          else
            hi = mid;
        }
        pick(hi);
      }
      // Spend what is left: the upgrades with the best sensitivity saved per byte.
      for (;;) {
        uint64_t used = total();
        double bestGain = 0.0;
        Item* bestItem = nullptr;
        size_t bestChoice = 0;
        for (Item& it : items) {
          const Choice& cur = it.choices[it.chosen];
          for (size_t i = 0; i < it.choices.size(); ++i) {
            const Choice& c = it.choices[i];
            if (c.bytes <= cur.bytes || used - cur.bytes + c.bytes > *budget)
              continue;
            double gain = (cost(cur) - cost(c)) / static_cast<double>(c.bytes - cur.bytes);
            if (gain > bestGain) {
              bestGain = gain;
              bestItem = &it;
              bestChoice = i;
            }
          }
        }
        if (!bestItem)
          break;
        bestItem->chosen = bestChoice;
      }
    } else {
      // No budget: only the overrides change encodings.
      std::vector<Item> forcedItems;
      for (Item& it : items)
        if (it.forced)
          forcedItems.push_back(std::move(it));
      items = std::move(forcedItems);
      if (items.empty())
        return;
    }

    double sensitivity = 0;
    uint64_t before = 0;
    for (Item& it : items) {
      const Choice& c = it.choices[it.chosen];
      uint64_t was = bytesOf(it.op, it.op.getEncoding());
      before += was;
      sensitivity += cost(c);
      if (c.encoding != it.op.getEncoding() || it.choices.size() > 1) {
        auto diag = it.op.emitRemark() << c.encoding.getLabel() << ": " << human(was) << " -> "
                                       << human(c.bytes);
        if (!std::isnan(c.sensitivity))
          diag << ", sensitivity " << llvm::formatv("{0:E2}", c.sensitivity).str();
      }
      it.op.setEncodingAttr(c.encoding);
    }
    uint64_t after = total();
    module.emitRemark() << "precision: " << items.size() << " weights, " << human(before) << " -> "
                        << human(after) << " ("
                        << llvm::formatv("{0:F2}", 8.0 * after / totalParams).str()
                        << " bits per weight), total sensitivity "
                        << llvm::formatv("{0:E2}", sensitivity).str()
                        << (budget ? ", budget " + human(*budget) : std::string());
  }
};

} // namespace
} // namespace kiln
