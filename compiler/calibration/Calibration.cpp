//===- Calibration.cpp - running the model at compile time -------*- C++ -*-===//
#include "compiler/calibration/Calibration.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "compiler/quantization/Quantize.h"
#include "dialects/kiln/KilnOps.h"
#include "formats/encoding.h"
#include "passes/Encoding.h"
#include "formats/contract.h"
#include "formats/kiln_generated.h"
#include "compiler/serialize/ArtifactWriter.h"
#include "kiln/kiln.h"
#include "kiln/kiln_calibration.h"
#include "support/image_file.h"
#include "support/progress.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Support/xxhash.h"

namespace kiln::calib {
namespace {

llvm::Error fail(const llvm::Twine& msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

// A 64-byte-aligned copy of the calibration artifact (the runtime maps it in place).
struct AlignedBuffer {
  uint8_t* data = nullptr;
  size_t size = 0;
  explicit AlignedBuffer(const std::vector<uint8_t>& bytes) : size(bytes.size()) {
    void* p = nullptr;
    if (posix_memalign(&p, 64, size == 0 ? 64 : size) == 0) {
      data = static_cast<uint8_t*>(p);
      std::memcpy(data, bytes.data(), size);
    }
  }
  ~AlignedBuffer() { std::free(data); }
};

using tools::Progress;

// What one calibration sample feeds the model, and what the unquantised model says.
struct Prepared {
  std::vector<int32_t> ids;
  std::vector<float> pixels;          // preprocessed image (empty: text only)
  std::vector<float> imageFeatures;   // projector output of the unquantised model
  std::vector<int> scored;            // positions whose next-token distribution counts
  std::vector<std::vector<double>> baseLogProbs;  // per scored position
};

void logSoftmax(const float* logits, int64_t n, std::vector<double>* out) {
  out->resize(static_cast<size_t>(n));
  double mx = logits[0];
  for (int64_t i = 1; i < n; ++i)
    mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += std::exp(static_cast<double>(logits[i]) - mx);
  double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i)
    (*out)[static_cast<size_t>(i)] = static_cast<double>(logits[i]) - lse;
}

// Which tensors may be quantised (matrices that linear-like kernels read, not the
// MoE router), and whether a tensor only matters to the decoder.
struct TensorUse {
  bool quantizable = false;
  bool int8Activations = false;  // a matrix product: int8 activations apply
  bool visionSide = false;  // read by the vision encoder or projector
  int64_t routerTopK = 0;   // > 0: the router of a mixture of experts choosing this many
  bool routerNormalize = false;
};

std::vector<TensorUse> tensorUses(const fb::Model* m) {
  std::vector<TensorUse> uses(m->tensors()->size());
  for (const fb::Stage* s : *m->stages()) {
    bool vision = s->kind() == fb::StageKind::VisionEncoder || s->kind() == fb::StageKind::Projector;
    for (const fb::Op* op : *s->ops()) {
      if (!op->weights())
        continue;
      const format::OpInfo* info = format::FindOp(static_cast<uint32_t>(op->kind()));
      for (uint32_t i = 0; i < op->weights()->size(); ++i) {
        uint32_t t = op->weights()->Get(i);
        TensorUse& u = uses[t];
        u.visionSide |= vision;
        if (info && format::HasSlot(info->quantizable_weights, i) && m->tensors()->Get(t)->shape()->size() >= 2)
          u.quantizable = true;
        if (info && format::HasSlot(info->int8_act_weights, i))
          u.int8Activations = true;
        if (op->kind() == fb::OpKind::Moe && i == 0 && op->params_as_MoeParams()) {
          u.routerTopK = op->params_as_MoeParams()->top_k();
          u.routerNormalize = op->params_as_MoeParams()->normalize_top_k();
        }
      }
    }
  }
  return uses;
}

// Watches the activations the runtime's kernels multiply each weight by
// (kiln_calib_set_weight_observer): nothing about the model is recomputed here.
//  * Hessians: X^T X of the inputs of every quantisable weight (GPTQ's);
//  * routing: the inputs of every MoE router, whose logits (with the f32 router
//    weights of the loaded artifact) give each token's top-k experts and their
//    routing weights exactly as the runtime chooses them.
struct Observer {
  bool hessians = false, routing = false;
  std::vector<TensorUse>* uses = nullptr;
  const uint8_t* weights = nullptr;  // the loaded f32 artifact
  const fb::Model* fbm = nullptr;
  std::map<uint32_t, std::vector<double>> sums;
  std::map<uint32_t, int64_t> rows;
  std::map<uint32_t, RoutingStats> routes;

  void addHessian(uint32_t tensor, const float* x, int64_t n, int64_t ld, int64_t k) {
    std::vector<double>& h = sums[tensor];
    if (h.empty())
      h.assign(static_cast<size_t>(k * k), 0.0);
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x + r * ld;
      for (int64_t i = 0; i < k; ++i) {
        double xi = xr[i];
        if (xi == 0.0)
          continue;
        double* hi = h.data() + i * k;
        for (int64_t j = 0; j < k; ++j)
          hi[j] += xi * xr[j];
      }
    }
    rows[tensor] += n;
  }

  // The runtime's routing (runtime/src/ops/matmul_ops.cc RunMoe): softmax, top k by
  // probability (ties: the lower expert), renormalised when the op says so.
  void addRoutes(uint32_t tensor, const TensorUse& use, const float* x, int64_t n, int64_t ld, int64_t k) {
    const fb::Tensor* t = fbm->tensors()->Get(tensor);
    const int64_t experts = t->shape()->Get(0);
    const float* w = reinterpret_cast<const float*>(weights + t->offset());
    RoutingStats& st = routes[tensor];
    if (st.selected.empty()) {
      st.selected.assign(static_cast<size_t>(experts), 0);
      st.mass.assign(static_cast<size_t>(experts), 0.0);
    }
    std::vector<double> prob(static_cast<size_t>(experts));
    std::vector<int64_t> chosen;
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x + r * ld;
      double mx = -INFINITY;
      for (int64_t e = 0; e < experts; ++e) {
        double d = 0;
        for (int64_t i = 0; i < k; ++i)
          d += static_cast<double>(xr[i]) * w[e * k + i];
        prob[e] = d;
        mx = std::max(mx, d);
      }
      double sum = 0;
      for (double& v : prob)
        sum += (v = std::exp(v - mx));
      chosen.clear();
      double chosenSum = 0;
      for (int64_t j = 0; j < use.routerTopK && j < experts; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < experts; ++e)
          if (!llvm::is_contained(chosen, e) && (best < 0 || prob[e] > prob[best]))
            best = e;
        chosen.push_back(best);
        chosenSum += prob[best];
      }
      for (int64_t e : chosen) {
        st.selected[e] += 1;
        st.mass[e] += prob[e] / (use.routerNormalize ? chosenSum : sum);
      }
      st.tokens += 1;
    }
  }

  static void callback(void* user, uint32_t tensor, const float* x, int64_t n, int64_t ld, int64_t k) {
    auto* self = static_cast<Observer*>(user);
    if (tensor >= self->uses->size())
      return;
    const TensorUse& use = (*self->uses)[tensor];
    if (self->hessians && use.quantizable)
      self->addHessian(tensor, x, n, ld, k);
    if (self->routing && use.routerTopK > 0)
      self->addRoutes(tensor, use, x, n, ld, k);
  }
};

// Each router's experts' cosine similarity (gate, up and down as one vector), from the
// loaded f32 weights of the MoE op it feeds (its weights: router, gate x E, up x E,
// down x E), into the router's statistics: what merging experts reads.
void addExpertSimilarity(const fb::Model* fbm, const uint8_t* base, std::map<uint32_t, RoutingStats>* routes) {
  for (const fb::Stage* s : *fbm->stages())
    for (const fb::Op* op : *s->ops()) {
      if (op->kind() != fb::OpKind::Moe || !op->weights() || op->weights()->size() < 1)
        continue;
      auto it = routes->find(op->weights()->Get(0));
      if (it == routes->end() || !it->second.similarity.empty())
        continue;
      const int64_t experts = static_cast<int64_t>(it->second.selected.size());
      if (static_cast<int64_t>(op->weights()->size()) != 1 + 3 * experts)
        continue;
      auto values = [&](int64_t e, int64_t part) {
        const fb::Tensor* t = fbm->tensors()->Get(op->weights()->Get(static_cast<uint32_t>(1 + part * experts + e)));
        uint64_t n = 1;
        for (uint32_t d : *t->shape())
          n *= d;
        return llvm::ArrayRef<float>(reinterpret_cast<const float*>(base + t->offset()), n);
      };
      std::vector<double> dot(static_cast<size_t>(experts * experts), 0.0);
      for (int64_t a = 0; a < experts; ++a)
        for (int64_t c = a; c < experts; ++c) {
          double d = 0;
          for (int64_t part = 0; part < 3; ++part) {
            llvm::ArrayRef<float> x = values(a, part), y = values(c, part);
            for (size_t i = 0; i < x.size() && i < y.size(); ++i)
              d += static_cast<double>(x[i]) * y[i];
          }
          dot[a * experts + c] = dot[c * experts + a] = d;
        }
      std::vector<double>& sim = it->second.similarity;
      sim.assign(dot.size(), 0.0);
      for (int64_t a = 0; a < experts; ++a)
        for (int64_t c = 0; c < experts; ++c) {
          double norms = std::sqrt(dot[a * experts + a] * dot[c * experts + c]);
          sim[a * experts + c] = norms > 0 ? dot[a * experts + c] / norms : 0.0;
        }
    }
}

} // namespace

std::vector<std::string> defaultCandidates() {
  return {"f16", "fp8_e4m3", "int8", "int8_a8", "int4_g128", "int4_g64", "int4_g32", "int4_g32_asym", "int4_g32_a8"};
}

llvm::Expected<std::vector<Sample>> readCalibrationSet(llvm::StringRef path) {
  std::string file = path.str();
  if (llvm::sys::fs::is_directory(path)) {
    std::vector<std::string> found;
    std::error_code ec;
    for (llvm::sys::fs::directory_iterator it(path, ec), end; it != end && !ec; it.increment(ec))
      if (llvm::StringRef(it->path()).ends_with(".jsonl"))
        found.push_back(it->path());
    if (found.size() != 1)
      return fail(path + ": expected one .jsonl file of {\"image\", \"prompt\"} lines, found " +
                  llvm::Twine(found.size()));
    file = found[0];
  }
  auto buffer = llvm::MemoryBuffer::getFile(file);
  if (!buffer)
    return fail(file + ": cannot read: " + buffer.getError().message());
  llvm::SmallString<256> dir(file);
  llvm::sys::path::remove_filename(dir);
  std::vector<Sample> samples;
  llvm::SmallVector<llvm::StringRef> lines;
  (*buffer)->getBuffer().split(lines, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    llvm::StringRef line = lines[i].trim();
    if (line.empty())
      continue;
    auto json = llvm::json::parse(line);
    const llvm::json::Object* o = json ? json->getAsObject() : nullptr;
    if (!json)
      llvm::consumeError(json.takeError());
    auto prompt = o ? o->getString("prompt") : std::nullopt;
    if (!prompt)
      return fail(file + ":" + llvm::Twine(i + 1) + ": expected a JSON object with a \"prompt\"");
    Sample s;
    s.prompt = prompt->str();
    if (auto image = o->getString("image"); image && !image->empty()) {
      llvm::SmallString<256> p;
      if (llvm::sys::path::is_absolute(*image)) {
        p = *image;
      } else {
        p = dir;
        llvm::sys::path::append(p, *image);
      }
      if (!llvm::sys::fs::exists(p))
        return fail(file + ":" + llvm::Twine(i + 1) + ": image '" + p + "' does not exist");
      // A FIFO or device would block or never end: images are regular files
      // (symlinks followed, as in the Hugging Face cache).
      if (!llvm::sys::fs::is_regular_file(p))
        return fail(file + ":" + llvm::Twine(i + 1) + ": image '" + p + "' is not a regular file");
      s.image = std::string(p);
    }
    if (auto answer = o->getString("answer"))
      s.answer = answer->str();
    samples.push_back(std::move(s));
  }
  if (samples.empty())
    return fail(file + ": no calibration samples");
  return samples;
}

namespace {

// The module as an f32 artifact loaded into the runtime, with one session.
struct Loaded {
  std::unique_ptr<AlignedBuffer> buffer;
  kiln_model_t* model = nullptr;
  kiln_session_t* session = nullptr;
  kiln_model_info_t info = {};
  kiln_session_options_t so = {};
  const fb::Model* fbm = nullptr;
  ~Loaded() {
    if (session)
      kiln_session_release(session);
    if (model)
      kiln_model_release(model);
  }
};

// Every weight as f32, so that candidates are measured against the checkpoint's own
// values (and pruned models against the unpruned one).
mlir::LogicalResult loadF32(mlir::ModuleOp module, int threads, Loaded* out) {
  mlir::OwningOpRef<mlir::ModuleOp> clone = module.clone();
  mlir::MLIRContext* ctx = module.getContext();
  clone->walk([&](WeightOp w) {
    w.setEncodingAttr(EncodingAttr::get(ctx, EncodingKind::f32, 0, true, ActivationMode::Float));
  });
  std::vector<uint8_t> bytes;
  ArtifactOptions artifactOptions;
  artifactOptions.compilerVersion = "calibration";
  if (mlir::failed(writeArtifactToMemory(*clone, artifactOptions, &bytes)))
    return mlir::failure();
  out->buffer = std::make_unique<AlignedBuffer>(bytes);
  bytes.clear();
  if (out->buffer->data == nullptr)
    return module.emitError("calibration: out of memory for the calibration artifact");
  kiln_error_t err;
  if (kiln_model_load_from_memory(out->buffer->data, out->buffer->size, nullptr, &out->model, &err) != KILN_OK)
    return module.emitError("calibration: the calibration artifact does not load: ") << err.message;
  out->info.struct_size = sizeof(out->info);
  kiln_model_get_info(out->model, &out->info);
  out->so.struct_size = sizeof(out->so);
  out->so.num_threads = threads;
  out->so.context_length = std::min(out->info.max_position_embeddings, 2048);
  if (kiln_session_create(out->model, &out->so, &out->session, &err) != KILN_OK)
    return module.emitError("calibration: ") << err.message;
  out->fbm = fb::GetSizePrefixedModel(out->buffer->data);  // verified by the load above
  return mlir::success();
}

// Feeds sample `i` to a fresh session state: its image (p->pixels keeps the
// preprocessed values), its prompt and answer tokens (p->ids; p->scored the positions
// whose next token counts: the answer's, else the prompt's last 8), and fills
// `logits` with the next-token logits of every position.
mlir::LogicalResult runSample(mlir::ModuleOp module, Loaded& l, const Sample& s, size_t i, Prepared* p,
                              std::vector<float>* logits) {
  kiln_error_t err;
  kiln_session_reset(l.session);
  if (!s.image.empty()) {
    if (l.info.image_tokens == 0)
      return module.emitError("calibration: sample ") << i + 1 << " has an image but " << l.info.architecture
                                                     << " takes none";
    tools::RgbImage img;
    std::string error;
    if (!tools::LoadRgbImage(s.image, &img, &error))
      return module.emitError("calibration: ") << error;
    if (kiln_session_set_image_rgb(l.session, img.pixels.data(), img.width, img.height,
                                   3 * static_cast<size_t>(img.width), &err) != KILN_OK)
      return module.emitError("calibration: ") << s.image << ": " << err.message;
    int64_t size = l.fbm->image()->image_size();
    p->pixels.resize(static_cast<size_t>(3 * size * size));
    if (kiln_calib_get_pixel_values(l.session, p->pixels.data(), p->pixels.size(), &err) != KILN_OK)
      return module.emitError("calibration: ") << err.message;
  }
  size_t count = 0;
  std::vector<int32_t> ids(4096);
  if (kiln_session_prompt_ids(l.session, s.prompt.c_str(), ids.data(), ids.size(), &count, &err) != KILN_OK)
    return module.emitError("calibration: sample ") << i + 1 << ": " << err.message;
  ids.resize(count);
  size_t promptLen = ids.size();
  p->scored.clear();
  if (!s.answer.empty()) {
    std::vector<int32_t> answer(1024);
    std::string text = " " + s.answer;
    if (kiln_tokenize(l.model, text.c_str(), text.size(), 0, answer.data(), answer.size(), &count, &err) != KILN_OK)
      return module.emitError("calibration: sample ") << i + 1 << ": " << err.message;
    answer.resize(count);
    ids.insert(ids.end(), answer.begin(), answer.end());
    for (size_t k = promptLen - 1; k + 1 < ids.size(); ++k)
      p->scored.push_back(static_cast<int>(k));
  } else {
    for (size_t k = promptLen > 8 ? promptLen - 8 : 0; k < promptLen; ++k)
      p->scored.push_back(static_cast<int>(k));
  }
  if (static_cast<int64_t>(ids.size()) > l.so.context_length)
    return module.emitError("calibration: sample ") << i + 1 << " has " << ids.size()
                                                    << " tokens, more than the context";
  p->ids = ids;
  logits->resize(ids.size() * static_cast<size_t>(l.info.vocab_size));
  if (kiln_session_prefill_logits(l.session, ids.data(), ids.size(), logits->data(), logits->size(), &err) !=
      KILN_OK)
    return module.emitError("calibration: sample ") << i + 1 << ": " << err.message;
  return mlir::success();
}

} // namespace

mlir::LogicalResult calibrate(mlir::ModuleOp module, const Options& options, Result* result) {
  mlir::MLIRContext* ctx = module.getContext();
  Loaded l;
  if (mlir::failed(loadF32(module, options.threads, &l)))
    return mlir::failure();
  kiln_error_t err;
  kiln_model_t* model = l.model;
  kiln_session_t* session = l.session;
  const fb::Model* fbm = l.fbm;
  const uint8_t* base = l.buffer->data;
  std::vector<TensorUse> uses = tensorUses(fbm);
  const int64_t vocab = l.info.vocab_size;
  const size_t imageFloats = static_cast<size_t>(l.info.image_tokens) * static_cast<size_t>(l.info.hidden_size);

  // Baseline: the unquantised model's next-token distributions (and the Hessians and
  // the routing statistics).
  Observer observer;
  observer.uses = &uses;
  observer.hessians = options.collectHessians;
  observer.routing = options.collectRouting;
  observer.weights = base;
  observer.fbm = fbm;
  if (observer.hessians || observer.routing)
    kiln_calib_set_weight_observer(session, Observer::callback, &observer);
  std::vector<Prepared> prepared(options.samples.size());
  {
    Progress progress(options.progress, "calibration", options.samples.size());
    progress.update(0);
    std::vector<float> logits;
    for (size_t i = 0; i < options.samples.size(); ++i) {
      Prepared& p = prepared[i];
      if (mlir::failed(runSample(module, l, options.samples[i], i, &p, &logits)))
        return mlir::failure();
      for (int k : p.scored) {
        p.baseLogProbs.emplace_back();
        logSoftmax(logits.data() + static_cast<size_t>(k) * vocab, vocab, &p.baseLogProbs.back());
      }
      if (!p.pixels.empty()) {
        p.imageFeatures.resize(imageFloats);
        if (kiln_calib_get_image_features(session, p.imageFeatures.data(), p.imageFeatures.size(), &err) != KILN_OK)
          return module.emitError("calibration: ") << err.message;
      }
      result->scoredPositions += static_cast<int>(p.scored.size());
      progress.update(i + 1);
    }
  }
  kiln_calib_set_weight_observer(session, nullptr, nullptr);
  if (options.collectHessians)
    for (auto& [tensor, h] : observer.sums) {
      double n = static_cast<double>(std::max<int64_t>(1, observer.rows[tensor]));
      for (double& v : h)
        v /= n;
      result->hessians[fbm->tensors()->Get(tensor)->name()->str()] = std::move(h);
    }
  if (options.collectRouting) {
    if (options.collectSimilarity)
      addExpertSimilarity(fbm, base, &observer.routes);
    for (auto& [tensor, r] : observer.routes)
      result->routing[fbm->tensors()->Get(tensor)->name()->str()] = std::move(r);
  }

  // Sensitivity: each weight alone in each candidate encoding.
  std::vector<std::pair<uint32_t, std::string>> jobs;
  for (uint32_t t = 0; t < fbm->tensors()->size(); ++t)
    if (uses[t].quantizable)
      for (const std::string& c : options.candidates)
        jobs.push_back({t, c});
  Progress progress(options.progress, "sensitivity", jobs.size());
  std::vector<float> logits;
  for (size_t j = 0; j < jobs.size(); ++j) {
    auto [t, label] = jobs[j];
    const fb::Tensor* tensor = fbm->tensors()->Get(t);
    std::string name = tensor->name()->str();
    progress.update(j, name + " " + label);
    std::string error;
    EncodingAttr enc = EncodingAttr::fromLabel(ctx, label, &error);
    if (!enc)
      return module.emitError("calibration: ") << error;
    format::EncodingSpec spec = encodingSpec(enc);
    uint64_t rows = static_cast<uint64_t>(tensor->shape()->Get(0));
    uint64_t cols = 1;
    for (uint32_t k = 1; k < tensor->shape()->size(); ++k)
      cols *= static_cast<uint64_t>(tensor->shape()->Get(k));
    if (format::StorageBytes(spec, rows, cols) == 0)
      continue;  // e.g. int4 groups that do not divide the input dimension
    bool act8 = enc.getActivation() == ActivationMode::Int8PerToken;
    if (act8 && !uses[t].int8Activations)
      continue;  // int8 activations apply to matrix products only
    const float* w = reinterpret_cast<const float*>(base + tensor->offset());
    auto h = result->hessians.find(name);
    std::vector<uint8_t> q = options.gptq && h != result->hessians.end() && h->second.size() == cols * cols
                                 ? quant::quantizeGptq(w, rows, cols, spec, h->second.data())
                                 : quant::quantizeRtn(w, rows, cols, spec);
    kiln_calib_encoding_t candidate = {spec.id, spec.group, spec.symmetric ? 1 : 0, act8 ? 1 : 0};
    if (kiln_calib_override_weight(model, t, q.data(), &candidate, &err) != KILN_OK)
      return module.emitError("calibration: ") << err.message;
    double kl = 0;
    int positions = 0;
    for (size_t i = 0; i < prepared.size(); ++i) {
      Prepared& p = prepared[i];
      kiln_session_reset(session);
      if (!p.pixels.empty()) {
        kiln_status_t st = uses[t].visionSide
                               ? kiln_session_set_pixel_values(session, p.pixels.data(), p.pixels.size(), &err)
                               : kiln_calib_set_image_features(session, p.imageFeatures.data(), p.imageFeatures.size(), &err);
        if (st != KILN_OK)
          return module.emitError("calibration: ") << err.message;
      }
      logits.resize(p.ids.size() * static_cast<size_t>(vocab));
      if (kiln_session_prefill_logits(session, p.ids.data(), p.ids.size(), logits.data(), logits.size(), &err) !=
          KILN_OK)
        return module.emitError("calibration: ") << err.message;
      std::vector<double> lp;
      for (size_t k = 0; k < p.scored.size(); ++k) {
        logSoftmax(logits.data() + static_cast<size_t>(p.scored[k]) * vocab, vocab, &lp);
        const std::vector<double>& base = p.baseLogProbs[k];
        double d = 0;
        for (int64_t v = 0; v < vocab; ++v)
          d += std::exp(base[static_cast<size_t>(v)]) * (base[static_cast<size_t>(v)] - lp[static_cast<size_t>(v)]);
        kl += std::max(0.0, d);
        ++positions;
      }
    }
    kiln_calib_restore_weight(model, t);
    result->sensitivity[name][label] = positions > 0 ? kl / positions : 0.0;
  }
  return mlir::success();
}

mlir::LogicalResult evaluateAnswers(mlir::ModuleOp module, const std::vector<Sample>& samples, int threads,
                                    Evaluation* out) {
  Loaded l;
  if (mlir::failed(loadF32(module, threads, &l)))
    return mlir::failure();
  const int64_t vocab = l.info.vocab_size;
  *out = Evaluation();
  std::vector<float> logits;
  std::vector<double> lp;
  int64_t tokens = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (samples[i].answer.empty())
      return module.emitError("evaluation: sample ") << i + 1 << " has no answer";
    Prepared p;
    if (mlir::failed(runSample(module, l, samples[i], i, &p, &logits)))
      return mlir::failure();
    bool right = true;
    for (int k : p.scored) {
      const float* row = logits.data() + static_cast<size_t>(k) * vocab;
      int32_t next = p.ids[static_cast<size_t>(k) + 1];
      right &= std::max_element(row, row + vocab) - row == next;
      logSoftmax(row, vocab, &lp);
      out->answerNll -= lp[static_cast<size_t>(next)];
      ++tokens;
    }
    out->samples += 1;
    out->correct += right ? 1 : 0;
  }
  if (tokens > 0)
    out->answerNll /= static_cast<double>(tokens);
  return mlir::success();
}

llvm::Expected<std::string> sourceHash(mlir::ModuleOp module) {
  auto ckpt = module->getAttrOfType<mlir::StringAttr>("kiln.checkpoint");
  if (!ckpt)
    return fail("module has no kiln.checkpoint attribute");
  llvm::SHA256 sha;
  std::map<std::string, std::unique_ptr<llvm::MemoryBuffer>> files;
  for (llvm::StringRef f : {"config.json", "tokenizer.json", "preprocessor_config.json"}) {
    llvm::SmallString<256> p(ckpt.getValue());
    llvm::sys::path::append(p, f);
    if (auto buf = llvm::MemoryBuffer::getFile(p)) {
      uint64_t h = llvm::xxh3_64bits((*buf)->getBuffer());
      sha.update(llvm::ArrayRef<uint8_t>(reinterpret_cast<uint8_t*>(&h), 8));
    }
  }
  llvm::Error error = llvm::Error::success();
  module.walk([&](WeightOp w) {
    if (error)
      return;
    sha.update(w.getSymName());
    // Every leaf of the weight's expression, in order; a plain source hashes as the
    // weight's one tensor always did.
    for (SourceAttr src : w.getSources()) {
      auto it = files.find(src.getFile().str());
      if (it == files.end()) {
        llvm::SmallString<256> p(ckpt.getValue());
        llvm::sys::path::append(p, src.getFile());
        auto buf = llvm::MemoryBuffer::getFile(p, false, false);
        if (!buf) {
          error = fail(p + ": cannot read: " + buf.getError().message());
          return;
        }
        it = files.emplace(src.getFile().str(), std::move(*buf)).first;
      }
      llvm::StringRef data = it->second->getBuffer();
      if (src.getOffset() > data.size() || src.getSize() > data.size() - src.getOffset()) {
        error = fail(src.getFile() + ": shorter than the module says (the checkpoint changed)");
        return;
      }
      uint64_t h = llvm::xxh3_64bits(data.substr(src.getOffset(), src.getSize()));
      sha.update(llvm::ArrayRef<uint8_t>(reinterpret_cast<uint8_t*>(&h), 8));
    }
    sha.update(weightExprTransforms(w.getSource()));
  });
  if (error)
    return std::move(error);
  return llvm::toHex(sha.final(), true);
}

std::string cacheKey(llvm::StringRef sourceHash, const Options& options) {
  llvm::SHA256 sha;
  sha.update(sourceHash);
  for (const Sample& s : options.samples) {
    sha.update(s.prompt);
    sha.update(s.answer);
    if (!s.image.empty())
      if (auto buf = llvm::MemoryBuffer::getFile(s.image)) {
        uint64_t h = llvm::xxh3_64bits((*buf)->getBuffer());
        sha.update(llvm::ArrayRef<uint8_t>(reinterpret_cast<uint8_t*>(&h), 8));
      }
  }
  for (const std::string& c : options.candidates)
    sha.update(c);
  // Bump when the measurement changes (2: GPTQ covers MoE experts).
  sha.update(options.gptq ? "gptq-2" : "rtn");
  return llvm::toHex(sha.final(), true).substr(0, 32);
}

bool loadCache(llvm::StringRef dir, llvm::StringRef key, Result* result) {
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, "sensitivity-" + key + ".json");
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer)
    return false;
  auto json = llvm::json::parse((*buffer)->getBuffer());
  if (!json) {
    llvm::consumeError(json.takeError());
    return false;
  }
  const llvm::json::Object* root = json->getAsObject();
  const llvm::json::Object* sens = root ? root->getObject("sensitivity") : nullptr;
  if (!sens || root->getString("key") != std::optional<llvm::StringRef>(key))
    return false;
  for (const auto& [weight, cands] : *sens)
    if (const llvm::json::Object* o = cands.getAsObject())
      for (const auto& [label, v] : *o)
        if (auto d = v.getAsNumber())
          result->sensitivity[weight.str()][label.str()] = *d;
  result->scoredPositions = static_cast<int>(root->getInteger("scored_positions").value_or(0));
  return true;
}

void saveCache(llvm::StringRef dir, llvm::StringRef key, const Result& result) {
  if (llvm::sys::fs::create_directories(dir))
    return;
  llvm::json::Object sens;
  for (const auto& [weight, cands] : result.sensitivity) {
    llvm::json::Object o;
    for (const auto& [label, v] : cands)
      o[label] = v;
    sens[weight] = std::move(o);
  }
  llvm::json::Object root{{"key", key.str()},
                          {"scored_positions", result.scoredPositions},
                          {"sensitivity", std::move(sens)}};
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, "sensitivity-" + key + ".json");
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec);
  if (!ec)
    os << llvm::json::Value(std::move(root)) << "\n";
}

} // namespace kiln::calib
