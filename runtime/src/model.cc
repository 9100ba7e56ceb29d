// kiln_model_*: loading (mmap), verification and the model's tokenizer.
#include <cstddef>
#include <algorithm>
#include <cstring>
#include <new>

#include "formats/kiln_format.h"
#include "model.h"
#include "kiln/kiln_calibration.h"
#include "support/error.h"
#include "support/sized_struct.h"
#include "verify.h"

using namespace kiln::rt;
namespace fb = kiln::fb;
namespace format = kiln::format;

namespace {

const char* Str(const flatbuffers::String* s) { return s != nullptr ? s->c_str() : ""; }

// The weight views, the tokenizer, the preprocessing spec and the info block of a
// verified artifact.
kiln_status_t Prepare(kiln_model_t* m, kiln_error_t* error) {
  const fb::Model* f = m->fb;
  for (const fb::Stage* s : *f->stages()) m->stages[static_cast<int>(s->kind())] = s;
  if (const fb::Stage* projector = m->stages[static_cast<int>(fb::StageKind::Projector)])
    for (const fb::Op* op : *projector->ops())
      if (op->kind() == fb::OpKind::SelectTokens) {
        m->image_tokens_scored = op->params_as_SelectTokensParams()->tokens();
        m->image_positions_original = op->params_as_SelectTokensParams()->original_positions();
      }

  m->weights.set_allocator(&m->allocator);
  if (!m->weights.resize(f->tensors()->size()))
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory for %u weight views", f->tensors()->size());
  for (uint32_t i = 0; i < f->tensors()->size(); ++i) {
    const fb::Tensor* t = f->tensors()->Get(i);
    RestoreWeight(m, i);  // data and encoding as stored
    WeightView& w = m->weights[i];
    w.shape = t->shape();
    w.rows = t->shape()->Get(0);
    w.cols = 1;
    for (uint32_t k = 1; k < t->shape()->size(); ++k) w.cols *= t->shape()->Get(k);
  }

  // Tokenizer: views into the artifact.
  // A tier's header may leave it out: the root's (formats/tiers.h).
  const fb::Tokenizer* tok = f->tokenizer() != nullptr ? f->tokenizer() : fb::GetSizePrefixedModel(m->data)->tokenizer();
  m->vocab.set_allocator(&m->allocator);
  m->merges.set_allocator(&m->allocator);
  m->added.set_allocator(&m->allocator);
  if (!m->vocab.resize(tok->vocab()->size()) || (tok->merges() && !m->merges.resize(tok->merges()->size())) ||
      (tok->added_tokens() && !m->added.resize(tok->added_tokens()->size())))
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory for the tokenizer");
  for (uint32_t i = 0; i < tok->vocab()->size(); ++i) {
    const flatbuffers::String* s = tok->vocab()->Get(i);
    m->vocab[i] = std::string_view(s->c_str(), s->size());
  }
  for (uint32_t i = 0; tok->merges() && i < tok->merges()->size(); ++i)
    m->merges[i] = {tok->merges()->Get(i)->left(), tok->merges()->Get(i)->right()};
  for (uint32_t i = 0; tok->added_tokens() && i < tok->added_tokens()->size(); ++i) {
    const fb::AddedToken* a = tok->added_tokens()->Get(i);
    m->added[i] = {a->id(), std::string_view(a->content()->c_str(), a->content()->size()), a->special()};
  }
  TokenizerSpec spec;
  spec.pretokenizer = tok->pretokenizer() == fb::PreTokenizer::Gpt2        ? TokenizerSpec::PreTokenizer::kGpt2
                      : tok->pretokenizer() == fb::PreTokenizer::Metaspace ? TokenizerSpec::PreTokenizer::kMetaspace
                                                                           : TokenizerSpec::PreTokenizer::kSplit;
  if (tok->prepend() != nullptr) spec.sentencepiece.prepend = std::string_view(tok->prepend()->c_str(), tok->prepend()->size());
  spec.sentencepiece.prepend_scheme = tok->prepend_scheme() == fb::PrependScheme::First   ? TokenizerSpec::PrependScheme::kFirst
                        : tok->prepend_scheme() == fb::PrependScheme::Never ? TokenizerSpec::PrependScheme::kNever
                                                                            : TokenizerSpec::PrependScheme::kAlways;
  spec.sentencepiece.byte_fallback = tok->byte_fallback();
  spec.sentencepiece.unk_id = tok->unk_id();
  spec.sentencepiece.fuse_unk = tok->fuse_unk();
  spec.sentencepiece.decode_strip = tok->decode_strip();
  if (tok->normalizer() == fb::Normalizer::NFC) {
    spec.nfc.enabled = true;
    if (tok->nfc_decompositions() != nullptr) {
      spec.nfc.decompositions = tok->nfc_decompositions()->data();
      spec.nfc.num_decompositions = tok->nfc_decompositions()->size();
    }
    if (tok->nfc_compositions() != nullptr) {
      spec.nfc.compositions = tok->nfc_compositions()->data();
      spec.nfc.num_compositions = tok->nfc_compositions()->size();
    }
    if (tok->nfc_combining_classes() != nullptr) {
      spec.nfc.classes = tok->nfc_combining_classes()->data();
      spec.nfc.num_classes = tok->nfc_combining_classes()->size();
    }
  }
  if (tok->pattern() != nullptr) spec.pattern = std::string_view(tok->pattern()->c_str(), tok->pattern()->size());
  spec.vocab = m->vocab.data();
  spec.vocab_size = m->vocab.size();
  spec.merges = m->merges.data();
  spec.num_merges = m->merges.size();
  spec.added = m->added.data();
  spec.num_added = m->added.size();
  spec.bos_id = tok->bos_id();
  spec.add_bos = tok->add_bos();
  spec.ignore_merges = tok->ignore_merges();
  if (kiln_status_t st = Tokenizer::Create(spec, &m->allocator, &m->tokenizer, error); st != KILN_OK) return st;

  // Image preprocessing and the image token's text (for prompt templates).
  m->multimodal = f->image() != nullptr;
  if (m->multimodal) {
    const fb::ImagePreprocess* p = f->preprocess();
    ImagePreprocessSpec& s = m->preprocess;
    s.processor = p->processor() == fb::ImageProcessor::Idefics3 ? ImagePreprocessSpec::Processor::kIdefics3
                                                                 : ImagePreprocessSpec::Processor::kClip;
    s.image_size = static_cast<int32_t>(f->image()->image_size());
    s.do_convert_rgb = p->do_convert_rgb();
    s.do_resize = p->do_resize();
    s.shortest_edge = static_cast<int32_t>(p->shortest_edge());
    s.longest_edge = static_cast<int32_t>(p->longest_edge());
    s.resample = p->resample();
    s.do_center_crop = p->do_center_crop();
    s.crop_height = static_cast<int32_t>(p->crop_height());
    s.crop_width = static_cast<int32_t>(p->crop_width());
    s.do_rescale = p->do_rescale();
    s.rescale_factor = p->rescale_factor();
    s.do_normalize = p->do_normalize();
    for (int c = 0; c < 3; ++c) {
      s.image_mean[c] = p->image_mean()->Get(c);
      s.image_std[c] = p->image_std()->Get(c);
    }
    s.max_image_edge = static_cast<int32_t>(p->max_image_edge());
    int64_t id = f->image()->image_token_id();
    for (const TokenizerSpec::Added& a : m->added)
      if (a.id == id) {
        m->image_token_text = a.content.data();
        m->image_token_text_len = a.content.size();
      }
  }

  m->eos_ids.set_allocator(&m->allocator);
  if (f->generation()->eos_token_ids() != nullptr)
    for (int32_t e : *f->generation()->eos_token_ids())
      if (!m->eos_ids.push_back(e)) return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");

  kiln_model_info_t& info = m->info;
  info.architecture = Str(f->metadata()->architecture());
  info.prompt_template = Str(f->metadata()->prompt_template());
  info.chat_template = f->chat() != nullptr ? Str(f->chat()->source()) : nullptr;
  info.target = Str(f->metadata()->target_triple());
  info.source_hash = Str(f->metadata()->source_hash());
  info.vocab_size = static_cast<int32_t>(f->text()->vocab_size());
  info.hidden_size = static_cast<int32_t>(f->text()->hidden_size());
  info.num_layers = static_cast<int32_t>(f->text()->num_layers());
  info.max_position_embeddings = static_cast<int32_t>(f->text()->max_position_embeddings());
  info.max_prefill_tokens = static_cast<int32_t>(f->memory_plan()->max_prefill_tokens());
  info.image_size = m->multimodal ? static_cast<int32_t>(f->image()->image_size()) : 0;
  info.image_tokens = m->multimodal ? static_cast<int32_t>(f->image()->image_tokens()) : 0;
  info.image_token_id = m->multimodal ? static_cast<int32_t>(f->image()->image_token_id()) : -1;
  info.image_tokens_scored = static_cast<int32_t>(m->image_tokens_scored);
  info.image_positions_original = m->image_positions_original ? 1 : 0;
  info.weight_bytes = f->memory_plan()->weight_bytes();
  info.file_bytes = m->size;
  return KILN_OK;
}

// Loads the code segment (verified: checksum, machine, symbols listed) and points
// every op bound to a generated kernel at its function.
kiln_status_t BindCode(kiln_model_t* m, kiln_error_t* error) {
  const fb::Model* f = m->fb;
  const fb::CodeSegment* code = f->code();
  if (code == nullptr) return KILN_OK;
  const kiln_kernel_library_t* lib = m->kernel_library;
  if (code->library()) {
    // Kernels linked into the application: the one built for this artifact.
    if (lib == nullptr)
      return Fail(error, KILN_ERROR_ARTIFACT_CODE,
                  "the artifact's kernels are in a static library (kiln-compile --emit=static-library): link it "
                  "and pass it in kiln_model_options_t.kernels");
    if (lib->struct_size < sizeof(kiln_kernel_library_t) || (lib->count > 0 && (lib->names == nullptr || lib->functions == nullptr)))
      return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "kiln_model_options_t.kernels is not a kernel library");
    if (lib->hash != code->checksum())
      return Fail(error, KILN_ERROR_ARTIFACT_CODE,
                  "the kernel library passed in (%016llx) was built for another artifact than this one (%016llx)",
                  static_cast<unsigned long long>(lib->hash), static_cast<unsigned long long>(code->checksum()));
  } else {
    const fb::Segment* seg = f->segments()->Get(code->segment());
    if (kiln_status_t st = m->code.Load(m->data + seg->offset(), seg->size(), error); st != KILN_OK) return st;
    if (m->perf_map != nullptr)
      if (kiln_status_t st = m->code.WritePerfMap(m->perf_map, error); st != KILN_OK) return st;
  }
  // The function an op names, from the library or the loaded segment.
  auto find = [&](const char* name) -> void* {
    if (!code->library()) return m->code.Find(name);
    for (uint32_t i = 0; i < lib->count; ++i)
      if (lib->names[i] != nullptr && std::strcmp(lib->names[i], name) == 0)
        return reinterpret_cast<void*>(lib->functions[i]);
    return nullptr;
  };
  size_t generated = 0;
  for (const fb::Stage* s : *f->stages())
    for (const fb::Op* op : *s->ops()) generated += FindKernel(op->kernel())->generated ? 1 : 0;
  m->generated_uk.set_allocator(&m->allocator);
  if (!m->generated_uk.resize(generated)) return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
  size_t next = 0;
  for (const fb::Stage* s : *f->stages()) {
    kiln::rt::Vec<const UkernelSet*>& table = m->op_uk[static_cast<int>(s->kind())];
    table.set_allocator(&m->allocator);
    if (!table.resize(s->ops()->size())) return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
    for (uint32_t i = 0; i < s->ops()->size(); ++i) {
      const fb::Op* op = s->ops()->Get(i);
      const KernelEntry* k = FindKernel(op->kernel());
      table[i] = nullptr;
      if (!k->generated) continue;
      void* fn = find(op->symbol()->c_str());
      if (fn == nullptr)
        return Fail(error, KILN_ERROR_ARTIFACT_CODE, "op '%s': the %s defines no function '%s'", Str(op->name()),
                    code->library() ? "kernel library" : "code segment", op->symbol()->c_str());
      UkernelSet& set = m->generated_uk[next++];
      set = *k->uk;
      if (!BindGeneratedUkernel(op->kind(), fn, &set))
        return Fail(error, KILN_ERROR_ARTIFACT_CODE, "op '%s': %s ops cannot run generated kernels", Str(op->name()),
                    fb::EnumNameOpKind(op->kind()));
      // A generated attention reads KV caches of the artifact's encoding only.
      set.attention_reads_kv = static_cast<int>(f->text()->kv_cache_encoding());
      set.attention_reads_blocks = f->schema_version() >= 1007;
      set.matmul_reads_rows = f->schema_version() >= 1017;
      const uint32_t kv_group = f->text()->kv_cache_group();
      set.attention_reads_spans = f->schema_version() >= 1008 && kv_group > 0 && (kv_group & (kv_group - 1)) == 0;
      if (op->symbols() != nullptr)
        for (const flatbuffers::String* extra : *op->symbols()) {
          void* f = find(extra->c_str());
          if (f == nullptr)
            return Fail(error, KILN_ERROR_ARTIFACT_CODE, "op '%s': the %s defines no function '%s'",
                        Str(op->name()), code->library() ? "kernel library" : "code segment", extra->c_str());
          if (!BindFusedUkernel(op->kind(), extra->c_str(), f, &set))
            return Fail(error, KILN_ERROR_ARTIFACT_CODE, "op '%s': %s ops cannot call '%s'", Str(op->name()),
                        fb::EnumNameOpKind(op->kind()), extra->c_str());
        }
      table[i] = &set;
    }
    kiln::rt::Vec<const UkernelSet*>& loaded = m->op_uk_loaded[static_cast<int>(s->kind())];
    loaded.set_allocator(&m->allocator);
    if (!loaded.resize(table.size())) return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < table.size(); ++i) loaded[i] = table[i];
  }
  return KILN_OK;
}

// Ops bound to generated kernels run them only while none of their weights is
// overridden (see kiln_model_t::op_uk_loaded).
void RebindGenerated(kiln_model_t* m) {
  for (const fb::Stage* s : *m->fb->stages()) {
    const int k = static_cast<int>(s->kind());
    // Without a code segment the tables are empty.
    for (uint32_t i = 0; i < s->ops()->size() && i < m->op_uk_loaded[k].size(); ++i) {
      if (m->op_uk_loaded[k][i] == nullptr) continue;
      bool overridden = false;
      for (uint32_t t : *s->ops()->Get(i)->weights()) overridden |= m->weights[t].overridden;
      m->op_uk[k][i] = overridden ? nullptr : m->op_uk_loaded[k][i];
    }
  }
}

// kiln_model_options_t.memory_budget: what the model and one session need
// (kiln_model_memory_report) against the budget, every part named when it does not
// fit. Only the header and the code segment have been read so far.
kiln_status_t CheckMemoryBudget(kiln_model_t* m, kiln_error_t* error) {
  kiln_memory_report_t r = {};
  r.struct_size = sizeof(r);
  if (kiln_status_t st = kiln_model_memory_report(m, m->budget_session_given ? &m->budget_session : nullptr, &r, error);
      st != KILN_OK)
    return st;
  if (r.total_bytes <= m->memory_budget) return KILN_OK;
  static const char* const kKv[] = {"default", "f32", "f16", "int8", "int4"};
  const double mb = 1e6;
  return Fail(error, KILN_ERROR_RESOURCE_EXHAUSTED,
              "needs %.1f MB, over the %.1f MB memory budget: weights %.1f MB (mapped), code %.1f MB, model tables "
              "%.1f MB, session %.1f MB (KV cache %.1f MB, %s for %d tokens; arena %.1f MB; scratch and buffers "
              "%.1f MB); a shorter context or a smaller KV-cache encoding (kiln_session_options_t) lowers it",
              r.total_bytes / mb, m->memory_budget / mb, r.weight_bytes / mb, r.code_bytes / mb, r.model_bytes / mb,
              r.session_bytes / mb, r.kv_cache_bytes / mb, kKv[r.kv_cache >= 0 && r.kv_cache <= 4 ? r.kv_cache : 0],
              r.context_length, r.arena_bytes / mb,
              (r.session_bytes - r.kv_cache_bytes - r.arena_bytes) / mb);
}

// Loads tier `tier` of the artifact at m->data (m is released on failure); *tiers gets
// the artifact's tier count once its root header is verified.
kiln_status_t Load(kiln_model_t* m, uint32_t tier, uint32_t* tiers, kiln_model_t** out_model, kiln_error_t* error) {
  kiln_status_t st = VerifyArtifact(m->data, m->size, DetectCpuFeatures(), &m->allocator, &m->fb, error, true, tier);
  if (st == KILN_OK || (st == KILN_ERROR_INVALID_ARGUMENT && tier > 0)) {
    const fb::Model* root = fb::GetSizePrefixedModel(m->data);  // verified (the tier's failure comes after)
    *tiers = TierCount(root);
    if (st == KILN_OK && root->tiers() != nullptr && root->tiers()->size() > 0)
      m->info.tier_weight_budget = root->tiers()->Get(tier)->weight_budget();
  }
  m->info.tier = static_cast<int32_t>(tier);
  m->info.tier_count = static_cast<int32_t>(*tiers);
  if (st == KILN_OK) st = Prepare(m, error);
  if (st == KILN_OK) st = BindCode(m, error);
  if (st == KILN_OK && m->memory_budget > 0) st = CheckMemoryBudget(m, error);
  if (st == KILN_OK) st = kiln::rt::SetUpKvPool(m, error);
  if (st != KILN_OK) {
    kiln_model_release(m);
    return st;
  }
  *out_model = m;
  return KILN_OK;
}

// Loads the tier options ask for, or the largest that fits the budget: `open`
// makes a new model over the artifact's bytes for each attempt.
template <typename Open>
kiln_status_t LoadTier(const kiln_model_options_t* options, Open open, kiln_model_t** out_model, kiln_error_t* error) {
  int32_t asked = -1;
  if (options != nullptr && options->struct_size >= offsetof(kiln_model_options_t, tier) + sizeof(options->tier))
    asked = options->tier;
  if (asked < -1) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "tier %d: must be >= 0 (or -1: the largest that fits)", asked);
  uint32_t tiers = 1;
  for (uint32_t k = asked >= 0 ? static_cast<uint32_t>(asked) : 0;; ++k) {
    kiln_model_t* m = nullptr;
    if (kiln_status_t st = open(&m); st != KILN_OK) return st;
    kiln_status_t st = Load(m, k, &tiers, out_model, error);
    if (st != KILN_ERROR_RESOURCE_EXHAUSTED || asked >= 0 || k + 1 >= tiers) {
      if (st == KILN_ERROR_RESOURCE_EXHAUSTED && asked < 0 && tiers > 1 && error != nullptr) {
        char msg[sizeof(error->message)];
        std::snprintf(msg, sizeof(msg), "no tier of %u fits; the smallest, tier %u, %s", tiers, k, error->message);
        std::memcpy(error->message, msg, sizeof(msg));
      }
      return st;
    }
  }
}

// Prefixes a failure's message with the file it is about.
kiln_status_t NamePath(kiln_status_t st, const char* path, kiln_error_t* error) {
  if (st != KILN_OK && error != nullptr) {
    char msg[sizeof(error->message)];
    std::snprintf(msg, sizeof(msg), "%s: %s", path, error->message);
    std::memcpy(error->message, msg, sizeof(msg));
  }
  return st;
}

kiln_model_t* NewModel(const kiln_model_options_t* options) {
  const kiln_allocator_t* a = options != nullptr ? options->allocator : nullptr;
  Allocator bootstrap(a);
  void* mem = bootstrap.Alloc(sizeof(kiln_model_t), 64);
  if (mem == nullptr) return nullptr;
  kiln_model_t* m = new (mem) kiln_model_t(a);
  // Fields after `allocator` exist when the caller's struct is new enough.
  if (options != nullptr &&
      options->struct_size >= offsetof(kiln_model_options_t, kernels) + sizeof(options->kernels))
    m->kernel_library = options->kernels;
  if (options != nullptr && options->struct_size >= offsetof(kiln_model_options_t, session) + sizeof(options->session)) {
    m->memory_budget = options->memory_budget;
    if (options->struct_size >= offsetof(kiln_model_options_t, kv_block_tokens) + sizeof(options->kv_block_tokens)) {
      m->kv_pool_tokens = options->kv_pool_tokens;
      m->kv_block_tokens = options->kv_block_tokens;
    }
    if (options->struct_size >= offsetof(kiln_model_options_t, perf_map) + sizeof(options->perf_map))
      m->perf_map = options->perf_map;
    if (options->session != nullptr) {
      // The caller's struct, of whatever size it declares (checked by the session planner).
      const kiln_session_options_t* so = options->session;
      m->budget_session_given = true;
      if (so->struct_size >= sizeof(uint32_t) && so->struct_size <= 4096)
        std::memcpy(&m->budget_session, so, std::min<size_t>(so->struct_size, sizeof(m->budget_session)));
      m->budget_session.struct_size = so->struct_size;
    }
  }
  return m;
}

}  // namespace

namespace kiln::rt {

void RestoreWeight(kiln_model_t* m, uint32_t tensor) {
  const fb::Tensor* t = m->fb->tensors()->Get(tensor);
  WeightView& w = m->weights[tensor];
  w.data = m->data + t->offset();
  w.encoding = t->encoding();
  w.spec.id = static_cast<uint8_t>(t->encoding());
  w.spec.group = t->group_size();
  w.spec.symmetric = t->symmetric();
  w.int8_activations = t->activation() == fb::ActivationMode::Int8PerToken;
  w.layout = static_cast<uint8_t>(t->layout());
  w.overridden = false;
}

}  // namespace kiln::rt

extern "C" {

kiln_status_t kiln_calib_override_weight(kiln_model_t* m, uint32_t tensor, const uint8_t* data,
                                         const kiln_calib_encoding_t* encoding, kiln_error_t* error) {
  ClearError(error);
  if (m == nullptr || data == nullptr || encoding == nullptr)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "null argument");
  if (tensor >= m->weights.size()) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "no tensor %u", tensor);
  format::EncodingSpec spec;
  spec.id = encoding->encoding;
  spec.group = encoding->group;
  spec.symmetric = encoding->symmetric != 0;
  WeightView& w = m->weights[tensor];
  if (spec.id >= format::kNumEncodings ||
      format::StorageBytes(spec, static_cast<uint64_t>(w.rows), static_cast<uint64_t>(w.cols)) == 0)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "encoding cannot hold tensor %u", tensor);
  // An op reading the replaced weight runs the reference kernel, which reads row-major
  // weights only: its other weights must not be packed.
  for (const fb::Stage* s : *m->fb->stages())
    for (const fb::Op* op : *s->ops()) {
      bool reads = false;
      for (uint32_t t : *op->weights()) reads |= t == tensor;
      if (!reads) continue;
      for (uint32_t t : *op->weights())
        if (t != tensor && m->weights[t].layout != format::kLayoutRowMajor && !m->weights[t].overridden)
          return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                      "tensor %u shares op '%s' with weight '%s', stored packed (%s); calibrate an artifact with "
                      "row-major weights",
                      tensor, op->name() ? op->name()->c_str() : "?", m->fb->tensors()->Get(t)->name() ? m->fb->tensors()->Get(t)->name()->c_str() : "?",
                      format::LayoutName(m->weights[t].layout));
    }
  w.data = data;
  w.spec = spec;
  w.encoding = static_cast<fb::Encoding>(spec.id);
  w.int8_activations = encoding->int8_activations != 0;
  w.layout = format::kLayoutRowMajor;  // calibration's bytes are row major
  w.overridden = true;
  RebindGenerated(m);
  return KILN_OK;
}

void kiln_calib_restore_weight(kiln_model_t* m, uint32_t tensor) {
  if (m == nullptr || tensor >= m->weights.size()) return;
  RestoreWeight(m, tensor);
  RebindGenerated(m);
}

kiln_status_t kiln_model_load(const char* path, const kiln_model_options_t* options, kiln_model_t** out_model,
                              kiln_error_t* out_error) {
  ClearError(out_error);
  if (path == nullptr || out_model == nullptr)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_model_load: path and out_model are required");
  return kiln::rt::LoadModelFile(path, options, UINT64_MAX, true, out_model, out_error);
}

}  // extern "C"

kiln_status_t kiln::rt::LoadModelFile(const char* path, const kiln_model_options_t* options, uint64_t budget,
                                      bool pool_from_budget, kiln_model_t** out_model, kiln_error_t* out_error) {
  auto open = [&](kiln_model_t** out) {
    kiln_model_t* m = NewModel(options);
    if (m == nullptr) return Fail(out_error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
    if (budget != UINT64_MAX) m->memory_budget = budget;
    m->pool_from_budget = pool_from_budget;
    if (kiln_status_t st = MapFile(path, &m->mapping, out_error); st != KILN_OK) {
      kiln_model_release(m);
      return st;
    }
    m->data = m->mapping.data;
    m->size = m->mapping.size;
    *out = m;
    return KILN_OK;
  };
  return NamePath(LoadTier(options, open, out_model, out_error), path, out_error);
}

extern "C" {

kiln_status_t kiln_artifact_verify(const char* path, int for_this_cpu, kiln_error_t* out_error) {
  ClearError(out_error);
  if (path == nullptr) return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_artifact_verify: path is required");
  FileMapping mapping;
  if (kiln_status_t st = MapFile(path, &mapping, out_error); st != KILN_OK) return st;
  Allocator allocator(nullptr);
  kiln_status_t st = KILN_OK;
  // Every tier of a tiered artifact (tier 0 is the root).
  for (uint32_t tier = 0, tiers = 1; st == KILN_OK && tier < tiers; ++tier) {
    const fb::Model* fbm = nullptr;
    st = VerifyArtifact(mapping.data, mapping.size, DetectCpuFeatures(), &allocator, &fbm, out_error,
                        for_this_cpu != 0, tier);
    if (st == KILN_OK && tier == 0) tiers = TierCount(fbm);
    // A code segment for this machine must also load (its ELF structure and relocations).
    if (st == KILN_OK && for_this_cpu != 0 && fbm->code() != nullptr && !fbm->code()->library()) {
      CodeImage image;
      const fb::Segment* seg = fbm->segments()->Get(fbm->code()->segment());
      st = image.Load(mapping.data + seg->offset(), seg->size(), out_error);
    }
  }
  UnmapFile(&mapping);
  return NamePath(st, path, out_error);
}

kiln_status_t kiln_model_load_from_memory(const void* data, size_t size, const kiln_model_options_t* options,
                                          kiln_model_t** out_model, kiln_error_t* out_error) {
  ClearError(out_error);
  if (data == nullptr || out_model == nullptr)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_model_load_from_memory: data and out_model are required");
  auto open = [&](kiln_model_t** out) {
    kiln_model_t* m = NewModel(options);
    if (m == nullptr) return Fail(out_error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
    m->data = static_cast<const uint8_t*>(data);
    m->size = size;
    *out = m;
    return KILN_OK;
  };
  return LoadTier(options, open, out_model, out_error);
}

void kiln_model_release(kiln_model_t* model) {
  if (model == nullptr) return;
  kiln::rt::KvPool::Destroy(model->kv_pool);
  Tokenizer::Destroy(model->tokenizer);
  model->weights.set_allocator(nullptr);
  model->vocab.set_allocator(nullptr);
  model->merges.set_allocator(nullptr);
  model->added.set_allocator(nullptr);
  model->eos_ids.set_allocator(nullptr);
  model->generated_uk.set_allocator(nullptr);
  for (auto& table : model->op_uk) table.set_allocator(nullptr);
  for (auto& table : model->op_uk_loaded) table.set_allocator(nullptr);
  UnmapFile(&model->mapping);
  kiln_allocator_t raw = model->allocator.raw();
  model->~kiln_model_t();
  Allocator(&raw).Free(model);
}

kiln_status_t kiln_model_get_info(const kiln_model_t* model, kiln_model_info_t* out_info) {
  if (model == nullptr || !kiln::rt::CopySizedOut(model->info, out_info)) return KILN_ERROR_INVALID_ARGUMENT;
  return KILN_OK;
}

void kiln_model_options_init(kiln_model_options_t* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->tier = -1;
}

kiln_status_t kiln_tokenize(const kiln_model_t* model, const char* text, size_t length, int add_special,
                            int32_t* out_ids, size_t capacity, size_t* out_count, kiln_error_t* out_error) {
  ClearError(out_error);
  if (model == nullptr || (text == nullptr && length > 0) || out_count == nullptr || (out_ids == nullptr && capacity > 0))
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenize: invalid arguments");
  Allocator scratch(&model->allocator.raw());
  Vec<int32_t> ids(&scratch);
  if (kiln_status_t st = model->tokenizer->Encode(text, length, add_special != 0, &ids, out_error); st != KILN_OK)
    return st;
  *out_count = ids.size();
  // A size query passes no buffer (out_ids null, capacity 0): nothing to copy.
  if (const size_t n = ids.size() < capacity ? ids.size() : capacity; n > 0)
    std::memcpy(out_ids, ids.data(), n * sizeof(int32_t));
  if (ids.size() > capacity)
    return Fail(out_error, KILN_ERROR_BUFFER_TOO_SMALL, "%zu ids do not fit in %zu", ids.size(), capacity);
  return KILN_OK;
}

kiln_status_t kiln_detokenize(const kiln_model_t* model, const int32_t* ids, size_t count, int skip_special,
                              char* out_text, size_t capacity, size_t* out_length, kiln_error_t* out_error) {
  ClearError(out_error);
  if (model == nullptr || (ids == nullptr && count > 0) || out_length == nullptr || (out_text == nullptr && capacity > 0))
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_detokenize: invalid arguments");
  Allocator scratch(&model->allocator.raw());
  Vec<char> text(&scratch);
  if (kiln_status_t st = model->tokenizer->Decode(ids, count, skip_special != 0, &text, out_error); st != KILN_OK)
    return st;
  *out_length = text.size();
  size_t n = text.size() < capacity ? text.size() : capacity;
  if (n > 0) std::memcpy(out_text, text.data(), n);  // a size query passes no buffer
  if (text.size() >= capacity) {
    if (capacity > 0 && text.size() > capacity)
      return Fail(out_error, KILN_ERROR_BUFFER_TOO_SMALL, "%zu bytes do not fit in %zu", text.size(), capacity);
    if (capacity == 0 && text.size() > 0)
      return Fail(out_error, KILN_ERROR_BUFFER_TOO_SMALL, "%zu bytes do not fit in %zu", text.size(), capacity);
  } else {
    out_text[n] = '\0';
  }
  return KILN_OK;
}

}  // extern "C"
