//===- OpParams.cpp - op parameters into the artifact ------------*- C++ -*-===//
#include "compiler/serialize/OpParams.h"

#include "dialects/kiln/KilnOps.h"
#include "mlir/IR/Builders.h"

#include <cctype>
#include <limits>

#include "dialects/kiln/KilnAttrs.h"
#include "formats/contract.h"
#include "flatbuffers/minireflect.h"
#include "mlir/IR/BuiltinAttributes.h"

namespace kiln {
namespace {

std::string normalized(llvm::StringRef s) {
  std::string out;
  for (char c : s)
    if (c != '_')
      out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return out;
}

// The value of an enum field from a string or a kiln enum attribute, matched to the
// schema's enumerator names ignoring case and underscores ("gelu_tanh" = GeluTanh).
std::optional<int64_t> enumValue(mlir::Attribute attr, const flatbuffers::TypeTable* enumTable) {
  std::string name;
  if (auto s = llvm::dyn_cast<mlir::StringAttr>(attr))
    name = s.str();
  else if (auto a = llvm::dyn_cast<ActivationKindAttr>(attr))
    name = stringifyActivationKind(a.getValue()).str();
  else
    return std::nullopt;
  for (size_t i = 0; i < enumTable->num_elems; ++i)
    if (normalized(enumTable->names[i]) == normalized(name))
      return enumTable->values ? enumTable->values[i] : static_cast<int64_t>(i);
  return std::nullopt;
}

} // namespace

namespace {

// Writes one table of the schema from named attributes (`lookup` gives the attribute
// of a field name, or null): scalars, enums, vectors of uint, and nested tables
// from dictionary attributes (recursively).
mlir::FailureOr<flatbuffers::Offset<void>>
serializeTable(flatbuffers::FlatBufferBuilder& b, mlir::Operation* op, const flatbuffers::TypeTable* table,
               llvm::function_ref<mlir::Attribute(llvm::StringRef)> lookup, llvm::StringRef prefix) {
  auto bad = [&](const char* field, const llvm::Twine& what) {
    return op->emitOpError("parameter '") << prefix << field << "' " << what;
  };

  // Vectors and nested tables are built before the table.
  std::vector<flatbuffers::uoffset_t> children(table->num_elems, 0);
  for (size_t i = 0; i < table->num_elems; ++i) {
    flatbuffers::TypeCode tc = table->type_codes[i];
    mlir::Attribute attr = lookup(table->names[i]);
    if (!attr)
      continue;
    if (tc.base_type == flatbuffers::ET_SEQUENCE && !tc.is_repeating) {
      auto dict = llvm::dyn_cast<mlir::DictionaryAttr>(attr);
      if (!dict)
        return bad(table->names[i], "must be a dictionary of its table's fields");
      const flatbuffers::TypeTable* sub = table->type_refs[tc.sequence_ref]();
      for (mlir::NamedAttribute a : dict) {
        bool known = false;
        for (size_t k = 0; k < sub->num_elems; ++k)
          known |= a.getName().getValue() == sub->names[k];
        if (!known)
          return bad(table->names[i], "has no field '" + a.getName().getValue() + "'");
      }
      mlir::FailureOr<flatbuffers::Offset<void>> nested = serializeTable(
          b, op, sub, [&](llvm::StringRef name) { return dict.get(name); },
          (prefix + table->names[i] + ".").str());
      if (mlir::failed(nested))
        return mlir::failure();
      children[i] = nested->o;
      continue;
    }
    if (!tc.is_repeating)
      continue;
    auto array = llvm::dyn_cast<mlir::DenseI64ArrayAttr>(attr);
    if (!array || tc.base_type != flatbuffers::ET_UINT)
      return bad(table->names[i], "must be an array of non-negative 32-bit integers");
    std::vector<uint32_t> values;
    for (int64_t v : array.asArrayRef()) {
      if (v < 0 || v > std::numeric_limits<uint32_t>::max())
        return bad(table->names[i], "has an element out of the 32-bit unsigned range: " + llvm::Twine(v));
      values.push_back(static_cast<uint32_t>(v));
    }
    children[i] = b.CreateVector(values).o;
  }

  flatbuffers::uoffset_t start = b.StartTable();
  for (size_t i = 0; i < table->num_elems; ++i) {
    const char* name = table->names[i];
    flatbuffers::TypeCode tc = table->type_codes[i];
    const flatbuffers::voffset_t field = flatbuffers::FieldIndexToOffset(static_cast<flatbuffers::voffset_t>(i));
    if (tc.is_repeating || tc.base_type == flatbuffers::ET_SEQUENCE) {
      if (children[i])
        b.AddOffset(field, flatbuffers::Offset<void>(children[i]));
      continue;
    }
    mlir::Attribute attr = lookup(name);
    if (tc.base_type == flatbuffers::ET_BOOL) {
      // A UnitAttr's presence is true; a BoolAttr its value; absent: false. A field
      // has_X is true when attribute X is present (an optional parameter's flag).
      if (!attr && llvm::StringRef(name).starts_with("has_")) {
        b.AddElement<uint8_t>(field, lookup(llvm::StringRef(name).drop_front(4)) ? 1 : 0, 0);
        continue;
      }
      bool v = attr && (!llvm::isa<mlir::BoolAttr>(attr) || llvm::cast<mlir::BoolAttr>(attr).getValue());
      b.AddElement<uint8_t>(field, v ? 1 : 0, 0);
      continue;
    }
    if (!attr)
      continue; // absent optional parameter: the schema's default
    if (tc.sequence_ref >= 0) { // an enum
      std::optional<int64_t> v = enumValue(attr, table->type_refs[tc.sequence_ref]());
      if (!v)
        return bad(name, "names no value of its enum in kiln.fbs");
      b.AddElement<uint8_t>(field, static_cast<uint8_t>(*v), 0);
      continue;
    }
    if (auto f = llvm::dyn_cast<mlir::FloatAttr>(attr)) {
      if (tc.base_type == flatbuffers::ET_FLOAT)
        b.AddElement<float>(field, static_cast<float>(f.getValueAsDouble()), 0.0f);
      else if (tc.base_type == flatbuffers::ET_DOUBLE)
        b.AddElement<double>(field, f.getValueAsDouble(), 0.0);
      else
        return bad(name, "must be an integer");
      continue;
    }
    auto i64 = llvm::dyn_cast<mlir::IntegerAttr>(attr);
    if (!i64)
      return bad(name, "has an attribute kind kiln.fbs cannot store");
    int64_t v = i64.getValue().getSExtValue();
    auto inRange = [&](int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
    switch (tc.base_type) {
    case flatbuffers::ET_UINT:
      if (!inRange(0, std::numeric_limits<uint32_t>::max()))
        return bad(name, "= " + llvm::Twine(v) + " is outside the artifact's 32-bit unsigned range");
      b.AddElement<uint32_t>(field, static_cast<uint32_t>(v), 0);
      break;
    case flatbuffers::ET_INT:
      if (!inRange(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()))
        return bad(name, "= " + llvm::Twine(v) + " is outside the artifact's 32-bit range");
      b.AddElement<int32_t>(field, static_cast<int32_t>(v), 0);
      break;
    case flatbuffers::ET_LONG:
      b.AddElement<int64_t>(field, v, 0);
      break;
    default:
      return bad(name, "has a type kiln.fbs stores differently");
    }
  }
  return flatbuffers::Offset<void>(b.EndTable(start));
}

// Parameters the artifact stores that the op's types carry rather than an attribute.
mlir::Attribute derivedParam(mlir::Operation* op, llvm::StringRef name) {
  if (auto s = llvm::dyn_cast<SelectTokensOp>(op); s && name == "tokens")
    return mlir::Builder(op->getContext())
        .getI64IntegerAttr(llvm::cast<mlir::RankedTensorType>(s.getInput().getType()).getDimSize(0));
  if (auto p = llvm::dyn_cast<PatchEmbedOp>(op); p && name == "class_token" && p.getClassEmbedding())
    return mlir::UnitAttr::get(op->getContext());
  return nullptr;
}

} // namespace

mlir::FailureOr<SerializedParams> serializeOpParams(flatbuffers::FlatBufferBuilder& b, mlir::Operation* op,
                                                    fb::OpKind kind) {
  SerializedParams out;
  out.type = format::ParamsOf(kind);
  if (out.type == fb::OpParams::NONE)
    return out;
  // The union's members in declaration order; member k (k >= 1) is its type_refs[k - 1].
  const flatbuffers::TypeTable* unionTable = fb::OpParamsTypeTable();
  const flatbuffers::TypeTable* table =
      unionTable->type_refs[unionTable->type_codes[static_cast<size_t>(out.type)].sequence_ref]();
  mlir::FailureOr<flatbuffers::Offset<void>> t =
      serializeTable(b, op, table,
                     [&](llvm::StringRef name) {
                       if (mlir::Attribute a = op->getAttr(name))
                         return a;
                       return derivedParam(op, name);
                     },
                     "");
  if (mlir::failed(t))
    return mlir::failure();
  out.table = *t;
  return out;
}

} // namespace kiln
