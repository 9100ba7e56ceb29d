//===- KilnOps.cpp - kiln dialect operations ---------------------*- C++ -*-===//
#include "dialects/kiln/KilnOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/DenseSet.h"

using namespace mlir;
using namespace kiln;

//===----------------------------------------------------------------------===//
// custom<WeightExpr>: a weight's expression. A #kiln.source is printed without its
// prefix, as it always was (`from <"file", offset = ...>`); a transform in full.
//===----------------------------------------------------------------------===//

static ParseResult parseWeightExpr(OpAsmParser& parser, WeightExprAttrInterface& expr) {
  SMLoc loc = parser.getCurrentLocation();
  Attribute attr;
  if (parser.parseCustomAttributeWithFallback(attr, Type(), [&](Attribute& result, Type type) {
        result = SourceAttr::parse(parser, type);
        return success(static_cast<bool>(result));
      }))
    return failure();
  expr = llvm::dyn_cast<WeightExprAttrInterface>(attr);
  if (!expr)
    return parser.emitError(loc, "expected a weight expression (#kiln.source, #kiln.concat, "
                                 "#kiln.slice, #kiln.permute or #kiln.weighted_sum), got ")
           << attr;
  return success();
}

static void printWeightExpr(OpAsmPrinter& printer, Operation*, WeightExprAttrInterface expr) {
  if (auto src = llvm::dyn_cast<SourceAttr>(expr))
    printer.printStrippedAttrOrType(src);
  else
    printer.printAttribute(expr);
}

//===----------------------------------------------------------------------===//
// custom<UpDown>: a gated MLP's `up, down` operands (or types), or `down` alone when
// gate and up are one interleaved weight.
//===----------------------------------------------------------------------===//

// One element (`down`) or two (`up, down`), read by `parse`.
template <typename T, typename Up, typename Parse>
static ParseResult parseOneOrTwo(OpAsmParser& parser, Up& up, T& down, Parse parse) {
  T first;
  if (parse(first))
    return failure();
  if (failed(parser.parseOptionalComma())) {
    down = first;
    return success();
  }
  up = first;
  return parse(down);
}

static ParseResult parseUpDown(OpAsmParser& parser, std::optional<OpAsmParser::UnresolvedOperand>& up,
                               OpAsmParser::UnresolvedOperand& down) {
  return parseOneOrTwo(parser, up, down, [&](OpAsmParser::UnresolvedOperand& v) { return parser.parseOperand(v); });
}

static ParseResult parseUpDown(OpAsmParser& parser, Type& up, Type& down) {
  return parseOneOrTwo(parser, up, down, [&](Type& t) { return parser.parseType(t); });
}

// Value or Type: `up, down`, or `down` when there is no up.
template <typename Up, typename Down>
static void printUpDown(OpAsmPrinter& printer, Operation*, Up up, Down down) {
  if (up)
    printer << up << ", ";
  printer << down;
}

#define GET_OP_CLASSES
#include "dialects/kiln/KilnOps.cpp.inc"

namespace {

RankedTensorType tensorOf(Value v) { return llvm::cast<RankedTensorType>(v.getType()); }

// Two sizes agree when either is dynamic or both are equal.
bool agree(int64_t a, int64_t b) {
  return ShapedType::isDynamic(a) || ShapedType::isDynamic(b) || a == b;
}

std::string dimStr(int64_t d) {
  return ShapedType::isDynamic(d) ? std::string("?") : std::to_string(d);
}

LogicalResult expectRank(Operation* op, StringRef what, Value v, int64_t rank) {
  int64_t actual = tensorOf(v).getRank();
  if (actual != rank)
    return op->emitOpError() << what << " must have rank " << rank << ", got " << actual;
  return success();
}

// Checks `actual` dimension against `expected`, naming both in the diagnostic.
LogicalResult expectDim(Operation* op, StringRef what, int64_t actual, StringRef expectedWhat,
                        int64_t expected) {
  if (!agree(actual, expected))
    return op->emitOpError() << what << " (" << dimStr(actual) << ") does not match "
                             << expectedWhat << " (" << dimStr(expected) << ")";
  return success();
}

LogicalResult expectResultShape(Operation* op, ArrayRef<int64_t> expected) {
  auto result = tensorOf(op->getResult(0));
  bool ok = result.getRank() == static_cast<int64_t>(expected.size());
  for (size_t i = 0; ok && i < expected.size(); ++i)
    ok = agree(result.getDimSize(i), expected[i]);
  if (!ok) {
    std::string want;
    for (size_t i = 0; i < expected.size(); ++i)
      want += (i ? "x" : "") + dimStr(expected[i]);
    return op->emitOpError() << "result type " << result << " does not match the expected shape ["
                             << want << "]";
  }
  return success();
}

// The safetensors dtype that stores `type`.
StringRef safetensorsDtype(Type type) {
  if (type.isF32())
    return "F32";
  if (type.isF16())
    return "F16";
  if (type.isBF16())
    return "BF16";
  return "";
}

} // namespace

//===----------------------------------------------------------------------===//
// Weights
//===----------------------------------------------------------------------===//

LogicalResult WeightOp::verify() {
  RankedTensorType type = getTensorType();
  if (!type.hasStaticShape())
    return emitOpError("weight '") << getSymName() << "' must have a static shape, got " << type;
  auto weightError = [&]() -> InFlightDiagnostic {
    InFlightDiagnostic diag = emitOpError("weight '");
    diag << getSymName() << "': ";
    return diag;
  };
  // Every node of the expression, operands first. The parser verified them already;
  // an expression a pass built with get() (not getChecked()) was not.
  WeightExprAttrInterface expr = getSource();
  SourceAttr plain = getPlainSource();
  if (!plain) {
    SmallVector<Attribute> order, stack = {expr};
    while (!stack.empty()) {
      Attribute a = stack.pop_back_val();
      order.push_back(a);
      if (auto e = llvm::dyn_cast<WeightExprAttrInterface>(a))
        llvm::append_range(stack, e.getExprOperands());
    }
    for (Attribute a : llvm::reverse(order))
      if (failed(verifyWeightExprNode(weightError, a)))
        return failure();
  }
  StringRef dtype = safetensorsDtype(type.getElementType());
  if (expr.getElementDtype() != dtype)
    return weightError() << "source dtype " << expr.getElementDtype()
                         << " does not match element type " << type.getElementType();
  uint64_t bytes = type.getElementTypeBitWidth() / 8;
  for (int64_t d : type.getShape()) {
    if (d < 0 || (d != 0 && bytes > UINT64_MAX / static_cast<uint64_t>(d)))
      return weightError() << "size overflows";
    bytes *= static_cast<uint64_t>(d);
  }
  std::optional<SmallVector<int64_t>> shape = expr.getResultShape();
  if (!shape) {
    // Only a plain source may leave its shape to the weight; inside a transform the
    // node verifiers require one.
    if (!plain)
      return weightError() << "expression has no shape";
    if (plain.getSize() != bytes)
      return weightError() << "source size " << plain.getSize() << " bytes does not match "
                           << type << " (" << bytes << " bytes)";
  } else if (ArrayRef<int64_t>(*shape) != type.getShape()) {
    std::string s;
    for (size_t i = 0; i < shape->size(); ++i)
      s += (i ? ", " : "") + std::to_string((*shape)[i]);
    return weightError() << "expression shape [" << s << "] does not match " << type;
  }
  if (plain && failed(verifyWeightExprNode(weightError, plain)))
    return failure();
  for (SourceAttr src : getSources())
    if (src.getOffset() > UINT64_MAX - src.getSize())
      return weightError() << "source offset + size overflows";
  // Layout: row_major holds every encoding and shape; a packed layout only what its
  // kernels read (formats/encoding.h LayoutFits, which the writer checks too).
  switch (getLayout()) {
  case LayoutKind::row_major:
    break;
  case LayoutKind::int4_p16k8: {
    EncodingAttr enc = getEncoding();
    const int64_t rows = type.getRank() ? type.getDimSize(0) : 0;
    const int64_t cols = rows > 0 ? type.getNumElements() / rows : 0;
    if (enc.getKind() != EncodingKind::int4 || !enc.getSymmetric() || enc.getGroupSize() <= 0 ||
        enc.getGroupSize() % 8 != 0 || cols == 0 || cols % enc.getGroupSize() != 0)
      return weightError() << "layout int4_p16k8 needs symmetric int4 with a group that is a multiple of 8 and "
                              "divides the input dimension, got "
                           << enc << " for " << type;
    break;
  }
  case LayoutKind::int4_p128k4: {
    EncodingAttr enc = getEncoding();
    const int64_t rows = type.getRank() ? type.getDimSize(0) : 0;
    const int64_t cols = rows > 0 ? type.getNumElements() / rows : 0;
    if (enc.getKind() != EncodingKind::int4 || !enc.getSymmetric() || enc.getGroupSize() <= 0 ||
        enc.getGroupSize() % 4 != 0 || cols == 0 || cols % enc.getGroupSize() != 0)
      return weightError() << "layout int4_p128k4 needs symmetric int4 with a group that is a multiple of 4 and "
                              "divides the input dimension, got "
                           << enc << " for " << type;
    break;
  }
  case LayoutKind::int4_p16k16: {
    EncodingAttr enc = getEncoding();
    const int64_t rows = type.getRank() ? type.getDimSize(0) : 0;
    const int64_t cols = rows > 0 ? type.getNumElements() / rows : 0;
    if (enc.getKind() != EncodingKind::int4 || !enc.getSymmetric() || enc.getGroupSize() <= 0 ||
        enc.getGroupSize() % 16 != 0 || cols == 0 || cols % enc.getGroupSize() != 0 || rows % 16 != 0)
      return weightError() << "layout int4_p16k16 needs symmetric int4 with a group that is a multiple of 16 and "
                              "divides the input dimension, and rows a multiple of 16, got "
                           << enc << " for " << type;
    break;
  }
  case LayoutKind::int8_p16k4: {
    const int64_t rows = type.getRank() ? type.getDimSize(0) : 0;
    const int64_t cols = rows > 0 ? type.getNumElements() / rows : 0;
    if (getEncoding().getKind() != EncodingKind::int8 || cols == 0 || cols % 4 != 0)
      return weightError() << "layout int8_p16k4 needs int8 with an input dimension that is a multiple of 4, got "
                           << getEncoding() << " for " << type;
    break;
  }
  case LayoutKind::panel16: {
    EncodingKind kind = getEncoding().getKind();
    if (kind != EncodingKind::f32 && kind != EncodingKind::f16 && kind != EncodingKind::bf16 &&
        kind != EncodingKind::fp8_e4m3 && kind != EncodingKind::fp8_e5m2)
      return weightError() << "layout panel16 needs f32, f16, bf16 or fp8, got " << getEncoding();
    break;
  }
  }
  return success();
}

LogicalResult WeightRefOp::verifySymbolUses(SymbolTableCollection& symbolTable) {
  auto weight = symbolTable.lookupNearestSymbolFrom<WeightOp>(*this, getNameAttr());
  if (!weight)
    return emitOpError("'") << getName() << "' does not name a kiln.weight";
  if (weight.getType() != getResult().getType())
    return emitOpError("type ") << getResult().getType() << " does not match the type "
                                << weight.getType() << " of weight '" << getName() << "'";
  return success();
}

//===----------------------------------------------------------------------===//
// Embeddings and token handling
//===----------------------------------------------------------------------===//

LogicalResult EmbeddingOp::verify() {
  if (failed(expectRank(*this, "table", getTable(), 2)) ||
      failed(expectRank(*this, "ids", getIds(), 1)))
    return failure();
  auto table = tensorOf(getTable());
  return expectResultShape(*this, {tensorOf(getIds()).getDimSize(0), table.getDimSize(1)});
}

LogicalResult MergeImageTokensOp::verify() {
  if (failed(expectRank(*this, "embeds", getEmbeds(), 2)) ||
      failed(expectRank(*this, "ids", getIds(), 1)) ||
      failed(expectRank(*this, "image", getImage(), 2)))
    return failure();
  auto embeds = tensorOf(getEmbeds());
  if (failed(expectDim(*this, "ids length", tensorOf(getIds()).getDimSize(0), "token count",
                       embeds.getDimSize(0))) ||
      failed(expectDim(*this, "image hidden size", tensorOf(getImage()).getDimSize(1),
                       "text hidden size", embeds.getDimSize(1))))
    return failure();
  if (getImageTokenId() < 0)
    return emitOpError("image_token_id must be non-negative");
  return expectResultShape(*this, embeds.getShape());
}

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

static LogicalResult verifyMatmul(Operation* op, Value input, Value weight, Value bias) {
  if (failed(expectRank(op, "input", input, 2)) || failed(expectRank(op, "weight", weight, 2)))
    return failure();
  auto in = tensorOf(input), w = tensorOf(weight);
  if (failed(expectDim(op, "input features", in.getDimSize(1), "weight in_features",
                       w.getDimSize(1))))
    return failure();
  if (bias) {
    if (failed(expectRank(op, "bias", bias, 1)) ||
        failed(expectDim(op, "bias length", tensorOf(bias).getDimSize(0),
                         "weight out_features", w.getDimSize(0))))
      return failure();
  }
  return expectResultShape(op, {in.getDimSize(0), w.getDimSize(0)});
}

static LogicalResult verifyNormParam(Operation* op, StringRef what, Value input, Value param);

// The fusions of a matmul op (kiln-fuse-*): a norm prologue over `input` (its kind,
// weight, layer-norm bias and epsilon) and a residual of the result's shape.
static LogicalResult verifyFusions(Operation* op, Value input, std::optional<StringRef> norm, Value normWeight,
                                   Value normBias, std::optional<APFloat> epsilon, Value residual) {
  if (residual && tensorOf(residual) != llvm::cast<RankedTensorType>(op->getResult(0).getType()))
    return op->emitOpError("residual type ") << residual.getType() << " differs from the result type "
                                             << op->getResult(0).getType();
  if (!norm) {
    if (normWeight || normBias || epsilon)
      return op->emitOpError("norm_weight, norm_bias and norm_epsilon need a norm (\"rms\" or \"layer\")");
    return success();
  }
  if (*norm != "rms" && *norm != "layer")
    return op->emitOpError("norm must be \"rms\" or \"layer\", got \"") << *norm << "\"";
  if (!normWeight || !epsilon)
    return op->emitOpError("a ") << *norm << " norm prologue needs norm_weight and norm_epsilon";
  if ((*norm == "layer") != static_cast<bool>(normBias))
    return op->emitOpError(*norm == "layer" ? "a layer norm prologue needs norm_bias"
                                            : "an rms norm prologue has no norm_bias");
  if (failed(verifyNormParam(op, "norm_weight", input, normWeight)) ||
      (normBias && failed(verifyNormParam(op, "norm_bias", input, normBias))))
    return failure();
  if (!(epsilon->convertToFloat() > 0.0f))
    return op->emitOpError("norm_epsilon must be positive");
  return success();
}

static LogicalResult verifyRopeDict(Operation* op, DictionaryAttr rope, int64_t heads, int64_t headDim);
static LogicalResult verifyHeads(Operation* op, int64_t heads, int64_t kvHeads, int64_t headDim);

LogicalResult LinearOp::verify() {
  if (failed(verifyMatmul(*this, getInput(), getWeight(), getBias())))
    return failure();
  if (failed(verifyFusions(*this, getInput(), getNorm(), getNormWeight(), getNormBias(), getNormEpsilon(), getResidual())))
    return failure();
  // The q|k|v epilogue (kiln-fuse-rope).
  std::optional<DictionaryAttr> qkv = getQkv();
  if (static_cast<bool>(getPositions()) != qkv.has_value())
    return emitOpError("positions come with, and only with, a qkv epilogue");
  if (!qkv)
    return success();
  if (getResidual() || getActivation())
    return emitOpError("a qkv epilogue takes no residual and no activation");
  for (mlir::NamedAttribute a : *qkv)
    if (!llvm::is_contained({"num_heads", "num_kv_heads", "head_dim", "cache_layer", "rope"}, a.getName().getValue()))
      return emitOpError("qkv has an unknown parameter '") << a.getName().getValue() << "'";
  auto heads = qkv->getAs<IntegerAttr>("num_heads"), kvHeads = qkv->getAs<IntegerAttr>("num_kv_heads"),
       headDim = qkv->getAs<IntegerAttr>("head_dim");
  if (!heads || !kvHeads || !headDim || failed(verifyHeads(*this, heads.getInt(), kvHeads.getInt(), headDim.getInt())))
    return failure();
  const int64_t width = (heads.getInt() + 2 * kvHeads.getInt()) * headDim.getInt();
  if (failed(expectDim(*this, "out_features", tensorOf(getWeight()).getDimSize(0),
                       "(num_heads + 2 num_kv_heads) * head_dim", width)) ||
      failed(expectDim(*this, "positions length", tensorOf(getPositions()).getDimSize(0), "input rows",
                       tensorOf(getInput()).getDimSize(0))))
    return failure();
  auto layer = qkv->getAs<IntegerAttr>("cache_layer");
  if (qkv->get("cache_layer") && (!layer || layer.getInt() < 0))
    return emitOpError("qkv cache_layer must be a non-negative integer");
  auto rope = qkv->getAs<DictionaryAttr>("rope");
  if (qkv->get("rope") && !rope)
    return emitOpError("qkv rope must be a dictionary");
  if (!rope && !layer)
    return emitOpError("a qkv epilogue rotates (rope), writes the KV cache (cache_layer), or both");
  if (rope && failed(verifyRopeDict(*this, rope, heads.getInt() + kvHeads.getInt(), headDim.getInt())))
    return failure();
  return success();
}

LogicalResult LmHeadOp::verify() { return verifyMatmul(*this, getInput(), getWeight(), Value()); }

static LogicalResult verifyGatedMlp(Operation* op, Value input, Value gate, Value up, Value down,
                                    StringRef which) {
  if (failed(expectRank(op, "input", input, 2)))
    return failure();
  for (auto [name, v] : {std::pair<StringRef, Value>{"gate", gate}, {"up", up}, {"down", down}})
    if (failed(expectRank(op, (which + name).str(), v, 2)))
      return failure();
  int64_t hidden = tensorOf(input).getDimSize(1);
  auto g = tensorOf(gate), u = tensorOf(up), d = tensorOf(down);
  if (failed(expectDim(op, (which + "gate in_features").str(), g.getDimSize(1), "hidden size",
                       hidden)) ||
      failed(expectDim(op, (which + "up shape").str(), u.getDimSize(0), "gate out_features",
                       g.getDimSize(0))) ||
      failed(expectDim(op, (which + "up in_features").str(), u.getDimSize(1), "hidden size",
                       hidden)) ||
      failed(expectDim(op, (which + "down out_features").str(), d.getDimSize(0), "hidden size",
                       hidden)) ||
      failed(expectDim(op, (which + "down in_features").str(), d.getDimSize(1),
                       "intermediate size", g.getDimSize(0))))
    return failure();
  return success();
}

LogicalResult GatedMlpOp::verify() {
  std::optional<int64_t> block = getGateUpBlock();
  if (static_cast<bool>(getUp()) == block.has_value())
    return emitOpError(getUp() ? "has an up weight and gate_up_block: gate_up_block says the gate "
                                 "weight interleaves gate and up"
                               : "has no up weight and no gate_up_block");
  if (block) {
    // One weight of gate and up rows interleaved in blocks of gate_up_block.
    if (*block < 1 || *block > 256)
      return emitOpError("gate_up_block ") << *block << " must lie in [1, 256]";
    if (failed(expectRank(*this, "gate", getGate(), 2)) || failed(expectRank(*this, "input", getInput(), 2)) ||
        failed(expectRank(*this, "down", getDown(), 2)))
      return failure();
    auto gu = tensorOf(getGate()), d = tensorOf(getDown());
    const int64_t hidden = tensorOf(getInput()).getDimSize(1);
    if (failed(expectDim(*this, "gate/up rows", gu.getDimSize(0), "2 x down in_features", 2 * d.getDimSize(1))) ||
        failed(expectDim(*this, "gate/up in_features", gu.getDimSize(1), "hidden size", hidden)) ||
        failed(expectDim(*this, "down out_features", d.getDimSize(0), "hidden size", hidden)))
      return failure();
  } else if (failed(verifyGatedMlp(*this, getInput(), getGate(), getUp(), getDown(), ""))) {
    return failure();
  }
  if (failed(expectResultShape(*this, tensorOf(getInput()).getShape())))
    return failure();
  return verifyFusions(*this, getInput(), getNorm(), getNormWeight(), getNormBias(), getNormEpsilon(), getResidual());
}

LogicalResult MoeOp::verify() {
  if (failed(expectRank(*this, "router", getRouter(), 2)))
    return failure();
  int64_t experts = getGate().size();
  if (experts == 0)
    return emitOpError("needs at least one expert");
  if (static_cast<int64_t>(getUp().size()) != experts ||
      static_cast<int64_t>(getDown().size()) != experts)
    return emitOpError("has ") << experts << " gate weights but " << getUp().size() << " up and "
                               << getDown().size() << " down weights";
  auto router = tensorOf(getRouter());
  if (failed(expectDim(*this, "router rows", router.getDimSize(0), "expert count", experts)) ||
      failed(expectDim(*this, "router in_features", router.getDimSize(1), "hidden size",
                       tensorOf(getInput()).getDimSize(1))))
    return failure();
  if (getTopK() < 1 || static_cast<int64_t>(getTopK()) > experts)
    return emitOpError("top_k ") << getTopK() << " must lie in [1, " << experts << "]";
  ArrayRef<int64_t> ids = getExpertIds();
  if (static_cast<int64_t>(ids.size()) != experts)
    return emitOpError("expert_ids has ") << ids.size() << " entries for " << experts
                                          << " experts";
  llvm::DenseSet<int64_t> seen;
  for (int64_t id : ids)
    if (id < 0 || !seen.insert(id).second)
      return emitOpError("expert_ids must be distinct and non-negative");
  for (int64_t e = 0; e < experts; ++e)
    if (failed(verifyGatedMlp(*this, getInput(), getGate()[e], getUp()[e], getDown()[e],
                              ("expert " + std::to_string(ids[e]) + " ").c_str())))
      return failure();
  if (failed(expectResultShape(*this, tensorOf(getInput()).getShape())))
    return failure();
  return verifyFusions(*this, getInput(), std::nullopt, Value(), Value(), std::nullopt, getResidual());
}

//===----------------------------------------------------------------------===//
// Normalisation
//===----------------------------------------------------------------------===//

static LogicalResult verifyNormParam(Operation* op, StringRef what, Value input, Value param) {
  if (failed(expectRank(op, what, param, 1)))
    return failure();
  auto in = tensorOf(input);
  if (in.getRank() < 1)
    return op->emitOpError("input must have rank >= 1");
  return expectDim(op, (what + " length").str(), tensorOf(param).getDimSize(0),
                   "the last dimension of the input", in.getShape().back());
}

static LogicalResult verifyEpsilon(Operation* op, APFloat eps) {
  if (!(eps.convertToFloat() > 0.0f))
    return op->emitOpError("epsilon must be positive");
  return success();
}

LogicalResult RmsNormOp::verify() {
  if (failed(verifyNormParam(*this, "weight", getInput(), getWeight())) ||
      failed(verifyEpsilon(*this, getEpsilon())))
    return failure();
  return expectResultShape(*this, tensorOf(getInput()).getShape());
}

LogicalResult LayerNormOp::verify() {
  if (failed(verifyNormParam(*this, "weight", getInput(), getWeight())) ||
      failed(verifyNormParam(*this, "bias", getInput(), getBias())) ||
      failed(verifyEpsilon(*this, getEpsilon())))
    return failure();
  return expectResultShape(*this, tensorOf(getInput()).getShape());
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

// The rotary parameters of kiln.rope (and of a fused kiln.qkv_attention's `rope`).
static LogicalResult verifyRopeScaling(Operation* op, double theta, StringRef ropeType,
                                       std::optional<APFloat> factor, std::optional<APFloat> low,
                                       std::optional<APFloat> high, bool hasOriginalMax) {
  if (!(theta > 0.0))
    return op->emitOpError("theta must be positive");
  if (ropeType == "llama3") {
    if (!factor || !low || !high || !hasOriginalMax)
      return op->emitOpError("rope_type \"llama3\" needs factor, low_freq_factor, "
                             "high_freq_factor and original_max_position_embeddings");
    if (!(low->convertToDouble() < high->convertToDouble()))
      return op->emitOpError("llama3 rope scaling needs low_freq_factor < high_freq_factor");
  } else if (ropeType != "default") {
    return op->emitOpError("unsupported rope_type \"") << ropeType << "\" (supported: default, llama3)";
  }
  return success();
}

LogicalResult RopeOp::verify() {
  if (failed(expectRank(*this, "input", getInput(), 2)) ||
      failed(expectRank(*this, "positions", getPositions(), 1)))
    return failure();
  if (getNumHeads() < 1 || getHeadDim() < 2 || getHeadDim() % 2 != 0)
    return emitOpError("needs num_heads >= 1 and an even head_dim, got ")
           << getNumHeads() << " and " << getHeadDim();
  auto in = tensorOf(getInput());
  if (failed(expectDim(*this, "input width", in.getDimSize(1), "num_heads * head_dim",
                       getNumHeads() * getHeadDim())) ||
      failed(expectDim(*this, "positions length", tensorOf(getPositions()).getDimSize(0),
                       "token count", in.getDimSize(0))))
    return failure();
  if (failed(verifyRopeScaling(*this, getTheta().convertToDouble(), getRopeType(), getFactor(), getLowFreqFactor(),
                               getHighFreqFactor(), getOriginalMaxPositionEmbeddings().has_value())))
    return failure();
  return expectResultShape(*this, in.getShape());
}

// The heads of an attention: positive, the query heads a multiple of the KV heads.
static LogicalResult verifyHeads(Operation* op, int64_t heads, int64_t kvHeads, int64_t headDim) {
  if (heads < 1 || kvHeads < 1 || headDim < 1)
    return op->emitOpError("num_heads, num_kv_heads and head_dim must be positive");
  if (heads % kvHeads != 0)
    return op->emitOpError("num_heads (") << heads << ") must be a multiple of num_kv_heads (" << kvHeads << ")";
  return success();
}

LogicalResult AttentionOp::verify() {
  for (auto [name, v] : {std::pair<StringRef, Value>{"query", getQuery()},
                         {"key", getKey()},
                         {"value", getValue()}})
    if (failed(expectRank(*this, name, v, 2)))
      return failure();
  int64_t heads = getNumHeads(), kvHeads = getNumKvHeads(), headDim = getHeadDim();
  if (failed(verifyHeads(*this, heads, kvHeads, headDim)))
    return failure();
  auto q = tensorOf(getQuery()), k = tensorOf(getKey()), v = tensorOf(getValue());
  if (failed(expectDim(*this, "query width", q.getDimSize(1), "num_heads * head_dim",
                       heads * headDim)) ||
      failed(expectDim(*this, "key width", k.getDimSize(1), "num_kv_heads * head_dim",
                       kvHeads * headDim)) ||
      failed(expectDim(*this, "value width", v.getDimSize(1), "num_kv_heads * head_dim",
                       kvHeads * headDim)) ||
      failed(expectDim(*this, "key rows", k.getDimSize(0), "value rows", v.getDimSize(0))) ||
      failed(expectDim(*this, "key rows", k.getDimSize(0), "query rows", q.getDimSize(0))))
    return failure();
  if (!(getScale().convertToDouble() > 0.0))
    return emitOpError("scale must be positive");
  if (getCacheLayer()) {
    if (*getCacheLayer() < 0)
      return emitOpError("cache_layer must be non-negative");
    if (!getPositions())
      return emitOpError("a KV-cache attention (cache_layer) needs positions");
    if (!getCausal())
      return emitOpError("a KV-cache attention (cache_layer) must be causal");
    if (failed(expectDim(*this, "positions length", tensorOf(getPositions()).getDimSize(0),
                         "query rows", q.getDimSize(0))))
      return failure();
  } else if (getPositions()) {
    return emitOpError("positions are only meaningful with a cache_layer");
  }
  return expectResultShape(*this, {q.getDimSize(0), heads * headDim});
}

// A fused rope's parameters (a kiln.qkv_attention's `rope`, a q|k|v linear's `qkv.rope`):
// those of kiln.rope, rotating `heads` heads of `headDim`.
static LogicalResult verifyRopeDict(Operation* op, DictionaryAttr rope, int64_t heads, int64_t headDim) {
  if (headDim % 2 != 0)
    return op->emitOpError("rope needs an even head_dim, got ") << headDim;
  for (mlir::NamedAttribute a : rope)
    if (!llvm::is_contained({"num_heads", "head_dim", "theta", "rope_type", "factor", "low_freq_factor", "high_freq_factor",
                             "original_max_position_embeddings"},
                            a.getName().getValue()))
      return op->emitOpError("rope has an unknown parameter '") << a.getName().getValue() << "'";
  // The rotation covers q and k, side by side.
  auto ropeHeads = rope.getAs<IntegerAttr>("num_heads"), ropeDim = rope.getAs<IntegerAttr>("head_dim");
  if (!ropeHeads || !ropeDim || ropeHeads.getInt() != heads || ropeDim.getInt() != headDim)
    return op->emitOpError("rope must rotate num_heads + num_kv_heads = ")
           << heads << " heads of head_dim " << headDim << " (its num_heads and head_dim)";
  auto f = [&](StringRef name) -> std::optional<APFloat> {
    if (auto v = rope.getAs<FloatAttr>(name))
      return v.getValue();
    return std::nullopt;
  };
  auto type = rope.getAs<StringAttr>("rope_type");
  std::optional<APFloat> theta = f("theta");
  if (!theta)
    return op->emitOpError("rope needs a float theta");
  return verifyRopeScaling(op, theta->convertToDouble(), type ? type.getValue() : "default", f("factor"),
                           f("low_freq_factor"), f("high_freq_factor"),
                           static_cast<bool>(rope.getAs<IntegerAttr>("original_max_position_embeddings")));
}

LogicalResult QkvAttentionOp::verify() {
  if (failed(expectRank(*this, "qkv", getQkv(), 2)))
    return failure();
  int64_t heads = getNumHeads(), kvHeads = getNumKvHeads(), headDim = getHeadDim();
  if (failed(verifyHeads(*this, heads, kvHeads, headDim)))
    return failure();
  auto qkv = tensorOf(getQkv());
  if (failed(expectDim(*this, "qkv width", qkv.getDimSize(1), "(num_heads + 2 num_kv_heads) * head_dim",
                       (heads + 2 * kvHeads) * headDim)))
    return failure();
  if (!(getScale().convertToDouble() > 0.0))
    return emitOpError("scale must be positive");
  if (getCacheLayer() && (*getCacheLayer() < 0 || !getCausal()))
    return emitOpError("a KV-cache attention (cache_layer) must be causal with a non-negative layer");
  if (static_cast<bool>(getPositions()) != (getCacheLayer().has_value() || getRope().has_value()))
    return emitOpError("positions are needed by, and only by, a cache_layer or a rope");
  if (getPositions() && failed(expectDim(*this, "positions length", tensorOf(getPositions()).getDimSize(0),
                                         "qkv rows", qkv.getDimSize(0))))
    return failure();
  if (auto rope = getRope())
    if (failed(verifyRopeDict(*this, *rope, heads + kvHeads, headDim)))
      return failure();
  if (getKvWritten()) {
    if (getRope())
      return emitOpError("kv_written: the producing linear rotates q and k, so the op has no rope");
    auto linear = getQkv().getDefiningOp<LinearOp>();
    auto epilogue = linear ? linear.getQkv() : std::nullopt;
    if (!epilogue || epilogue->get("num_heads") != getNumHeadsAttr() ||
        epilogue->get("num_kv_heads") != getNumKvHeadsAttr() || epilogue->get("head_dim") != getHeadDimAttr() ||
        epilogue->get("cache_layer") != getCacheLayerAttr())
      return emitOpError("kv_written needs its q|k|v from a kiln.linear whose qkv epilogue has its heads and "
                         "cache_layer");
  }
  return expectResultShape(*this, {qkv.getDimSize(0), heads * headDim});
}

//===----------------------------------------------------------------------===//
// Vision
//===----------------------------------------------------------------------===//

LogicalResult PatchEmbedOp::verify() {
  if (failed(expectRank(*this, "pixels", getPixels(), 3)) ||
      failed(expectRank(*this, "weight", getWeight(), 4)))
    return failure();
  int64_t p = getPatchSize();
  if (p < 1)
    return emitOpError("patch_size must be positive");
  auto px = tensorOf(getPixels()), w = tensorOf(getWeight());
  if (failed(expectDim(*this, "weight channels", w.getDimSize(1), "image channels",
                       px.getDimSize(0))) ||
      failed(expectDim(*this, "kernel height", w.getDimSize(2), "patch_size", p)) ||
      failed(expectDim(*this, "kernel width", w.getDimSize(3), "patch_size", p)))
    return failure();
  if (!px.hasStaticShape())
    return emitOpError("pixels must have a static shape");
  if (px.getDimSize(1) % p || px.getDimSize(2) % p)
    return emitOpError("image size ") << px.getDimSize(1) << "x" << px.getDimSize(2)
                                      << " is not a multiple of patch_size " << p;
  if (getBias() && (failed(expectRank(*this, "bias", getBias(), 1)) ||
                    failed(expectDim(*this, "bias length", tensorOf(getBias()).getDimSize(0),
                                     "hidden size", w.getDimSize(0)))))
    return failure();
  // A class token: row 0, the patches after it.
  const int64_t rows = (px.getDimSize(1) / p) * (px.getDimSize(2) / p) + (getClassEmbedding() ? 1 : 0);
  if (Value cls = getClassEmbedding()) {
    if (!getPosition())
      return emitOpError("a class embedding comes with a position table");
    if (failed(expectRank(*this, "class embedding", cls, 1)) ||
        failed(expectDim(*this, "class embedding length", tensorOf(cls).getDimSize(0), "hidden size",
                         w.getDimSize(0))))
      return failure();
  }
  if (Value pos = getPosition()) {
    if (failed(expectRank(*this, "position", pos, 2)) ||
        failed(expectDim(*this, "position width", tensorOf(pos).getDimSize(1), "hidden size", w.getDimSize(0))))
      return failure();
    if (tensorOf(pos).getDimSize(0) < rows)
      return emitOpError("position table has ") << tensorOf(pos).getDimSize(0) << " rows for " << rows
                                                << (getClassEmbedding() ? " rows (patches and the class token)"
                                                                        : " patches");
  }
  return expectResultShape(*this, {rows, w.getDimSize(0)});
}

LogicalResult ClassTokenOp::verify() {
  if (failed(expectRank(*this, "input", getInput(), 2)) ||
      failed(verifyNormParam(*this, "class_embedding", getInput(), getClassEmbedding())))
    return failure();
  auto in = tensorOf(getInput());
  int64_t rows = in.isDynamicDim(0) ? ShapedType::kDynamic : in.getDimSize(0) + 1;
  return expectResultShape(*this, {rows, in.getDimSize(1)});
}

LogicalResult PositionEmbeddingOp::verify() {
  if (failed(expectRank(*this, "input", getInput(), 2)) ||
      failed(expectRank(*this, "table", getTable(), 2)))
    return failure();
  auto in = tensorOf(getInput()), table = tensorOf(getTable());
  if (failed(expectDim(*this, "table width", table.getDimSize(1), "hidden size",
                       in.getDimSize(1))))
    return failure();
  if (!in.isDynamicDim(0) && !table.isDynamicDim(0) && in.getDimSize(0) > table.getDimSize(0))
    return emitOpError("input has ") << in.getDimSize(0) << " rows but the table only "
                                     << table.getDimSize(0) << " positions";
  return expectResultShape(*this, in.getShape());
}

LogicalResult SelectTokensOp::verify() {
  if (failed(expectRank(*this, "input", getInput(), 2)) ||
      failed(expectRank(*this, "result", getResult(), 2)))
    return failure();
  auto in = tensorOf(getInput()), out = tensorOf(getResult());
  if (in.isDynamicDim(0) || out.isDynamicDim(0))
    return emitOpError("selects from a static number of tokens into a static number");
  if (getScore() != "norm" && getScore() != "distinct")
    return emitOpError("score must be norm or distinct, got '") << getScore() << "'";
  if (getKeep() < 1 || static_cast<int64_t>(getKeep()) > in.getDimSize(0))
    return emitOpError("keep ") << getKeep() << " must lie in [1, " << in.getDimSize(0) << "]";
  if (failed(expectDim(*this, "result rows", out.getDimSize(0), "keep", getKeep())) ||
      failed(expectDim(*this, "result width", out.getDimSize(1), "input width", in.getDimSize(1))))
    return failure();
  return success();
}

LogicalResult SliceRowsOp::verify() {
  if (failed(expectRank(*this, "input", getInput(), 2)) ||
      failed(expectRank(*this, "result", getResult(), 2)))
    return failure();
  auto in = tensorOf(getInput()), out = tensorOf(getResult());
  if (getStart() < 0)
    return emitOpError("start must be non-negative");
  if (failed(expectDim(*this, "result width", out.getDimSize(1), "input width",
                       in.getDimSize(1))))
    return failure();
  if (!in.isDynamicDim(0) && !out.isDynamicDim(0) &&
      static_cast<int64_t>(getStart()) + out.getDimSize(0) > in.getDimSize(0))
    return emitOpError("rows [") << getStart() << ", " << getStart() + out.getDimSize(0)
                                 << ") exceed the input's " << in.getDimSize(0) << " rows";
  return success();
}

LogicalResult ConcatOp::verify() {
  if (getInputs().empty())
    return emitOpError("needs at least one input");
  int64_t rows = tensorOf(getInputs()[0]).getRank() == 2 ? tensorOf(getInputs()[0]).getDimSize(0) : 0;
  int64_t width = 0;
  for (Value in : getInputs()) {
    if (failed(expectRank(*this, "every input", in, 2)) ||
        failed(expectDim(*this, "input rows", tensorOf(in).getDimSize(0), "the first input's rows",
                         rows)))
      return failure();
    int64_t w = tensorOf(in).getDimSize(1);
    width = ShapedType::isDynamic(w) || ShapedType::isDynamic(width) ? ShapedType::kDynamic
                                                                     : width + w;
  }
  return expectResultShape(*this, {rows, width});
}

LogicalResult PixelShuffleOp::verify() {
  if (failed(expectRank(*this, "input", getInput(), 2)))
    return failure();
  auto in = tensorOf(getInput());
  if (!in.hasStaticShape())
    return emitOpError("input must have a static shape");
  int64_t r = getScaleFactor(), seq = in.getDimSize(0);
  int64_t side = 0;
  while ((side + 1) * (side + 1) <= seq)
    ++side;
  if (side * side != seq)
    return emitOpError("input rows (") << seq << ") do not form a square patch grid";
  if (r < 1 || side % r != 0)
    return emitOpError("scale_factor ") << r << " does not divide the patch grid side " << side;
  return expectResultShape(*this, {seq / (r * r), in.getDimSize(1) * r * r});
}
