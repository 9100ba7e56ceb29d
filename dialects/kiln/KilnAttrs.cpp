//===- KilnAttrs.cpp - kiln dialect attributes -------------------*- C++ -*-===//
#include "dialects/kiln/KilnAttrs.h"

#include "dialects/kiln/KilnDialect.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace kiln;

#include "dialects/kiln/KilnEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/kiln/KilnAttrs.cpp.inc"

void KilnDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/kiln/KilnAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// EncodingAttr
//===----------------------------------------------------------------------===//

// Syntax: #kiln.encoding<KIND (, group = N)? (, asym)? (, act = MODE)?>
Attribute EncodingAttr::parse(AsmParser& parser, Type) {
  MLIRContext* ctx = parser.getContext();
  StringRef kindName;
  if (parser.parseLess() || parser.parseKeyword(&kindName))
    return {};
  std::optional<EncodingKind> kind = symbolizeEncodingKind(kindName);
  if (!kind) {
    parser.emitError(parser.getCurrentLocation(), "unknown encoding '")
        << kindName << "'; expected f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8 or int4";
    return {};
  }
  int64_t group = 0;
  bool symmetric = true;
  ActivationMode act = ActivationMode::Float;
  while (succeeded(parser.parseOptionalComma())) {
    StringRef key;
    SMLoc loc = parser.getCurrentLocation();
    if (parser.parseKeyword(&key))
      return {};
    if (key == "group") {
      if (parser.parseEqual() || parser.parseInteger(group))
        return {};
    } else if (key == "asym") {
      symmetric = false;
    } else if (key == "act") {
      StringRef mode;
      if (parser.parseEqual() || parser.parseKeyword(&mode))
        return {};
      std::optional<ActivationMode> m = symbolizeActivationMode(mode);
      if (!m) {
        parser.emitError(loc, "unknown activation mode '") << mode << "'";
        return {};
      }
      act = *m;
    } else {
      parser.emitError(loc, "unknown encoding parameter '") << key << "'";
      return {};
    }
  }
  if (parser.parseGreater())
    return {};
  return parser.getChecked<EncodingAttr>(ctx, *kind, group, symmetric, act);
}

void EncodingAttr::print(AsmPrinter& printer) const {
  printer << "<" << stringifyEncodingKind(getKind());
  if (getGroupSize() != 0)
    printer << ", group = " << getGroupSize();
  if (!getSymmetric())
    printer << ", asym";
  if (getActivation() != ActivationMode::Float)
    printer << ", act = " << stringifyActivationMode(getActivation());
  printer << ">";
}

LogicalResult EncodingAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                   EncodingKind kind, int64_t groupSize, bool symmetric,
                                   ActivationMode activation) {
  bool isInt4 = kind == EncodingKind::int4;
  bool isInt = isInt4 || kind == EncodingKind::int8;
  if (isInt4) {
    if (groupSize != 32 && groupSize != 64 && groupSize != 128)
      return emitError() << "int4 needs group = 32, 64 or 128, got " << groupSize;
  } else if (groupSize != 0) {
    return emitError() << "group size applies to int4 only";
  }
  if (!symmetric && !isInt4)
    return emitError() << "asymmetric (zero-point) storage applies to int4 only";
  if (activation != ActivationMode::Float && !isInt)
    return emitError() << "int8 activations need an int8 or int4 weight encoding";
  return success();
}

std::string EncodingAttr::getLabel() const {
  std::string label = stringifyEncodingKind(getKind()).str();
  if (getKind() == EncodingKind::int4)
    label += "_g" + std::to_string(getGroupSize());
  if (!getSymmetric())
    label += "_asym";
  if (getActivation() == ActivationMode::Int8PerToken)
    label += "_a8";
  return label;
}

EncodingAttr EncodingAttr::fromLabel(MLIRContext* context, StringRef label, std::string* error) {
  SmallVector<StringRef> parts;
  label.split(parts, '_');
  // fp8_e4m3 / fp8_e5m2 contain an underscore of their own.
  std::string kindName = parts.empty() ? "" : parts[0].str();
  size_t next = 1;
  if (kindName == "fp8" && parts.size() > 1) {
    kindName += "_" + parts[1].str();
    next = 2;
  }
  std::optional<EncodingKind> kind = symbolizeEncodingKind(kindName);
  if (!kind) {
    *error = "unknown encoding '" + label.str() +
             "' (f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8, int4_gN; suffixes _asym, _a8)";
    return {};
  }
  int64_t group = 0;
  bool symmetric = true;
  ActivationMode act = ActivationMode::Float;
  for (size_t i = next; i < parts.size(); ++i) {
    StringRef p = parts[i];
    if (p.consume_front("g") && !p.empty() && !p.getAsInteger(10, group))
      continue;
    if (parts[i] == "asym")
      symmetric = false;
    else if (parts[i] == "a8")
      act = ActivationMode::Int8PerToken;
    else {
      *error = "unknown encoding suffix '" + parts[i].str() + "' in '" + label.str() + "'";
      return {};
    }
  }
  if (*kind == EncodingKind::int4 && group == 0)
    group = 32;
  bool isInt4 = *kind == EncodingKind::int4, isInt = isInt4 || *kind == EncodingKind::int8;
  if ((isInt4 && group != 32 && group != 64 && group != 128) || (!isInt4 && group != 0) ||
      (!symmetric && !isInt4) || (act != ActivationMode::Float && !isInt)) {
    *error = "invalid encoding '" + label.str() +
             "': int4 groups are 32, 64 or 128; _asym is int4 only; _a8 needs int8 or int4";
    return {};
  }
  return EncodingAttr::get(context, *kind, group, symmetric, act);
}
