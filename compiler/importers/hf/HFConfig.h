//===- HFConfig.h - Hugging Face config.json -------------------*- C++ -*-===//
//
// Typed views of a checkpoint's config.json (and generation_config.json,
// preprocessor_config.json), with the defaults of the transformers configuration
// classes for every key the supported architectures read. Errors name the file and
// the key path ("config.json: text_config.num_attention_heads: ...").
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_IMPORTERS_HF_HFCONFIG_H
#define KILN_COMPILER_IMPORTERS_HF_HFCONFIG_H

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

namespace kiln::hf {

/// The `architectures` values Kiln imports.
llvm::ArrayRef<llvm::StringLiteral> supportedArchitectures();

struct RopeScaling {
  std::string type = "default"; // "default" or "llama3"
  double factor = 1.0;
  double lowFreqFactor = 1.0;
  double highFreqFactor = 4.0;
  int64_t originalMaxPositionEmbeddings = 8192;
};

/// A decoder-only text model: LlamaConfig, Qwen2Config or MixtralConfig.
struct TextConfig {
  std::string modelType; // llama, qwen2, mixtral
  int64_t vocabSize = 0;
  int64_t hiddenSize = 0;
  int64_t intermediateSize = 0;
  int64_t numHiddenLayers = 0;
  int64_t numAttentionHeads = 0;
  int64_t numKeyValueHeads = 0;
  int64_t headDim = 0;
  int64_t maxPositionEmbeddings = 0;
  double rmsNormEps = 1e-6;
  double ropeTheta = 10000.0;
  RopeScaling ropeScaling;
  std::string hiddenAct = "silu";
  bool tieWordEmbeddings = false;
  bool attentionBias = false; // q/k/v/o biases (Llama's attention_bias)
  bool qkvBias = false;       // q/k/v biases only (Qwen2)
  bool mlpBias = false;
  // Mixtral
  int64_t numLocalExperts = 0;
  int64_t numExpertsPerTok = 0;
  std::optional<int64_t> slidingWindow;
  // Token ids (may also come from generation_config.json)
  std::optional<int64_t> bosTokenId;
  std::vector<int64_t> eosTokenIds;
};

/// CLIP (LLaVA) or SigLIP (Idefics3) vision transformer.
struct VisionConfig {
  std::string modelType; // clip_vision_model, idefics3_vision
  int64_t hiddenSize = 0;
  int64_t intermediateSize = 0;
  int64_t numHiddenLayers = 0;
  int64_t numAttentionHeads = 0;
  int64_t numChannels = 3;
  int64_t imageSize = 0;
  int64_t patchSize = 0;
  double layerNormEps = 1e-5;
  std::string hiddenAct;
};

struct ModelConfig {
  std::string architecture;
  TextConfig text;
  std::optional<VisionConfig> vision;
  // LLaVA
  /// Hidden states the projector reads (one, or several concatenated along the
  /// feature dimension); 0 is the embeddings, N the output of layer N.
  std::vector<int64_t> visionFeatureLayers = {-2};
  std::string visionFeatureSelectStrategy = "default";
  std::string projectorHiddenAct = "gelu";
  bool projectorBias = true;
  // Idefics3
  int64_t scaleFactor = 2;
  // Both VLMs
  int64_t imageTokenId = -1;
};

/// Parses config.json of a supported architecture; `file` names it in errors.
llvm::Expected<ModelConfig> parseModelConfig(const llvm::json::Value& root, llvm::StringRef file);

/// generation_config.json: the keys the runtime's generation loop honours.
struct GenerationConfig {
  std::optional<int64_t> bosTokenId;
  std::vector<int64_t> eosTokenIds;
  std::optional<int64_t> padTokenId;
  bool doSample = false;
  double temperature = 1.0;
  int64_t topK = 50;
  double topP = 1.0;
  double repetitionPenalty = 1.0;  // transformers' RepetitionPenaltyLogitsProcessor; 1: off
  std::optional<int64_t> maxNewTokens;
};
llvm::Expected<GenerationConfig> parseGenerationConfig(const llvm::json::Value& root,
                                                       llvm::StringRef file);

/// preprocessor_config.json of CLIPImageProcessor or Idefics3ImageProcessor.
struct PreprocessorConfig {
  std::string processorType;
  bool doConvertRgb = true;
  bool doResize = true;
  int64_t shortestEdge = 0; // CLIP: resize so the shorter side has this length
  int64_t longestEdge = 0;  // Idefics3: resize so the longer side has this length
  int64_t resample = 3;     // PIL code: 0 nearest, 2 bilinear, 3 bicubic, 1 lanczos
  bool doCenterCrop = false;
  int64_t cropHeight = 0, cropWidth = 0;
  bool doRescale = true;
  double rescaleFactor = 1.0 / 255.0;
  bool doNormalize = true;
  std::vector<double> imageMean, imageStd;
  bool doImageSplitting = false;
  bool doPad = false;
  int64_t maxImageEdge = 0; // Idefics3 max_image_size.longest_edge (one tile)
};
llvm::Expected<PreprocessorConfig> parsePreprocessorConfig(const llvm::json::Value& root,
                                                           llvm::StringRef file);

/// Reads and parses a JSON file.
llvm::Expected<llvm::json::Value> readJsonFile(llvm::StringRef path, llvm::StringRef displayName);

} // namespace kiln::hf

#endif // KILN_COMPILER_IMPORTERS_HF_HFCONFIG_H
