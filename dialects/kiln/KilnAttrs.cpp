//===- KilnAttrs.cpp - kiln dialect attributes -------------------*- C++ -*-===//
#include "dialects/kiln/KilnAttrs.h"

#include "dialects/kiln/KilnDialect.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>

using namespace mlir;
using namespace kiln;

#include "dialects/kiln/KilnEnums.cpp.inc"

#include "dialects/kiln/KilnAttrInterfaces.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/kiln/KilnAttrs.cpp.inc"

void KilnDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/kiln/KilnAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Weight expressions
//===----------------------------------------------------------------------===//

namespace {

std::string shapeStr(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The shape and dtype of a transform's operand `index`, which must be a weight
// expression with a stated shape.
struct OperandInfo {
  SmallVector<int64_t> shape;
  StringRef dtype;
};

FailureOr<OperandInfo> operandInfo(function_ref<InFlightDiagnostic()> emitError,
                                   StringRef transform, Attribute operand, size_t index) {
  auto expr = llvm::dyn_cast_or_null<WeightExprAttrInterface>(operand);
  if (!expr) {
    emitError() << transform << " operand " << index
                << " is not a weight expression (#kiln.source, #kiln.concat, #kiln.slice, "
                   "#kiln.permute or #kiln.weighted_sum)";
    return failure();
  }
  std::optional<SmallVector<int64_t>> shape = expr.getResultShape();
  if (!shape) {
    emitError() << transform << " operand " << index
                << " has no shape: a #kiln.source inside a transform needs shape = [...]";
    return failure();
  }
  return OperandInfo{std::move(*shape), expr.getElementDtype()};
}

// Every operand's shape and dtype, in order.
FailureOr<SmallVector<OperandInfo>> operandInfos(function_ref<InFlightDiagnostic()> emitError, StringRef transform,
                                                 ArrayRef<Attribute> operands) {
  SmallVector<OperandInfo> infos;
  for (auto [i, operand] : llvm::enumerate(operands)) {
    FailureOr<OperandInfo> info = operandInfo(emitError, transform, operand, i);
    if (failed(info))
      return failure();
    infos.push_back(std::move(*info));
  }
  return infos;
}

} // namespace

std::string kiln::weightExprTransforms(Attribute expr) {
  if (llvm::isa<SourceAttr>(expr))
    return "";
  std::string text;
  llvm::raw_string_ostream os(text);
  expr.print(os);
  return text;
}

unsigned kiln::safetensorsDtypeBytes(StringRef dtype) {
  if (dtype == "F32")
    return 4;
  if (dtype == "F16" || dtype == "BF16")
    return 2;
  return 0;
}

SmallVector<SourceAttr> kiln::getWeightSources(Attribute expr) {
  SmallVector<SourceAttr> leaves;
  SmallVector<Attribute> stack = {expr};
  while (!stack.empty()) {
    Attribute a = stack.pop_back_val();
    if (auto src = llvm::dyn_cast<SourceAttr>(a)) {
      leaves.push_back(src);
    } else if (auto e = llvm::dyn_cast<WeightExprAttrInterface>(a)) {
      SmallVector<Attribute> operands = e.getExprOperands();
      stack.append(operands.rbegin(), operands.rend()); // first operand on top
    }
  }
  return leaves;
}

uint64_t kiln::getWeightSourceBytes(Attribute expr) {
  uint64_t bytes = 0;
  for (SourceAttr src : getWeightSources(expr))
    bytes += src.getSize();
  return bytes;
}

LogicalResult kiln::verifyWeightExprNode(function_ref<InFlightDiagnostic()> emitError,
                                         Attribute expr) {
  return llvm::TypeSwitch<Attribute, LogicalResult>(expr)
      .Case([&](SourceAttr a) {
        return SourceAttr::verify(emitError, a.getFile(), a.getOffset(), a.getSize(),
                                  a.getDtype(), a.getShape());
      })
      .Case([&](ConcatAttr a) {
        return ConcatAttr::verify(emitError, a.getAxis(), a.getOperands(), a.getBlock());
      })
      .Case([&](SliceAttr a) {
        return SliceAttr::verify(emitError, a.getOperand(), a.getOffsets(), a.getSizes());
      })
      .Case([&](PermuteAttr a) { return PermuteAttr::verify(emitError, a.getOperand(), a.getDims()); })
      .Case([&](WeightedSumAttr a) { return WeightedSumAttr::verify(emitError, a.getOperands(), a.getWeights()); })
      .Default([&](Attribute) {
        return emitError() << "expected a weight expression (#kiln.source, #kiln.concat, "
                              "#kiln.slice, #kiln.permute or #kiln.weighted_sum), got "
                           << expr;
      });
}

// SourceAttr

LogicalResult SourceAttr::verify(function_ref<InFlightDiagnostic()> emitError, StringRef file,
                                 uint64_t offset, uint64_t size, StringRef dtype,
                                 ArrayRef<int64_t> shape) {
  // Without a shape, the weight that reads the source checks it against its type.
  if (shape.empty())
    return success();
  if (offset > UINT64_MAX - size)
    return emitError() << "source offset + size overflows";
  unsigned elementBytes = safetensorsDtypeBytes(dtype);
  if (elementBytes == 0)
    return emitError() << "source dtype " << dtype << " is not F32, F16 or BF16";
  uint64_t bytes = elementBytes;
  for (int64_t d : shape) {
    if (d < 1)
      return emitError() << "source shape " << shapeStr(shape)
                         << " has a dimension below 1";
    if (bytes > UINT64_MAX / static_cast<uint64_t>(d))
      return emitError() << "source shape " << shapeStr(shape) << " overflows";
    bytes *= static_cast<uint64_t>(d);
  }
  if (bytes != size)
    return emitError() << "source size " << size << " bytes does not match shape "
                       << shapeStr(shape) << " of " << dtype << " (" << bytes << " bytes)";
  return success();
}

std::optional<SmallVector<int64_t>> SourceAttr::getResultShape() const {
  if (getShape().empty())
    return std::nullopt;
  return SmallVector<int64_t>(getShape());
}

StringRef SourceAttr::getElementDtype() const { return getDtype(); }

SmallVector<Attribute> SourceAttr::getExprOperands() const { return {}; }

// ConcatAttr

LogicalResult ConcatAttr::verify(function_ref<InFlightDiagnostic()> emitError, int64_t axis,
                                 ArrayRef<Attribute> operands, int64_t block) {
  if (block < 0)
    return emitError() << "concat block " << block << " is negative";
  if (operands.empty())
    return emitError() << "concat needs at least one operand";
  FailureOr<SmallVector<OperandInfo>> all = operandInfos(emitError, "concat", operands);
  if (failed(all))
    return failure();
  const SmallVector<OperandInfo>& infos = *all;
  const OperandInfo& first = infos.front();
  int64_t rank = static_cast<int64_t>(first.shape.size());
  if (axis < 0 || axis >= rank)
    return emitError() << "concat axis " << axis << " is out of range for rank " << rank;
  for (size_t i = 1; i < infos.size(); ++i) {
    const OperandInfo& info = infos[i];
    if (static_cast<int64_t>(info.shape.size()) != rank)
      return emitError() << "concat operand " << i << " has rank " << info.shape.size()
                         << " but operand 0 has rank " << rank;
    for (int64_t d = 0; d < rank; ++d)
      if (d != axis && info.shape[d] != first.shape[d])
        return emitError() << "concat operand " << i << " has shape " << shapeStr(info.shape)
                           << ", which differs from operand 0's " << shapeStr(first.shape)
                           << " outside axis " << axis;
    if (block > 0 && info.shape[axis] != first.shape[axis])
      return emitError() << "concat operand " << i << " has " << info.shape[axis]
                         << " elements along axis " << axis << " but operand 0 has "
                         << first.shape[axis] << " (interleaved in blocks of " << block
                         << ", the operands have the same shape)";
    if (info.dtype != first.dtype)
      return emitError() << "concat operand " << i << " has dtype " << info.dtype
                         << " but operand 0 has " << first.dtype
                         << " (the leaves of a weight share one dtype)";
  }
  return success();
}

std::optional<SmallVector<int64_t>> ConcatAttr::getResultShape() const {
  std::optional<SmallVector<int64_t>> shape;
  for (Attribute operand : getOperands()) {
    auto expr = llvm::dyn_cast<WeightExprAttrInterface>(operand);
    std::optional<SmallVector<int64_t>> s = expr ? expr.getResultShape() : std::nullopt;
    if (!s || getAxis() < 0 || getAxis() >= static_cast<int64_t>(s->size()))
      return std::nullopt;
    if (!shape)
      shape = std::move(s);
    else
      (*shape)[getAxis()] += (*s)[getAxis()];
  }
  return shape;
}

StringRef ConcatAttr::getElementDtype() const {
  auto expr = getOperands().empty()
                  ? WeightExprAttrInterface()
                  : llvm::dyn_cast<WeightExprAttrInterface>(getOperands().front());
  return expr ? expr.getElementDtype() : StringRef();
}

SmallVector<Attribute> ConcatAttr::getExprOperands() const {
  return SmallVector<Attribute>(getOperands());
}

// SliceAttr

LogicalResult SliceAttr::verify(function_ref<InFlightDiagnostic()> emitError, Attribute operand,
                                ArrayRef<int64_t> offsets, ArrayRef<int64_t> sizes) {
  FailureOr<OperandInfo> info = operandInfo(emitError, "slice", operand, 0);
  if (failed(info))
    return failure();
  ArrayRef<int64_t> shape = info->shape;
  if (offsets.size() != shape.size() || sizes.size() != shape.size())
    return emitError() << "slice has " << offsets.size() << " offsets and " << sizes.size()
                       << " sizes for an operand of rank " << shape.size();
  for (size_t d = 0; d < shape.size(); ++d)
    if (offsets[d] < 0 || sizes[d] < 1 || offsets[d] > shape[d] - sizes[d])
      return emitError() << "slice offsets " << shapeStr(offsets) << " and sizes "
                         << shapeStr(sizes) << " exceed operand shape " << shapeStr(shape)
                         << " in dimension " << d;
  return success();
}

std::optional<SmallVector<int64_t>> SliceAttr::getResultShape() const {
  return SmallVector<int64_t>(getSizes());
}

StringRef SliceAttr::getElementDtype() const {
  auto expr = llvm::dyn_cast<WeightExprAttrInterface>(getOperand());
  return expr ? expr.getElementDtype() : StringRef();
}

SmallVector<Attribute> SliceAttr::getExprOperands() const { return {getOperand()}; }

// PermuteAttr

LogicalResult PermuteAttr::verify(function_ref<InFlightDiagnostic()> emitError, Attribute operand,
                                  ArrayRef<int64_t> dims) {
  FailureOr<OperandInfo> info = operandInfo(emitError, "permute", operand, 0);
  if (failed(info))
    return failure();
  size_t rank = info->shape.size();
  SmallVector<bool> seen(rank, false);
  bool valid = dims.size() == rank;
  for (int64_t d : dims) {
    if (!valid)
      break;
    valid = d >= 0 && static_cast<size_t>(d) < rank && !seen[d];
    if (valid)
      seen[d] = true;
  }
  if (!valid)
    return emitError() << "permute dims " << shapeStr(dims) << " are not a permutation of [0, "
                       << rank << ")";
  return success();
}

std::optional<SmallVector<int64_t>> PermuteAttr::getResultShape() const {
  auto expr = llvm::dyn_cast<WeightExprAttrInterface>(getOperand());
  std::optional<SmallVector<int64_t>> in = expr ? expr.getResultShape() : std::nullopt;
  if (!in)
    return std::nullopt;
  SmallVector<int64_t> out;
  for (int64_t d : getDims()) {
    if (d < 0 || d >= static_cast<int64_t>(in->size()))
      return std::nullopt;
    out.push_back((*in)[d]);
  }
  return out;
}

StringRef PermuteAttr::getElementDtype() const {
  auto expr = llvm::dyn_cast<WeightExprAttrInterface>(getOperand());
  return expr ? expr.getElementDtype() : StringRef();
}

SmallVector<Attribute> PermuteAttr::getExprOperands() const { return {getOperand()}; }

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

//===----------------------------------------------------------------------===//
// Module configuration
//===----------------------------------------------------------------------===//

FailureOr<F64> kiln::parseF64Parameter(AsmParser& parser) {
  double value = 0;
  if (parser.parseFloat(value))
    return failure();
  return F64(value);
}

void kiln::printF64Parameter(AsmPrinter& printer, F64 value) { printer.printFloat(llvm::APFloat(value.value)); }

namespace {
// `name` must be at least `min`.
LogicalResult atLeast(function_ref<InFlightDiagnostic()> emitError, StringRef name, int64_t value,
                      int64_t min) {
  if (value < min)
    return emitError() << name << " must be at least " << min << ", got " << value;
  return success();
}
} // namespace

LogicalResult TextConfigAttr::verify(function_ref<InFlightDiagnostic()> emitError, int64_t vocabSize,
                                     int64_t hiddenSize, int64_t numLayers, int64_t numHeads,
                                     int64_t numKvHeads, int64_t headDim, int64_t maxPositionEmbeddings,
                                     bool, int64_t slidingWindow) {
  if (failed(atLeast(emitError, "vocab_size", vocabSize, 1)) ||
      failed(atLeast(emitError, "hidden_size", hiddenSize, 1)) ||
      failed(atLeast(emitError, "num_layers", numLayers, 1)) ||
      failed(atLeast(emitError, "num_heads", numHeads, 1)) ||
      failed(atLeast(emitError, "num_kv_heads", numKvHeads, 1)) ||
      failed(atLeast(emitError, "head_dim", headDim, 1)) ||
      failed(atLeast(emitError, "max_position_embeddings", maxPositionEmbeddings, 1)) ||
      failed(atLeast(emitError, "sliding_window", slidingWindow, 0)))
    return failure();
  if (numHeads % numKvHeads != 0)
    return emitError() << "num_heads (" << numHeads << ") must be a multiple of num_kv_heads (" << numKvHeads
                       << ")";
  return success();
}

LogicalResult KvCacheAttr::verify(function_ref<InFlightDiagnostic()> emitError, EncodingKind kind, int64_t group) {
  switch (kind) {
  case EncodingKind::f32:
  case EncodingKind::f16:
    if (group != 0)
      return emitError() << "a " << stringifyEncodingKind(kind) << " KV cache has no group";
    return success();
  case EncodingKind::int8:
  case EncodingKind::int4:
    if (group < 1 || group > (1 << 16) || (kind == EncodingKind::int4 && group % 2 != 0))
      return emitError() << "an " << stringifyEncodingKind(kind) << " KV cache needs a positive"
                         << (kind == EncodingKind::int4 ? " even" : "") << " group (at most 65536), got "
                         << group;
    return success();
  default:
    return emitError() << "a KV cache is f32, f16, int8 or int4, not " << stringifyEncodingKind(kind);
  }
}

LogicalResult ImageConfigAttr::verify(function_ref<InFlightDiagnostic()> emitError, int64_t imageSize,
                                      int64_t channels, int64_t imageTokens, int64_t imageTokenId) {
  return failure(failed(atLeast(emitError, "image_size", imageSize, 1)) ||
                 failed(atLeast(emitError, "channels", channels, 1)) ||
                 failed(atLeast(emitError, "image_tokens", imageTokens, 1)) ||
                 failed(atLeast(emitError, "image_token_id", imageTokenId, 0)));
}

LogicalResult PreprocessorConfigAttr::verify(function_ref<InFlightDiagnostic()> emitError, StringRef processor,
                                             bool, bool, int64_t shortestEdge, int64_t longestEdge,
                                             int64_t resample, bool, ArrayRef<int64_t> cropSize, bool,
                                             F64 rescaleFactor, bool, ArrayRef<F64> imageMean,
                                             ArrayRef<F64> imageStd, int64_t maxImageEdge) {
  if (processor != "CLIPImageProcessor" && processor != "Idefics3ImageProcessor")
    return emitError() << "processor must be CLIPImageProcessor or Idefics3ImageProcessor, got '" << processor
                       << "'";
  if (failed(atLeast(emitError, "shortest_edge", shortestEdge, 0)) ||
      failed(atLeast(emitError, "longest_edge", longestEdge, 0)) ||
      failed(atLeast(emitError, "resample", resample, 0)) ||
      failed(atLeast(emitError, "max_image_edge", maxImageEdge, 0)))
    return failure();
  if (cropSize.size() != 2 || cropSize[0] < 0 || cropSize[1] < 0)
    return emitError() << "crop_size must be [height, width], both at least 0";
  if (!(rescaleFactor > 0.0))
    return emitError() << "rescale_factor must be positive";
  if (imageMean.size() != imageStd.size() || imageMean.empty())
    return emitError() << "image_mean and image_std need one value per channel (got " << imageMean.size()
                       << " and " << imageStd.size() << ")";
  for (F64 s : imageStd)
    if (!(s.value > 0.0))
      return emitError() << "image_std values must be positive";
  return success();
}

LogicalResult GenerationConfigAttr::verify(function_ref<InFlightDiagnostic()> emitError, int64_t bosTokenId,
                                           ArrayRef<int64_t> eosTokenIds, int64_t padTokenId, bool,
                                           F64 temperature, int64_t topK, F64 topP,
                                           int64_t maxNewTokens, F64 repetitionPenalty) {
  if (failed(atLeast(emitError, "bos_token_id", bosTokenId, -1)) ||
      failed(atLeast(emitError, "pad_token_id", padTokenId, -1)) || failed(atLeast(emitError, "top_k", topK, 0)) ||
      failed(atLeast(emitError, "max_new_tokens", maxNewTokens, 0)))
    return failure();
  for (int64_t id : eosTokenIds)
    if (id < 0)
      return emitError() << "eos_token_ids must be token ids (at least 0), got " << id;
  if (!(temperature >= 0.0))
    return emitError() << "temperature must be at least 0";
  if (!(topP > 0.0 && topP <= 1.0))
    return emitError() << "top_p must lie in (0, 1]";
  if (!(repetitionPenalty > 0.0) || std::isinf(static_cast<double>(repetitionPenalty)))
    return emitError() << "repetition_penalty must be a positive number";
  return success();
}

LogicalResult TokenizerConfigAttr::verify(function_ref<InFlightDiagnostic()> emitError, StringRef file,
                                          int64_t vocab, int64_t addedTokens) {
  if (file.empty())
    return emitError() << "file must name the tokenizer file";
  return failure(failed(atLeast(emitError, "vocab", vocab, 0)) ||
                 failed(atLeast(emitError, "added_tokens", addedTokens, 0)));
}

LogicalResult TargetAttr::verify(function_ref<InFlightDiagnostic()> emitError, StringRef triple, StringRef,
                                 bool) {
  if (triple.empty())
    return emitError() << "triple must name an LLVM target triple";
  return success();
}

// WeightedSumAttr

LogicalResult WeightedSumAttr::verify(function_ref<InFlightDiagnostic()> emitError, ArrayRef<Attribute> operands,
                                      Attribute weightsAny) {
  auto weightsAttr = llvm::dyn_cast_or_null<DenseF64ArrayAttr>(weightsAny);
  if (!weightsAttr)
    return emitError() << "weighted_sum weights must be an array<f64: ...>";
  ArrayRef<double> weights = weightsAttr.asArrayRef();
  if (operands.empty())
    return emitError() << "weighted_sum needs at least one operand";
  if (weights.size() != operands.size())
    return emitError() << "weighted_sum has " << weights.size() << " weights for " << operands.size() << " operands";
  for (auto [i, w] : llvm::enumerate(weights))
    if (!std::isfinite(w))
      return emitError() << "weighted_sum weight " << i << " is not finite";
  FailureOr<SmallVector<OperandInfo>> all = operandInfos(emitError, "weighted_sum", operands);
  if (failed(all))
    return failure();
  const SmallVector<OperandInfo>& infos = *all;
  for (size_t i = 1; i < infos.size(); ++i) {
    if (infos[i].shape != infos[0].shape)
      return emitError() << "weighted_sum operand " << i << " has shape " << shapeStr(infos[i].shape)
                         << " but operand 0 has " << shapeStr(infos[0].shape);
    if (infos[i].dtype != infos[0].dtype)
      return emitError() << "weighted_sum operand " << i << " has dtype " << infos[i].dtype << " but operand 0 has "
                         << infos[0].dtype << " (the leaves of a weight share one dtype)";
  }
  return success();
}

std::optional<SmallVector<int64_t>> WeightedSumAttr::getResultShape() const {
  auto expr = getOperands().empty() ? WeightExprAttrInterface()
                                    : llvm::dyn_cast<WeightExprAttrInterface>(getOperands().front());
  return expr ? expr.getResultShape() : std::nullopt;
}

StringRef WeightedSumAttr::getElementDtype() const {
  auto expr = getOperands().empty() ? WeightExprAttrInterface()
                                    : llvm::dyn_cast<WeightExprAttrInterface>(getOperands().front());
  return expr ? expr.getElementDtype() : StringRef();
}

SmallVector<Attribute> WeightedSumAttr::getExprOperands() const { return SmallVector<Attribute>(getOperands()); }
