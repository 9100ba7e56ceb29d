//===- Report.cpp - the precision report -------------------------*- C++ -*-===//
#include "compiler/pipelines/Report.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "dialects/kiln/KilnOps.h"
#include "formats/encoding.h"
#include "passes/Encoding.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

namespace kiln {
namespace {

uint64_t bytesOf(WeightOp w, EncodingAttr e) {
  auto type = w.getTensorType();
  uint64_t rows = static_cast<uint64_t>(type.getDimSize(0));
  uint64_t cols = rows ? static_cast<uint64_t>(type.getNumElements()) / rows : 0;
  return storageBytes(e, rows, cols);
}

struct Row {
  std::string name, stage, encoding, sourceEncoding;
  std::vector<int64_t> shape;
  uint64_t params = 0, bytes = 0, sourceBytes = 0;
  double sensitivity = NAN;
  std::map<std::string, std::pair<uint64_t, double>> candidates;
};

// A fixed colour per encoding family, light to dark with fewer bits.
const char* colorOf(llvm::StringRef label) {
  if (label == "f32") return "#9e9e9e";
  if (label == "f16" || label == "bf16") return "#4e79a7";
  if (label.starts_with("fp8")) return "#59a14f";
  if (label.starts_with("int8")) return "#f28e2b";
  if (label.starts_with("int4") && label.contains("asym")) return "#b07aa1";
  if (label.starts_with("int4")) return "#e15759";
  return "#333333";
}

std::string escape(llvm::StringRef s) {
  std::string out;
  for (char c : s)
    out += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  return out;
}

void writeSvg(llvm::raw_ostream& os, const std::vector<Row>& rows, llvm::StringRef title, llvm::StringRef subtitle) {
  const int rowH = 14, top = 70, nameW = 430, barX = nameW + 10, barW = 330, sensX = barX + barW + 90, sensW = 260;
  const int width = sensX + sensW + 30;
  int stages = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    stages += i == 0 || rows[i].stage != rows[i - 1].stage;
  const int height = top + rowH * static_cast<int>(rows.size() + stages) + 60;
  uint64_t maxBytes = 1;
  double minS = 1e-9, maxS = 1e-1;
  for (const Row& r : rows) {
    maxBytes = std::max(maxBytes, std::max(r.bytes, r.sourceBytes));
    if (r.sensitivity > 0) {
      minS = std::min(minS, r.sensitivity);
      maxS = std::max(maxS, r.sensitivity);
    }
  }
  double lmin = std::floor(std::log10(minS)), lmax = std::ceil(std::log10(maxS));
  auto sx = [&](double s) {
    double l = s > 0 ? std::log10(s) : lmin;
    return sensX + (l - lmin) / (lmax - lmin) * sensW;
  };
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
     << "\" font-family=\"monospace\" font-size=\"11\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  os << "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">" << escape(title) << "</text>\n";
  os << "<text x=\"10\" y=\"38\">" << escape(subtitle) << "</text>\n";
  os << "<text x=\"" << barX << "\" y=\"" << top - 8 << "\">bytes (grey: checkpoint, colour: stored)</text>\n";
  os << "<text x=\"" << sensX << "\" y=\"" << top - 8 << "\">sensitivity (mean KL, log scale)</text>\n";
  for (double l = lmin; l <= lmax; l += 1) {
    double x = sx(std::pow(10.0, l));
    os << "<line x1=\"" << x << "\" y1=\"" << top - 4 << "\" x2=\"" << x << "\" y2=\"" << height - 50
       << "\" stroke=\"#eeeeee\"/>\n<text x=\"" << x - 12 << "\" y=\"" << height - 38 << "\" fill=\"#777\">1e"
       << static_cast<int>(l) << "</text>\n";
  }
  std::string stage;
  int line = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (r.stage != stage) {
      // A header row per stage.
      stage = r.stage;
      int hy = top + rowH * line++;
      os << "<line x1=\"0\" y1=\"" << hy << "\" x2=\"" << width << "\" y2=\"" << hy << "\" stroke=\"#bbbbbb\"/>\n";
      os << "<text x=\"4\" y=\"" << hy + 11 << "\" font-weight=\"bold\" fill=\"#555\">" << escape(stage)
         << "</text>\n";
    }
    int y = top + rowH * line++;
    std::string name = r.name.size() > 60 ? "…" + r.name.substr(r.name.size() - 59) : r.name;
    os << "<text x=\"16\" y=\"" << y + 11 << "\">" << escape(name) << "</text>\n";
    double srcW = static_cast<double>(r.sourceBytes) / maxBytes * barW;
    double w = static_cast<double>(r.bytes) / maxBytes * barW;
    os << "<rect x=\"" << barX << "\" y=\"" << y + 2 << "\" width=\"" << srcW << "\" height=\"" << rowH - 4
       << "\" fill=\"#e0e0e0\"/>\n";
    os << "<rect x=\"" << barX << "\" y=\"" << y + 2 << "\" width=\"" << w << "\" height=\"" << rowH - 4
       << "\" fill=\"" << colorOf(r.encoding) << "\"><title>" << escape(r.name) << ": " << r.encoding << ", "
       << r.bytes << " bytes</title></rect>\n";
    os << "<text x=\"" << barX + barW + 6 << "\" y=\"" << y + 11 << "\" fill=\"" << colorOf(r.encoding) << "\">"
       << escape(r.encoding) << "</text>\n";
    for (const auto& [label, c] : r.candidates)
      if (c.second > 0)
        os << "<circle cx=\"" << sx(c.second) << "\" cy=\"" << y + 7 << "\" r=\"2\" fill=\"" << colorOf(label)
           << "\" opacity=\"0.35\"><title>" << label << ": " << c.second << "</title></circle>\n";
    if (r.sensitivity > 0)
      os << "<circle cx=\"" << sx(r.sensitivity) << "\" cy=\"" << y + 7 << "\" r=\"4\" fill=\""
         << colorOf(r.encoding) << "\" stroke=\"black\" stroke-width=\"0.5\"/>\n";
  }
  // Legend.
  const char* legend[] = {"f32", "bf16", "fp8_e4m3", "int8", "int4_g32", "int4_g32_asym"};
  int lx = 10;
  for (const char* l : legend) {
    os << "<rect x=\"" << lx << "\" y=\"" << height - 22 << "\" width=\"10\" height=\"10\" fill=\"" << colorOf(l)
       << "\"/><text x=\"" << lx + 14 << "\" y=\"" << height - 13 << "\">"
       << (llvm::StringRef(l) == "bf16" ? "f16/bf16" : l) << "</text>\n";
    lx += 110;
  }
  os << "<text x=\"" << lx << "\" y=\"" << height - 13
     << "\">large dot: chosen encoding; small dots: other candidates</text>\n";
  os << "</svg>\n";
}

} // namespace

mlir::LogicalResult writePrecisionReport(mlir::ModuleOp module, const CompileOptions& options,
                                         llvm::StringRef artifactPath, llvm::StringRef reportPath) {
  // The stage that first reads each weight.
  mlir::SymbolTable symbols(module);
  llvm::StringMap<std::string> stageOf;
  for (auto fn : module.getOps<mlir::func::FuncOp>())
    if (auto stage = fn->getAttrOfType<StageKindAttr>("kiln.stage"))
      fn.walk([&](WeightRefOp ref) {
        stageOf.try_emplace(ref.getName(), stringifyStageKind(stage.getValue()).str());
      });

  std::vector<Row> rows;
  uint64_t total = 0, source = 0, params = 0;
  double sensitivity = 0;
  for (WeightOp w : module.getOps<WeightOp>()) {
    auto it = stageOf.find(w.getSymName());
    if (it == stageOf.end())
      continue;
    Row r;
    r.name = w.getSymName().str();
    r.stage = it->second;
    r.shape.assign(w.getTensorType().getShape().begin(), w.getTensorType().getShape().end());
    r.params = static_cast<uint64_t>(w.getTensorType().getNumElements());
    r.encoding = w.getEncoding().getLabel();
    r.bytes = bytesOf(w, w.getEncoding());
    r.sourceBytes = w.getSourceBytes();  // every leaf of the weight's expression
    llvm::StringRef dtype = w.getSourceDtype();
    r.sourceEncoding = dtype == "F32" ? "f32" : dtype == "F16" ? "f16" : "bf16";
    if (r.encoding == r.sourceEncoding)
      r.sensitivity = 0.0;
    if (auto dict = w->getAttrOfType<mlir::DictionaryAttr>("kiln.sensitivity"))
      for (mlir::NamedAttribute na : dict) {
        std::string error;
        EncodingAttr enc = EncodingAttr::fromLabel(module.getContext(), na.getName().getValue(), &error);
        double s = llvm::cast<mlir::FloatAttr>(na.getValue()).getValueAsDouble();
        if (!enc)
          continue;
        r.candidates[na.getName().str()] = {bytesOf(w, enc), s};
        if (na.getName().getValue() == r.encoding)
          r.sensitivity = s;
      }
    total += r.bytes;
    source += r.sourceBytes;
    params += r.params;
    if (!std::isnan(r.sensitivity))
      sensitivity += r.sensitivity;
    rows.push_back(std::move(r));
  }

  llvm::json::Array weights;
  for (const Row& r : rows) {
    llvm::json::Object cands;
    for (const auto& [label, c] : r.candidates)
      cands[label] = llvm::json::Object{{"bytes", static_cast<int64_t>(c.first)}, {"sensitivity", c.second}};
    llvm::json::Array shape;
    for (int64_t d : r.shape)
      shape.push_back(d);
    weights.push_back(llvm::json::Object{
        {"name", r.name},
        {"stage", r.stage},
        {"shape", std::move(shape)},
        {"parameters", static_cast<int64_t>(r.params)},
        {"source_encoding", r.sourceEncoding},
        {"encoding", r.encoding},
        {"source_bytes", static_cast<int64_t>(r.sourceBytes)},
        {"bytes", static_cast<int64_t>(r.bytes)},
        {"sensitivity", std::isnan(r.sensitivity) ? llvm::json::Value(nullptr) : llvm::json::Value(r.sensitivity)},
        {"candidates", std::move(cands)}});
  }
  // Experts kiln-prune-experts removed, by router, with their routing statistics; the
  // kept ones' ids are the expert_ids of the MoE ops that read the router.
  llvm::StringMap<llvm::ArrayRef<int64_t>> keptIdsOf;
  module.walk([&](MoeOp m) {
    if (auto ref = m.getRouter().getDefiningOp<WeightRefOp>())
      keptIdsOf[ref.getName()] = m.getExpertIds();
  });
  llvm::json::Array prunedExperts;
  // Where any layer merged, every pruned row says merged_into (null: removed), also in
  // a layer that merged none (both of a pair chosen, or no kept expert alike).
  bool anyMerged = false;
  for (WeightOp w : module.getOps<WeightOp>())
    if (auto pruned = w->getAttrOfType<mlir::DictionaryAttr>("kiln.pruned_experts"))
      anyMerged |= static_cast<bool>(pruned.get("merged_into"));
  for (WeightOp w : module.getOps<WeightOp>()) {
    auto pruned = w->getAttrOfType<mlir::DictionaryAttr>("kiln.pruned_experts");
    if (!pruned)
      continue;  // the dialect verified its fields
    auto ids = pruned.getAs<mlir::DenseI64ArrayAttr>("expert_ids").asArrayRef();
    auto selected = pruned.getAs<mlir::DenseI64ArrayAttr>("selected").asArrayRef();
    auto mass = pruned.getAs<mlir::DenseF64ArrayAttr>("mass").asArrayRef();
    int64_t tokens = pruned.getAs<mlir::IntegerAttr>("tokens").getInt();
    auto mergedInto = pruned.getAs<mlir::DenseI64ArrayAttr>("merged_into");
    // One row per expert of `ids`, with its statistics (and, merged, the expert its
    // weights went into; null: removed).
    auto rows = [&](llvm::ArrayRef<int64_t> ids, llvm::ArrayRef<int64_t> selected, llvm::ArrayRef<double> mass,
                    llvm::ArrayRef<int64_t> into, bool withMerged) {
      llvm::json::Array out;
      for (size_t i = 0; i < ids.size() && i < selected.size() && i < mass.size(); ++i) {
        llvm::json::Object row{{"expert", ids[i]},
                               {"selected", selected[i]},
                               {"selection_share", tokens > 0 ? static_cast<double>(selected[i]) / tokens : 0.0},
                               {"mass", mass[i]}};
        if (withMerged)
          row["merged_into"] = i < into.size() && into[i] >= 0 ? llvm::json::Value(into[i]) : llvm::json::Value(nullptr);
        out.push_back(std::move(row));
      }
      return out;
    };
    llvm::json::Array experts =
        rows(ids, selected, mass, mergedInto ? mergedInto.asArrayRef() : llvm::ArrayRef<int64_t>(), anyMerged);
    // The kept experts' statistics: kiln.routing follows the kept rows.
    llvm::json::Array kept;
    if (auto routing = w->getAttrOfType<mlir::DictionaryAttr>("kiln.routing"))
      kept = rows(keptIdsOf.lookup(w.getSymName()), routing.getAs<mlir::DenseI64ArrayAttr>("selected").asArrayRef(),
                  routing.getAs<mlir::DenseF64ArrayAttr>("mass").asArrayRef(), {}, false);
    // Merged experts keep their router rows (and statistics): not listed as kept.
    if (mergedInto) {
      llvm::json::Array only;
      for (llvm::json::Value& row : kept)
        if (auto e = row.getAsObject()->getInteger("expert"); !e || !llvm::is_contained(ids, *e))
          only.push_back(std::move(row));
      kept = std::move(only);
    }
    // Merged experts keep their router rows: the rows less those merged.
    int64_t keptCount = w.getTensorType().getDimSize(0);
    if (mergedInto)
      for (int64_t t : mergedInto.asArrayRef())
        keptCount -= t >= 0 ? 1 : 0;
    prunedExperts.push_back(llvm::json::Object{{"router", w.getSymName().str()},
                                               {"calibration_tokens", tokens},
                                               {"kept", keptCount},
                                               {"pruned", std::move(experts)},
                                               {"kept_experts", std::move(kept)}});
  }
  auto arch = module->getAttrOfType<mlir::StringAttr>("kiln.architecture");
  llvm::json::Object root{
      {"architecture", arch ? arch.str() : ""},
      {"checkpoint", options.checkpoint},
      {"artifact", artifactPath.str()},
      {"memory_budget", options.memoryBudget.empty() ? llvm::json::Value(nullptr) : llvm::json::Value(options.memoryBudget)},
      {"bits_per_weight_target", options.bitsPerWeight > 0 ? llvm::json::Value(options.bitsPerWeight) : llvm::json::Value(nullptr)},
      {"quantizer", usesGptq(options) ? "gptq" : "rtn"},
      {"parameters", static_cast<int64_t>(params)},
      {"source_bytes", static_cast<int64_t>(source)},
      {"bytes", static_cast<int64_t>(total)},
      {"bits_per_weight", params ? 8.0 * static_cast<double>(total) / static_cast<double>(params) : 0.0},
      {"total_sensitivity", sensitivity},
      {"pruned_experts", std::move(prunedExperts)},
      {"weights", std::move(weights)}};

  std::error_code ec;
  llvm::raw_fd_ostream json(reportPath, ec);
  if (ec)
    return module.emitError() << "cannot write the report '" << reportPath << "': " << ec.message();
  json << llvm::formatv("{0:2}", llvm::json::Value(std::move(root))) << "\n";

  llvm::SmallString<256> svgPath(reportPath);
  llvm::sys::path::replace_extension(svgPath, "svg");
  llvm::raw_fd_ostream svg(svgPath, ec);
  if (ec)
    return module.emitError() << "cannot write the chart '" << svgPath << "': " << ec.message();
  std::string subtitle = llvm::formatv("{0} weights: {1:F2} MB -> {2:F2} MB ({3:F2} bits per weight), total "
                                       "sensitivity {4:E2}{5}",
                                       rows.size(), source / 1e6, total / 1e6, params ? 8.0 * total / params : 0.0,
                                       sensitivity,
                                       options.memoryBudget.empty() ? std::string()
                                                                    : ", budget " + options.memoryBudget)
                             .str();
  writeSvg(svg, rows, "Kiln precision: " + (arch ? arch.str() : std::string("model")), subtitle);
  return mlir::success();
}

} // namespace kiln
