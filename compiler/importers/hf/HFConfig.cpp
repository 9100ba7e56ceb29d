//===- HFConfig.cpp - Hugging Face config.json -------------------*- C++ -*-===//
#include "compiler/importers/hf/HFConfig.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/MemoryBuffer.h"

namespace kiln::hf {

llvm::ArrayRef<llvm::StringLiteral> supportedArchitectures() {
  static const llvm::StringLiteral kArchs[] = {
      "LlamaForCausalLM", "Qwen2ForCausalLM", "MixtralForCausalLM",
      "LlavaForConditionalGeneration", "Idefics3ForConditionalGeneration"};
  return kArchs;
}

namespace {

constexpr int64_t kMaxInt32 = 2147483647;
// The runtime's bounds (runtime/src/verify.h), which the artifact must meet.
constexpr int64_t kMaxVocab = int64_t{1} << 22;
constexpr int64_t kMaxDim = int64_t{1} << 26;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeadDim = 4096;
constexpr int64_t kMaxImageSize = 8192;
// Experts per MoE layer: far beyond any checkpoint (Mixtral has 8).
constexpr int64_t kMaxExperts = 1024;

/// Reads typed keys of one JSON object, remembering the first error. Key paths in
/// errors are prefixed by the object's own path ("text_config.").
class Reader {
public:
  Reader(const llvm::json::Object* obj, std::string file, std::string prefix,
         std::shared_ptr<std::string> error = nullptr)
      : obj_(obj), file_(std::move(file)), prefix_(std::move(prefix)),
        error_(error ? error : std::make_shared<std::string>()) {}

  bool has(llvm::StringRef key) const {
    const llvm::json::Value* v = obj_ ? obj_->get(key) : nullptr;
    return v && v->kind() != llvm::json::Value::Null;
  }
  const llvm::json::Value* raw(llvm::StringRef key) const {
    const llvm::json::Value* v = obj_ ? obj_->get(key) : nullptr;
    return v && v->kind() != llvm::json::Value::Null ? v : nullptr;
  }

  int64_t integer(llvm::StringRef key, int64_t dflt) {
    const llvm::json::Value* v = raw(key);
    if (!v)
      return dflt;
    if (auto i = v->getAsInteger())
      return *i;
    setError(key, "expected an integer");
    return dflt;
  }
  std::optional<int64_t> optInteger(llvm::StringRef key) {
    if (!has(key))
      return std::nullopt;
    return integer(key, 0);
  }
  /// A positive integer of at most `max`: the artifact stores these in 32-bit
  /// fields and the runtime bounds them (runtime/src/verify.h), so a value past the
  /// bound is refused here, naming the key, rather than narrowed or refused at load.
  int64_t positive(llvm::StringRef key, int64_t dflt, int64_t max = kMaxInt32) {
    int64_t v = integer(key, dflt);
    if (v <= 0)
      setError(key, "must be positive, got " + std::to_string(v));
    else if (v > max)
      setError(key, std::to_string(v) + " exceeds the supported maximum " + std::to_string(max));
    return v;
  }
  /// An integer in [lo, hi] when present.
  std::optional<int64_t> optInRange(llvm::StringRef key, int64_t lo, int64_t hi) {
    std::optional<int64_t> v = optInteger(key);
    if (v && (*v < lo || *v > hi))
      setError(key, std::to_string(*v) + " is outside [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
    return v;
  }
  /// A finite number greater than `above`.
  double numberAbove(llvm::StringRef key, double dflt, double above) {
    double v = number(key, dflt);
    if (!(v > above) || !std::isfinite(v)) {
      char msg[96];
      std::snprintf(msg, sizeof(msg), "must be a finite number greater than %g, got %g", above, v);
      setError(key, msg);
    }
    return v;
  }
  double number(llvm::StringRef key, double dflt) {
    const llvm::json::Value* v = raw(key);
    if (!v)
      return dflt;
    if (auto d = v->getAsNumber())
      return *d;
    setError(key, "expected a number");
    return dflt;
  }
  bool boolean(llvm::StringRef key, bool dflt) {
    const llvm::json::Value* v = raw(key);
    if (!v)
      return dflt;
    if (auto b = v->getAsBoolean())
      return *b;
    setError(key, "expected true or false");
    return dflt;
  }
  std::string string(llvm::StringRef key, llvm::StringRef dflt) {
    const llvm::json::Value* v = raw(key);
    if (!v)
      return dflt.str();
    if (auto s = v->getAsString())
      return s->str();
    setError(key, "expected a string");
    return dflt.str();
  }
  /// An integer or a list of integers (eos_token_id may be either).
  std::vector<int64_t> integers(llvm::StringRef key) {
    std::vector<int64_t> out;
    const llvm::json::Value* v = raw(key);
    if (!v)
      return out;
    if (auto i = v->getAsInteger()) {
      out.push_back(*i);
    } else if (const llvm::json::Array* a = v->getAsArray()) {
      for (const llvm::json::Value& e : *a) {
        if (auto i = e.getAsInteger())
          out.push_back(*i);
        else
          setError(key, "expected integers");
      }
    } else {
      setError(key, "expected an integer or a list of integers");
    }
    for (int64_t i : out)
      if (i < 0 || i > kMaxInt32)
        setError(key, std::to_string(i) + " is not a token id (0 to 2^31-1)");
    return out;
  }
  std::vector<double> numbers(llvm::StringRef key, std::vector<double> dflt) {
    const llvm::json::Value* v = raw(key);
    if (!v)
      return dflt;
    std::vector<double> out;
    if (auto d = v->getAsNumber())
      return {*d, *d, *d};
    if (const llvm::json::Array* a = v->getAsArray()) {
      for (const llvm::json::Value& e : *a) {
        if (auto d = e.getAsNumber())
          out.push_back(*d);
        else
          setError(key, "expected numbers");
      }
      return out;
    }
    setError(key, "expected a number or a list of numbers");
    return dflt;
  }
  /// A nested object (absent: a reader over nothing, so every key takes its default).
  Reader object(llvm::StringRef key) {
    const llvm::json::Value* v = raw(key);
    const llvm::json::Object* o = nullptr;
    if (v) {
      o = v->getAsObject();
      if (!o)
        setError(key, "expected an object");
    }
    return Reader(o, file_, prefix_ + key.str() + ".", error_);
  }

  void setError(llvm::StringRef key, const std::string& message) {
    if (error_->empty())
      *error_ = file_ + ": " + prefix_ + key.str() + ": " + message;
  }
  llvm::Error takeError() const {
    if (error_->empty())
      return llvm::Error::success();
    return llvm::createStringError(llvm::inconvertibleErrorCode(), *error_);
  }
  bool failed() const { return !error_->empty(); }

private:
  const llvm::json::Object* obj_;
  std::string file_;
  std::string prefix_;
  std::shared_ptr<std::string> error_;
};

// Token ids go into the artifact's 32-bit fields.
void checkTokenIds(Reader& r, llvm::StringRef key, const std::vector<int64_t>& ids) {
  for (int64_t id : ids)
    if (id < 0 || id > kMaxInt32) {
      r.setError(key, std::to_string(id) + " is outside [0, 2^31-1]");
      return;
    }
}

// Defaults of transformers' LlamaConfig / Qwen2Config / MixtralConfig.
TextConfig parseText(Reader r, llvm::StringRef modelType) {
  TextConfig t;
  t.modelType = modelType.str();
  bool qwen2 = modelType == "qwen2", mixtral = modelType == "mixtral";
  t.vocabSize = r.positive("vocab_size", qwen2 ? 151936 : 32000, kMaxVocab);
  t.hiddenSize = r.positive("hidden_size", 4096, kMaxDim);
  t.intermediateSize =
      r.positive("intermediate_size", qwen2 ? 22016 : mixtral ? 14336 : 11008, kMaxDim);
  t.numHiddenLayers = r.positive("num_hidden_layers", 32, kMaxLayers);
  t.numAttentionHeads = r.positive("num_attention_heads", 32, kMaxDim);
  t.numKeyValueHeads = r.positive("num_key_value_heads", mixtral ? 8 : t.numAttentionHeads, kMaxDim);
  t.headDim = r.has("head_dim") ? r.positive("head_dim", 0, kMaxHeadDim)
                                : (t.numAttentionHeads > 0 ? t.hiddenSize / t.numAttentionHeads : 0);
  t.maxPositionEmbeddings =
      r.positive("max_position_embeddings", qwen2 ? 32768 : mixtral ? 131072 : 2048);
  t.rmsNormEps = r.number("rms_norm_eps", mixtral ? 1e-5 : 1e-6);
  t.ropeTheta = r.number("rope_theta", mixtral ? 1e6 : 10000.0);
  t.hiddenAct = r.string("hidden_act", "silu");
  t.tieWordEmbeddings = r.boolean("tie_word_embeddings", false);
  t.attentionBias = r.boolean("attention_bias", false);
  t.mlpBias = r.boolean("mlp_bias", false);
  t.qkvBias = qwen2; // Qwen2Attention: q/k/v with bias, o_proj without
  if (mixtral) {
    t.numLocalExperts = r.positive("num_local_experts", 8, kMaxExperts);
    t.numExpertsPerTok = r.positive("num_experts_per_tok", 2, kMaxExperts);
    t.slidingWindow = r.optInRange("sliding_window", 1, kMaxInt32);
  } else if (qwen2 && r.boolean("use_sliding_window", false)) {
    t.slidingWindow = r.has("sliding_window") ? r.optInRange("sliding_window", 1, kMaxInt32)
                                              : std::optional<int64_t>(4096);
  }
  t.bosTokenId = r.optInRange("bos_token_id", 0, kMaxInt32);
  t.eosTokenIds = r.integers("eos_token_id");
  checkTokenIds(r, "eos_token_id", t.eosTokenIds);

  if (r.has("rope_scaling")) {
    Reader s = r.object("rope_scaling");
    std::string type = s.string("rope_type", s.string("type", "default"));
    if (type == "llama3") {
      t.ropeScaling.type = "llama3";
      // As the runtime's RoPE check: positive factors, high_freq_factor above
      // low_freq_factor (their difference divides).
      t.ropeScaling.factor = s.numberAbove("factor", 8.0, 0.0);
      t.ropeScaling.lowFreqFactor = s.numberAbove("low_freq_factor", 1.0, 0.0);
      t.ropeScaling.highFreqFactor = s.number("high_freq_factor", 4.0);
      if (!s.failed() && !(t.ropeScaling.highFreqFactor > t.ropeScaling.lowFreqFactor &&
                           std::isfinite(t.ropeScaling.highFreqFactor)))
        s.setError("high_freq_factor", "must be greater than low_freq_factor");
      t.ropeScaling.originalMaxPositionEmbeddings =
          s.positive("original_max_position_embeddings", 8192);
    } else if (type != "default") {
      s.setError("rope_type", "rope scaling '" + type + "' is not supported (supported: llama3)");
    }
  }

  if (!r.failed()) {
    if (t.hiddenAct != "silu")
      r.setError("hidden_act", "'" + t.hiddenAct + "' is not supported for the text model (silu)");
    else if (t.numAttentionHeads % t.numKeyValueHeads != 0)
      r.setError("num_key_value_heads", std::to_string(t.numKeyValueHeads) +
                                            " does not divide num_attention_heads (" +
                                            std::to_string(t.numAttentionHeads) + ")");
    else if (t.headDim % 2 != 0)
      r.setError("head_dim", "rotary embeddings need an even head_dim, got " +
                                 std::to_string(t.headDim));
    else if (mixtral && t.numExpertsPerTok > t.numLocalExperts)
      r.setError("num_experts_per_tok", "exceeds num_local_experts");
  }
  return t;
}

VisionConfig parseVision(Reader r, bool siglip) {
  VisionConfig v;
  v.modelType = siglip ? "idefics3_vision" : "clip_vision_model";
  // LlavaConfig's default CLIP tower (ViT-L/14-336) when keys are missing;
  // Idefics3VisionConfig's defaults for SigLIP.
  v.hiddenSize = r.positive("hidden_size", siglip ? 1152 : 1024, kMaxDim);
  v.intermediateSize = r.positive("intermediate_size", siglip ? 3072 : 4096, kMaxDim);
  v.numHiddenLayers = r.positive("num_hidden_layers", siglip ? 12 : 24, kMaxLayers);
  v.numAttentionHeads = r.positive("num_attention_heads", 16, kMaxDim);
  v.numChannels = r.positive("num_channels", 3, 3); // RGB: the runtime's image path
  v.imageSize = r.positive("image_size", siglip ? 224 : 336, kMaxImageSize);
  v.patchSize = r.positive("patch_size", siglip ? 32 : 14, kMaxImageSize);
  v.layerNormEps = r.number("layer_norm_eps", siglip ? 1e-6 : 1e-5);
  v.hiddenAct = r.string("hidden_act", siglip ? "gelu_pytorch_tanh" : "quick_gelu");
  if (!r.failed()) {
    if (v.imageSize % v.patchSize != 0)
      r.setError("image_size", std::to_string(v.imageSize) + " is not a multiple of patch_size " +
                                   std::to_string(v.patchSize));
    else if (v.hiddenSize % v.numAttentionHeads != 0)
      r.setError("num_attention_heads", "does not divide hidden_size");
  }
  return v;
}

} // namespace

llvm::Expected<llvm::json::Value> readJsonFile(llvm::StringRef path, llvm::StringRef displayName) {
  // Only a regular file (symlinks followed, as the Hugging Face cache uses them): a
  // FIFO would block the open forever, a device read without end. O_NONBLOCK keeps
  // the open itself from waiting on a FIFO's writer.
  int fd = ::open(path.str().c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return llvm::createStringError(std::error_code(errno, std::generic_category()),
                                   displayName + ": cannot read: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   displayName + ": not a regular file");
  }
  auto buffer = llvm::MemoryBuffer::getOpenFile(fd, path, st.st_size);
  ::close(fd);
  if (!buffer)
    return llvm::createStringError(buffer.getError(),
                                   displayName + ": cannot read: " + buffer.getError().message());
  auto parsed = llvm::json::parse((*buffer)->getBuffer());
  if (!parsed)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   displayName + ": not valid JSON: " +
                                       llvm::toString(parsed.takeError()));
  return parsed;
}

llvm::Expected<ModelConfig> parseModelConfig(const llvm::json::Value& root, llvm::StringRef file) {
  const llvm::json::Object* obj = root.getAsObject();
  if (!obj)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   file + ": top level is not a JSON object");
  Reader r(obj, file.str(), "");
  ModelConfig cfg;

  const llvm::json::Array* archs = obj->getArray("architectures");
  std::string supported = llvm::join(supportedArchitectures(), ", ");
  if (!archs || archs->empty() || !(*archs)[0].getAsString())
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   file + ": missing \"architectures\"; Kiln imports " + supported);
  cfg.architecture = (*archs)[0].getAsString()->str();
  if (!llvm::is_contained(supportedArchitectures(), cfg.architecture))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   file + ": unsupported architecture '" + cfg.architecture +
                                       "'; Kiln imports " + supported);

  llvm::StringRef arch = cfg.architecture;
  if (arch == "LlamaForCausalLM" || arch == "Qwen2ForCausalLM" || arch == "MixtralForCausalLM") {
    llvm::StringRef type = arch == "LlamaForCausalLM"  ? "llama"
                           : arch == "Qwen2ForCausalLM" ? "qwen2"
                                                        : "mixtral";
    std::string declared = r.string("model_type", type);
    if (declared != type)
      r.setError("model_type", "'" + declared + "' does not match architecture " + arch.str());
    cfg.text = parseText(r, type);
  } else {
    bool idefics = arch == "Idefics3ForConditionalGeneration";
    Reader tr = r.object("text_config");
    std::string textType = tr.string("model_type", "llama");
    if (textType != "llama" && textType != "qwen2" && textType != "mixtral")
      tr.setError("model_type", "text model '" + textType +
                                    "' is not supported (supported: llama, qwen2, mixtral)");
    cfg.text = parseText(tr, textType);
    if (idefics) {
      // Idefics3Config builds its default text config with rms_norm_eps = 1e-5 and
      // keeps tie_word_embeddings at the top level.
      if (!tr.has("rms_norm_eps"))
        cfg.text.rmsNormEps = 1e-5;
      cfg.text.tieWordEmbeddings = r.boolean("tie_word_embeddings", false);
      cfg.imageTokenId = r.integer("image_token_id", 128257);
      cfg.scaleFactor = r.positive("scale_factor", 2, kMaxImageSize);
    } else {
      cfg.imageTokenId = r.has("image_token_index") ? r.integer("image_token_index", 32000)
                                                    : r.integer("image_token_id", 32000);
      // One layer, or a list whose hidden states are concatenated (newer LLaVA).
      if (r.has("vision_feature_layer")) {
        cfg.visionFeatureLayers.clear();
        const llvm::json::Value* v = r.raw("vision_feature_layer");
        if (auto i = v->getAsInteger()) {
          cfg.visionFeatureLayers.push_back(*i);
        } else if (const llvm::json::Array* a = v->getAsArray()) {
          for (const llvm::json::Value& e : *a)
            if (auto i = e.getAsInteger())
              cfg.visionFeatureLayers.push_back(*i);
            else
              r.setError("vision_feature_layer", "expected integers");
        } else {
          r.setError("vision_feature_layer", "expected an integer or a list of integers");
        }
      }
      if (cfg.visionFeatureLayers.empty())
        r.setError("vision_feature_layer", "needs at least one layer");
      cfg.visionFeatureSelectStrategy = r.string("vision_feature_select_strategy", "default");
      if (cfg.visionFeatureSelectStrategy != "default" && cfg.visionFeatureSelectStrategy != "full")
        r.setError("vision_feature_select_strategy",
                   "'" + cfg.visionFeatureSelectStrategy + "' is not one of default, full");
      cfg.projectorHiddenAct = r.string("projector_hidden_act", "gelu");
      cfg.projectorBias = r.boolean("multimodal_projector_bias", true);
    }
    Reader vr = r.object("vision_config");
    std::string visionType = vr.string("model_type", idefics ? "idefics3_vision" : "clip_vision_model");
    if (idefics && visionType != "idefics3_vision" && visionType != "siglip_vision_model")
      vr.setError("model_type", "'" + visionType + "' is not a SigLIP/Idefics3 vision model");
    if (!idefics && visionType != "clip_vision_model")
      vr.setError("model_type", "'" + visionType + "' is not supported (supported: clip_vision_model)");
    cfg.vision = parseVision(vr, idefics);
    if (!r.failed() && !idefics) {
      int64_t layers = cfg.vision->numHiddenLayers;
      // -(sel + 1) > layers, not sel < -(layers + 1): no overflow at either end.
      for (int64_t sel : cfg.visionFeatureLayers)
        if (sel < 0 ? -(sel + 1) > layers : sel > layers)
          r.setError("vision_feature_layer", std::to_string(sel) + " is outside the " +
                                                 std::to_string(layers) +
                                                 "-layer vision tower's hidden states");
    }
    if (!r.failed() && (cfg.imageTokenId < 0 || cfg.imageTokenId > kMaxInt32))
      r.setError(idefics || !r.has("image_token_index") ? "image_token_id" : "image_token_index",
                 std::to_string(cfg.imageTokenId) + " is not a token id (0 to 2^31-1)");
    if (!r.failed() && idefics) {
      int64_t side = cfg.vision->imageSize / cfg.vision->patchSize;
      if (side % cfg.scaleFactor != 0)
        r.setError("scale_factor", std::to_string(cfg.scaleFactor) +
                                       " does not divide the patch grid side " +
                                       std::to_string(side));
    }
  }
  if (llvm::Error err = r.takeError())
    return std::move(err);
  return cfg;
}

llvm::Expected<GenerationConfig> parseGenerationConfig(const llvm::json::Value& root,
                                                       llvm::StringRef file) {
  const llvm::json::Object* obj = root.getAsObject();
  if (!obj)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   file + ": top level is not a JSON object");
  Reader r(obj, file.str(), "");
  GenerationConfig g;
  g.bosTokenId = r.optInRange("bos_token_id", 0, kMaxInt32);
  g.eosTokenIds = r.integers("eos_token_id");
  checkTokenIds(r, "eos_token_id", g.eosTokenIds);
  g.padTokenId = r.optInRange("pad_token_id", 0, kMaxInt32);
  g.doSample = r.boolean("do_sample", false);
  g.temperature = r.number("temperature", 1.0);
  if (!(g.temperature >= 0.0))
    r.setError("temperature", std::to_string(g.temperature) + " is negative");
  g.topK = r.integer("top_k", 50);
  if (g.topK < 0 || g.topK > kMaxInt32)
    r.setError("top_k", std::to_string(g.topK) + " is outside [0, 2^31-1]");
  g.topP = r.number("top_p", 1.0);
  if (!(g.topP > 0.0 && g.topP <= 1.0))
    r.setError("top_p", std::to_string(g.topP) + " is outside (0, 1]");
  g.repetitionPenalty = r.number("repetition_penalty", 1.0);
  if (!(g.repetitionPenalty > 0.0) || std::isinf(g.repetitionPenalty))
    r.setError("repetition_penalty", std::to_string(g.repetitionPenalty) + " is not a positive number");
  g.maxNewTokens = r.optInRange("max_new_tokens", 0, kMaxInt32);
  if (llvm::Error err = r.takeError())
    return std::move(err);
  return g;
}

llvm::Expected<PreprocessorConfig> parsePreprocessorConfig(const llvm::json::Value& root,
                                                           llvm::StringRef file) {
  const llvm::json::Object* obj = root.getAsObject();
  if (!obj)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   file + ": top level is not a JSON object");
  Reader r(obj, file.str(), "");
  PreprocessorConfig p;
  p.processorType = r.string("image_processor_type", "");
  if (p.processorType != "CLIPImageProcessor" && p.processorType != "Idefics3ImageProcessor")
    r.setError("image_processor_type", "'" + p.processorType +
                                           "' is not supported (supported: CLIPImageProcessor, "
                                           "Idefics3ImageProcessor)");
  bool idefics = p.processorType == "Idefics3ImageProcessor";
  p.doConvertRgb = r.boolean("do_convert_rgb", true);
  p.doResize = r.boolean("do_resize", true);
  p.resample = r.integer("resample", idefics ? 1 : 3);
  if (p.resample != 0 && p.resample != 1 && p.resample != 2 && p.resample != 3)
    r.setError("resample", "PIL filter " + std::to_string(p.resample) +
                               " is not supported (0 nearest, 1 lanczos, 2 bilinear, 3 bicubic)");
  const llvm::json::Value* size = r.raw("size");
  if (size && size->getAsInteger()) {
    p.shortestEdge = *size->getAsInteger(); // legacy: an int means shortest_edge
  } else {
    Reader s = r.object("size");
    p.shortestEdge = s.integer("shortest_edge", 0);
    p.longestEdge = s.integer("longest_edge", 0);
  }
  p.doCenterCrop = r.boolean("do_center_crop", !idefics);
  const llvm::json::Value* crop = r.raw("crop_size");
  if (crop && crop->getAsInteger()) {
    p.cropHeight = p.cropWidth = *crop->getAsInteger();
  } else {
    Reader c = r.object("crop_size");
    p.cropHeight = c.integer("height", 0);
    p.cropWidth = c.integer("width", 0);
  }
  p.doRescale = r.boolean("do_rescale", true);
  p.rescaleFactor = r.number("rescale_factor", 1.0 / 255.0);
  p.doNormalize = r.boolean("do_normalize", true);
  std::vector<double> clipMean = {0.48145466, 0.4578275, 0.40821073};
  std::vector<double> clipStd = {0.26862954, 0.26130258, 0.27577711};
  p.imageMean = r.numbers("image_mean", idefics ? std::vector<double>{0.5, 0.5, 0.5} : clipMean);
  p.imageStd = r.numbers("image_std", idefics ? std::vector<double>{0.5, 0.5, 0.5} : clipStd);
  p.doImageSplitting = r.boolean("do_image_splitting", false);
  p.doPad = r.boolean("do_pad", false);
  p.maxImageEdge = r.object("max_image_size").integer("longest_edge", 0);
  // Stored in 32-bit fields; the runtime takes images of at most 8192 pixels a side.
  for (auto [key, value] : {std::pair<const char*, int64_t>{"size", p.shortestEdge},
                            {"size", p.longestEdge},
                            {"crop_size", p.cropHeight},
                            {"crop_size", p.cropWidth},
                            {"max_image_size", p.maxImageEdge}})
    if (!r.failed() && (value < 0 || value > kMaxImageSize))
      r.setError(key, std::to_string(value) + " is outside [0, " + std::to_string(kMaxImageSize) + "]");
  if (!r.failed()) {
    if (p.imageMean.size() != 3 || p.imageStd.size() != 3)
      r.setError("image_mean", "image_mean and image_std need 3 values");
    for (double s : p.imageStd)
      if (!(s > 0))
        r.setError("image_std", "must be positive");
    if (!idefics && p.doResize && p.shortestEdge <= 0)
      r.setError("size", "CLIPImageProcessor needs size.shortest_edge");
    if (!idefics && p.doCenterCrop && (p.cropHeight <= 0 || p.cropWidth <= 0))
      r.setError("crop_size", "needs positive height and width");
    if (idefics && p.maxImageEdge <= 0)
      r.setError("max_image_size", "Idefics3ImageProcessor needs max_image_size.longest_edge");
  }
  if (llvm::Error err = r.takeError())
    return std::move(err);
  return p;
}

} // namespace kiln::hf
