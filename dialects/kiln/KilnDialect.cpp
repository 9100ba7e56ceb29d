//===- KilnDialect.cpp - kiln dialect ----------------------------*- C++ -*-===//
#include "dialects/kiln/KilnDialect.h"

#include <cmath>


#include "dialects/kiln/KilnAttrs.h"
#include "dialects/kiln/KilnOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

using namespace mlir;
using namespace kiln;

#include "dialects/kiln/KilnDialect.cpp.inc"

void KilnDialect::initialize() {
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "dialects/kiln/KilnOps.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Discardable attributes
//===----------------------------------------------------------------------===//

namespace {

LogicalResult requireModule(Operation* op, NamedAttribute attr) {
  if (!llvm::isa<ModuleOp>(op))
    return op->emitOpError("attribute '") << attr.getName().getValue() << "' belongs on the module";
  return success();
}

LogicalResult requireInt(Operation* op, NamedAttribute attr, int64_t min, int64_t multipleOf = 1) {
  auto i = llvm::dyn_cast<IntegerAttr>(attr.getValue());
  if (!i || !i.getType().isInteger(64))
    return op->emitOpError("attribute '") << attr.getName().getValue() << "' must be an i64 integer";
  if (i.getInt() < min || i.getInt() % multipleOf != 0)
    return op->emitOpError("attribute '") << attr.getName().getValue() << "' must be "
                                          << (multipleOf > 1 ? "a multiple of " + std::to_string(multipleOf) + " and "
                                                             : std::string())
                                          << "at least " << min << ", got " << i.getInt();
  return success();
}

LogicalResult requireString(Operation* op, NamedAttribute attr) {
  auto s = llvm::dyn_cast<StringAttr>(attr.getValue());
  if (!s || s.getValue().empty())
    return op->emitOpError("attribute '") << attr.getName().getValue() << "' must be a non-empty string";
  return success();
}

// Ops of a stage function (the attributes kernel selection and memory planning put
// on executable ops).
LogicalResult requireStageOp(Operation* op, NamedAttribute attr) {
  auto fn = op->getParentOfType<func::FuncOp>();
  if (!fn || !fn->hasAttr("kiln.stage") || op->getDialect() == nullptr ||
      op->getDialect()->getNamespace() != KilnDialect::getDialectNamespace())
    return op->emitOpError("attribute '") << attr.getName().getValue()
                                          << "' belongs on a kiln op inside a stage function";
  return success();
}

} // namespace

LogicalResult KilnDialect::verifyOperationAttribute(Operation* op, NamedAttribute attr) {
  llvm::StringRef name = attr.getName().getValue();
  auto unknown = [&] {
    return op->emitOpError("unknown attribute '")
           << attr.getName().getValue()
           << "' (kiln.* attributes: architecture, checkpoint, prompt_template, chat_template, text, image, "
              "preprocessor, generation, tokenizer, max_prefill_tokens, kv_cache, target, stage, arena_bytes, "
              "kernel, symbol, symbols, fused, offset, output, sensitivity, fused_from, routing, "
              "pruned_experts)";
  };
  if (!name.consume_front("kiln."))
    return unknown();
  if (name == "architecture" || name == "checkpoint")
    return failure(failed(requireModule(op, attr)) || failed(requireString(op, attr)));
  if (name == "prompt_template") {
    if (failed(requireModule(op, attr)))
      return failure();
    auto s = llvm::dyn_cast<StringAttr>(attr.getValue());
    if (!s || !llvm::is_contained(llvm::ArrayRef<llvm::StringRef>{"llava", "llava-chatml", "idefics3", "plain"},
                                  s.getValue()))
      return op->emitOpError("attribute 'kiln.prompt_template' must be one of llava, llava-chatml, idefics3, plain");
    return success();
  }
  // The chat template's pieces (compiler/importers/hf/ChatTemplate.h): the writer
  // checks their shape when it serializes them.
  if (name == "chat_template") {
    if (failed(requireModule(op, attr)))
      return failure();
    auto d = llvm::dyn_cast<DictionaryAttr>(attr.getValue());
    auto turns = d ? d.getAs<ArrayAttr>("turns") : ArrayAttr();
    if (!turns || turns.size() != 24)
      return op->emitOpError("attribute 'kiln.chat_template' must be a dictionary with 24 'turns'");
    return success();
  }
  // The module configuration: typed attributes whose own verifiers check the values.
  // `proto` (a null attribute) names the class the attribute must have.
  auto config = [&](auto proto) -> LogicalResult {
    using AttrT = decltype(proto);
    if (failed(requireModule(op, attr)))
      return failure();
    if (!llvm::isa<AttrT>(attr.getValue()))
      return op->emitOpError("attribute '") << attr.getName().getValue() << "' must be a #kiln."
                                            << AttrT::getMnemonic() << "<...>";
    return success();
  };
  if (name == "text")
    return config(TextConfigAttr());
  if (name == "image")
    return config(ImageConfigAttr());
  if (name == "preprocessor")
    return config(PreprocessorConfigAttr());
  if (name == "generation")
    return config(GenerationConfigAttr());
  if (name == "tokenizer")
    return config(TokenizerConfigAttr());
  if (name == "target")
    return config(TargetAttr());
  if (name == "kv_cache")
    return config(KvCacheAttr());
  if (name == "max_prefill_tokens")
    return failure(failed(requireModule(op, attr)) || failed(requireInt(op, attr, 1)));
  if (name == "stage") {
    if (!llvm::isa<func::FuncOp>(op) || !llvm::isa<StageKindAttr>(attr.getValue()))
      return op->emitOpError("attribute 'kiln.stage' must be a #kiln.stage<...> on a func.func");
    return success();
  }
  if (name == "arena_bytes") {
    if (!llvm::isa<func::FuncOp>(op) || !op->hasAttr("kiln.stage"))
      return op->emitOpError("attribute 'kiln.arena_bytes' belongs on a stage function");
    return requireInt(op, attr, 0);
  }
  if (name == "kernel" || name == "symbol")
    return failure(failed(requireStageOp(op, attr)) || failed(requireString(op, attr)));
  if (name == "offset")
    return failure(failed(requireStageOp(op, attr)) || failed(requireInt(op, attr, 0, 64)));
  if (name == "output")
    return failure(failed(requireStageOp(op, attr)) || failed(requireInt(op, attr, 0)));
  // Fusion: a fused op's further generated functions and the layers folded into it
  // (arrays of strings); a fused weight's parts (symbol references).
  if (name == "symbols" || name == "fused") {
    if (failed(requireStageOp(op, attr)))
      return failure();
    auto array = llvm::dyn_cast<ArrayAttr>(attr.getValue());
    if (!array || !llvm::all_of(array, [](Attribute a) { return llvm::isa<StringAttr>(a); }))
      return op->emitOpError("attribute 'kiln.") << name << "' must be an array of strings";
    return success();
  }
  if (name == "fused_from") {
    auto array = llvm::dyn_cast<ArrayAttr>(attr.getValue());
    if (!llvm::isa<WeightOp>(op) || !array ||
        !llvm::all_of(array, [](Attribute a) { return llvm::isa<FlatSymbolRefAttr>(a); }))
      return op->emitOpError("attribute 'kiln.fused_from' must be an array of weight symbols on a kiln.weight");
    return success();
  }
  // MoE routing statistics (calibration) and the record of pruned experts
  // (kiln-prune-experts), on a router weight: per-expert arrays of one length.
  if (name == "routing" || name == "pruned_experts") {
    auto dict = llvm::dyn_cast<DictionaryAttr>(attr.getValue());
    bool pruned = name == "pruned_experts";
    auto tokens = dict ? dict.getAs<IntegerAttr>("tokens") : IntegerAttr();
    auto selected = dict ? dict.getAs<DenseI64ArrayAttr>("selected") : DenseI64ArrayAttr();
    auto mass = dict ? dict.getAs<DenseF64ArrayAttr>("mass") : DenseF64ArrayAttr();
    auto ids = dict ? dict.getAs<DenseI64ArrayAttr>("expert_ids") : DenseI64ArrayAttr();
    // Optional: the experts' weight similarity (routing, experts x experts) and the
    // expert each pruned one was merged into (pruned_experts, -1: removed).
    auto extra = dict ? (pruned ? dict.get("merged_into") : dict.get("similarity")) : Attribute();
    auto similarity = llvm::dyn_cast_or_null<DenseF64ArrayAttr>(extra);
    auto mergedInto = llvm::dyn_cast_or_null<DenseI64ArrayAttr>(extra);
    bool extraOk = !extra || (pruned ? static_cast<bool>(mergedInto) : static_cast<bool>(similarity));
    if (!llvm::isa<WeightOp>(op) || !tokens || tokens.getInt() < 0 || !selected || !mass || (pruned && !ids) ||
        !extraOk || dict.size() != (pruned ? 4u : 3u) + (extra ? 1u : 0u))
      return op->emitOpError("attribute 'kiln.")
             << name << "' must be {" << (pruned ? "expert_ids = array<i64>, " : "")
             << "tokens = N, selected = array<i64>, mass = array<f64>"
             << (pruned ? ", optional merged_into = array<i64>" : ", optional similarity = array<f64>")
             << "} on a kiln.weight";
    if (pruned && ids.size() != selected.size())
      return op->emitOpError("attribute 'kiln.pruned_experts' has ")
             << ids.size() << " expert ids and " << selected.size() << " selections";
    if (mergedInto && mergedInto.size() != ids.size())
      return op->emitOpError("attribute 'kiln.pruned_experts' has ")
             << ids.size() << " expert ids and " << mergedInto.size() << " merged_into entries";
    if (similarity && similarity.size() != selected.size() * selected.size())
      return op->emitOpError("attribute 'kiln.routing' has ")
             << similarity.size() << " similarities for " << selected.size() << " experts (expected "
             << selected.size() * selected.size() << ")";
    if (selected.size() != mass.size())
      return op->emitOpError("attribute 'kiln.")
             << name << "' has " << selected.size() << " selections and " << mass.size() << " masses";
    for (int64_t i = 0; i < selected.size(); ++i)
      if (selected[i] < 0 || !(mass[i] >= 0.0) || std::isinf(mass[i]))
        return op->emitOpError("attribute 'kiln.")
               << name << "': expert " << i << " has selections " << selected[i] << " and mass " << mass[i]
               << " (counts and masses are finite and non-negative)";
    return success();
  }
  if (name == "sensitivity") {
    if (!llvm::isa<WeightOp>(op))
      return op->emitOpError("attribute 'kiln.sensitivity' belongs on a kiln.weight");
    auto dict = llvm::dyn_cast<DictionaryAttr>(attr.getValue());
    if (!dict)
      return op->emitOpError("attribute 'kiln.sensitivity' must be a dictionary {encoding label = KL}");
    for (NamedAttribute entry : dict) {
      std::string error;
      if (!EncodingAttr::fromLabel(op->getContext(), entry.getName().getValue(), &error))
        return op->emitOpError("attribute 'kiln.sensitivity': ") << error;
      auto f = llvm::dyn_cast<FloatAttr>(entry.getValue());
      if (!f || !(f.getValueAsDouble() >= 0.0))
        return op->emitOpError("attribute 'kiln.sensitivity': '")
               << entry.getName().getValue() << "' must be a non-negative float";
    }
    return success();
  }
  return unknown();
}
