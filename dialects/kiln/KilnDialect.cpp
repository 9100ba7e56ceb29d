//===- KilnDialect.cpp - kiln dialect ----------------------------*- C++ -*-===//
#include "dialects/kiln/KilnDialect.h"

#include "dialects/kiln/KilnAttrs.h"
#include "dialects/kiln/KilnOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringSwitch.h"

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

enum class FieldType { I64, Bool, F64, Str, I64Array, F64Array };

struct Field {
  const char* key;
  FieldType type;
  bool required;
  int64_t min; // I64 only
};

// The module configuration dictionaries the importer writes and the writer reads.
// A field the writer needs is required: nothing is read with a silent default.
const Field kTextFields[] = {
    {"vocab_size", FieldType::I64, true, 1},  {"hidden_size", FieldType::I64, true, 1},
    {"num_layers", FieldType::I64, true, 1},  {"num_heads", FieldType::I64, true, 1},
    {"num_kv_heads", FieldType::I64, true, 1}, {"head_dim", FieldType::I64, true, 1},
    {"max_position_embeddings", FieldType::I64, true, 1},
    {"tie_word_embeddings", FieldType::Bool, false, 0},
    {"sliding_window", FieldType::I64, false, 0}};
const Field kImageFields[] = {{"image_size", FieldType::I64, true, 1},
                              {"channels", FieldType::I64, true, 1},
                              {"image_tokens", FieldType::I64, true, 1},
                              {"image_token_id", FieldType::I64, true, 0}};
const Field kPreprocessorFields[] = {
    {"processor", FieldType::Str, true, 0},       {"do_convert_rgb", FieldType::Bool, true, 0},
    {"do_resize", FieldType::Bool, true, 0},      {"shortest_edge", FieldType::I64, true, 0},
    {"longest_edge", FieldType::I64, true, 0},    {"resample", FieldType::I64, true, 0},
    {"do_center_crop", FieldType::Bool, true, 0}, {"crop_size", FieldType::I64Array, true, 0},
    {"do_rescale", FieldType::Bool, true, 0},     {"rescale_factor", FieldType::F64, true, 0},
    {"do_normalize", FieldType::Bool, true, 0},   {"image_mean", FieldType::F64Array, true, 0},
    {"image_std", FieldType::F64Array, true, 0},  {"max_image_edge", FieldType::I64, true, 0}};
const Field kGenerationFields[] = {
    {"bos_token_id", FieldType::I64, false, 0},  {"eos_token_ids", FieldType::I64Array, true, 0},
    {"pad_token_id", FieldType::I64, false, 0},  {"do_sample", FieldType::Bool, false, 0},
    {"temperature", FieldType::F64, false, 0},   {"top_k", FieldType::I64, false, 0},
    {"top_p", FieldType::F64, false, 0},         {"max_new_tokens", FieldType::I64, false, 0}};
const Field kTokenizerFields[] = {{"file", FieldType::Str, true, 0},
                                  {"vocab", FieldType::I64, true, 0},
                                  {"added_tokens", FieldType::I64, true, 0}};

// The target kiln-select-kernels bound kernels for (codegen/generators reads it).
const Field kTargetFields[] = {{"triple", FieldType::Str, true, 0},
                               {"features", FieldType::Str, true, 0},
                               {"generate", FieldType::Bool, true, 0}};

const char* typeName(FieldType t) {
  switch (t) {
  case FieldType::I64: return "an integer";
  case FieldType::Bool: return "a bool";
  case FieldType::F64: return "a float";
  case FieldType::Str: return "a string";
  case FieldType::I64Array: return "an array<i64>";
  case FieldType::F64Array: return "an array<f64>";
  }
  return "?";
}

LogicalResult verifyDictionary(Operation* op, NamedAttribute attr, llvm::ArrayRef<Field> fields) {
  auto dict = llvm::dyn_cast<DictionaryAttr>(attr.getValue());
  if (!dict)
    return op->emitOpError("attribute '") << attr.getName().getValue() << "' must be a dictionary";
  for (NamedAttribute entry : dict) {
    const Field* field = nullptr;
    for (const Field& f : fields)
      if (entry.getName().getValue() == f.key)
        field = &f;
    if (!field)
      return op->emitOpError("attribute '") << attr.getName().getValue() << "' has an unknown field '"
                                            << entry.getName().getValue() << "'";
    Attribute v = entry.getValue();
    bool ok = false;
    switch (field->type) {
    case FieldType::I64:
      if (auto i = llvm::dyn_cast<IntegerAttr>(v); i && i.getType().isInteger(64)) {
        if (i.getInt() < field->min)
          return op->emitOpError("attribute '") << attr.getName().getValue() << "': " << field->key
                                                << " must be at least " << field->min << ", got "
                                                << i.getInt();
        ok = true;
      }
      break;
    case FieldType::Bool: ok = llvm::isa<BoolAttr>(v); break;
    case FieldType::F64: ok = llvm::isa<FloatAttr>(v); break;
    case FieldType::Str: ok = llvm::isa<StringAttr>(v); break;
    case FieldType::I64Array: ok = llvm::isa<DenseI64ArrayAttr>(v); break;
    case FieldType::F64Array: ok = llvm::isa<DenseF64ArrayAttr>(v); break;
    }
    if (!ok)
      return op->emitOpError("attribute '") << attr.getName().getValue() << "': " << field->key << " must be "
                                            << typeName(field->type);
  }
  for (const Field& f : fields)
    if (f.required && !dict.get(f.key))
      return op->emitOpError("attribute '") << attr.getName().getValue() << "' lacks the field '" << f.key
                                            << "'";
  return success();
}

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
           << "' (kiln.* attributes: architecture, checkpoint, prompt_template, text, image, "
              "preprocessor, generation, tokenizer, max_prefill_tokens, target, stage, arena_bytes, "
              "kernel, symbol, offset, output, sensitivity)";
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
  if (name == "text" || name == "image" || name == "preprocessor" || name == "generation" || name == "tokenizer" ||
      name == "target") {
    if (failed(requireModule(op, attr)))
      return failure();
    llvm::ArrayRef<Field> fields = llvm::StringSwitch<llvm::ArrayRef<Field>>(name)
                                       .Case("text", kTextFields)
                                       .Case("image", kImageFields)
                                       .Case("preprocessor", kPreprocessorFields)
                                       .Case("generation", kGenerationFields)
                                       .Case("target", kTargetFields)
                                       .Default(kTokenizerFields);
    return verifyDictionary(op, attr, fields);
  }
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
