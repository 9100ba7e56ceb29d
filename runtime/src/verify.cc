#include "verify.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "formats/contract.h"
#include "formats/encoding.h"
#include "formats/kiln_format.h"
#include "formats/kv_codec.h"
#include "kernels/kernel.h"
#include "ops/shapes.h"
#include "support/allocator.h"
#include "support/error.h"

namespace kiln::rt {
namespace {

using flatbuffers::Vector;

constexpr int kNumStageKinds = 5;

bool AddOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }
bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

// Rounds v up to the artifact alignment; false if that overflows.
bool AlignUp(uint64_t v, uint64_t* out) {
  uint64_t sum;
  if (__builtin_add_overflow(v, format::kAlignment - 1, &sum)) return false;
  *out = sum / format::kAlignment * format::kAlignment;
  return true;
}

const char* ValueName(const fb::Value* v) { return v->name() != nullptr ? v->name()->c_str() : "<unnamed>"; }

// flatbuffers 2.0.8's verifier checks only the 4-byte alignment of a vector's
// length, not that 8-byte elements are 8-byte aligned.
template <typename T>
bool Aligned8(const Vector<T>* v) {
  return v == nullptr || reinterpret_cast<uintptr_t>(v->Data()) % 8 == 0;
}


class Verifier {
 public:
  Verifier(const uint8_t* data, size_t size, uint64_t cpu, bool this_cpu, Allocator* allocator, kiln_error_t* error,
           uint64_t header_offset = 0)
      : data_(data), size_(size), cpu_(cpu), this_cpu_(this_cpu), allocator_(allocator), error_(error),
        header_offset_(header_offset) {}

  kiln_status_t Run(const fb::Model** out);

 private:
  kiln_status_t Header();
  kiln_status_t Tiers();
  kiln_status_t VectorAlignment();
  kiln_status_t Region(const char* what, uint64_t offset, uint64_t size, uint64_t* prev_end);
  kiln_status_t Segments();
  kiln_status_t Code();
  kiln_status_t Tensors();
  kiln_status_t Values();
  kiln_status_t Stages();
  kiln_status_t StageIo(const fb::Stage* stage);
  kiln_status_t Op(const fb::Stage* stage, const fb::Op* op, bool* defined);
  kiln_status_t OpShapes(const fb::Op* op, const Dims& o);
  kiln_status_t KvWrittenBy(const fb::Stage* stage, const fb::Op* op, uint32_t index);
  kiln_status_t Configs();
  kiln_status_t TokenizerData();

  // Declared dims of value `i` (already range-checked).
  const Dims& D(uint32_t i) const { return value_dims_[i]; }
  // Dims of value `i` where the current op of the current stage reads it: the row
  // symbol it was bound or written with.
  const Dims& V(uint32_t i) const { return stage_dims_[i]; }
  Dims W(uint32_t i) const;

  kiln_status_t Bad(kiln_status_t status, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
  kiln_status_t OpBad(const fb::Op* op, const char* what) {
    return Bad(KILN_ERROR_ARTIFACT_OP, "op '%s' (%s): %s", OpName(op), fb::EnumNameOpKind(op->kind()), what);
  }
  kiln_status_t ShapeBad(const fb::Op* op, const char* what) {
    return Bad(KILN_ERROR_ARTIFACT_SHAPE, "op '%s' (%s): %s", OpName(op), fb::EnumNameOpKind(op->kind()),
               what);
  }

  const uint8_t* data_;
  size_t size_;
  uint64_t cpu_;
  bool this_cpu_;  // hold CPU features and the machine against this CPU
  Allocator* allocator_;
  kiln_error_t* error_;
  uint64_t header_offset_ = 0;  // of the header verified: a tier's, in a tiered artifact
  // A tier's header may leave its tokenizer out: the root's (verified) serves.
  const fb::Tokenizer* shared_tokenizer_ = nullptr;

 public:
  void ShareTokenizer(const fb::Tokenizer* tok) { shared_tokenizer_ = tok; }

 private:
  const fb::Tokenizer* Tok() const { return model_->tokenizer() != nullptr ? model_->tokenizer() : shared_tokenizer_; }
  const fb::Model* model_ = nullptr;
  uint64_t header_end_ = 0;
  Dims* value_dims_ = nullptr;
  Dims* stage_dims_ = nullptr;
  size_t num_values_ = 0;
  int64_t hidden_ = 0, vocab_ = 0, layers_ = 0, kv_heads_ = 0, head_dim_ = 0;
  bool multimodal_ = false;
};

kiln_status_t Verifier::Bad(kiln_status_t status, const char* fmt, ...) {
  if (error_ != nullptr) {
    error_->status = status;
    va_list args;
    va_start(args, fmt);
    vsnprintf(error_->message, sizeof(error_->message), fmt, args);
    va_end(args);
  }
  return status;
}

Dims Verifier::W(uint32_t i) const {
  Dims d;
  const fb::Tensor* t = model_->tensors()->Get(i);
  d.rank = static_cast<int>(t->shape()->size());
  for (int k = 0; k < d.rank && k < 4; ++k) d.d[k] = t->shape()->Get(k);
  return d;
}

kiln_status_t Verifier::Header() {
  if (reinterpret_cast<uintptr_t>(data_) % format::kAlignment != 0)
    return Bad(KILN_ERROR_INVALID_ARGUMENT, "artifact data is not 64-byte aligned");
  if (size_ < 12 || header_offset_ > size_ - 12)
    return Bad(KILN_ERROR_ARTIFACT_TRUNCATED, "file of %zu bytes is too short for a Kiln artifact", size_);
  const uint8_t* header = data_ + header_offset_;
  if (std::memcmp(header + 8, format::kFileIdentifier, 4) != 0)
    return Bad(KILN_ERROR_ARTIFACT_NOT_KILN, "no \"KILN\" file identifier: not a Kiln artifact");
  uint32_t fb_size;
  std::memcpy(&fb_size, header, 4);
  if (fb_size > format::kMaxHeaderBytes)
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "header size %u exceeds the limit", fb_size);
  if (static_cast<uint64_t>(fb_size) + 4 > size_ - header_offset_)
    return Bad(KILN_ERROR_ARTIFACT_TRUNCATED, "header of %u bytes runs past the end of the %zu-byte file",
               fb_size, size_);
  header_end_ = header_offset_ + static_cast<uint64_t>(fb_size) + 4;
  flatbuffers::Verifier::Options opts;
  opts.max_depth = 64;
  opts.max_tables = 1u << 24;
  opts.check_alignment = true;
  flatbuffers::Verifier verifier(header, static_cast<size_t>(fb_size) + 4, opts);
  if (!fb::VerifySizePrefixedModelBuffer(verifier))
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "the FlatBuffer header fails structural verification");
  model_ = fb::GetSizePrefixedModel(header);
  uint32_t version = model_->schema_version();
  if (version / 1000 != format::kSchemaMajor)
    return Bad(KILN_ERROR_ARTIFACT_VERSION, "schema version %u.%u; this runtime reads %u.x", version / 1000,
               version % 1000, format::kSchemaMajor);
  // Required tables.
  if (model_->metadata() == nullptr || model_->segments() == nullptr || model_->tensors() == nullptr ||
      model_->values() == nullptr || model_->stages() == nullptr || model_->memory_plan() == nullptr ||
      model_->text() == nullptr || Tok() == nullptr || model_->generation() == nullptr)
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "a required table is missing from the header");
  uint64_t req = model_->required_cpu_features();
  if (req & ~format::kKnownCpuFeatures)
    return Bad(KILN_ERROR_ARTIFACT_CPU_FEATURES, "requires CPU features this runtime does not know (0x%llx)",
               static_cast<unsigned long long>(req & ~format::kKnownCpuFeatures));
  uint64_t missing = this_cpu_ ? req & ~cpu_ : 0;
  if (missing != 0) {
    char names[256] = {0};
    size_t used = 0;
    for (uint64_t b = 1; b != 0; b <<= 1)
      if (missing & b) used += snprintf(names + used, sizeof(names) - used, "%s%s", used ? "," : "", format::CpuFeatureName(b));
    return Bad(KILN_ERROR_ARTIFACT_CPU_FEATURES, "this CPU lacks %s, which the artifact's kernels need", names);
  }
  return KILN_OK;
}

// The tier table (formats/tiers.h): in the root header only; tier 0 is the root
// itself, the others' headers lie after it and before every segment, 64-byte aligned,
// in order, within the file. Their contents are verified when a tier is loaded.
kiln_status_t Verifier::Tiers() {
  const auto* tiers = model_->tiers();
  if (tiers == nullptr || tiers->size() == 0) return KILN_OK;
  if (!Aligned8(tiers)) return Bad(KILN_ERROR_ARTIFACT_ALIGNMENT, "the tier table is not 8-byte aligned");
  if (header_offset_ != 0) return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "a tier's header has a tier table of its own");
  if (tiers->size() > format::kMaxTiers)
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "%u tiers; at most %zu", tiers->size(), format::kMaxTiers);
  const fb::Tier* root = tiers->Get(0);
  if (root->header_offset() != 0 || root->header_size() != header_end_)
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "tier 0 is not the root header");
  uint64_t prev_end = header_end_;
  for (uint32_t k = 1; k < tiers->size(); ++k) {
    const fb::Tier* t = tiers->Get(k);
    if (t->header_size() < 12)
      return Bad(KILN_ERROR_ARTIFACT_TRUNCATED, "tier %u's header of %llu bytes is too short", k,
                 static_cast<unsigned long long>(t->header_size()));
    char what[32];
    std::snprintf(what, sizeof(what), "tier %u's header", k);
    if (kiln_status_t st = Region(what, t->header_offset(), t->header_size(), &prev_end); st != KILN_OK) return st;
    uint32_t fb_size;
    std::memcpy(&fb_size, data_ + t->header_offset(), 4);
    if (static_cast<uint64_t>(fb_size) + 4 != t->header_size())
      return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "tier %u: its header's size prefix says %u bytes, the table %llu", k,
                 fb_size, static_cast<unsigned long long>(t->header_size()) - 4);
  }
  // Every segment follows every header.
  for (const fb::Segment* s : *model_->segments())
    if (s->offset() < prev_end)
      return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "a segment overlaps the tier headers");
  return KILN_OK;
}

// Every vector of 8-byte elements the runtime reads, before anything reads them.
kiln_status_t Verifier::VectorAlignment() {
  if (!Aligned8(model_->segments()))
    return Bad(KILN_ERROR_ARTIFACT_ALIGNMENT, "the segments vector is not 8-byte aligned");
  for (uint32_t i = 0; i < model_->tensors()->size(); ++i) {
    const fb::Tensor* t = model_->tensors()->Get(i);
    if (!Aligned8(t->shape()))
      return Bad(KILN_ERROR_ARTIFACT_ALIGNMENT, "tensor '%s': shape vector is not 8-byte aligned",
                 t->name() ? t->name()->c_str() : "<unnamed>");
  }
  for (uint32_t i = 0; i < model_->values()->size(); ++i) {
    const fb::Value* v = model_->values()->Get(i);
    if (!Aligned8(v->shape()))
      return Bad(KILN_ERROR_ARTIFACT_ALIGNMENT, "value '%s': shape vector is not 8-byte aligned", ValueName(v));
  }
  return KILN_OK;
}

kiln_status_t Verifier::Segments() {
  const auto* segs = model_->segments();
  uint64_t prev_end;
  if (!AlignUp(header_end_, &prev_end)) return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "header size overflows");
  for (uint32_t i = 0; i < segs->size(); ++i) {
    char what[32];
    std::snprintf(what, sizeof(what), "segment %u", i);
    if (kiln_status_t st = Region(what, segs->Get(i)->offset(), segs->Get(i)->size(), &prev_end); st != KILN_OK)
      return st;
  }
  return KILN_OK;
}

// A region of the file (a segment, a tier's header): 64-byte aligned, inside the
// file, at or after *prev_end (the end of the header or of the region before it),
// which then moves to its end.
kiln_status_t Verifier::Region(const char* what, uint64_t offset, uint64_t size, uint64_t* prev_end) {
  uint64_t end;
  if (offset % format::kAlignment != 0)
    return Bad(KILN_ERROR_ARTIFACT_ALIGNMENT, "%s at offset %llu is not 64-byte aligned", what,
               static_cast<unsigned long long>(offset));
  if (AddOverflows(offset, size, &end) || end > size_)
    return Bad(KILN_ERROR_ARTIFACT_TRUNCATED, "%s [%llu, +%llu) runs past the end of the %zu-byte file", what,
               static_cast<unsigned long long>(offset), static_cast<unsigned long long>(size), size_);
  if (offset < *prev_end) return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "%s overlaps the header or the one before it", what);
  *prev_end = end;
  return KILN_OK;
}

// The code segment: in a segment, the checksum of its bytes, for this machine,
// assuming no CPU feature the artifact does not declare. Its ELF structure is the
// loader's to check (code/elf_loader.h).
kiln_status_t Verifier::Code() {
  const fb::CodeSegment* code = model_->code();
  if (code == nullptr) return KILN_OK;
  if (!code->library() && code->segment() >= model_->segments()->size())
    return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "code segment: segment %u out of range", code->segment());
  if (code->symbols() == nullptr || code->triple() == nullptr)
    return Bad(KILN_ERROR_ARTIFACT_CODE, "code segment: no symbol list or target triple");
  for (const flatbuffers::String* sym : *code->symbols())
    if (sym == nullptr || sym->size() == 0) return Bad(KILN_ERROR_ARTIFACT_CODE, "code segment: an empty symbol name");
#if defined(__x86_64__)
  constexpr uint16_t kMachine = 62;
  const char* here = "x86-64";
#elif defined(__aarch64__)
  constexpr uint16_t kMachine = 183;
  const char* here = "AArch64";
#else
  constexpr uint16_t kMachine = 0;
  const char* here = "this architecture";
#endif
  if (this_cpu_ && code->machine() != kMachine)
    return Bad(KILN_ERROR_ARTIFACT_CPU_FEATURES, "the code segment is for %s (ELF machine %u); this runtime runs on %s",
               code->triple()->c_str(), code->machine(), here);
  if ((code->cpu_features() & ~model_->required_cpu_features()) != 0)
    return Bad(KILN_ERROR_ARTIFACT_CPU_FEATURES, "the code segment assumes CPU features the artifact does not declare");
  if (code->library()) return KILN_OK;  // linked into the app: its hash is checked at load
  const fb::Segment* seg = model_->segments()->Get(code->segment());
  if (format::Checksum64(data_ + seg->offset(), seg->size()) != code->checksum())
    return Bad(KILN_ERROR_ARTIFACT_CODE, "code segment: checksum mismatch (the %llu bytes at offset %llu are corrupt)",
               static_cast<unsigned long long>(seg->size()), static_cast<unsigned long long>(seg->offset()));
  return KILN_OK;
}

kiln_status_t Verifier::Tensors() {
  const auto* tensors = model_->tensors();
  const auto* segs = model_->segments();
  for (uint32_t i = 0; i < tensors->size(); ++i) {
    const fb::Tensor* t = tensors->Get(i);
    const char* name = t->name() ? t->name()->c_str() : "<unnamed>";
    if (t->shape() == nullptr || t->shape()->size() < 1 || t->shape()->size() > 4)
      return Bad(KILN_ERROR_ARTIFACT_SHAPE, "tensor '%s': rank must be 1 to 4", name);
    uint64_t elems = 1;
    for (int64_t d : *t->shape()) {
      if (d <= 0 || d > kMaxDim) return Bad(KILN_ERROR_ARTIFACT_SHAPE, "tensor '%s': dimension %lld out of range", name, static_cast<long long>(d));
      if (MulOverflows(elems, static_cast<uint64_t>(d), &elems))
        return Bad(KILN_ERROR_ARTIFACT_SHAPE, "tensor '%s': element count overflows", name);
    }
    if (t->encoding() > fb::Encoding::MAX)
      return Bad(KILN_ERROR_UNSUPPORTED, "tensor '%s': encoding %u is not supported by this runtime", name,
                 static_cast<unsigned>(t->encoding()));
    uint64_t rows = static_cast<uint64_t>(t->shape()->Get(0));
    format::EncodingSpec spec;
    spec.id = static_cast<uint8_t>(t->encoding());
    spec.group = t->group_size();
    spec.symmetric = t->symmetric();
    if (spec.id == format::kEncINT4 && spec.group != 32 && spec.group != 64 && spec.group != 128)
      return Bad(KILN_ERROR_ARTIFACT_SHAPE, "tensor '%s': int4 group size %u is not 32, 64 or 128", name, spec.group);
    if (t->activation() > fb::ActivationMode::MAX)
      return Bad(KILN_ERROR_UNSUPPORTED, "tensor '%s': unknown activation mode", name);
    if (t->activation() == fb::ActivationMode::Int8PerToken && spec.id != format::kEncINT8 &&
        spec.id != format::kEncINT4)
      return Bad(KILN_ERROR_ARTIFACT_SHAPE, "tensor '%s': int8 activations need int8 or int4 weights", name);
    if (format::LayoutName(static_cast<uint8_t>(t->layout())) == nullptr)
      return Bad(KILN_ERROR_UNSUPPORTED, "tensor '%s': layout %u is not supported by this runtime", name,
                 static_cast<unsigned>(t->layout()));
    if (elems > (uint64_t{1} << 40))
      return Bad(KILN_ERROR_ARTIFACT_SHAPE, "tensor '%s': %llu elements is more than this runtime accepts", name,
                 static_cast<unsigned long long>(elems));
    // Packed layouts are the matmul weights' ([N, K], a patch embedding's [N, C, p, p]);
    // a vector (a norm's weight, a bias) is read row major.
    if (t->layout() != fb::Layout::RowMajor && t->shape()->size() < 2)
      return Bad(KILN_ERROR_ARTIFACT_SHAPE, "tensor '%s': layout %s needs a matrix, not a vector", name,
                 format::LayoutName(static_cast<uint8_t>(t->layout())));
    if (!format::LayoutFits(static_cast<uint8_t>(t->layout()), spec, rows, elems / rows))
      return Bad(KILN_ERROR_ARTIFACT_SHAPE, "tensor '%s': layout %s cannot hold a [%llu, %llu] %s weight", name,
                 format::LayoutName(static_cast<uint8_t>(t->layout())), static_cast<unsigned long long>(rows),
                 static_cast<unsigned long long>(elems / rows), fb::EnumNameEncoding(t->encoding()));
    uint64_t bytes = format::StorageBytes(spec, rows, elems / rows);
    if (bytes == 0 || bytes != t->size())
      return Bad(KILN_ERROR_ARTIFACT_SHAPE, "tensor '%s': %llu bytes do not match its shape and encoding %s", name,
                 static_cast<unsigned long long>(t->size()), fb::EnumNameEncoding(t->encoding()));
    if (t->segment() >= segs->size())
      return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "tensor '%s': segment %u does not exist", name, t->segment());
    const fb::Segment* s = segs->Get(t->segment());
    uint64_t end;
    if (t->offset() % format::kAlignment != 0)
      return Bad(KILN_ERROR_ARTIFACT_ALIGNMENT, "tensor '%s': offset %llu is not 64-byte aligned", name,
                 static_cast<unsigned long long>(t->offset()));
    if (t->offset() < s->offset() || AddOverflows(t->offset(), t->size(), &end) || end > s->offset() + s->size())
      return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "tensor '%s': data lies outside its segment", name);
  }
  return KILN_OK;
}

kiln_status_t Verifier::Values() {
  const auto* values = model_->values();
  num_values_ = values->size();
  for (uint32_t i = 0; i < values->size(); ++i) {
    const fb::Value* v = values->Get(i);
    const char* name = v->name() ? v->name()->c_str() : "<unnamed>";
    if (v->dtype() != fb::DType::F32 && v->dtype() != fb::DType::I32)
      return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "value '%s': unknown dtype", name);
    if (v->kind() > fb::ValueKind::MAX)
      return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "value '%s': unknown kind", name);
    if (v->shape() == nullptr || v->shape()->size() < 1 || v->shape()->size() > 3)
      return Bad(KILN_ERROR_ARTIFACT_SHAPE, "value '%s': rank must be 1 to 3", name);
    if (v->max_rows() < 1 || v->max_rows() > kMaxRows)
      return Bad(KILN_ERROR_ARTIFACT_SHAPE, "value '%s': max_rows %lld out of range", name,
                 static_cast<long long>(v->max_rows()));
    uint64_t row_elems = 1;
    for (uint32_t k = 0; k < v->shape()->size(); ++k) {
      int64_t d = v->shape()->Get(k);
      if (d == -1 && k == 0) continue;
      if (d <= 0 || d > kMaxDim)
        return Bad(KILN_ERROR_ARTIFACT_SHAPE, "value '%s': dimension %u is %lld", name, k, static_cast<long long>(d));
      if (k == 0) {
        if (d != v->max_rows())
          return Bad(KILN_ERROR_ARTIFACT_SHAPE, "value '%s': static rows %lld differ from max_rows", name,
                     static_cast<long long>(d));
        continue;
      }
      if (MulOverflows(row_elems, static_cast<uint64_t>(d), &row_elems))
        return Bad(KILN_ERROR_ARTIFACT_SHAPE, "value '%s': size overflows", name);
    }
    uint64_t bytes, aligned;
    if (MulOverflows(row_elems, static_cast<uint64_t>(v->max_rows()), &bytes) || MulOverflows(bytes, 4, &bytes) ||
        !AlignUp(bytes, &aligned) || aligned != v->size())
      return Bad(KILN_ERROR_ARTIFACT_SHAPE, "value '%s': size %llu does not match its shape", name,
                 static_cast<unsigned long long>(v->size()));
    if (bytes > kMaxArenaBytes)
      return Bad(KILN_ERROR_ARTIFACT_SHAPE, "value '%s': %llu bytes is more than this runtime accepts", name,
                 static_cast<unsigned long long>(bytes));
    if (v->kind() == fb::ValueKind::Arena && v->arena_offset() % format::kAlignment != 0)
      return Bad(KILN_ERROR_ARTIFACT_ALIGNMENT, "value '%s': arena offset is not 64-byte aligned", name);
  }
  return KILN_OK;
}

kiln_status_t Verifier::Configs() {
  const fb::TextConfig* t = model_->text();
  vocab_ = t->vocab_size();
  hidden_ = t->hidden_size();
  layers_ = t->num_layers();
  kv_heads_ = t->num_kv_heads();
  head_dim_ = t->head_dim();
  if (vocab_ < 1 || vocab_ > kMaxVocab || hidden_ < 1 || hidden_ > kMaxDim || layers_ < 1 || layers_ > kMaxLayers ||
      t->num_heads() < 1 || kv_heads_ < 1 || t->num_heads() % kv_heads_ != 0 || head_dim_ < 2 ||
      head_dim_ % 2 != 0 || head_dim_ > 4096 || t->max_position_embeddings() < 1)
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "text config out of range (vocab %lld, hidden %lld, layers %lld, "
               "heads %u/%lld, head_dim %lld)", static_cast<long long>(vocab_), static_cast<long long>(hidden_),
               static_cast<long long>(layers_), t->num_heads(), static_cast<long long>(kv_heads_),
               static_cast<long long>(head_dim_));
  // The session sizes the KV cache, layers x positions x (num_kv_heads * head_dim)
  // floats for keys and again for values, from these fields whether or not an op
  // uses the cache: bound them here, not only through cached attention ops.
  const uint64_t kv_width = static_cast<uint64_t>(kv_heads_) * static_cast<uint64_t>(head_dim_);
  if (kv_width > static_cast<uint64_t>(kMaxDim) ||
      static_cast<uint64_t>(t->num_heads()) * static_cast<uint64_t>(head_dim_) > static_cast<uint64_t>(kMaxDim))
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED,
               "text config: num_heads %u / num_kv_heads %u with head_dim %lld give widths beyond %lld",
               t->num_heads(), t->num_kv_heads(), static_cast<long long>(head_dim_), static_cast<long long>(kMaxDim));
  uint64_t kv_bytes;
  if (MulOverflows(static_cast<uint64_t>(layers_), t->max_position_embeddings(), &kv_bytes) ||
      MulOverflows(kv_bytes, kv_width, &kv_bytes) || MulOverflows(kv_bytes, 2 * sizeof(float), &kv_bytes) ||
      kv_bytes > (uint64_t{1} << 62))
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED,
               "text config: a KV cache of %u positions (num_layers %lld, num_kv_heads %u, head_dim %lld) overflows",
               t->max_position_embeddings(), static_cast<long long>(layers_), t->num_kv_heads(),
               static_cast<long long>(head_dim_));
  if (!format::KvEncodingValid(static_cast<uint8_t>(t->kv_cache_encoding()), t->kv_cache_group(),
                               static_cast<uint32_t>(head_dim_)))
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED,
               "text config: kv_cache_encoding %u with kv_cache_group %u is not a KV-cache encoding for head_dim %lld "
               "(f32, f16; int8 or int4 with a group dividing head_dim)",
               static_cast<unsigned>(t->kv_cache_encoding()), t->kv_cache_group(), static_cast<long long>(head_dim_));
  const fb::MemoryPlan* mp = model_->memory_plan();
  if (mp->arena_bytes() > kMaxArenaBytes || mp->max_prefill_tokens() < 1 || mp->max_prefill_tokens() > kMaxRows)
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "memory plan out of range");
  multimodal_ = model_->image() != nullptr;
  if (multimodal_) {
    const fb::ImageConfig* im = model_->image();
    const fb::ImagePreprocess* pp = model_->preprocess();
    if (pp == nullptr) return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "image model without preprocessing data");
    if (im->image_size() < 1 || im->image_size() > 8192 || im->channels() != 3 || im->image_tokens() < 1 ||
        im->image_tokens() > kMaxRows || im->image_token_id() < 0 || im->image_token_id() >= (int64_t{1} << 31))
      return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "image config out of range");
    if (pp->image_mean() == nullptr || pp->image_mean()->size() != 3 || pp->image_std() == nullptr ||
        pp->image_std()->size() != 3)
      return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "image preprocessing needs 3 means and 3 standard deviations");
    for (float s : *pp->image_std())
      if (!(s > 0.0f) || !std::isfinite(s)) return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "image_std must be positive");
    if (pp->processor() > fb::ImageProcessor::MAX)
      return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "unknown image processor");
  }
  const fb::Generation* g = model_->generation();
  if (g->eos_token_ids() != nullptr)
    for (int32_t e : *g->eos_token_ids())
      if (e < 0 || e >= vocab_) return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "eos token id %d outside the vocabulary", e);
  if (g->bos_token_id() >= vocab_) return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "bos token id outside the vocabulary");
  // The sampling defaults (kiln_generate_options_init_from_model) as generation takes them.
  if (!(g->temperature() >= 0.0f) || std::isinf(g->temperature()) || g->top_k() < 0 ||
      !(g->top_p() > 0.0f && g->top_p() <= 1.0f) || !(g->repetition_penalty() > 0.0f) ||
      std::isinf(g->repetition_penalty()))
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED,
               "generation defaults out of range (temperature %g, top_k %d, top_p %g, repetition_penalty %g)",
               static_cast<double>(g->temperature()), g->top_k(), static_cast<double>(g->top_p()),
               static_cast<double>(g->repetition_penalty()));
  for (uint32_t i = 0; model_->precision() != nullptr && i < model_->precision()->size(); ++i)
    if (model_->precision()->Get(i)->tensor() >= model_->tensors()->size())
      return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "precision table entry %u names no tensor", i);
  // The chat template's pieces (session.cc RenderChat; an absent string is empty).
  if (const fb::ChatTemplate* c = model_->chat()) {
    if (c->turns() == nullptr || c->turns()->size() != 24)
      return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "chat template: %u turns, expected 24",
                 c->turns() == nullptr ? 0u : c->turns()->size());
    if (c->trim() >= 64) return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "chat template: trim bits %u", c->trim());
  }
  return KILN_OK;
}

kiln_status_t Verifier::TokenizerData() {
  const fb::Tokenizer* tok = Tok();
  if (tok->vocab() == nullptr || tok->vocab()->size() < 1 || tok->vocab()->size() > static_cast<uint32_t>(kMaxVocab))
    return Bad(KILN_ERROR_ARTIFACT_TOKENIZER, "tokenizer vocabulary missing or too large");
  uint32_t n = tok->vocab()->size();
  if (tok->pretokenizer() > fb::PreTokenizer::MAX)
    return Bad(KILN_ERROR_ARTIFACT_TOKENIZER, "unknown pre-tokenizer");
  if (tok->pretokenizer() == fb::PreTokenizer::Split && (tok->pattern() == nullptr || tok->pattern()->size() == 0))
    return Bad(KILN_ERROR_ARTIFACT_TOKENIZER, "Split pre-tokenizer without a pattern");
  if (tok->merges() != nullptr)
    for (uint32_t i = 0; i < tok->merges()->size(); ++i) {
      const fb::Merge* m = tok->merges()->Get(i);
      if (m->left() >= n || m->right() >= n)
        return Bad(KILN_ERROR_ARTIFACT_TOKENIZER, "merge %u refers to an id outside the vocabulary", i);
    }
  if (tok->added_tokens() != nullptr)
    for (const fb::AddedToken* a : *tok->added_tokens())
      if (a->id() < 0 || static_cast<uint32_t>(a->id()) >= n || a->content() == nullptr || a->content()->size() == 0)
        return Bad(KILN_ERROR_ARTIFACT_TOKENIZER, "malformed added token");
  if (tok->bos_id() >= static_cast<int32_t>(n))
    return Bad(KILN_ERROR_ARTIFACT_TOKENIZER, "bos id outside the vocabulary");
  if (tok->normalizer() > fb::Normalizer::MAX)
    return Bad(KILN_ERROR_ARTIFACT_TOKENIZER, "unknown normalizer");
  if (tok->prepend_scheme() > fb::PrependScheme::MAX)
    return Bad(KILN_ERROR_ARTIFACT_TOKENIZER, "unknown prepend scheme");
  if (tok->unk_id() >= static_cast<int32_t>(n))
    return Bad(KILN_ERROR_ARTIFACT_TOKENIZER, "unk id outside the vocabulary");
  if (tok->decode_strip() > 8)
    return Bad(KILN_ERROR_ARTIFACT_TOKENIZER, "decoder strips %u leading spaces (at most 8)", tok->decode_strip());
  return KILN_OK;
}

// Stage inputs and outputs by kind: what the session binds must fit.
kiln_status_t Verifier::StageIo(const fb::Stage* s) {
  auto in = s->inputs();
  auto out = s->outputs();
  if (in == nullptr || out == nullptr || out->size() != 1)
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "stage '%s': needs inputs and exactly one output",
               fb::EnumNameStageKind(s->kind()));
  for (uint32_t i = 0; i < in->size(); ++i) {
    uint32_t v = in->Get(i);
    if (v >= num_values_ || model_->values()->Get(v)->kind() != fb::ValueKind::StageInput)
      return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "stage '%s': input %u is not a stage input value",
                 fb::EnumNameStageKind(s->kind()), v);
    for (uint32_t j = 0; j < i; ++j)
      if (in->Get(j) == v)
        return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "stage '%s': input '%s' is bound twice",
                   fb::EnumNameStageKind(s->kind()), ValueName(model_->values()->Get(v)));
  }
  if (out->Get(0) >= num_values_ || model_->values()->Get(out->Get(0))->kind() != fb::ValueKind::StageOutput)
    return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "stage '%s': output is not a stage output value",
               fb::EnumNameStageKind(s->kind()));
  auto dims = [&](uint32_t v) -> const Dims& { return D(v); };
  auto is = [&](uint32_t v, int rank, int64_t a, int64_t b, int64_t c, fb::DType dt) {
    const Dims& d = dims(v);
    if (d.rank != rank || model_->values()->Get(v)->dtype() != dt) return false;
    if (d.d[0] != a) return false;
    if (rank > 1 && d.d[1] != b) return false;
    if (rank > 2 && d.d[2] != c) return false;
    return true;
  };
  const Dims& o = dims(out->Get(0));
  bool ok = true;
  switch (s->kind()) {
    case fb::StageKind::VisionEncoder: {
      if (!multimodal_) return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "vision encoder in a text-only model");
      int64_t sz = model_->image()->image_size();
      ok = in->size() == 1 && is(in->Get(0), 3, 3, sz, sz, fb::DType::F32) && o.rank == 2 && o.d[0] > 0 &&
           model_->values()->Get(out->Get(0))->dtype() == fb::DType::F32;
      break;
    }
    case fb::StageKind::Projector: {
      if (!multimodal_) return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "projector in a text-only model");
      ok = in->size() == 1 && D(in->Get(0)).rank == 2 && D(in->Get(0)).d[0] > 0 &&
           is(out->Get(0), 2, model_->image()->image_tokens(), hidden_, 0, fb::DType::F32);
      if (!ok) break;
      // The session binds the vision encoder's output buffer (sized from that value)
      // as the projector's input: the two must have the same shape.
      const fb::Stage* vision = nullptr;
      for (const fb::Stage* other : *model_->stages())
        if (other->kind() == fb::StageKind::VisionEncoder) vision = other;
      if (vision == nullptr || vision->outputs() == nullptr || vision->outputs()->size() != 1 ||
          vision->outputs()->Get(0) >= num_values_)
        return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "an image model needs vision_encoder and projector stages");
      uint32_t pv = in->Get(0), vv = vision->outputs()->Get(0);
      const Dims &p = D(pv), &v = D(vv);
      if (!is(pv, v.rank, v.d[0], v.d[1], 0, fb::DType::F32) || v.rank != 2 || v.d[0] <= 0 ||
          model_->values()->Get(vv)->dtype() != fb::DType::F32)
        return Bad(KILN_ERROR_ARTIFACT_SHAPE,
                   "stage 'Projector': input '%s' [%lld, %lld] does not match the vision encoder's output '%s' "
                   "[%lld, %lld]", ValueName(model_->values()->Get(pv)), static_cast<long long>(p.d[0]),
                   static_cast<long long>(p.d[1]), ValueName(model_->values()->Get(vv)),
                   static_cast<long long>(v.d[0]), static_cast<long long>(v.d[1]));
      break;
    }
    case fb::StageKind::DecoderPrefill:
      ok = in->size() == (multimodal_ ? 3u : 2u) && is(in->Get(0), 1, -1, 0, 0, fb::DType::I32) &&
           is(in->Get(1), 1, -1, 0, 0, fb::DType::I32) && is(out->Get(0), 2, -1, hidden_, 0, fb::DType::F32) &&
           (!multimodal_ || is(in->Get(2), 2, -1, hidden_, 0, fb::DType::F32));
      break;
    case fb::StageKind::DecoderDecode:
      ok = in->size() == 2 && is(in->Get(0), 1, 1, 0, 0, fb::DType::I32) && is(in->Get(1), 1, 1, 0, 0, fb::DType::I32) &&
           is(out->Get(0), 2, 1, hidden_, 0, fb::DType::F32);
      break;
    case fb::StageKind::LmHead:
      ok = in->size() == 1 && is(in->Get(0), 2, -1, hidden_, 0, fb::DType::F32) &&
           is(out->Get(0), 2, -1, vocab_, 0, fb::DType::F32);
      break;
  }
  if (!ok)
    return Bad(KILN_ERROR_ARTIFACT_SHAPE, "stage '%s': inputs or output do not have the shapes the runtime binds",
               fb::EnumNameStageKind(s->kind()));
  return KILN_OK;
}

kiln_status_t Verifier::Stages() {
  const auto* stages = model_->stages();
  bool seen[kNumStageKinds] = {false, false, false, false, false};
  for (uint32_t i = 0; i < stages->size(); ++i) {
    const fb::Stage* s = stages->Get(i);
    int k = static_cast<int>(s->kind());
    if (k < 0 || k >= kNumStageKinds) return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "stage %u: unknown kind", i);
    if (seen[k]) return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "stage '%s' appears twice", fb::EnumNameStageKind(s->kind()));
    seen[k] = true;
    if (s->arena_bytes() > model_->memory_plan()->arena_bytes())
      return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "stage '%s': arena larger than the memory plan's",
                 fb::EnumNameStageKind(s->kind()));
    if (kiln_status_t st = StageIo(s); st != KILN_OK) return st;
    if (s->ops() == nullptr || s->ops()->size() == 0)
      return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "stage '%s' has no ops", fb::EnumNameStageKind(s->kind()));
    // Values become defined as ops produce them; an op may only read what is defined.
    bool* defined = allocator_->AllocArray<bool>(num_values_ > 0 ? num_values_ : 1);
    if (defined == nullptr) return Bad(KILN_ERROR_OUT_OF_MEMORY, "out of memory while verifying");
    std::memset(defined, 0, num_values_ > 0 ? num_values_ : 1);
    // Row symbols of the stage inputs as the session binds them: decoder prefill's
    // input_ids and positions get the chunk's token count, its image_features the
    // chunk's image-token count (another number); the LM head gets the tokens too.
    for (size_t v = 0; v < num_values_; ++v) stage_dims_[v] = value_dims_[v];
    int next_sym = kSymFirstFree;
    for (uint32_t j = 0; j < s->inputs()->size(); ++j) {
      uint32_t v = s->inputs()->Get(j);
      defined[v] = true;
      if (stage_dims_[v].d[0] != -1) continue;
      if (s->kind() == fb::StageKind::LmHead || (s->kind() == fb::StageKind::DecoderPrefill && j < 2))
        stage_dims_[v].sym = kSymTokens;
      else if (s->kind() == fb::StageKind::DecoderPrefill && j == 2)
        stage_dims_[v].sym = kSymImage;
      else
        stage_dims_[v].sym = next_sym++;
    }
    kiln_status_t st = KILN_OK;
    for (uint32_t j = 0; j < s->ops()->size() && st == KILN_OK; ++j) {
      const fb::Op* op = s->ops()->Get(j);
      st = Op(s, op, defined);
      if (st == KILN_OK) st = KvWrittenBy(s, op, j);
    }
    if (st == KILN_OK && !defined[s->outputs()->Get(0)])
      st = Bad(KILN_ERROR_ARTIFACT_MALFORMED, "stage '%s' never writes its output", fb::EnumNameStageKind(s->kind()));
    allocator_->Free(defined);
    if (st != KILN_OK) return st;
  }
  if (!seen[2] || !seen[3] || !seen[4])
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "decoder_prefill, decoder_decode and lm_head stages are required");
  if (multimodal_ && (!seen[0] || !seen[1]))
    return Bad(KILN_ERROR_ARTIFACT_MALFORMED, "an image model needs vision_encoder and projector stages");
  return KILN_OK;
}

// Expected operand counts per op kind: inputs, minimum and maximum weights.
struct Arity {
  int inputs_min, inputs_max, weights_min, weights_max;
  fb::OpParams params;
};

// Arity and parameter table of an op kind, from formats/ops.def.
Arity ArityOf(fb::OpKind k) {
  const format::OpInfo* info = format::FindOp(static_cast<uint32_t>(k));
  if (info == nullptr) return {-1, -1, -1, -1, fb::OpParams::NONE};
  return {info->inputs_min, info->inputs_max, info->weights_min, info->weights_max, format::ParamsOf(k)};
}

kiln_status_t Verifier::Op(const fb::Stage* stage, const fb::Op* op, bool* defined) {
  if (op->kind() > fb::OpKind::MAX) return Bad(KILN_ERROR_ARTIFACT_OP, "op '%s': unknown op kind %u", OpName(op),
                                               static_cast<unsigned>(op->kind()));
  const KernelEntry* kernel = FindKernel(op->kernel());
  if (kernel == nullptr)
    return Bad(KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL, "op '%s': kernel id %u is unknown to this runtime", OpName(op),
               op->kernel());
  if (kernel->op_kind != op->kind())
    return Bad(KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL, "op '%s': kernel %s does not run %s ops", OpName(op), kernel->name,
               fb::EnumNameOpKind(op->kind()));
  if (uint64_t missing = kernel->cpu_features & ~cpu_; this_cpu_ && missing != 0)
    return Bad(KILN_ERROR_ARTIFACT_CPU_FEATURES, "op '%s': kernel %s needs %s, which this CPU lacks", OpName(op),
               kernel->name, format::CpuFeatureName(missing & (~missing + 1)));
  if (this_cpu_ && kernel->uk == nullptr)
    return Bad(KILN_ERROR_ARTIFACT_CPU_FEATURES, "op '%s': kernel %s is not built into this runtime (another CPU architecture)",
               OpName(op), kernel->name);
  if ((kernel->cpu_features & ~model_->required_cpu_features()) != 0)
    return Bad(KILN_ERROR_ARTIFACT_CPU_FEATURES, "op '%s': kernel %s needs CPU features the artifact does not declare",
               OpName(op), kernel->name);
  // Whether the code segment lists function `name`.
  auto listed = [&](const flatbuffers::String* name) {
    if (name == nullptr || model_->code() == nullptr) return false;
    for (const flatbuffers::String* sym : *model_->code()->symbols())
      if (sym->size() == name->size() && memcmp(sym->c_str(), name->c_str(), sym->size()) == 0) return true;
    return false;
  };
  if (kernel->generated) {
    if (!listed(op->symbol()))
      return Bad(KILN_ERROR_ARTIFACT_CODE, "op '%s': generated kernel %s names no function of the code segment (%s)",
                 OpName(op), kernel->name, op->symbol() ? op->symbol()->c_str() : "no symbol");
    const char* prefix = GeneratedSymbolPrefix(op->kind());
    if (prefix == nullptr || std::strncmp(op->symbol()->c_str(), prefix, std::strlen(prefix)) != 0)
      return Bad(KILN_ERROR_ARTIFACT_CODE, "op '%s': %s op bound to '%s', not a %s* function", OpName(op),
                 fb::EnumNameOpKind(op->kind()), op->symbol()->c_str(), prefix ? prefix : "(none)");
    // A generated attention over the KV cache reads the artifact's cache encoding
    // only, which its name carries (codegen: kiln_uk_attention_f32_<enc>[g<group>]_f32_).
    const fb::AttentionParams* ap = op->params_as_AttentionParams();
    if (ap != nullptr && ap->cache_layer() >= 0) {
      const fb::TextConfig* t = model_->text();
      const uint8_t enc = static_cast<uint8_t>(t->kv_cache_encoding());
      char expected[96];
      if (t->kv_cache_group() > 0)
        std::snprintf(expected, sizeof(expected), "kiln_uk_attention_f32_%sg%u_f32_", format::EncodingName(enc),
                      t->kv_cache_group());
      else
        std::snprintf(expected, sizeof(expected), "kiln_uk_attention_f32_%s_f32_", format::EncodingName(enc));
      if (std::strncmp(op->symbol()->c_str(), expected, std::strlen(expected)) != 0)
        return Bad(KILN_ERROR_ARTIFACT_CODE,
                   "op '%s': attention over a %s KV cache bound to '%s', a kernel for another cache encoding", OpName(op),
                   format::EncodingName(enc), op->symbol()->c_str());
    }
  }
  Arity a = ArityOf(op->kind());
  int ni = op->inputs() ? static_cast<int>(op->inputs()->size()) : 0;
  int nw = op->weights() ? static_cast<int>(op->weights()->size()) : 0;
  if (ni < a.inputs_min || ni > a.inputs_max || nw < a.weights_min || nw > a.weights_max)
    return OpBad(op, "wrong number of inputs or weights");
  // Linear had no parameters before schema 1.5.
  const bool optional_params = op->kind() == fb::OpKind::Linear && op->params_type() == fb::OpParams::NONE;
  if (op->params_type() != a.params && !optional_params) return OpBad(op, "parameters of the wrong kind");
  if (a.params != fb::OpParams::NONE && op->params() == nullptr && !optional_params)
    return OpBad(op, "parameters missing");
  for (int i = 0; i < ni; ++i) {
    uint32_t v = op->inputs()->Get(i);
    if (v >= num_values_) return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "op '%s': input %u out of range", OpName(op), v);
    if (!defined[v]) return OpBad(op, "reads a value no earlier op of its stage wrote");
  }
  for (int i = 0; i < nw; ++i) {
    uint32_t w = op->weights()->Get(i);
    if (w >= model_->tensors()->size())
      return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "op '%s': weight %u out of range", OpName(op), w);
    const fb::Tensor* t = model_->tensors()->Get(w);
    fb::Encoding e = t->encoding();
    if ((kernel->encodings & (1u << static_cast<unsigned>(e))) == 0)
      return Bad(KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL, "op '%s': kernel %s cannot read %s weights", OpName(op),
                 kernel->name, fb::EnumNameEncoding(e));
    if (!format::KernelReadsLayout(static_cast<uint8_t>(t->layout()), kernel->generated, kernel->encodings,
                                   static_cast<uint16_t>(op->kind()), static_cast<uint32_t>(i),
                                   t->activation() == fb::ActivationMode::Int8PerToken,
                                   model_->required_cpu_features()))
      return Bad(KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL, "op '%s': kernel %s cannot read weight '%s' in layout %s",
                 OpName(op), kernel->name, t->name() ? t->name()->c_str() : "<unnamed>",
                 format::LayoutName(static_cast<uint8_t>(t->layout())));
  }
  // A fused op's further functions: listed in the code segment, of a family its kind
  // may call. Only generated kernels have them.
  if (op->symbols() != nullptr) {
    if (!kernel->generated || op->symbols()->size() > 4)
      return OpBad(op, "further generated functions (symbols) without a generated kernel, or too many");
    for (const flatbuffers::String* extra : *op->symbols()) {
      if (!listed(extra))
        return Bad(KILN_ERROR_ARTIFACT_CODE, "op '%s': further function '%s' is not in the code segment", OpName(op),
                   extra != nullptr ? extra->c_str() : "(null)");
      if (!BindFusedUkernel(op->kind(), extra->c_str(), nullptr, nullptr))
        return Bad(KILN_ERROR_ARTIFACT_CODE, "op '%s': %s ops cannot call '%s'", OpName(op),
                   fb::EnumNameOpKind(op->kind()), extra->c_str());
    }
  }
  uint32_t out = op->output();
  if (out >= num_values_) return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "op '%s': output out of range", OpName(op));
  const fb::Value* ov = model_->values()->Get(out);
  if (ov->kind() == fb::ValueKind::StageInput) return OpBad(op, "writes a stage input");
  if (ov->dtype() != fb::DType::F32) return OpBad(op, "output must be f32");
  if (ov->kind() == fb::ValueKind::Arena) {
    uint64_t end;
    if (AddOverflows(ov->arena_offset(), ov->size(), &end) || end > stage->arena_bytes())
      return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "op '%s': output lies outside the stage's arena", OpName(op));
  } else if (out != stage->outputs()->Get(0)) {
    return OpBad(op, "writes another stage's output");
  }
  for (int i = 0; i < ni; ++i) {
    const fb::Value* iv = model_->values()->Get(op->inputs()->Get(i));
    if (iv->kind() == fb::ValueKind::Arena) {
      uint64_t end;
      if (AddOverflows(iv->arena_offset(), iv->size(), &end) || end > stage->arena_bytes())
        return Bad(KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS, "op '%s': input lies outside the stage's arena", OpName(op));
    }
  }
  // The rows the executor gives the output (executor.cc OutputRows): its static
  // count, else those of the op's first input, symbol included.
  Dims o = D(out);
  if (o.d[0] == -1) {
    const Dims& first = V(op->inputs()->Get(0));
    o.d[0] = first.d[0];
    o.sym = first.sym;
  }
  if (o.sym == kSymStatic && o.d[0] > ov->max_rows())
    return Bad(KILN_ERROR_ARTIFACT_SHAPE, "op '%s' (%s): output '%s' gets %lld rows; its max_rows is %lld", OpName(op),
               fb::EnumNameOpKind(op->kind()), ValueName(ov), static_cast<long long>(o.d[0]),
               static_cast<long long>(ov->max_rows()));
  // A dynamic stage output (decoder prefill's hidden states, the LM head's logits)
  // lives in a session buffer of the stage's token rows: every write must have them.
  if (ov->kind() == fb::ValueKind::StageOutput && D(out).d[0] == -1 && o.sym != kSymTokens) {
    char rows[32];
    return Bad(KILN_ERROR_ARTIFACT_SHAPE, "op '%s' (%s): writes %s rows to the stage output '%s', which has the "
               "stage's token rows", OpName(op), fb::EnumNameOpKind(op->kind()), RowsName(o, rows, sizeof(rows)),
               ValueName(ov));
  }
  if (kiln_status_t st = OpShapes(op, o); st != KILN_OK) return st;
  stage_dims_[out] = o;
  defined[out] = true;
  return KILN_OK;
}

// An attention whose keys and values a q|k|v epilogue wrote (1.15, kv_written) reads
// the output of the op of its stage that last wrote its input: a Linear whose epilogue
// has its heads and cache layer, so that the cache rows it reads are this step's.
kiln_status_t Verifier::KvWrittenBy(const fb::Stage* stage, const fb::Op* op, uint32_t index) {
  const fb::AttentionParams* ap = op->params_as_AttentionParams();
  if (op->kind() != fb::OpKind::QkvAttention || ap == nullptr || !ap->kv_written()) return KILN_OK;
  const uint32_t in = op->inputs()->Get(0);
  const fb::Op* producer = nullptr;
  for (uint32_t j = index; j-- > 0 && producer == nullptr;)
    if (stage->ops()->Get(j)->output() == in) producer = stage->ops()->Get(j);
  const fb::LinearParams* lp = producer != nullptr ? producer->params_as_LinearParams() : nullptr;
  const fb::QkvEpilogueParams* q = lp != nullptr ? lp->qkv() : nullptr;
  if (q == nullptr || q->num_heads() != ap->num_heads() || q->num_kv_heads() != ap->num_kv_heads() ||
      q->head_dim() != ap->head_dim() || q->cache_layer() != ap->cache_layer())
    return OpBad(op, "kv_written, but its input is not the output of a Linear whose q|k|v epilogue has its heads and "
                     "cache layer");
  return KILN_OK;
}

kiln_status_t Verifier::OpShapes(const fb::Op* op, const Dims& o) {
  ops::ShapeRule rule = ops::ShapeRuleOf(op->kind());
  if (rule == nullptr) return OpBad(op, "no shape rule for this op kind");
  const ShapeCheck check{model_, op, o, stage_dims_,
                         op->inputs() ? static_cast<int>(op->inputs()->size()) : 0,
                         op->weights() ? static_cast<int>(op->weights()->size()) : 0,
                         layers_, kv_heads_, head_dim_, error_};
  return rule(check);
}

kiln_status_t Verifier::Run(const fb::Model** out) {
  if (kiln_status_t st = Header(); st != KILN_OK) return st;
  if (kiln_status_t st = VectorAlignment(); st != KILN_OK) return st;
  if (kiln_status_t st = Segments(); st != KILN_OK) return st;
  if (kiln_status_t st = Tiers(); st != KILN_OK) return st;
  if (kiln_status_t st = Code(); st != KILN_OK) return st;
  if (kiln_status_t st = Tensors(); st != KILN_OK) return st;
  if (kiln_status_t st = Values(); st != KILN_OK) return st;
  if (kiln_status_t st = Configs(); st != KILN_OK) return st;
  if (kiln_status_t st = TokenizerData(); st != KILN_OK) return st;
  // Value dims for the op checks.
  Dims* dims = allocator_->AllocArray<Dims>(num_values_ > 0 ? num_values_ : 1);
  Dims* stage_dims = allocator_->AllocArray<Dims>(num_values_ > 0 ? num_values_ : 1);
  if (dims == nullptr || stage_dims == nullptr) {
    allocator_->Free(dims);
    allocator_->Free(stage_dims);
    return Bad(KILN_ERROR_OUT_OF_MEMORY, "out of memory while verifying");
  }
  for (size_t i = 0; i < num_values_; ++i) {
    const fb::Value* v = model_->values()->Get(static_cast<uint32_t>(i));
    dims[i] = Dims();
    dims[i].rank = static_cast<int>(v->shape()->size());
    for (int k = 0; k < dims[i].rank; ++k) dims[i].d[k] = v->shape()->Get(k);
    dims[i].sym = kSymStatic;
  }
  value_dims_ = dims;
  stage_dims_ = stage_dims;
  kiln_status_t st = Stages();
  allocator_->Free(dims);
  allocator_->Free(stage_dims);
  value_dims_ = nullptr;
  stage_dims_ = nullptr;
  if (st != KILN_OK) return st;
  *out = model_;
  return KILN_OK;
}

}  // namespace

kiln_status_t VerifyArtifact(const uint8_t* data, size_t size, uint64_t cpu_features, Allocator* allocator,
                             const fb::Model** out_model, kiln_error_t* error, bool for_this_cpu, uint32_t tier) {
  if (data == nullptr || out_model == nullptr || allocator == nullptr)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "null artifact");
  Verifier root(data, size, cpu_features, for_this_cpu, allocator, error);
  const fb::Model* model = nullptr;
  if (kiln_status_t st = root.Run(&model); st != KILN_OK) return st;
  if (tier >= TierCount(model))
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "tier %u: the artifact has %u", tier, TierCount(model));
  if (tier == 0) {
    *out_model = model;
    return KILN_OK;
  }
  Verifier v(data, size, cpu_features, for_this_cpu, allocator, error, model->tiers()->Get(tier)->header_offset());
  v.ShareTokenizer(model->tokenizer());
  if (kiln_status_t st = v.Run(out_model); st != KILN_OK) {
    if (error != nullptr) {  // name the tier
      char msg[sizeof(error->message)];
      std::snprintf(msg, sizeof(msg), "tier %u: %s", tier, error->message);
      std::memcpy(error->message, msg, sizeof(msg));
    }
    return st;
  }
  return KILN_OK;
}

uint32_t TierCount(const fb::Model* root) {
  return root->tiers() != nullptr && root->tiers()->size() > 0 ? root->tiers()->size() : 1;
}

}  // namespace kiln::rt
