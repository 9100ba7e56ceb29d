//===- HFImporter.cpp - Hugging Face checkpoint importer ----------*- C++ -*-===//
//
// Architecture semantics follow transformers' modeling code:
//   models/llama/modeling_llama.py, models/qwen2/modeling_qwen2.py,
//   models/mixtral/modeling_mixtral.py, models/clip/modeling_clip.py,
//   models/llava/modeling_llava.py, models/idefics3/modeling_idefics3.py.
//
//===----------------------------------------------------------------------===//
#include "compiler/importers/hf/HFImporter.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "compiler/importers/hf/ChatTemplate.h"
#include "compiler/importers/hf/HFConfig.h"
#include "dialects/kiln/KilnOps.h"
#include "compiler/importers/safetensors/Safetensors.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

using namespace mlir;

namespace kiln::hf {

void registerImporterDialects(MLIRContext* context) {
  context->loadDialect<KilnDialect, func::FuncDialect>();
}

namespace {

constexpr int64_t kDyn = ShapedType::kDynamic;

std::string shapeStr(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::optional<ActivationKind> activationFor(llvm::StringRef name) {
  if (name == "silu" || name == "swish")
    return ActivationKind::silu;
  if (name == "gelu")
    return ActivationKind::gelu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new" || name == "gelu_fast")
    return ActivationKind::gelu_tanh;
  if (name == "quick_gelu")
    return ActivationKind::quick_gelu;
  if (name == "relu")
    return ActivationKind::relu;
  return std::nullopt;
}

/// Tensor-name prefixes of one checkpoint layout.
struct Layout {
  std::string text;   // "model." — embed_tokens, layers.N, norm
  std::string lmHead; // "lm_head.weight"
  std::string vision; // "vision_tower.vision_model."
  std::string projector;
};

class Importer {
public:
  Importer(MLIRContext* ctx, llvm::StringRef dir, const ImportOptions& options)
      : ctx_(ctx), dir_(dir.str()), options_(options), b_(ctx) {}

  OwningOpRef<ModuleOp> run();

private:
  // ---- diagnostics
  Location fileLoc(llvm::StringRef file) {
    return FileLineColLoc::get(ctx_, (llvm::Twine(dir_) + "/" + file).str(), 0, 0);
  }
  Location nameLoc(llvm::StringRef name) { return NameLoc::get(StringAttr::get(ctx_, name)); }
  // A file of the checkpoint directory.
  std::string path(llvm::StringRef file) const {
    llvm::SmallString<256> p(dir_);
    llvm::sys::path::append(p, file);
    return std::string(p);
  }
  void error(Location loc, const llvm::Twine& msg) { emitError(loc) << msg; }

  // ---- weights
  Value weight(llvm::StringRef name, ArrayRef<int64_t> shape);
  bool hasTensor(llvm::StringRef name) const { return ckpt_.tensors.count(name.str()); }
  void markUnused(llvm::StringRef name) { knownUnused_.insert(name.str()); }

  // ---- types
  RankedTensorType act(ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, b_.getF32Type());
  }
  RankedTensorType ids(int64_t n) {
    return RankedTensorType::get({n}, b_.getI32Type());
  }
  template <typename Op, typename... Args>
  Value create(llvm::StringRef name, Args&&... args) {
    return b_.create<Op>(nameLoc(name), std::forward<Args>(args)...)->getResult(0);
  }

  // ---- builders
  Value linear(llvm::StringRef prefix, Value x, int64_t out, int64_t in, bool bias);
  Value layerNorm(llvm::StringRef prefix, Value x, int64_t dim, double eps);
  SmallVector<Value> visionTransformer(Value pixels, ArrayRef<int64_t> hiddenStates, bool siglip);
  Value decoder(Value tokenIds, Value positions, Value image);
  func::FuncOp beginStage(llvm::StringRef name, StageKind kind, TypeRange inputs, TypeRange outputs);
  void buildVisionStages();
  void buildDecoderStages();

  LogicalResult readConfigs();
  LogicalResult readChatTemplate(const llvm::json::Object& tokenizer);
  std::string builtinTemplateName() const;
  LogicalResult checkDeclaredCounts();
  LogicalResult checkFiniteWeights();
  void setModuleAttributes();
  LogicalResult finish();

  MLIRContext* ctx_;
  std::string dir_;
  ImportOptions options_;
  OpBuilder b_;
  ModuleOp module_;
  safetensors::Checkpoint ckpt_;
  ModelConfig cfg_;
  std::optional<GenerationConfig> gen_;
  std::optional<PreprocessorConfig> pre_;
  Layout layout_;
  int64_t imageTokens_ = 0;
  int64_t tokenizerVocab_ = 0;
  int64_t tokenizerAdded_ = 0;
  std::optional<ChatPieces> chat_;
  std::string imageOpen_, imageClose_;  // around an image's tokens (Idefics3)
  bool chatStartsWithBos_ = false;

  std::map<std::string, WeightOp> weights_;
  Operation* firstStage_ = nullptr; // the first function: weights go before it
  std::set<std::string> knownUnused_;
  std::vector<std::string> problems_; // missing or mis-shaped tensors
};

Value Importer::weight(llvm::StringRef name, ArrayRef<int64_t> shape) {
  WeightOp op;
  auto it = weights_.find(name.str());
  if (it != weights_.end()) {
    op = it->second;
  } else {
    Type elt = b_.getF32Type();
    SourceAttr source;
    auto t = ckpt_.tensors.find(name.str());
    if (t == ckpt_.tensors.end()) {
      problems_.push_back("missing tensor '" + name.str() + "' (expected shape " +
                          shapeStr(shape) + ")");
      source = SourceAttr::get(ctx_, "<missing>", 0, 0, "F32");
    } else {
      const safetensors::TensorInfo& info = t->second;
      switch (info.dtype) {
      case safetensors::DType::F32: elt = b_.getF32Type(); break;
      case safetensors::DType::F16: elt = b_.getF16Type(); break;
      case safetensors::DType::BF16: elt = b_.getBF16Type(); break;
      default:
        problems_.push_back("tensor '" + name.str() + "' in " + info.file + " has dtype " +
                            safetensors::dtypeName(info.dtype).str() +
                            "; Kiln imports F32, F16 and BF16 weights");
      }
      if (llvm::ArrayRef<int64_t>(info.shape) != shape)
        problems_.push_back("tensor '" + name.str() + "' in " + info.file + " has shape " +
                            shapeStr(info.shape) + " but config.json implies " + shapeStr(shape));
      source = SourceAttr::get(ctx_, info.file, info.dataOffset, info.size,
                               safetensors::dtypeName(info.dtype));
    }
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPointToEnd(module_.getBody());
    // Weights are grouped before the stages; insert before the first function
    // (remembered: looking it up walked every weight, quadratic in their number).
    if (firstStage_)
      b_.setInsertionPoint(firstStage_);
    auto type = RankedTensorType::get(shape, elt);
    auto encodingKind = elt.isF32() ? EncodingKind::f32
                        : elt.isF16() ? EncodingKind::f16
                                      : EncodingKind::bf16;
    op = b_.create<WeightOp>(nameLoc(name), b_.getStringAttr(name), TypeAttr::get(type), source,
                             EncodingAttr::get(ctx_, encodingKind, 0, true, ActivationMode::Float));
    weights_[name.str()] = op;
  }
  return b_.create<WeightRefOp>(nameLoc(name), op.getTensorType(),
                                FlatSymbolRefAttr::get(op.getSymNameAttr()));
}

Value Importer::linear(llvm::StringRef prefix, Value x, int64_t out, int64_t in, bool bias) {
  Value w = weight((prefix + ".weight").str(), {out, in});
  Value bv = bias ? weight((prefix + ".bias").str(), {out}) : Value();
  auto xt = llvm::cast<RankedTensorType>(x.getType());
  return create<LinearOp>(prefix, act({xt.getDimSize(0), out}), x, w, bv);
}

Value Importer::layerNorm(llvm::StringRef prefix, Value x, int64_t dim, double eps) {
  Value w = weight((prefix + ".weight").str(), {dim});
  Value bv = weight((prefix + ".bias").str(), {dim});
  return create<LayerNormOp>(prefix, x.getType(), x, w, bv, b_.getF32FloatAttr(eps));
}

func::FuncOp Importer::beginStage(llvm::StringRef name, StageKind kind, TypeRange inputs,
                                  TypeRange outputs) {
  b_.setInsertionPointToEnd(module_.getBody());
  auto fn = b_.create<func::FuncOp>(nameLoc(name), name, b_.getFunctionType(inputs, outputs));
  if (!firstStage_)
    firstStage_ = fn;
  fn->setAttr("kiln.stage", StageKindAttr::get(ctx_, kind));
  b_.setInsertionPointToStart(fn.addEntryBlock());
  return fn;
}

// CLIP (LLaVA) or SigLIP (Idefics3) vision transformer. Runs as many encoder
// layers as the deepest requested hidden state needs and returns the requested
// hidden states ([patches(+1), hidden]; 0 = embeddings, N = output of layer N).
SmallVector<Value> Importer::visionTransformer(Value pixels, ArrayRef<int64_t> hiddenStates,
                                               bool siglip) {
  const VisionConfig& v = *cfg_.vision;
  const std::string& V = layout_.vision;
  int64_t D = v.hiddenSize, p = v.patchSize, side = v.imageSize / p, patches = side * side;
  Value w = weight(V + "embeddings.patch_embedding.weight", {D, v.numChannels, p, p});
  Value bias = siglip ? weight(V + "embeddings.patch_embedding.bias", {D}) : Value();
  Value x = create<PatchEmbedOp>(V + "embeddings.patch_embedding", act({patches, D}), pixels, w,
                                 bias, Value(), Value(), b_.getI64IntegerAttr(p));
  int64_t rows = patches;
  if (!siglip) {
    Value cls = weight(V + "embeddings.class_embedding", {D});
    rows = patches + 1;
    x = create<ClassTokenOp>(V + "embeddings.class_embedding", act({rows, D}), x, cls);
  }
  Value pos = weight(V + "embeddings.position_embedding.weight", {rows, D});
  x = create<PositionEmbeddingOp>(V + "embeddings.position_embedding", x.getType(), x, pos);
  if (!siglip)
    x = layerNorm(V + "pre_layrnorm", x, D, v.layerNormEps); // sic: the hub spelling

  ActivationKind actKind = *activationFor(v.hiddenAct);
  int64_t heads = v.numAttentionHeads, headDim = D / heads;
  double scale = 1.0 / std::sqrt(static_cast<double>(headDim));
  int64_t layersToRun = *std::max_element(hiddenStates.begin(), hiddenStates.end());
  std::map<int64_t, Value> states = {{0, x}};
  for (int64_t i = 0; i < layersToRun; ++i) {
    std::string L = V + "encoder.layers." + std::to_string(i) + ".";
    Value h = layerNorm(L + "layer_norm1", x, D, v.layerNormEps);
    Value q = linear(L + "self_attn.q_proj", h, D, D, true);
    Value k = linear(L + "self_attn.k_proj", h, D, D, true);
    Value val = linear(L + "self_attn.v_proj", h, D, D, true);
    Value a = create<AttentionOp>(L + "self_attn", act({rows, D}), q, k, val, Value(),
                                  b_.getI64IntegerAttr(heads), b_.getI64IntegerAttr(heads),
                                  b_.getI64IntegerAttr(headDim), b_.getF64FloatAttr(scale),
                                  UnitAttr(), IntegerAttr());
    Value o = linear(L + "self_attn.out_proj", a, D, D, true);
    x = create<AddOp>(L + "residual1", x.getType(), x, o);
    h = layerNorm(L + "layer_norm2", x, D, v.layerNormEps);
    Value m = linear(L + "mlp.fc1", h, v.intermediateSize, D, true);
    m = create<ActivationOp>(L + "mlp.act", m.getType(), m, ActivationKindAttr::get(ctx_, actKind));
    m = linear(L + "mlp.fc2", m, D, v.intermediateSize, true);
    x = create<AddOp>(L + "residual2", x.getType(), x, m);
    states[i + 1] = x;
  }
  SmallVector<Value> out;
  for (int64_t k : hiddenStates)
    out.push_back(states.at(k));
  return out;
}

void Importer::buildVisionStages() {
  const VisionConfig& v = *cfg_.vision;
  bool idefics = cfg_.architecture == "Idefics3ForConditionalGeneration";
  int64_t D = v.hiddenSize, H = cfg_.text.hiddenSize;
  int64_t side = v.imageSize / v.patchSize, patches = side * side;
  auto pixelsType = act({v.numChannels, v.imageSize, v.imageSize});

  // Vision encoder. LLaVA reads hidden states (index 0 = embeddings after
  // pre_layrnorm), one or several concatenated along the feature dimension;
  // Idefics3 reads the last layer's output after post_layernorm.
  SmallVector<int64_t> hiddenStates = {v.numHiddenLayers};
  int64_t featureRows = patches, featureWidth = D;
  if (!idefics) {
    hiddenStates.clear();
    for (int64_t sel : cfg_.visionFeatureLayers)
      hiddenStates.push_back(sel < 0 ? v.numHiddenLayers + 1 + sel : sel);
    featureRows = cfg_.visionFeatureSelectStrategy == "default" ? patches : patches + 1;
    featureWidth = D * static_cast<int64_t>(hiddenStates.size());
  }
  func::FuncOp enc = beginStage("vision_encoder", StageKind::vision_encoder, {pixelsType},
                                {act({featureRows, featureWidth})});
  SmallVector<Value> states = visionTransformer(enc.getArgument(0), hiddenStates, idefics);
  Value x;
  if (idefics) {
    x = layerNorm(layout_.vision + "post_layernorm", states.front(), D, v.layerNormEps);
  } else {
    SmallVector<Value> selected;
    for (Value s : states) {
      if (cfg_.visionFeatureSelectStrategy == "default")
        s = create<SliceRowsOp>(layout_.vision + "select_features", act({patches, D}), s,
                                b_.getI64IntegerAttr(1));
      selected.push_back(s);
    }
    x = selected.size() == 1
            ? selected.front()
            : create<ConcatOp>(layout_.vision + "concat_features", act({featureRows, featureWidth}),
                               selected);
    // post_layernorm and the layers past the deepest selected one never run: say so,
    // and leave their weights out of the model.
    int64_t layersRun = *std::max_element(hiddenStates.begin(), hiddenStates.end());
    std::vector<std::string> dropped;
    for (int64_t i = layersRun; i < v.numHiddenLayers; ++i)
      dropped.push_back(std::to_string(i));
    // One pass over the tensors (not one per dropped layer).
    std::string layersPrefix = layout_.vision + "encoder.layers.";
    for (auto& [name, info] : ckpt_.tensors) {
      llvm::StringRef rest(name);
      unsigned long long index;
      if (rest.consume_front(layersPrefix) && !rest.consumeInteger(10, index) &&
          rest.starts_with(".") && index >= static_cast<unsigned long long>(layersRun))
        markUnused(name);
    }
    for (auto& [name, info] : ckpt_.tensors)
      if (llvm::StringRef(name).starts_with(layout_.vision + "post_layernorm."))
        markUnused(name);
    std::vector<std::string> sel;
    for (int64_t l : cfg_.visionFeatureLayers)
      sel.push_back(std::to_string(l));
    if (!dropped.empty())
      emitRemark(enc.getLoc()) << "vision_feature_layer = " << llvm::join(sel, ", ")
                               << ": vision layer(s) " << llvm::join(dropped, ", ")
                               << " and post_layernorm never run; their weights are dropped";
  }
  b_.create<func::ReturnOp>(nameLoc("vision_encoder"), x);

  // Projector.
  if (idefics) {
    int64_t r = cfg_.scaleFactor, tokens = patches / (r * r);
    imageTokens_ = tokens;
    func::FuncOp proj = beginStage("projector", StageKind::projector, {act({patches, D})},
                                   {act({tokens, H})});
    Value s = create<PixelShuffleOp>("model.connector.pixel_shuffle", act({tokens, D * r * r}),
                                     proj.getArgument(0), b_.getI64IntegerAttr(r));
    Value y = linear("model.connector.modality_projection.proj", s, H, D * r * r, false);
    b_.create<func::ReturnOp>(nameLoc("projector"), y);
  } else {
    imageTokens_ = featureRows;
    func::FuncOp proj = beginStage("projector", StageKind::projector,
                                   {act({featureRows, featureWidth})}, {act({featureRows, H})});
    const std::string& P = layout_.projector;
    Value y = linear(P + "linear_1", proj.getArgument(0), H, featureWidth, cfg_.projectorBias);
    y = create<ActivationOp>(P + "act", y.getType(), y,
                             ActivationKindAttr::get(ctx_, *activationFor(cfg_.projectorHiddenAct)));
    y = linear(P + "linear_2", y, H, H, cfg_.projectorBias);
    b_.create<func::ReturnOp>(nameLoc("projector"), y);
  }
}

Value Importer::decoder(Value tokenIds, Value positions, Value image) {
  const TextConfig& t = cfg_.text;
  const std::string& P = layout_.text;
  int64_t H = t.hiddenSize, heads = t.numAttentionHeads, kv = t.numKeyValueHeads, hd = t.headDim;
  int64_t T = llvm::cast<RankedTensorType>(tokenIds.getType()).getDimSize(0);
  Value table = weight(P + "embed_tokens.weight", {t.vocabSize, H});
  // An image token id past the vocabulary has no embedding row: it is a placeholder
  // whose row the image features replace.
  IntegerAttr placeholder;
  if (image && cfg_.imageTokenId >= t.vocabSize)
    placeholder = b_.getI64IntegerAttr(cfg_.imageTokenId);
  Value x = create<EmbeddingOp>(P + "embed_tokens", act({T, H}), table, tokenIds, placeholder);
  if (image)
    x = create<MergeImageTokensOp>(P + "merge_image_tokens", x.getType(), x, tokenIds, image,
                                   b_.getI64IntegerAttr(cfg_.imageTokenId));

  auto ropeAttrs = [&](int64_t numHeads) {
    SmallVector<NamedAttribute> attrs = {
        b_.getNamedAttr("num_heads", b_.getI64IntegerAttr(numHeads)),
        b_.getNamedAttr("head_dim", b_.getI64IntegerAttr(hd)),
        b_.getNamedAttr("theta", b_.getF64FloatAttr(t.ropeTheta))};
    if (t.ropeScaling.type == "llama3") {
      attrs.push_back(b_.getNamedAttr("rope_type", b_.getStringAttr("llama3")));
      attrs.push_back(b_.getNamedAttr("factor", b_.getF64FloatAttr(t.ropeScaling.factor)));
      attrs.push_back(
          b_.getNamedAttr("low_freq_factor", b_.getF64FloatAttr(t.ropeScaling.lowFreqFactor)));
      attrs.push_back(
          b_.getNamedAttr("high_freq_factor", b_.getF64FloatAttr(t.ropeScaling.highFreqFactor)));
      attrs.push_back(b_.getNamedAttr(
          "original_max_position_embeddings",
          b_.getI64IntegerAttr(t.ropeScaling.originalMaxPositionEmbeddings)));
    }
    return attrs;
  };

  bool qkvBias = t.attentionBias || t.qkvBias;
  for (int64_t i = 0; i < t.numHiddenLayers; ++i) {
    std::string L = P + "layers." + std::to_string(i) + ".";
    auto eps = b_.getF32FloatAttr(t.rmsNormEps);
    Value h = create<RmsNormOp>(L + "input_layernorm", x.getType(), x,
                                weight(L + "input_layernorm.weight", {H}), eps);
    Value q = linear(L + "self_attn.q_proj", h, heads * hd, H, qkvBias);
    Value k = linear(L + "self_attn.k_proj", h, kv * hd, H, qkvBias);
    Value v = linear(L + "self_attn.v_proj", h, kv * hd, H, qkvBias);
    q = b_.create<RopeOp>(nameLoc(L + "self_attn.rotary_q"), q.getType(),
                          ValueRange{q, positions}, ropeAttrs(heads))
            .getResult();
    k = b_.create<RopeOp>(nameLoc(L + "self_attn.rotary_k"), k.getType(),
                          ValueRange{k, positions}, ropeAttrs(kv))
            .getResult();
    Value a = create<AttentionOp>(L + "self_attn", act({T, heads * hd}), q, k, v, positions,
                                  b_.getI64IntegerAttr(heads), b_.getI64IntegerAttr(kv),
                                  b_.getI64IntegerAttr(hd),
                                  b_.getF64FloatAttr(1.0 / std::sqrt(static_cast<double>(hd))),
                                  b_.getUnitAttr(), b_.getI64IntegerAttr(i));
    Value o = linear(L + "self_attn.o_proj", a, H, heads * hd, t.attentionBias);
    x = create<AddOp>(L + "residual1", x.getType(), x, o);
    h = create<RmsNormOp>(L + "post_attention_layernorm", x.getType(), x,
                          weight(L + "post_attention_layernorm.weight", {H}), eps);
    Value m;
    int64_t I = t.intermediateSize;
    auto silu = ActivationKindAttr::get(ctx_, ActivationKind::silu);
    if (t.modelType == "mixtral") {
      std::string M = L + "block_sparse_moe.";
      int64_t E = t.numLocalExperts;
      Value router = weight(M + "gate.weight", {E, H});
      SmallVector<Value> gates, ups, downs;
      SmallVector<int64_t> expertIds;
      for (int64_t e = 0; e < E; ++e) {
        std::string X = M + "experts." + std::to_string(e) + ".";
        gates.push_back(weight(X + "w1.weight", {I, H}));
        ups.push_back(weight(X + "w3.weight", {I, H}));
        downs.push_back(weight(X + "w2.weight", {H, I}));
        expertIds.push_back(e);
      }
      m = create<MoeOp>(L + "block_sparse_moe", x.getType(), h, router, gates, ups, downs,
                        b_.getI64IntegerAttr(t.numExpertsPerTok), b_.getBoolAttr(true), silu,
                        b_.getDenseI64ArrayAttr(expertIds));
    } else if (t.mlpBias) {
      // With biases the MLP is spelled out: down(act(gate(x) + bg) * (up(x) + bu)) + bd.
      Value g = linear(L + "mlp.gate_proj", h, I, H, true);
      g = create<ActivationOp>(L + "mlp.act_fn", g.getType(), g, silu);
      Value u = linear(L + "mlp.up_proj", h, I, H, true);
      Value gu = create<MulOp>(L + "mlp.gate_mul", g.getType(), g, u);
      m = linear(L + "mlp.down_proj", gu, H, I, true);
    } else {
      m = create<GatedMlpOp>(L + "mlp", x.getType(), h, weight(L + "mlp.gate_proj.weight", {I, H}),
                             weight(L + "mlp.up_proj.weight", {I, H}),
                             weight(L + "mlp.down_proj.weight", {H, I}), silu);
    }
    x = create<AddOp>(L + "residual2", x.getType(), x, m);
  }
  return create<RmsNormOp>(P + "norm", x.getType(), x, weight(P + "norm.weight", {H}),
                           b_.getF32FloatAttr(t.rmsNormEps));
}

void Importer::buildDecoderStages() {
  const TextConfig& t = cfg_.text;
  int64_t H = t.hiddenSize;
  bool vlm = cfg_.vision.has_value();

  SmallVector<Type> prefillInputs = {ids(kDyn), ids(kDyn)};
  if (vlm)
    prefillInputs.push_back(act({kDyn, H}));
  func::FuncOp prefill =
      beginStage("decoder_prefill", StageKind::decoder_prefill, prefillInputs, {act({kDyn, H})});
  Value out = decoder(prefill.getArgument(0), prefill.getArgument(1),
                      vlm ? prefill.getArgument(2) : Value());
  b_.create<func::ReturnOp>(nameLoc("decoder_prefill"), out);

  func::FuncOp decode = beginStage("decoder_decode", StageKind::decoder_decode, {ids(1), ids(1)},
                                   {act({1, H})});
  out = decoder(decode.getArgument(0), decode.getArgument(1), Value());
  b_.create<func::ReturnOp>(nameLoc("decoder_decode"), out);

  func::FuncOp head = beginStage("lm_head", StageKind::lm_head, {act({kDyn, H})},
                                 {act({kDyn, t.vocabSize})});
  std::string headName = layout_.lmHead;
  if (t.tieWordEmbeddings) {
    headName = layout_.text + "embed_tokens.weight";
    if (hasTensor(layout_.lmHead))
      markUnused(layout_.lmHead);
  }
  Value w = weight(headName, {t.vocabSize, H});
  Value logits = create<LmHeadOp>("lm_head", act({kDyn, t.vocabSize}), head.getArgument(0), w);
  b_.create<func::ReturnOp>(nameLoc("lm_head"), logits);
}

LogicalResult Importer::readConfigs() {
  if (!llvm::sys::fs::is_directory(dir_)) {
    error(UnknownLoc::get(ctx_), "checkpoint directory '" + dir_ + "' does not exist");
    return failure();
  }
  auto configJson = readJsonFile(path("config.json"), "config.json");
  if (!configJson) {
    error(fileLoc("config.json"), llvm::toString(configJson.takeError()));
    return failure();
  }
  auto cfg = parseModelConfig(*configJson, "config.json");
  if (!cfg) {
    error(fileLoc("config.json"), llvm::toString(cfg.takeError()));
    return failure();
  }
  cfg_ = std::move(*cfg);

  if (llvm::sys::fs::exists(path("generation_config.json"))) {
    auto json = readJsonFile(path("generation_config.json"), "generation_config.json");
    if (!json) {
      error(fileLoc("generation_config.json"), llvm::toString(json.takeError()));
      return failure();
    }
    auto gen = parseGenerationConfig(*json, "generation_config.json");
    if (!gen) {
      error(fileLoc("generation_config.json"), llvm::toString(gen.takeError()));
      return failure();
    }
    gen_ = std::move(*gen);
  }

  // Token ids the runtime looks up must be in the model's vocabulary (it refuses an
  // artifact whose EOS or BOS is not); name the file and key that gave the id.
  {
    const TextConfig& t = cfg_.text;
    std::string textKey = cfg_.vision ? "text_config." : "";
    bool genEos = gen_ && !gen_->eosTokenIds.empty(), genBos = gen_ && gen_->bosTokenId;
    auto check = [&](int64_t id, bool fromGen, llvm::StringRef key) {
      if (id >= 0 && id < t.vocabSize)
        return true;
      llvm::StringRef file = fromGen ? "generation_config.json" : "config.json";
      error(fileLoc(file), (file + ": " + (fromGen ? std::string() : textKey) + key + ": " +
                            std::to_string(id) + " is outside the vocabulary (vocab_size " +
                            std::to_string(t.vocabSize) + ")")
                               .str());
      return false;
    };
    for (int64_t e : genEos ? gen_->eosTokenIds : t.eosTokenIds)
      if (!check(e, genEos, "eos_token_id"))
        return failure();
    if (std::optional<int64_t> bos = genBos ? gen_->bosTokenId : t.bosTokenId)
      if (!check(*bos, genBos, "bos_token_id"))
        return failure();
  }

  if (cfg_.vision) {
    if (!llvm::sys::fs::exists(path("preprocessor_config.json"))) {
      error(fileLoc("preprocessor_config.json"),
            "missing: " + cfg_.architecture + " needs the image processor configuration");
      return failure();
    }
    auto json = readJsonFile(path("preprocessor_config.json"), "preprocessor_config.json");
    if (!json) {
      error(fileLoc("preprocessor_config.json"), llvm::toString(json.takeError()));
      return failure();
    }
    auto pre = parsePreprocessorConfig(*json, "preprocessor_config.json");
    if (!pre) {
      error(fileLoc("preprocessor_config.json"), llvm::toString(pre.takeError()));
      return failure();
    }
    pre_ = std::move(*pre);
    bool idefics = cfg_.architecture == "Idefics3ForConditionalGeneration";
    bool idProc = pre_->processorType == "Idefics3ImageProcessor";
    if (idefics != idProc) {
      error(fileLoc("preprocessor_config.json"),
            "preprocessor_config.json: " + pre_->processorType + " does not belong to " +
                cfg_.architecture);
      return failure();
    }
    int64_t size = idefics ? pre_->maxImageEdge
                           : (pre_->doCenterCrop ? pre_->cropHeight : pre_->shortestEdge);
    if (size != cfg_.vision->imageSize ||
        (!idefics && pre_->doCenterCrop && pre_->cropWidth != cfg_.vision->imageSize)) {
      error(fileLoc("preprocessor_config.json"),
            "preprocessor_config.json: processed images are " + std::to_string(size) +
                " pixels but the vision tower expects image_size " +
                std::to_string(cfg_.vision->imageSize));
      return failure();
    }
    if (idefics && pre_->doImageSplitting)
      emitWarning(fileLoc("preprocessor_config.json"))
          << "do_image_splitting is not supported yet: images are encoded as one tile of "
          << pre_->maxImageEdge << "x" << pre_->maxImageEdge;
  }

  // The tokenizer travels to the artifact; check it is there and is a BPE model.
  auto tok = readJsonFile(path("tokenizer.json"), "tokenizer.json");
  if (!tok) {
    error(fileLoc("tokenizer.json"), llvm::toString(tok.takeError()));
    return failure();
  }
  const llvm::json::Object* tokObj = tok->getAsObject();
  const llvm::json::Object* model = tokObj ? tokObj->getObject("model") : nullptr;
  const llvm::json::Object* vocab = model ? model->getObject("vocab") : nullptr;
  if (!model || model->getString("type") != std::optional<llvm::StringRef>("BPE") || !vocab) {
    error(fileLoc("tokenizer.json"), "tokenizer.json: only BPE tokenizers (model.type \"BPE\" "
                                     "with a vocab) are supported");
    return failure();
  }
  tokenizerVocab_ = static_cast<int64_t>(vocab->size());
  if (const llvm::json::Array* added = tokObj->getArray("added_tokens"))
    tokenizerAdded_ = static_cast<int64_t>(added->size());
  if (failed(readChatTemplate(*tokObj)))
    return failure();

  auto ckpt = safetensors::openCheckpoint(dir_);
  if (!ckpt) {
    error(fileLoc("model.safetensors"), llvm::toString(ckpt.takeError()));
    return failure();
  }
  ckpt_ = std::move(*ckpt);
  return success();
}

void Importer::setModuleAttributes() {
  const TextConfig& t = cfg_.text;
  Builder b(ctx_);

  module_->setAttr("kiln.architecture", b.getStringAttr(cfg_.architecture));
  llvm::SmallString<256> abs(dir_);
  llvm::sys::fs::make_absolute(abs);
  llvm::sys::path::remove_dots(abs, true);
  module_->setAttr("kiln.checkpoint", b.getStringAttr(abs));

  module_->setAttr("kiln.text",
                   TextConfigAttr::get(ctx_, t.vocabSize, t.hiddenSize, t.numHiddenLayers, t.numAttentionHeads,
                                       t.numKeyValueHeads, t.headDim, t.maxPositionEmbeddings,
                                       t.tieWordEmbeddings, t.slidingWindow.value_or(0)));

  if (cfg_.vision) {
    module_->setAttr("kiln.image", ImageConfigAttr::get(ctx_, cfg_.vision->imageSize, cfg_.vision->numChannels,
                                                        imageTokens_, cfg_.imageTokenId));
    const PreprocessorConfig& p = *pre_;
    module_->setAttr("kiln.preprocessor",
                     PreprocessorConfigAttr::get(ctx_, p.processorType, p.doConvertRgb, p.doResize, p.shortestEdge,
                                                 p.longestEdge, p.resample, p.doCenterCrop,
                                                 {p.cropHeight, p.cropWidth}, p.doRescale, p.rescaleFactor,
                                                 p.doNormalize, llvm::SmallVector<F64>(p.imageMean.begin(), p.imageMean.end()),
                                                 llvm::SmallVector<F64>(p.imageStd.begin(), p.imageStd.end()),
                                                 p.maxImageEdge));
  }

  std::optional<int64_t> bos = gen_ && gen_->bosTokenId ? gen_->bosTokenId : t.bosTokenId;
  std::vector<int64_t> eos = gen_ && !gen_->eosTokenIds.empty() ? gen_->eosTokenIds : t.eosTokenIds;
  module_->setAttr(
      "kiln.generation",
      gen_ ? GenerationConfigAttr::get(ctx_, bos.value_or(-1), eos, gen_->padTokenId.value_or(-1), gen_->doSample,
                                       gen_->temperature, gen_->topK, gen_->topP, gen_->maxNewTokens.value_or(0),
                                       gen_->repetitionPenalty)
           : GenerationConfigAttr::get(ctx_, bos.value_or(-1), eos, -1, false, 1.0, 0, 1.0, 0, 1.0));

  module_->setAttr("kiln.tokenizer",
                   TokenizerConfigAttr::get(ctx_, "tokenizer.json", tokenizerVocab_, tokenizerAdded_));

  // The built-in template older runtimes apply (newer ones apply kiln.chat_template).
  module_->setAttr("kiln.prompt_template", b.getStringAttr(builtinTemplateName()));
  if (chat_) {
    const ChatPieces& c = *chat_;
    SmallVector<Attribute> turns;
    for (int prev = 0; prev < 4; ++prev)
      for (int role = 0; role < kRoles; ++role)
        for (int image = 0; image < 2; ++image) {
          const ChatTurn& t = c.turns[prev][role][image];
          turns.push_back(b.getArrayAttr({b.getBoolAttr(t.allowed), b.getStringAttr(t.text),
                                          b.getStringAttr(t.afterImage)}));
        }
    unsigned trim = 0;
    for (int r = 0; r < kRoles; ++r) trim |= (c.trimLeft[r] ? 1u << r : 0u) | (c.trimRight[r] ? 8u << r : 0u);
    module_->setAttr("kiln.chat_template",
                     b.getDictionaryAttr({b.getNamedAttr("source", b.getStringAttr(c.source)),
                                          b.getNamedAttr("jinja", b.getStringAttr(c.jinja)),
                                          b.getNamedAttr("turns", b.getArrayAttr(turns)),
                                          b.getNamedAttr("generation_prompt", b.getStringAttr(c.generationPrompt)),
                                          b.getNamedAttr("trim", b.getI32IntegerAttr(static_cast<int32_t>(trim))),
                                          b.getNamedAttr("image_open", b.getStringAttr(imageOpen_)),
                                          b.getNamedAttr("image_close", b.getStringAttr(imageClose_)),
                                          b.getNamedAttr("starts_with_bos", b.getBoolAttr(chatStartsWithBos_))}));
  }
}

// The architecture's built-in template (tests/models/kiln_models/prompts.py), or
// --prompt-template's.
std::string Importer::builtinTemplateName() const {
  if (!options_.promptTemplate.empty()) return options_.promptTemplate;
  llvm::StringRef arch = cfg_.architecture;
  if (arch == "LlavaForConditionalGeneration") return cfg_.text.modelType == "qwen2" ? "llava-chatml" : "llava";
  if (arch == "Idefics3ForConditionalGeneration") return "idefics3";
  return "plain";
}

// The chat template: --chat-template's (a built-in name, a file, none), else the
// checkpoint's, else the architecture's built-in; derived into the pieces the
// runtime applies (ChatTemplate.h). A template given by option that cannot be used
// is an error; the checkpoint's is a warning, and the built-in is used instead.
LogicalResult Importer::readChatTemplate(const llvm::json::Object& tokenizer) {
  auto readText = [&](const std::string& file, std::string* out) {
    auto buffer = llvm::MemoryBuffer::getFile(file);
    if (!buffer) return false;
    *out = (*buffer)->getBuffer().str();
    return true;
  };
  // tokenizer_config.json's special tokens: the template's bos_token, eos_token, ...
  ChatVariables vars;
  std::optional<llvm::json::Value> tokConfig;
  if (llvm::sys::fs::exists(path("tokenizer_config.json"))) {
    auto json = readJsonFile(path("tokenizer_config.json"), "tokenizer_config.json");
    if (!json) {
      error(fileLoc("tokenizer_config.json"), llvm::toString(json.takeError()));
      return failure();
    }
    tokConfig = std::move(*json);
    if (const llvm::json::Object* o = tokConfig->getAsObject())
      for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
        const llvm::json::Value* v = o->get(key);
        if (!v) continue;
        if (auto str = v->getAsString()) vars[key] = str->str();
        else if (const llvm::json::Object* added = v->getAsObject())  // {"content": "<s>", ...}
          if (auto content = added->getString("content")) vars[key] = content->str();
      }
  }
  // The image token's text ("<image>"): the tokenizer's token of config.json's id.
  std::string imageToken;
  if (cfg_.vision) {
    imageToken = "<image>";
    if (const llvm::json::Array* added = tokenizer.getArray("added_tokens"))
      for (const llvm::json::Value& a : *added)
        if (const llvm::json::Object* o = a.getAsObject())
          if (o->getInteger("id") == cfg_.imageTokenId)
            if (auto content = o->getString("content")) imageToken = content->str();
  }
  if (cfg_.architecture == "Idefics3ForConditionalGeneration") {  // Idefics3Processor._prompt_single_image
    imageOpen_ = "<fake_token_around_image><global-img>";
    imageClose_ = "<fake_token_around_image>";
  }

  std::string choice = options_.chatTemplate.empty() ? options_.promptTemplate : options_.chatTemplate;
  bool explicitChoice = !choice.empty();
  if (choice == "none" || choice == "plain") return success();
  std::string text, source;
  if (explicitChoice) {
    text = builtinChatTemplate(choice);
    source = "built-in " + choice;
    if (text.empty()) {
      source = choice;
      if (!llvm::sys::fs::is_regular_file(choice)) {
        error(UnknownLoc::get(ctx_), "--chat-template '" + choice +
                                         "': neither a built-in template (llava, llava-chatml, idefics3, chatml, "
                                         "none) nor a file");
        return failure();
      }
      if (!readText(choice, &text)) {
        error(UnknownLoc::get(ctx_), "--chat-template '" + choice + "': cannot read the file");
        return failure();
      }
      if (llvm::StringRef(choice).ends_with(".json")) {
        auto json = llvm::json::parse(text);
        const llvm::json::Object* o = json ? json->getAsObject() : nullptr;
        auto t = o ? o->getString("chat_template") : std::nullopt;
        if (!json) llvm::consumeError(json.takeError());
        if (!t) {
          error(UnknownLoc::get(ctx_), "--chat-template '" + choice + "': no \"chat_template\" string in the JSON");
          return failure();
        }
        text = t->str();
      }
    }
  } else {
    // transformers' order: a processor's chat_template.jinja / .json, then the tokenizer's.
    if (readText(path("chat_template.jinja"), &text)) {
      source = "chat_template.jinja";
    } else if (llvm::sys::fs::exists(path("chat_template.json"))) {
      auto json = readJsonFile(path("chat_template.json"), "chat_template.json");
      if (!json) {
        error(fileLoc("chat_template.json"), llvm::toString(json.takeError()));
        return failure();
      }
      const llvm::json::Object* o = json->getAsObject();
      if (auto t = o ? o->getString("chat_template") : std::nullopt) {
        text = t->str();
        source = "chat_template.json";
      }
    } else if (const llvm::json::Object* o = tokConfig ? tokConfig->getAsObject() : nullptr) {
      const llvm::json::Value* t = o->get("chat_template");
      if (t && t->getAsString()) {
        text = t->getAsString()->str();
      } else if (t && t->getAsArray()) {  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        for (const llvm::json::Value& named : *t->getAsArray())
          if (const llvm::json::Object* n = named.getAsObject())
            if (n->getString("name") == std::optional<llvm::StringRef>("default"))
              if (auto tt = n->getString("template")) text = tt->str();
      }
      if (!text.empty()) source = "tokenizer_config.json";
    }
  }
  auto derive = [&](const std::string& t, const std::string& src) {
    ChatPieces pieces;
    std::string why;
    if (!deriveChatPieces(t, vars, imageToken, &pieces, &why)) return std::optional<std::string>(why);
    pieces.source = src;
    chat_ = std::move(pieces);
    return std::optional<std::string>();
  };
  if (!text.empty()) {
    auto why = derive(text, source);
    if (!why) {
      // Tokenized without adding BOS when the template writes it (no second BOS).
      auto it = vars.find("bos_token");
      if (it != vars.end() && !it->second.empty()) {
        chatStartsWithBos_ = true;
        for (int role = 0; role < kRoles; ++role)
          for (int image = 0; image < 2; ++image) {
            const ChatTurn& t = chat_->turns[kChatStart][role][image];
            if (t.allowed && !llvm::StringRef(t.text).starts_with(it->second)) chatStartsWithBos_ = false;
          }
      }
      return success();
    }
    if (explicitChoice) {
      error(UnknownLoc::get(ctx_), "--chat-template '" + choice + "': " + *why);
      return failure();
    }
    emitWarning(fileLoc(source)) << "the chat template cannot be used (" << *why << "); prompts use the built-in '"
                                 << builtinTemplateName() << "' template";
  }
  std::string name = builtinTemplateName();
  if (name == "plain") return success();
  if (auto why = derive(builtinChatTemplate(name), "built-in " + name)) {
    error(UnknownLoc::get(ctx_), "built-in chat template '" + name + "': " + *why);
    return failure();
  }
  return success();
}

// Counts the config declares (layers, experts) are checked against the tensors the
// checkpoint holds before anything is built: a config declaring a million layers
// fails at once, naming the key, instead of building a million layers' IR to report
// them missing.
LogicalResult Importer::checkDeclaredCounts() {
  // The number of consecutive indices N such that some tensor starts with
  // prefix + "<i>." for every i < N (one pass over the names).
  auto present = [&](const std::string& prefix) {
    std::set<unsigned long long> seen;
    for (const auto& [name, info] : ckpt_.tensors) {
      llvm::StringRef rest(name);
      unsigned long long index;
      if (rest.consume_front(prefix) && !rest.consumeInteger(10, index) && rest.starts_with("."))
        seen.insert(index);
    }
    int64_t n = 0;
    while (seen.count(static_cast<unsigned long long>(n)))
      ++n;
    return n;
  };
  auto where = [&]() {
    return ckpt_.files.size() == 1 ? llvm::sys::path::filename(ckpt_.files[0].path).str()
                                   : std::string("the checkpoint's shards");
  };
  const TextConfig& t = cfg_.text;
  std::string textKey = cfg_.vision ? "text_config." : "";
  std::string layers = layout_.text + "layers.";
  int64_t have = present(layers);
  if (t.numHiddenLayers > have) {
    error(fileLoc("config.json"),
          "config.json: " + textKey + "num_hidden_layers: " + std::to_string(t.numHiddenLayers) +
              " layers declared but " + where() + " has tensors for " + std::to_string(have) +
              " (" + layers + "0 to " + layers + std::to_string(std::max<int64_t>(have, 1) - 1) +
              ")");
    return failure();
  }
  if (t.modelType == "mixtral") {
    for (int64_t i = 0; i < t.numHiddenLayers; ++i) {
      std::string experts = layers + std::to_string(i) + ".block_sparse_moe.experts.";
      int64_t e = present(experts);
      if (t.numLocalExperts > e) {
        error(fileLoc("config.json"),
              "config.json: " + textKey + "num_local_experts: " +
                  std::to_string(t.numLocalExperts) + " experts declared but " + where() +
                  " has tensors for " + std::to_string(e) + " under " + experts);
        return failure();
      }
      break; // every layer has the same experts: the first one tells
    }
  }
  if (cfg_.vision) {
    const VisionConfig& v = *cfg_.vision;
    // LLaVA runs the layers up to the deepest selected hidden state; Idefics3 all.
    int64_t needed = v.numHiddenLayers;
    if (cfg_.architecture == "LlavaForConditionalGeneration") {
      needed = 0;
      for (int64_t sel : cfg_.visionFeatureLayers)
        needed = std::max(needed, sel < 0 ? v.numHiddenLayers + 1 + sel : sel);
    }
    std::string vlayers = layout_.vision + "encoder.layers.";
    int64_t vhave = present(vlayers);
    if (needed > vhave) {
      error(fileLoc("config.json"),
            "config.json: vision_config.num_hidden_layers: " + std::to_string(v.numHiddenLayers) +
                " layers declared (" + std::to_string(needed) + " run) but " + where() +
                " has tensors for " + std::to_string(vhave) + " under " + vlayers);
      return failure();
    }
  }
  return success();
}

// Non-finite weights compile into a model whose every logit is NaN: refuse them,
// naming the tensor and the first bad element.
LogicalResult Importer::checkFiniteWeights() {
  std::map<std::string, std::unique_ptr<llvm::MemoryBuffer>> files;
  for (const auto& [name, op] : weights_) {
    auto t = ckpt_.tensors.find(name);
    if (t == ckpt_.tensors.end())
      continue;
    const safetensors::TensorInfo& info = t->second;
    auto it = files.find(info.file);
    if (it == files.end()) {
      llvm::SmallString<256> p(dir_);
      llvm::sys::path::append(p, info.file);
      auto buf = llvm::MemoryBuffer::getFile(p, /*IsText=*/false,
                                             /*RequiresNullTerminator=*/false);
      if (!buf) {
        error(fileLoc(info.file), info.file + ": cannot read: " + buf.getError().message());
        return failure();
      }
      it = files.emplace(info.file, std::move(*buf)).first;
    }
    const llvm::MemoryBuffer& buf = *it->second;
    if (info.dataOffset > buf.getBufferSize() ||
        info.size > buf.getBufferSize() - info.dataOffset)
      continue; // the header check reported it
    const uint8_t* p = reinterpret_cast<const uint8_t*>(buf.getBufferStart()) + info.dataOffset;
    uint64_t n = info.numElements(), bad = n;
    switch (info.dtype) {
    case safetensors::DType::F32:
      for (uint64_t i = 0; i < n && bad == n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, p + 4 * i, 4);
        if ((bits & 0x7f800000u) == 0x7f800000u)
          bad = i;
      }
      break;
    case safetensors::DType::F16:
    case safetensors::DType::BF16: {
      uint16_t mask = info.dtype == safetensors::DType::F16 ? 0x7c00 : 0x7f80;
      for (uint64_t i = 0; i < n && bad == n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, p + 2 * i, 2);
        if ((bits & mask) == mask)
          bad = i;
      }
      break;
    }
    default:
      continue;
    }
    if (bad != n) {
      error(nameLoc(name), info.file + ": tensor '" + name + "' has a non-finite value (NaN or " +
                               "infinity) at element " + std::to_string(bad) +
                               ": the model would compute NaN logits");
      return failure();
    }
  }
  return success();
}

LogicalResult Importer::finish() {
  if (!problems_.empty()) {
    std::string where = ckpt_.files.size() == 1
                            ? llvm::sys::path::filename(ckpt_.files[0].path).str()
                            : std::string("model.safetensors.index.json");
    InFlightDiagnostic diag = emitError(fileLoc(where))
                              << where << ": checkpoint does not match " << cfg_.architecture
                              << " (" << problems_.size() << " problem(s))";
    for (const std::string& p : problems_)
      diag.attachNote() << p;
    return failure();
  }
  std::vector<std::string> extra;
  for (const auto& [name, info] : ckpt_.tensors)
    if (!weights_.count(name) && !knownUnused_.count(name))
      extra.push_back(name);
  if (!extra.empty()) {
    InFlightDiagnostic diag = emitWarning(fileLoc(ckpt_.files.front().path))
                              << "checkpoint: " << extra.size()
                              << " tensor(s) are not used by "
                              << cfg_.architecture << " and are ignored";
    for (size_t i = 0; i < extra.size() && i < 16; ++i)
      diag.attachNote() << "unused tensor '" << extra[i] << "'";
  }
  return success();
}

OwningOpRef<ModuleOp> Importer::run() {
  registerImporterDialects(ctx_);
  if (failed(readConfigs()))
    return {};

  // Tensor-name layout. LLaVA exists in two hub layouts: LLaVA-1.5
  // ("language_model.model.*") and the one transformers >= 4.52 writes
  // ("model.language_model.*").
  llvm::StringRef arch = cfg_.architecture;
  if (arch == "LlavaForConditionalGeneration") {
    if (hasTensor("model.language_model.embed_tokens.weight"))
      layout_ = {"model.language_model.", "lm_head.weight", "model.vision_tower.vision_model.",
                 "model.multi_modal_projector."};
    else
      layout_ = {"language_model.model.", "language_model.lm_head.weight",
                 "vision_tower.vision_model.", "multi_modal_projector."};
  } else if (arch == "Idefics3ForConditionalGeneration") {
    layout_ = {"model.text_model.", "lm_head.weight", "model.vision_model.", "model.connector."};
  } else {
    layout_ = {"model.", "lm_head.weight", "", ""};
  }

  if (cfg_.vision && !activationFor(cfg_.vision->hiddenAct)) {
    error(fileLoc("config.json"), "config.json: vision_config.hidden_act: '" +
                                      cfg_.vision->hiddenAct + "' is not supported");
    return {};
  }
  if (cfg_.vision && !activationFor(cfg_.projectorHiddenAct)) {
    error(fileLoc("config.json"), "config.json: projector_hidden_act: '" +
                                      cfg_.projectorHiddenAct + "' is not supported");
    return {};
  }

  if (failed(checkDeclaredCounts()))
    return {};

  OwningOpRef<ModuleOp> module = ModuleOp::create(UnknownLoc::get(ctx_));
  module_ = *module;
  if (cfg_.vision)
    buildVisionStages();
  buildDecoderStages();
  if (failed(finish()) || failed(checkFiniteWeights()))
    return {};
  setModuleAttributes();
  if (cfg_.text.slidingWindow && *cfg_.text.slidingWindow < cfg_.text.maxPositionEmbeddings)
    emitWarning(fileLoc("config.json"))
        << "sliding_window = " << *cfg_.text.slidingWindow
        << ": contexts are limited to the window, where full and windowed attention agree";
  if (failed(mlir::verify(*module)))
    return {};
  return module;
}

} // namespace

OwningOpRef<ModuleOp> importCheckpoint(MLIRContext* context, llvm::StringRef directory,
                                       const ImportOptions& options) {
  return Importer(context, directory, options).run();
}

} // namespace kiln::hf
