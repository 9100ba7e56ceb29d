//===- ArtifactWriter.cpp - kiln IR to a .kiln artifact ----------*- C++ -*-===//
#include "compiler/serialize/ArtifactWriter.h"

#include "support/progress.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/generators/KernelGenerator.h"
#include "codegen/selection/KernelRegistry.h"
#include "compiler/importers/tokenizer/TokenizerJson.h"
#include "compiler/serialize/OpParams.h"
#include "compiler/quantization/Quantize.h"
#include "formats/contract.h"
#include "formats/encoding.h"
#include "passes/Encoding.h"
#include "dialects/kiln/KilnOps.h"
#include "formats/kiln_format.h"
#include "formats/kiln_generated.h"
#include "formats/numeric.h"
#include "formats/tiers.h"
#include "kiln/kiln.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/Signals.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Support/xxhash.h"

namespace kiln {
namespace {

using mlir::failure;
using mlir::LogicalResult;
using mlir::success;

uint64_t alignUp(uint64_t v) {
  return (v + format::kAlignment - 1) / format::kAlignment * format::kAlignment;
}

//===----------------------------------------------------------------------===//
// Weights
//===----------------------------------------------------------------------===//

struct WeightEntry {
  mutable WeightOp op; // op accessors are not const
  uint32_t index;
  fb::Encoding encoding;
  format::EncodingSpec spec;
  uint64_t rows = 0, cols = 0;
  uint64_t numElements;
  uint64_t bytes;     // stored size
  uint8_t layout = format::kLayoutRowMajor;  // formats/encoding.h LayoutId
  uint64_t offset;    // absolute file offset (set during layout)
  int stage = -1;     // first stage that reads it
};

// Source elements as f32.
void sourceToF32(const uint8_t* src, llvm::StringRef dtype, uint64_t n, float* out) {
  uint8_t id = dtype == "F32" ? format::kEncF32 : dtype == "F16" ? format::kEncF16 : format::kEncBF16;
  format::DecodeFloatElements(id, src, 0, n, out);
}

uint64_t numElements(llvm::ArrayRef<int64_t> shape) {
  uint64_t n = 1;
  for (int64_t d : shape)
    n *= static_cast<uint64_t>(d);
  return n;
}

// Row-major strides of `shape`, in elements.
llvm::SmallVector<int64_t> stridesOf(llvm::ArrayRef<int64_t> shape) {
  llvm::SmallVector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;)
    strides[d - 1] = strides[d] * shape[d];
  return strides;
}

// Appends to `out`, in row-major order of `shape`, the elements of `in` at
// base + sum(index[d] * strides[d]): a slice (strides of the input, base at the
// slice's first element) or a permutation (the input's strides permuted).
void gather(const float* in, llvm::ArrayRef<int64_t> shape, llvm::ArrayRef<int64_t> strides,
            int64_t base, std::vector<float>* out) {
  size_t rank = shape.size();
  if (rank == 0) {
    out->push_back(in[base]);
    return;
  }
  if (numElements(shape) == 0)
    return;
  llvm::SmallVector<int64_t> index(rank - 1, 0);
  int64_t inner = shape.back(), innerStride = strides.back();
  while (true) {
    int64_t pos = base;
    for (size_t d = 0; d + 1 < rank; ++d)
      pos += index[d] * strides[d];
    if (innerStride == 1)
      out->insert(out->end(), in + pos, in + pos + inner);
    else
      for (int64_t j = 0; j < inner; ++j)
        out->push_back(in[pos + j * innerStride]);
    int64_t d = static_cast<int64_t>(rank) - 2;
    while (d >= 0 && ++index[d] == shape[d])
      index[d--] = 0;
    if (d < 0)
      return;
  }
}

// Converts `n` source elements of safetensors dtype `dtype` to the float encoding
// `dst` (bytes copied when the format is the same: exact, and fast).
bool convertWeight(const uint8_t* src, llvm::StringRef dtype, uint64_t n, uint8_t dst, uint8_t* out) {
  uint8_t id = dtype == "F32" ? format::kEncF32 : dtype == "F16" ? format::kEncF16 : format::kEncBF16;
  if (id == dst) {
    std::memcpy(out, src, format::StorageBytes(format::EncodingSpec{dst, 0, true}, 1, n));
    return true;
  }
  std::vector<float> f32(n);
  format::DecodeFloatElements(id, src, 0, n, f32.data());
  return format::EncodeFloatElements(dst, f32.data(), n, out);
}


//===----------------------------------------------------------------------===//
// The writer
//===----------------------------------------------------------------------===//

fb::Layout toFb(LayoutKind k) {
  switch (k) {
  case LayoutKind::row_major: return fb::Layout::RowMajor;
  case LayoutKind::panel16: return fb::Layout::Panel16;
  case LayoutKind::int4_p16k8: return fb::Layout::Int4P16K8;
  case LayoutKind::int8_p16k4: return fb::Layout::Int8P16K4;
  case LayoutKind::int4_p128k4: return fb::Layout::Int4P128K4;
  case LayoutKind::int4_p16k16: return fb::Layout::Int4P16K16;
  }
  return fb::Layout::RowMajor;
}

fb::StageKind toFb(StageKind k) {
  switch (k) {
  case StageKind::vision_encoder: return fb::StageKind::VisionEncoder;
  case StageKind::projector: return fb::StageKind::Projector;
  case StageKind::decoder_prefill: return fb::StageKind::DecoderPrefill;
  case StageKind::decoder_decode: return fb::StageKind::DecoderDecode;
  case StageKind::lm_head: return fb::StageKind::LmHead;
  }
  return fb::StageKind::VisionEncoder;
}

const char* const kStageInputNames[5][3] = {
    {"pixel_values", nullptr, nullptr},
    {"vision_features", nullptr, nullptr},
    {"input_ids", "positions", "image_features"},
    {"input_ids", "positions", nullptr},
    {"hidden_states", nullptr, nullptr}};
const char* const kStageOutputNames[5] = {"vision_features", "image_features", "hidden_states",
                                          "hidden_states", "logits"};

class Writer {
public:
  Writer(mlir::ModuleOp module, const ArtifactOptions& options)
      : module_(module), options_(options), symbols_(module) {}

  LogicalResult run(llvm::StringRef path);
  LogicalResult runToMemory(std::vector<uint8_t>* out);

private:
  const uint8_t* sourceBytes(WeightOp op, SourceAttr src);
  LogicalResult evaluate(WeightOp op, mlir::Attribute expr, std::vector<float>* values,
                         llvm::SmallVector<int64_t>* shape);
  LogicalResult prepare();
  LogicalResult emit(llvm::raw_ostream& os);
  mlir::InFlightDiagnostic error() { return module_.emitError(); }
  LogicalResult collect();
  LogicalResult generateCode();
  LogicalResult buildHeader(uint64_t dataStart);
  LogicalResult writeFile(llvm::StringRef path);

  mlir::ModuleOp module_;
  ArtifactOptions options_;
  mlir::SymbolTable symbols_;
  std::string checkpoint_;
  std::vector<WeightEntry> weights_;
  llvm::DenseMap<mlir::Operation*, uint32_t> weightIndex_; // WeightOp -> index
  std::vector<mlir::func::FuncOp> stages_;
  TokenizerData tokenizer_;
  std::string sourceHash_;
  int64_t maxPrefill_ = 0;
  flatbuffers::FlatBufferBuilder fbb_{1 << 16};
  uint64_t weightBytes_ = 0;
  uint64_t kernelFeatures_ = 0; // CPU features of the bound kernels
  uint64_t dataStart_ = 0;
  GeneratedCode code_;        // the code segment (empty: no generated kernels)
  uint64_t codeOffset_ = 0;
  std::map<std::string, std::unique_ptr<llvm::MemoryBuffer>> files_; // mapped source files
};

// Kernels generated for the ops bound to `generated` kernels (codegen/generators),
// compiled for the target kiln-select-kernels recorded: the code segment.
LogicalResult Writer::generateCode() {
  llvm::Expected<Target> target = moduleTarget(module_);
  if (!target)
    return error() << llvm::toString(target.takeError());
  mlir::OwningOpRef<mlir::ModuleOp> kernels = buildKernelModule(module_, *target);
  if (!kernels)
    return failure();
  if (kernels->getBody()->empty())
    return success();
  if (!options_.kernelLibrary)
    return compileKernels(*kernels, *target, &code_);
  // A static library: the kernels' object identifies it (its checksum is the
  // hash); the library's object adds the table the app passes to the runtime.
  mlir::OwningOpRef<mlir::ModuleOp> again = kernels->clone();
  KernelObjectOptions packaging;
  packaging.library = true;
  if (failed(compileKernels(*kernels, *target, &code_, nullptr, nullptr, packaging)))
    return failure();
  packaging.tableSymbol = options_.kernelLibrarySymbol;
  packaging.hash = format::Checksum64(code_.object.data(), code_.object.size());
  GeneratedCode library;
  if (failed(compileKernels(*again, *target, &library, nullptr, nullptr, packaging)))
    return failure();
  if (options_.kernelLibraryObject)
    *options_.kernelLibraryObject = std::move(library.object);
  return success();
}

LogicalResult Writer::collect() {
  auto ckpt = module_->getAttrOfType<mlir::StringAttr>("kiln.checkpoint");
  if (!ckpt)
    return error() << "module has no kiln.checkpoint attribute (import it with kiln-compile)";
  checkpoint_ = ckpt.str();
  auto maxPrefill = module_->getAttrOfType<mlir::IntegerAttr>("kiln.max_prefill_tokens");
  if (!maxPrefill)
    return error() << "module is not memory-planned (run kiln-plan-memory)";
  maxPrefill_ = maxPrefill.getInt();

  for (auto fn : module_.getOps<mlir::func::FuncOp>())
    if (fn->hasAttr("kiln.stage"))
      stages_.push_back(fn);

  // Weights in module order, only those a stage reads.
  llvm::DenseMap<mlir::Operation*, int> firstStage;
  for (size_t si = 0; si < stages_.size(); ++si)
    stages_[si].walk([&](WeightRefOp ref) {
      if (auto w = symbols_.lookup<WeightOp>(ref.getName()))
        firstStage.try_emplace(w, static_cast<int>(si));
    });
  for (WeightOp w : module_.getOps<WeightOp>()) {
    auto it = firstStage.find(w);
    if (it == firstStage.end())
      continue;
    WeightEntry e;
    e.op = w;
    e.index = static_cast<uint32_t>(weights_.size());
    e.spec = encodingSpec(w.getEncoding());
    e.encoding = static_cast<fb::Encoding>(e.spec.id);
    e.numElements = static_cast<uint64_t>(w.getTensorType().getNumElements());
    e.rows = static_cast<uint64_t>(w.getTensorType().getDimSize(0));
    e.cols = e.rows ? e.numElements / e.rows : 0;
    e.bytes = format::StorageBytes(e.spec, e.rows, e.cols);
    if (e.bytes == 0)
      return w.emitOpError("encoding ") << w.getEncoding() << " cannot store a [" << e.rows << ", "
                                        << e.cols << "] weight (int4 needs the input dimension to "
                                           "be a multiple of the group size)";
    e.layout = static_cast<uint8_t>(toFb(w.getLayout()));
    if (!format::LayoutFits(e.layout, e.spec, e.rows, e.cols))
      return w.emitOpError("layout ") << format::LayoutName(e.layout) << " cannot hold a [" << e.rows << ", "
                                      << e.cols << "] weight of encoding " << w.getEncoding();
    e.offset = 0;
    e.stage = it->second;
    weightIndex_[w] = e.index;
    weights_.push_back(e);
  }

  if (failed(generateCode()))
    return failure();

  // Tokenizer.
  llvm::SmallString<256> tokPath(checkpoint_);
  llvm::sys::path::append(tokPath, "tokenizer.json");
  if (auto err = readTokenizerJson(tokPath, tokenizer_))
    return error() << *err;
  return success();
}

LogicalResult Writer::buildHeader(uint64_t dataStart) {
  fbb_.Clear();
  kernelFeatures_ = 0;
  fbb_.ForceDefaults(true);
  auto& b = fbb_;
  mlir::MLIRContext* ctx = module_.getContext();

  // Weight layout: consecutive, each 64-byte aligned.
  uint64_t cursor = dataStart;
  for (WeightEntry& w : weights_) {
    w.offset = cursor;
    cursor = alignUp(cursor + w.bytes);
  }
  weightBytes_ = cursor - dataStart;
  std::vector<fb::Segment> segments = {fb::Segment(dataStart, weightBytes_)};
  // The code segment follows the weights.
  flatbuffers::Offset<fb::CodeSegment> codeSegment = 0;
  if (!code_.object.empty()) {
    // In the file after the weights, or (a static library) not in the file.
    const bool inFile = !options_.kernelLibrary;
    if (inFile) {
      codeOffset_ = cursor;
      segments.push_back(fb::Segment(codeOffset_, code_.object.size()));
    }
    std::vector<flatbuffers::Offset<flatbuffers::String>> symbols;
    for (const std::string& sym : code_.symbols)
      symbols.push_back(b.CreateString(sym));
    codeSegment = fb::CreateCodeSegment(
        b, inFile ? static_cast<uint32_t>(segments.size() - 1) : 0, code_.machine, code_.cpuFeatures,
        format::Checksum64(code_.object.data(), code_.object.size()), b.CreateString(code_.triple),
        b.CreateVector(symbols), /*library=*/!inFile);
    kernelFeatures_ |= code_.cpuFeatures;
  }

  std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
  for (const WeightEntry& w : weights_) {
    std::vector<int64_t> shape(w.op.getTensorType().getShape().begin(),
                               w.op.getTensorType().getShape().end());
    EncodingAttr enc = w.op.getEncoding();
    tensors.push_back(fb::CreateTensorDirect(
        b, w.op.getSymName().str().c_str(), &shape, w.encoding,
        static_cast<uint32_t>(enc.getGroupSize()), enc.getSymmetric(),
        enc.getActivation() == ActivationMode::Float ? fb::ActivationMode::Float
                                                     : fb::ActivationMode::Int8PerToken,
        toFb(w.op.getLayout()), 0, w.offset, w.bytes));
  }

  // Stages, values and ops.
  std::vector<flatbuffers::Offset<fb::Value>> values;
  std::vector<flatbuffers::Offset<fb::Stage>> stages;
  uint64_t arenaMax = 0, visionIoBytes = 0;
  for (mlir::func::FuncOp fn : stages_) {
    auto kind = llvm::cast<StageKindAttr>(fn->getAttr("kiln.stage")).getValue();
    int ki = static_cast<int>(kind);
    llvm::DenseMap<mlir::Value, uint32_t> valueIndex;
    auto addValue = [&](mlir::Value v, const std::string& name, fb::ValueKind vk,
                        uint64_t arenaOffset) -> uint32_t {
      auto type = llvm::cast<mlir::RankedTensorType>(v.getType());
      std::vector<int64_t> shape;
      uint64_t rowElems = 1;
      int64_t maxRows = 1;
      for (auto [d, dim] : llvm::enumerate(type.getShape())) {
        if (mlir::ShapedType::isDynamic(dim)) {
          shape.push_back(-1);
          maxRows = maxPrefill_;
        } else {
          shape.push_back(dim);
          if (d == 0)
            maxRows = dim;
          else
            rowElems *= static_cast<uint64_t>(dim);
        }
      }
      if (type.getRank() == 1 && !type.isDynamicDim(0))
        maxRows = type.getDimSize(0);
      fb::DType dt = type.getElementType().isInteger(32) ? fb::DType::I32 : fb::DType::F32;
      uint64_t size = alignUp(static_cast<uint64_t>(maxRows) * rowElems * 4);
      if (vk != fb::ValueKind::Arena && (ki == 0 || ki == 1))
        visionIoBytes += size;
      uint32_t idx = static_cast<uint32_t>(values.size());
      values.push_back(fb::CreateValueDirect(b, name.c_str(), dt, &shape, maxRows, vk,
                                             arenaOffset, size));
      valueIndex[v] = idx;
      return idx;
    };
    std::vector<uint32_t> inputs, outputs;
    for (auto [i, arg] : llvm::enumerate(fn.getArguments()))
      inputs.push_back(addValue(arg,
                                i < 3 && kStageInputNames[ki][i] ? kStageInputNames[ki][i]
                                                                 : "input" + std::to_string(i),
                                fb::ValueKind::StageInput, 0));
    std::vector<flatbuffers::Offset<fb::Op>> ops;
    for (mlir::Operation& op : fn.getBody().front()) {
      if (llvm::isa<WeightRefOp, mlir::func::ReturnOp>(op))
        continue;
      std::optional<fb::OpKind> opKind = opKindOf(&op);
      if (!opKind)
        return op.emitOpError("cannot be written to an artifact");
      auto kernelName = op.getAttrOfType<mlir::StringAttr>("kiln.kernel");
      if (!kernelName)
        return op.emitOpError("has no kernel (run kiln-select-kernels)");
      const format::KernelInfo* kernel = kernelByName(kernelName.getValue());
      if (!kernel)
        return op.emitOpError("unknown kernel '") << kernelName.getValue() << "'";
      std::string name;
      if (auto nl = llvm::dyn_cast<mlir::NameLoc>(op.getLoc()))
        name = nl.getName().str();
      else
        name = op.getName().getStringRef().str();

      std::vector<uint32_t> in, w;
      for (mlir::Value operand : op.getOperands()) {
        if (auto ref = operand.getDefiningOp<WeightRefOp>()) {
          auto weight = symbols_.lookup<WeightOp>(ref.getName());
          w.push_back(weightIndex_.at(weight));
        } else {
          auto it = valueIndex.find(operand);
          if (it == valueIndex.end())
            return op.emitOpError("reads a value defined outside its stage");
          in.push_back(it->second);
        }
      }
      uint32_t out;
      if (auto o = op.getAttrOfType<mlir::IntegerAttr>("kiln.output")) {
        out = addValue(op.getResult(0), kStageOutputNames[ki], fb::ValueKind::StageOutput, 0);
        outputs.push_back(out);
      } else if (auto off = op.getAttrOfType<mlir::IntegerAttr>("kiln.offset")) {
        out = addValue(op.getResult(0), name, fb::ValueKind::Arena,
                       static_cast<uint64_t>(off.getInt()));
      } else {
        return op.emitOpError("has no place in memory (run kiln-plan-memory)");
      }

      mlir::FailureOr<SerializedParams> params = serializeOpParams(b, &op, *opKind);
      if (mlir::failed(params))
        return failure();
      kernelFeatures_ |= kernel->cpu_features;
      auto symbol = op.getAttrOfType<mlir::StringAttr>(kSymbolAttrName);
      if (llvm::StringRef(kernel->isa) == "generated" && !symbol)
        return op.emitOpError("is bound to generated kernel ") << kernel->name << " but no kernel was generated";
      // A fused op's further generated functions and the layers folded into it.
      auto strings = [&](llvm::StringRef attr) {
        std::vector<flatbuffers::Offset<flatbuffers::String>> v;
        if (auto a = op.getAttrOfType<mlir::ArrayAttr>(attr))
          for (mlir::Attribute e : a)
            if (auto str = llvm::dyn_cast<mlir::StringAttr>(e))
              v.push_back(b.CreateString(str.getValue().str()));
        return v;
      };
      std::vector<flatbuffers::Offset<flatbuffers::String>> extraSymbols = strings(kSymbolsAttrName);
      std::vector<flatbuffers::Offset<flatbuffers::String>> fused = strings("kiln.fused");
      ops.push_back(fb::CreateOpDirect(b, *opKind, kernel->id, name.c_str(), &in, &w, out, params->type,
                                       params->table, symbol ? symbol.getValue().str().c_str() : nullptr,
                                       extraSymbols.empty() ? nullptr : &extraSymbols,
                                       fused.empty() ? nullptr : &fused));
    }
    auto arena = fn->getAttrOfType<mlir::IntegerAttr>("kiln.arena_bytes");
    uint64_t arenaBytes = arena ? static_cast<uint64_t>(arena.getInt()) : 0;
    arenaMax = std::max(arenaMax, arenaBytes);
    stages.push_back(fb::CreateStageDirect(b, toFb(kind), fn.getSymName().str().c_str(), &inputs,
                                           &outputs, &ops, arenaBytes));
  }

  // Model facts from the module's configuration attributes (typed and verified by
  // the dialect; an image input needs both its shape and its preprocessing).
  auto text = module_->getAttrOfType<TextConfigAttr>("kiln.text");
  auto image = module_->getAttrOfType<ImageConfigAttr>("kiln.image");
  auto pre = module_->getAttrOfType<PreprocessorConfigAttr>("kiln.preprocessor");
  auto gen = module_->getAttrOfType<GenerationConfigAttr>("kiln.generation");
  if (!text)
    return error() << "module has no kiln.text attribute (import it with kiln-compile)";
  if (static_cast<bool>(image) != static_cast<bool>(pre))
    return error() << "module has " << (image ? "kiln.image but no kiln.preprocessor" : "kiln.preprocessor but no kiln.image");
  auto str = [&](llvm::StringRef key) {
    auto a = module_->getAttrOfType<mlir::StringAttr>(key);
    return a ? a.str() : std::string();
  };
  // Model facts go into 32-bit fields: a value that does not fit is an error naming
  // it, never silently narrowed (the importer range-checks the config; this is the
  // writer's own guard for IR from elsewhere).
  std::string narrowed;
  auto u32 = [&](llvm::StringRef key, int64_t v) {
    if ((v < 0 || v > static_cast<int64_t>(UINT32_MAX)) && narrowed.empty())
      narrowed = key.str() + " = " + std::to_string(v) + " does not fit the artifact's 32-bit field";
    return static_cast<uint32_t>(v);
  };
  auto i32 = [&](llvm::StringRef key, int64_t v) {
    if ((v < INT32_MIN || v > INT32_MAX) && narrowed.empty())
      narrowed = key.str() + " = " + std::to_string(v) + " does not fit the artifact's 32-bit field";
    return static_cast<int32_t>(v);
  };
  int64_t layers = text.getNumLayers(), kvHeads = text.getNumKvHeads(), headDim = text.getHeadDim();
  // The KV cache's encoding (kiln-plan-memory; none: f32).
  fb::Encoding kvEncoding = fb::Encoding::F32;
  uint32_t kvGroup = 0;
  if (auto kv = module_->getAttrOfType<KvCacheAttr>("kiln.kv_cache")) {
    kvEncoding = static_cast<fb::Encoding>(kv.getKind());
    kvGroup = static_cast<uint32_t>(kv.getGroup());
    if (headDim < 1 || headDim > UINT32_MAX ||
        !format::KvEncodingValid(static_cast<uint8_t>(kvEncoding), kvGroup, static_cast<uint32_t>(headDim)))
      return error() << "kiln.kv_cache " << stringifyEncodingKind(kv.getKind()) << " with group " << kvGroup
                     << " does not fit heads of head_dim " << headDim;
  }
  auto textConfig = fb::CreateTextConfig(
      b, u32("vocab_size", text.getVocabSize()), u32("hidden_size", text.getHiddenSize()),
      u32("num_layers", layers), u32("num_heads", text.getNumHeads()), u32("num_kv_heads", kvHeads),
      u32("head_dim", headDim), u32("max_position_embeddings", text.getMaxPositionEmbeddings()),
      u32("sliding_window", text.getSlidingWindow()), kvEncoding, kvGroup);
  flatbuffers::Offset<fb::ImageConfig> imageConfig;
  flatbuffers::Offset<fb::ImagePreprocess> preprocess;
  if (image) {
    imageConfig = fb::CreateImageConfig(b, u32("image_size", image.getImageSize()),
                                        u32("channels", image.getChannels()),
                                        u32("image_tokens", image.getImageTokens()),
                                        i32("image_token_id", image.getImageTokenId()));
    std::vector<float> mean(pre.getImageMean().begin(), pre.getImageMean().end()),
        stdv(pre.getImageStd().begin(), pre.getImageStd().end());
    preprocess = fb::CreateImagePreprocessDirect(
        b,
        pre.getProcessor() == "Idefics3ImageProcessor" ? fb::ImageProcessor::Idefics3 : fb::ImageProcessor::Clip,
        pre.getDoConvertRgb(), pre.getDoResize(), u32("shortest_edge", pre.getShortestEdge()),
        u32("longest_edge", pre.getLongestEdge()), static_cast<uint8_t>(pre.getResample()),
        pre.getDoCenterCrop(), u32("crop_size", pre.getCropSize()[0]), u32("crop_size", pre.getCropSize()[1]),
        pre.getDoRescale(), pre.getRescaleFactor(), pre.getDoNormalize(), &mean, &stdv,
        u32("max_image_edge", pre.getMaxImageEdge()));
  }

  // Tokenizer.
  std::vector<flatbuffers::Offset<flatbuffers::String>> vocab;
  for (const std::string& t : tokenizer_.vocab)
    vocab.push_back(b.CreateString(t));
  std::vector<fb::Merge> merges;
  for (auto [l, r] : tokenizer_.merges)
    merges.push_back(fb::Merge(l, r));
  std::vector<flatbuffers::Offset<fb::AddedToken>> added;
  for (const auto& a : tokenizer_.added)
    added.push_back(fb::CreateAddedTokenDirect(b, a.id, a.content.c_str(), a.special));
  const fb::PreTokenizer preTokenizer = tokenizer_.pretokenizer == TokenizerData::PreTokenizer::Split ? fb::PreTokenizer::Split
                                       : tokenizer_.pretokenizer == TokenizerData::PreTokenizer::Metaspace
                                           ? fb::PreTokenizer::Metaspace
                                           : fb::PreTokenizer::Gpt2;
  const fb::PrependScheme prependScheme =
      tokenizer_.prependScheme == TokenizerData::PrependScheme::First   ? fb::PrependScheme::First
      : tokenizer_.prependScheme == TokenizerData::PrependScheme::Never ? fb::PrependScheme::Never
                                                                        : fb::PrependScheme::Always;
  // NFC: the compiler's Unicode tables travel with the artifact.
  flatbuffers::Offset<flatbuffers::String> unicodeVersion;
  flatbuffers::Offset<flatbuffers::Vector<uint64_t>> nfcDecompositions, nfcCompositions;
  flatbuffers::Offset<flatbuffers::Vector<uint32_t>> nfcClasses;
  if (tokenizer_.nfc) {
    const UnicodeNfcTables& u = unicodeNfcTables();
    unicodeVersion = b.CreateString(u.version);
    nfcDecompositions = b.CreateVector(u.decompositions, u.numDecompositions);
    nfcCompositions = b.CreateVector(u.compositions, u.numCompositions);
    nfcClasses = b.CreateVector(u.combiningClasses, u.numCombiningClasses);
  }
  auto tokenizer = fb::CreateTokenizer(
      b, preTokenizer, b.CreateString(tokenizer_.pattern), b.CreateVector(vocab),
      b.CreateVectorOfStructs(merges), b.CreateVector(added), tokenizer_.bosId, tokenizer_.addBos,
      tokenizer_.ignoreMerges, b.CreateString(tokenizer_.prepend), prependScheme, tokenizer_.byteFallback,
      tokenizer_.unkId, tokenizer_.fuseUnk, static_cast<uint8_t>(tokenizer_.decodeStrip),
      tokenizer_.nfc ? fb::Normalizer::NFC : fb::Normalizer::None, unicodeVersion, nfcDecompositions,
      nfcCompositions, nfcClasses);

  std::vector<int32_t> eos;
  if (gen)
    for (int64_t e : gen.getEosTokenIds())
      eos.push_back(i32("eos_token_id", e));
  auto generation =
      gen ? fb::CreateGenerationDirect(b, i32("bos_token_id", gen.getBosTokenId()), &eos,
                                       i32("pad_token_id", gen.getPadTokenId()), gen.getDoSample(),
                                       static_cast<float>(gen.getTemperature()), i32("top_k", gen.getTopK()),
                                       static_cast<float>(gen.getTopP()), i32("max_new_tokens", gen.getMaxNewTokens()),
                                       static_cast<float>(gen.getRepetitionPenalty()))
          : fb::CreateGenerationDirect(b, -1, &eos, -1, false, 1.0f, 0, 1.0f, 0, 1.0f);
  if (!narrowed.empty())
    return error() << narrowed;

  std::vector<flatbuffers::Offset<fb::PrecisionEntry>> precision;
  for (const WeightEntry& w : weights_) {
    auto stageKind =
        llvm::cast<StageKindAttr>(stages_[w.stage]->getAttr("kiln.stage")).getValue();
    // The measured sensitivity of the chosen encoding, when calibration measured it.
    float sens = std::numeric_limits<float>::quiet_NaN();
    if (auto dict = w.op->getAttrOfType<mlir::DictionaryAttr>("kiln.sensitivity")) {
      llvm::StringRef dtype = w.op.getSourceDtype();
      std::string label = w.op.getEncoding().getLabel();
      if (auto f = dict.getAs<mlir::FloatAttr>(label))
        sens = static_cast<float>(f.getValueAsDouble());
      else if (label == (dtype == "F32" ? "f32" : dtype == "F16" ? "f16" : "bf16"))
        sens = 0.0f;  // the checkpoint's own encoding is exact
    }
    // Source bytes: every leaf of the weight's expression.
    precision.push_back(fb::CreatePrecisionEntry(b, w.index, toFb(stageKind), w.op.getSourceBytes(),
                                                 w.bytes, sens));
  }

  // The session's stage buffers: ids, positions and hidden states of one prefill
  // step, one row of logits, and the image path's pixels and features.
  uint64_t hidden = static_cast<uint64_t>(text.getHiddenSize());
  uint64_t ioBytes = alignUp(static_cast<uint64_t>(maxPrefill_) * 4) * 2 +
                     alignUp(static_cast<uint64_t>(maxPrefill_) * hidden * 4) +
                     alignUp(static_cast<uint64_t>(text.getVocabSize()) * 4) + visionIoBytes;
  auto memoryPlan = fb::CreateMemoryPlan(
      b, arenaMax, static_cast<uint32_t>(maxPrefill_), ioBytes,
      2 * static_cast<uint64_t>(layers) *
          (format::KvRowBytes(static_cast<uint8_t>(kvEncoding), static_cast<uint64_t>(kvHeads * headDim)) +
           4 * format::KvRowScales(static_cast<uint8_t>(kvEncoding), static_cast<uint64_t>(kvHeads * headDim),
                                   kvGroup)),
      weightBytes_);
  auto metadata = fb::CreateMetadataDirect(b, str("kiln.architecture").c_str(), sourceHash_.c_str(),
                                           options_.compilerVersion.c_str(),
                                           options_.targetTriple.c_str(),
                                           str("kiln.prompt_template").c_str());
  // The chat template's pieces (kiln.chat_template, from the importer's ChatTemplate.h).
  flatbuffers::Offset<fb::ChatTemplate> chat = 0;
  if (auto c = module_->getAttrOfType<mlir::DictionaryAttr>("kiln.chat_template")) {
    auto s = [&](llvm::StringRef key) {
      auto a = c.getAs<mlir::StringAttr>(key);
      return b.CreateString(a ? a.getValue().str() : std::string());
    };
    auto turnsAttr = c.getAs<mlir::ArrayAttr>("turns");
    if (!turnsAttr || turnsAttr.size() != 24)
      return error() << "kiln.chat_template: 'turns' must hold 24 [allowed, text, after_image] entries";
    std::vector<flatbuffers::Offset<fb::ChatTurn>> turns;
    for (mlir::Attribute t : turnsAttr) {
      auto parts = llvm::dyn_cast<mlir::ArrayAttr>(t);
      if (!parts || parts.size() != 3 || !llvm::isa<mlir::BoolAttr>(parts[0]) ||
          !llvm::isa<mlir::StringAttr>(parts[1]) || !llvm::isa<mlir::StringAttr>(parts[2]))
        return error() << "kiln.chat_template: a turn is not [allowed, text, after_image]";
      turns.push_back(fb::CreateChatTurn(b, llvm::cast<mlir::BoolAttr>(parts[0]).getValue(),
                                         b.CreateString(llvm::cast<mlir::StringAttr>(parts[1]).getValue().str()),
                                         b.CreateString(llvm::cast<mlir::StringAttr>(parts[2]).getValue().str())));
    }
    auto trim = c.getAs<mlir::IntegerAttr>("trim");
    auto bos = c.getAs<mlir::BoolAttr>("starts_with_bos");
    auto source = s("source"), jinja = s("jinja"), prompt = s("generation_prompt"), open = s("image_open"),
         close = s("image_close");
    auto turnsVec = b.CreateVector(turns);
    chat = fb::CreateChatTemplate(b, source, jinja, turnsVec, prompt, trim ? static_cast<uint8_t>(trim.getInt()) : 0,
                                  open, close, bos && bos.getValue());
  }
  auto model = fb::CreateModel(
      b, format::kSchemaVersion, metadata, options_.requiredCpuFeatures | kernelFeatures_,
      b.CreateVectorOfStructs(segments), b.CreateVector(tensors), b.CreateVector(values),
      b.CreateVector(stages), memoryPlan, textConfig, imageConfig, preprocess, tokenizer, generation,
      b.CreateVector(precision), codeSegment, 0, chat);
  b.FinishSizePrefixed(model, fb::ModelIdentifier());
  (void)ctx;
  return success();
}

const uint8_t* Writer::sourceBytes(WeightOp op, SourceAttr src) {
  std::string file = src.getFile().str();
  auto it = files_.find(file);
  if (it == files_.end()) {
    llvm::SmallString<256> p(checkpoint_);
    llvm::sys::path::append(p, file);
    auto buf = llvm::MemoryBuffer::getFile(p, /*IsText=*/false, /*RequiresNullTerminator=*/false);
    if (!buf) {
      op.emitOpError("cannot read ") << p << ": " << buf.getError().message();
      return nullptr;
    }
    it = files_.emplace(file, std::move(*buf)).first;
  }
  const llvm::MemoryBuffer& buf = *it->second;
  if (src.getOffset() > buf.getBufferSize() || src.getSize() > buf.getBufferSize() - src.getOffset()) {
    op.emitOpError("data [") << src.getOffset() << ", +" << src.getSize() << ") lies outside " << file << " ("
                               << buf.getBufferSize() << " bytes): the checkpoint changed since it was imported";
    return nullptr;
  }
  return reinterpret_cast<const uint8_t*>(buf.getBufferStart()) + src.getOffset();
}

// The values of a weight expression as f32, row-major, and their shape. The module
// is verified: shapes, bounds and dtypes agree.
LogicalResult Writer::evaluate(WeightOp op, mlir::Attribute expr, std::vector<float>* values,
                               llvm::SmallVector<int64_t>* shape) {
  if (auto src = llvm::dyn_cast<SourceAttr>(expr)) {
    // A source without a shape is the weight's whole expression: the weight's shape.
    llvm::ArrayRef<int64_t> s = src.getShape();
    shape->assign(s.begin(), s.end());
    if (s.empty())
      shape->assign(op.getTensorType().getShape().begin(), op.getTensorType().getShape().end());
    const uint8_t* bytes = sourceBytes(op, src);
    if (!bytes)
      return failure();
    values->resize(numElements(*shape));
    sourceToF32(bytes, src.getDtype(), values->size(), values->data());
    return success();
  }
  if (auto concat = llvm::dyn_cast<ConcatAttr>(expr)) {
    size_t axis = static_cast<size_t>(concat.getAxis());
    std::vector<std::vector<float>> parts;
    std::vector<uint64_t> chunk;  // elements of one part per index of the dims before axis
    shape->clear();
    for (mlir::Attribute operand : concat.getOperands()) {
      llvm::SmallVector<int64_t> s;
      parts.emplace_back();
      if (failed(evaluate(op, operand, &parts.back(), &s)))
        return failure();
      if (shape->empty())
        *shape = s;
      else
        (*shape)[axis] += s[axis];
      chunk.push_back(numElements(llvm::ArrayRef<int64_t>(s).drop_front(axis)));
    }
    uint64_t outer = numElements(llvm::ArrayRef<int64_t>(*shape).take_front(axis));
    values->clear();
    values->reserve(numElements(*shape));
    if (concat.getBlock() == 0) {
      for (uint64_t o = 0; o < outer; ++o)
        for (size_t i = 0; i < parts.size(); ++i)
          values->insert(values->end(), parts[i].begin() + o * chunk[i], parts[i].begin() + (o + 1) * chunk[i]);
      return success();
    }
    // Interleaved: the operands have one extent along the axis, taken `block` slices
    // at a time from each in turn (a slice: chunk / extent elements).
    const uint64_t extent = static_cast<uint64_t>((*shape)[axis]) / parts.size();
    const uint64_t block = static_cast<uint64_t>(concat.getBlock());
    const uint64_t slice = chunk[0] / extent;
    for (uint64_t o = 0; o < outer; ++o)
      for (uint64_t b0 = 0; b0 < extent; b0 += block)
        for (const std::vector<float>& part : parts) {
          const uint64_t begin = o * chunk[0] + b0 * slice, end = begin + (std::min(extent, b0 + block) - b0) * slice;
          values->insert(values->end(), part.begin() + begin, part.begin() + end);
        }
    return success();
  }
  if (auto slice = llvm::dyn_cast<SliceAttr>(expr)) {
    std::vector<float> in;
    llvm::SmallVector<int64_t> inShape;
    if (failed(evaluate(op, slice.getOperand(), &in, &inShape)))
      return failure();
    llvm::SmallVector<int64_t> strides = stridesOf(inShape);
    int64_t base = 0;
    for (auto [off, stride] : llvm::zip(slice.getOffsets(), strides))
      base += off * stride;
    shape->assign(slice.getSizes().begin(), slice.getSizes().end());
    values->clear();
    values->reserve(numElements(*shape));
    gather(in.data(), *shape, strides, base, values);
    return success();
  }
  if (auto permute = llvm::dyn_cast<PermuteAttr>(expr)) {
    std::vector<float> in;
    llvm::SmallVector<int64_t> inShape;
    if (failed(evaluate(op, permute.getOperand(), &in, &inShape)))
      return failure();
    llvm::SmallVector<int64_t> inStrides = stridesOf(inShape), strides;
    shape->clear();
    for (int64_t d : permute.getDims()) {
      shape->push_back(inShape[d]);
      strides.push_back(inStrides[d]);
    }
    values->clear();
    values->reserve(numElements(*shape));
    gather(in.data(), *shape, strides, 0, values);
    return success();
  }
  if (auto sum = llvm::dyn_cast<WeightedSumAttr>(expr)) {
    // Summed in double, rounded once (the same order whatever the operands' count).
    std::vector<double> acc;
    llvm::ArrayRef<double> coeffs = sum.getCoefficients();
    for (auto [operand, c] : llvm::zip(sum.getOperands(), coeffs)) {
      std::vector<float> in;
      llvm::SmallVector<int64_t> inShape;
      if (failed(evaluate(op, operand, &in, &inShape)))
        return failure();
      if (acc.empty()) {
        *shape = inShape;
        acc.assign(in.size(), 0.0);
      }
      for (size_t i = 0; i < in.size(); ++i)
        acc[i] += c * static_cast<double>(in[i]);
    }
    values->assign(acc.begin(), acc.end());
    return success();
  }
  return op.emitOpError("weight '") << op.getSymName() << "': cannot evaluate " << expr;
}

LogicalResult Writer::prepare() {
  // Source hash: config files and every weight's bytes, so that two artifacts from
  // the same checkpoint share it and any change of the source changes it.
  llvm::SHA256 sha;
  for (llvm::StringRef f : {"config.json", "generation_config.json", "preprocessor_config.json",
                            "tokenizer.json"}) {
    llvm::SmallString<256> p(checkpoint_);
    llvm::sys::path::append(p, f);
    if (auto buf = llvm::MemoryBuffer::getFile(p)) {
      sha.update(f);
      uint64_t h = llvm::xxh3_64bits((*buf)->getBuffer());
      sha.update(llvm::ArrayRef<uint8_t>(reinterpret_cast<uint8_t*>(&h), sizeof(h)));
    }
  }
  for (const WeightEntry& w : weights_) {
    // Every leaf of the weight's expression, in order (a plain source: its bytes).
    sha.update(w.op.getSymName());
    for (SourceAttr leaf : w.op.getSources()) {
      const uint8_t* src = sourceBytes(w.op, leaf);
      if (!src)
        return failure();
      uint64_t h = llvm::xxh3_64bits(llvm::ArrayRef<uint8_t>(src, leaf.getSize()));
      sha.update(llvm::ArrayRef<uint8_t>(reinterpret_cast<uint8_t*>(&h), sizeof(h)));
    }
    sha.update(weightExprTransforms(w.op.getSource()));
  }
  auto digest = sha.final();
  sourceHash_ = llvm::toHex(digest, /*LowerCase=*/true);

  // Two passes: the header's size does not depend on the offsets (ForceDefaults
  // writes every scalar), so build once to learn it, then with the real offsets.
  if (failed(buildHeader(0)))
    return failure();
  dataStart_ = alignUp(fbb_.GetSize());
  if (failed(buildHeader(dataStart_)))
    return failure();
  if (alignUp(fbb_.GetSize()) != dataStart_)
    return error() << "internal error: artifact header size changed between passes";
  if (fbb_.GetSize() > format::kMaxHeaderBytes)
    return error() << "artifact header of " << fbb_.GetSize() << " bytes exceeds the limit";
  return success();
}

LogicalResult Writer::emit(llvm::raw_ostream& os) {
  uint64_t pos = 0;
  auto write = [&](const void* p, uint64_t n) {
    os.write(static_cast<const char*>(p), n);
    pos += n;
  };
  auto pad = [&](uint64_t to) {
    static const char zeros[64] = {};
    while (pos < to)
      write(zeros, std::min<uint64_t>(64, to - pos));
  };
  write(fbb_.GetBufferPointer(), fbb_.GetSize());
  pad(dataStart_);
  std::vector<uint8_t> scratch;
  tools::Progress progress(options_.progress, "weights", weights_.size());
  size_t done = 0;
  for (const WeightEntry& w : weights_) {
    progress.update(done++, w.op.getSymName().str());
    pad(w.offset);
    // A plain source converts straight from its bytes (copied when the encoding is
    // the checkpoint's); an expression is evaluated to f32 first, then encoded.
    const uint8_t* src = nullptr;
    if (SourceAttr plain = w.op.getPlainSource()) {
      src = sourceBytes(w.op, plain);
      if (!src)
        return failure();
    }
    std::vector<float> f32;
    if (!src || format::IsQuantized(w.spec.id)) {
      if (src) {
        f32.resize(w.numElements);
        sourceToF32(src, w.op.getSourceDtype(), w.numElements, f32.data());
      } else {
        llvm::SmallVector<int64_t> shape;
        if (failed(evaluate(w.op, w.op.getSource(), &f32, &shape)))
          return failure();
        if (f32.size() != w.numElements)
          return w.op.emitOpError("weight '") << w.op.getSymName() << "': expression yields "
                                              << f32.size() << " elements, not " << w.numElements;
      }
    }
    if (format::IsQuantized(w.spec.id)) {
      // A weight fused from others that read the same input (kiln-fuse-qkv) shares
      // their Hessian: its rows are theirs, and GPTQ treats rows independently.
      auto h = options_.hessians.find(w.op.getSymName().str());
      if (auto parts = w.op->getAttrOfType<mlir::ArrayAttr>("kiln.fused_from");
          h == options_.hessians.end() && parts && !parts.empty())
        if (auto first = llvm::dyn_cast<mlir::FlatSymbolRefAttr>(parts[0]))
          h = options_.hessians.find(first.getValue().str());
      std::vector<uint8_t> q = h != options_.hessians.end() && h->second.size() == w.cols * w.cols
                                   ? quant::quantizeGptq(f32.data(), w.rows, w.cols, w.spec, h->second.data())
                                   : quant::quantizeRtn(f32.data(), w.rows, w.cols, w.spec);
      if (w.layout != format::kLayoutRowMajor) {
        scratch.assign(q.size(), 0);
        format::RepackLayout(true, w.layout, w.spec, q.data(), w.rows, w.cols, scratch.data());
        q.swap(scratch);
      }
      write(q.data(), q.size());
      continue;
    }
    scratch.resize(w.bytes);
    bool converted = src ? convertWeight(src, w.op.getSourceDtype(), w.numElements, w.spec.id, scratch.data())
                         : format::EncodeFloatElements(w.spec.id, f32.data(), w.numElements, scratch.data());
    if (!converted)
      return w.op.emitOpError("cannot convert to ") << w.op.getEncoding();
    if (w.layout != format::kLayoutRowMajor) {
      std::vector<uint8_t> packed(scratch.size());
      format::RepackLayout(true, w.layout, w.spec, scratch.data(), w.rows, w.cols, packed.data());
      scratch.swap(packed);
    }
    write(scratch.data(), scratch.size());
  }
  pad(alignUp(pos));
  // The code segment ends the file (no padding after it: the file ends where its
  // last segment does, so any truncation is detectable).
  if (!code_.object.empty() && !options_.kernelLibrary) {
    pad(codeOffset_);
    write(code_.object.data(), code_.object.size());
  }
  return success();
}

// Temporary files are named "<output>.tmp-XXXXXXXX" beside the output (a rename
// within one directory is atomic). The writer holds an exclusive flock on its
// temporary file while it exists, so a later run can tell a live writer's file
// from one a killed writer (SIGKILL runs no handler) left behind, and removes only
// the latter.
void removeStaleTempFiles(llvm::StringRef dir, llvm::StringRef outputName) {
  std::string prefix = (outputName + ".tmp-").str();
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; it != end && !ec; it.increment(ec)) {
    llvm::StringRef name = llvm::sys::path::filename(it->path());
    if (!name.starts_with(prefix) || name.size() != prefix.size() + 8)
      continue;
    struct stat st;
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      continue;
    int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0)
      continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0)
      ::unlink(it->path().c_str());
    ::close(fd);
  }
}

// Checks the artifact at `loadPath` as the runtime will: kiln_model_load runs the
// runtime's complete verifier. Returns the runtime's message when it refuses, or
// an empty string. `*unverifiable` is set when the only objection is CPU features
// this host lacks (an artifact for another device, or one that assumes features
// this machine does not have): it cannot be checked here, which is not an error.
std::string verifyWithRuntime(const char* loadPath, bool kernelLibrary, bool* unverifiable) {
  *unverifiable = false;
  kiln_model_t* model = nullptr;
  kiln_error_t err;
  kiln_status_t st = kiln_model_load(loadPath, nullptr, &model, &err);
  if (st == KILN_OK) {
    kiln_model_release(model);
    st = kiln_artifact_verify(loadPath, 1, &err);  // every tier of a tiered artifact
    if (st == KILN_OK)
      return std::string();
  }
  // Kernels in a static library (not linked here) or an artifact for another CPU:
  // everything but running it is still checked, for the device it is built for.
  if (st == KILN_ERROR_ARTIFACT_CPU_FEATURES || (st == KILN_ERROR_ARTIFACT_CODE && kernelLibrary)) {
    kiln_error_t any;
    kiln_status_t structural = kiln_artifact_verify(loadPath, st == KILN_ERROR_ARTIFACT_CPU_FEATURES ? 0 : 1, &any);
    if (structural != KILN_OK) {
      st = structural;
      err = any;
    } else if (st == KILN_ERROR_ARTIFACT_CODE) {
      return std::string();
    }
  }
  // The runtime prefixes the path it loaded (the temporary file): drop it.
  std::string message = err.message;
  std::string prefix = std::string(loadPath) + ": ";
  if (llvm::StringRef(message).starts_with(prefix))
    message.erase(0, prefix.size());
  if (st == KILN_ERROR_ARTIFACT_CPU_FEATURES) {
    *unverifiable = true;
    return message.empty() ? std::string(kiln_status_message(st)) : message;
  }
  return message.empty() ? std::string(kiln_status_message(st)) : message;
}

// Writes the bytes `emit` produces to `path` atomically, after the runtime's verifier
// accepted them; diagnostics go to `module`.
LogicalResult writeAtomically(mlir::ModuleOp module, llvm::StringRef path, bool kernelLibrary,
                              llvm::function_ref<LogicalResult(llvm::raw_ostream&)> emit) {
  auto error = [&]() { return module.emitError(); };
  // The output must be a regular file or not exist: writing "onto" a device node,
  // FIFO or symlink would replace it (the rename below replaces whatever the name
  // points at, /dev/full included).
  {
    struct stat st;
    if (::lstat(path.str().c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      return error() << "output '" << path << "' exists and is not a regular file ("
                     << (S_ISLNK(st.st_mode)    ? "a symbolic link"
                         : S_ISDIR(st.st_mode)  ? "a directory"
                         : S_ISFIFO(st.st_mode) ? "a FIFO"
                         : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                       : "not a file")
                     << "); refusing to replace it";
  }
  // Write to a temporary file beside the destination, then rename: readers see a
  // complete artifact or none. On Linux the temporary file is anonymous (O_TMPFILE)
  // until it is complete and verified, so a crash or SIGKILL leaves nothing; where
  // O_TMPFILE is not supported, a named one, flock-ed, and removed by the next run.
  llvm::SmallString<256> dir(path);
  llvm::sys::path::remove_filename(dir);
  if (dir.empty())
    dir = ".";
  llvm::StringRef outName = llvm::sys::path::filename(path);
  removeStaleTempFiles(dir, outName);
  llvm::SmallString<256> tmpModel(dir);
  llvm::sys::path::append(tmpModel, outName + ".tmp-%%%%%%%%");

  int fd = -1;
  llvm::SmallString<256> tmp; // the temporary file's name (empty while anonymous)
#ifdef O_TMPFILE
  fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0666);
#endif
  if (fd < 0) {
    if (std::error_code ec = llvm::sys::fs::createUniqueFile(tmpModel, fd, tmp))
      return error() << "cannot create a file in '" << dir << "': " << ec.message();
    llvm::sys::RemoveFileOnSignal(tmp);
  }
  (void)::flock(fd, LOCK_EX | LOCK_NB);
  auto cleanup = [&]() {
    if (!tmp.empty()) {
      llvm::sys::fs::remove(tmp);
      llvm::sys::DontRemoveFileOnSignal(tmp);
    }
    ::close(fd);
  };

  bool ok = true;
  {
    llvm::raw_fd_ostream os(fd, /*shouldClose=*/false);
    ok = succeeded(emit(os));
    os.flush();
    if (os.has_error()) {
      error() << "writing '" << (tmp.empty() ? path : llvm::StringRef(tmp))
              << "' failed: " << os.error().message();
      os.clear_error();
      ok = false;
    }
  }
  if (ok && ::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
    error() << "writing '" << path << "' failed: " << std::strerror(errno);
    ok = false;
  }
  if (!ok) {
    cleanup();
    return failure();
  }

  // The runtime's verifier, on the bytes written, before the file takes its name.
  std::string loadPath = tmp.empty() ? "/proc/self/fd/" + std::to_string(fd) : tmp.str().str();
  bool unverifiable = false;
  std::string refusal = verifyWithRuntime(loadPath.c_str(), kernelLibrary, &unverifiable);
  if (!refusal.empty() && !unverifiable) {
    error() << "the runtime refuses the artifact it would write to '" << path << "': " << refusal;
    cleanup();
    return failure();
  }
  if (unverifiable)
    mlir::emitWarning(module.getLoc())
        << "'" << path << "' is verified for its target but cannot run on this machine (" << refusal << ")";

  if (tmp.empty()) {
    // Give the anonymous file a temporary name, then rename it over the output
    // (linkat cannot replace an existing file).
    for (int attempt = 0;; ++attempt) {
      llvm::sys::fs::createUniquePath(tmpModel, tmp, /*MakeAbsolute=*/false);
      if (::linkat(AT_FDCWD, loadPath.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) == 0)
        break;
      if (errno != EEXIST || attempt > 100) {
        error() << "cannot create a file in '" << dir << "': " << std::strerror(errno);
        tmp.clear();
        cleanup();
        return failure();
      }
    }
    llvm::sys::RemoveFileOnSignal(tmp);
  }
  // Re-checked just before the rename, which would replace a non-regular file.
  struct stat st;
  if (::lstat(path.str().c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    error() << "output '" << path << "' exists and is not a regular file; refusing to replace it";
    cleanup();
    return failure();
  }
  if (std::error_code ec = llvm::sys::fs::rename(tmp, path)) {
    error() << "cannot rename '" << tmp << "' to '" << path << "': " << ec.message();
    cleanup();
    return failure();
  }
  llvm::sys::DontRemoveFileOnSignal(tmp);
  ::close(fd);
  return success();
}

LogicalResult Writer::writeFile(llvm::StringRef path) {
  if (failed(prepare()))
    return failure();
  return writeAtomically(module_, path, options_.kernelLibrary, [&](llvm::raw_ostream& os) { return emit(os); });
}

LogicalResult Writer::run(llvm::StringRef path) {
  if (failed(collect()))
    return failure();
  return writeFile(path);
}

LogicalResult Writer::runToMemory(std::vector<uint8_t>* out) {
  if (failed(collect()) || failed(prepare()))
    return failure();
  llvm::SmallVector<char, 0> buffer;
  llvm::raw_svector_ostream os(buffer);
  if (failed(emit(os)))
    return failure();
  out->assign(buffer.begin(), buffer.end());
  return success();
}

} // namespace

mlir::LogicalResult writeArtifact(mlir::ModuleOp module, llvm::StringRef path,
                                  const ArtifactOptions& options) {
  return Writer(module, options).run(path);
}

mlir::LogicalResult writeArtifactToMemory(mlir::ModuleOp module, const ArtifactOptions& options,
                                          std::vector<uint8_t>* out) {
  return Writer(module, options).runToMemory(out);
}

mlir::LogicalResult writeTieredArtifact(mlir::ModuleOp module, llvm::StringRef path,
                                        const std::vector<std::vector<uint8_t>>& tiers,
                                        const std::vector<uint64_t>& budgets) {
  std::vector<format::TierInput> inputs;
  for (size_t k = 0; k < tiers.size(); ++k)
    inputs.push_back({tiers[k].data(), tiers[k].size(), k < budgets.size() ? budgets[k] : 0});
  std::vector<uint8_t> merged;
  std::string error;
  if (!format::MergeTiers(inputs, &merged, &error))
    return module.emitError() << "--tiers: " << error;
  return writeAtomically(module, path, false, [&](llvm::raw_ostream& os) {
    os.write(reinterpret_cast<const char*>(merged.data()), merged.size());
    return success();
  });
}

} // namespace kiln
