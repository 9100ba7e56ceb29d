// fuzz_artifact: the artifact loader and verifier (kiln_model_load_from_memory), then,
// when an input loads, a short run: the tokenizer, a session with a 64-token context
// and one thread, and at most 2 generated tokens from a few ids (with zero pixel
// values and the image tokens when the model takes images). Every input must yield a
// status; a crash, a sanitizer report or a hang is a defect of the runtime.
//
// The custom mutator (libFuzzer builds only) edits the artifact structurally: it
// verifies and unpacks the size-prefixed FlatBuffer header with the object API, edits
// a few fields (shapes, indices, offsets, sizes, kernel ids, op kinds, params, counts,
// tokenizer and config fields), re-packs the header and keeps the data segments. The
// data start does not move when the new header fits in the old one (it is zero-padded
// up to the first segment's offset, which every absolute offset already assumes);
// otherwise the data moves to the next 64-byte boundary after the header and every
// segment and tensor offset is shifted by the same amount. Inputs that are not a
// verifiable header (and one mutation in eight) get libFuzzer's byte mutations.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "formats/kiln_format.h"
#include "formats/kiln_generated.h"
#include "kiln/kiln.h"

namespace fb = kiln::fb;

namespace {

// A 64-byte aligned copy of the input (the loader requires 64-byte alignment).
struct AlignedCopy {
  uint8_t* data = nullptr;
  AlignedCopy(const uint8_t* src, size_t size) {
    data = static_cast<uint8_t*>(std::aligned_alloc(64, (size + 63) / 64 * 64 + 64));
    if (size) std::memcpy(data, src, size);
  }
  ~AlignedCopy() { std::free(data); }
};

void RunModel(kiln_model_t* model, const uint8_t* bytes, size_t size) {
  kiln_error_t err;
  kiln_model_info_t info = {};
  info.struct_size = sizeof(info);
  if (kiln_model_get_info(model, &info) != KILN_OK) return;

  // The tokenizer, both ways.
  static const char kText[] = "Hello, world! 123 <image>\n\xc3\xa9t\xc3\xa9";
  int32_t ids[64];
  size_t count = 0;
  if (kiln_tokenize(model, kText, sizeof(kText) - 1, 1, ids, 64, &count, &err) == KILN_OK) {
    char text[256];
    size_t length = 0;
    kiln_detokenize(model, ids, count, 0, text, sizeof(text), &length, &err);
    kiln_detokenize(model, ids, count, 1, text, sizeof(text), &length, &err);
  }

  // Images: pixel values of [channels, image_size, image_size] (channels from the
  // header, which the loader verified).
  size_t pixel_count = 0;
  int32_t image_tokens = 0;
  if (info.image_tokens > 0 && info.image_size > 0) {
    const fb::Model* m = fb::GetSizePrefixedModel(bytes);
    uint32_t channels = m->image() != nullptr ? m->image()->channels() : 3;
    uint64_t n = uint64_t{channels} * uint64_t(info.image_size) * uint64_t(info.image_size);
    if (n > 0 && n <= (16u << 20) && info.image_tokens <= 1024) {
      pixel_count = static_cast<size_t>(n);
      image_tokens = info.image_tokens;
    }
  }

  kiln_session_options_t so = {};
  so.struct_size = sizeof(so);
  so.num_threads = 1;
  so.context_length = 64 + image_tokens;
  kiln_session_t* session = nullptr;
  if (kiln_session_create(model, &so, &session, &err) != KILN_OK) return;

  std::vector<int32_t> prompt = {1, 2};
  if (pixel_count > 0) {
    std::vector<float> pixels(pixel_count, 0.0f);
    if (kiln_session_set_pixel_values(session, pixels.data(), pixels.size(), &err) == KILN_OK)
      prompt.insert(prompt.end(), static_cast<size_t>(image_tokens), info.image_token_id);
  }
  prompt.push_back(3);
  prompt.push_back(4);
  kiln_generate_options_t go;
  kiln_generate_options_init(&go);
  go.max_new_tokens = 2;
  kiln_session_generate_ids(session, prompt.data(), prompt.size(), &go, &err);
  int32_t out[8];
  size_t n_out = 0;
  kiln_session_get_output_ids(session, out, 8, &n_out);
  kiln_session_release(session);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  AlignedCopy copy(data, size);
  kiln_model_t* model = nullptr;
  kiln_error_t err;
  kiln_status_t st = kiln_model_load_from_memory(copy.data, size, nullptr, &model, &err);
  if (st == KILN_OK) {
    RunModel(model, copy.data, size);
    kiln_model_release(model);
  } else if (model != nullptr) {
    std::abort();  // out_model is written only on success
  }
  return 0;
}

#ifdef KILN_LIBFUZZER

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using Rng = std::minstd_rand;

size_t Pick(Rng& rng, size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); }

// A new value for an integer field: boundary values, small values, near the old one,
// or scaled.
template <typename T>
T MutInt(Rng& rng, T old) {
  using L = std::numeric_limits<T>;
  // Arithmetic in uint64_t (wraps, no signed overflow), then truncated to T.
  uint64_t o = static_cast<uint64_t>(old);
  switch (rng() % 12) {
    case 0: return T(0);
    case 1: return T(1);
    case 2: return L::max();
    case 3: return L::is_signed ? T(-1) : L::max();
    case 4: return L::min();
    case 5: return static_cast<T>(o + 1);
    case 6: return static_cast<T>(o - 1);
    case 7: return static_cast<T>(o * 2);
    case 8: return static_cast<T>(old / 2);
    case 9: return static_cast<T>(o + 64);
    case 10: return static_cast<T>(rng() % 300);
    default: return static_cast<T>((uint64_t(rng()) << 32) ^ rng());
  }
}

float MutFloat(Rng& rng, float old) {
  switch (rng() % 7) {
    case 0: return 0.0f;
    case 1: return -old;
    case 2: return std::numeric_limits<float>::infinity();
    case 3: return std::numeric_limits<float>::quiet_NaN();
    case 4: return old * 1e30f;
    case 5: return 1e-30f;
    default: return float(int(rng() % 2000) - 1000) / 7.0f;
  }
}

template <typename E>
E MutEnum(Rng& rng, E old) {
  using U = typename std::underlying_type<E>::type;
  return static_cast<E>(rng() % 4 == 0 ? MutInt<U>(rng, static_cast<U>(old)) : U(rng() % 24));
}

// Edits one element of an index/shape vector, or its length.
template <typename T>
void MutVec(Rng& rng, std::vector<T>& v) {
  switch (rng() % 5) {
    case 0:
      if (!v.empty()) v.pop_back();
      break;
    case 1:
      if (!v.empty()) v.push_back(v[Pick(rng, v.size())]);
      else v.push_back(T(1));
      break;
    case 2:
      if (v.size() > 1) std::swap(v[Pick(rng, v.size())], v[Pick(rng, v.size())]);
      break;
    default:
      if (!v.empty()) {
        T& x = v[Pick(rng, v.size())];
        if constexpr (std::is_floating_point<T>::value) x = MutFloat(rng, float(x));
        else x = MutInt<T>(rng, x);
      }
  }
}

uint32_t AnyKernelId(Rng& rng) {
  size_t n;
  const kiln::format::KernelInfo* k = kiln::format::AllKernels(&n);
  return n != 0 && rng() % 4 != 0 ? k[Pick(rng, n)].id : MutInt<uint32_t>(rng, 0);
}

void MutParams(Rng& rng, fb::OpT& op) {
  fb::OpParamsUnion& p = op.params;
  switch (rng() % 3) {
    case 0: {  // another parameter table kind (or none)
      switch (rng() % 6) {
        case 0: p.Reset(); break;
        case 1: p.Set(fb::AttentionParamsT()); break;
        case 2: p.Set(fb::RopeParamsT()); break;
        case 3: p.Set(fb::NormParamsT()); break;
        case 4: p.Set(fb::MoeParamsT()); break;
        default: p.Set(fb::EmbeddingParamsT()); break;
      }
      return;
    }
    default: break;
  }
  if (auto* a = p.AsAttentionParams()) {
    switch (rng() % 6) {
      case 0: a->num_heads = MutInt(rng, a->num_heads); break;
      case 1: a->num_kv_heads = MutInt(rng, a->num_kv_heads); break;
      case 2: a->head_dim = MutInt(rng, a->head_dim); break;
      case 3: a->scale = MutFloat(rng, a->scale); break;
      case 4: a->causal = !a->causal; break;
      default: a->cache_layer = MutInt(rng, a->cache_layer); break;
    }
  } else if (auto* r = p.AsRopeParams()) {
    switch (rng() % 5) {
      case 0: r->num_heads = MutInt(rng, r->num_heads); break;
      case 1: r->head_dim = MutInt(rng, r->head_dim); break;
      case 2: r->theta = MutFloat(rng, 10000.0f); break;
      case 3: r->rope_type = MutEnum(rng, r->rope_type); break;
      default: r->original_max_position_embeddings = MutInt(rng, r->original_max_position_embeddings);
    }
  } else if (auto* m = p.AsMoeParams()) {
    switch (rng() % 3) {
      case 0: m->top_k = MutInt(rng, m->top_k); break;
      case 1: m->activation = MutEnum(rng, m->activation); break;
      default: MutVec(rng, m->expert_ids);
    }
  } else if (auto* e = p.AsEmbeddingParams()) {
    e->placeholder_id = MutInt(rng, e->placeholder_id);
  } else if (auto* mi = p.AsMergeImageTokensParams()) {
    mi->image_token_id = MutInt(rng, mi->image_token_id);
  } else if (auto* ac = p.AsActivationParams()) {
    ac->kind = MutEnum(rng, ac->kind);
  } else if (auto* g = p.AsGatedMlpParams()) {
    g->activation = MutEnum(rng, g->activation);
  } else if (auto* nm = p.AsNormParams()) {
    nm->epsilon = MutFloat(rng, nm->epsilon);
  } else if (auto* pe = p.AsPatchEmbedParams()) {
    pe->patch_size = MutInt(rng, pe->patch_size);
  } else if (auto* sr = p.AsSliceRowsParams()) {
    sr->start = MutInt(rng, sr->start);
  } else if (auto* ps = p.AsPixelShuffleParams()) {
    ps->scale_factor = MutInt(rng, ps->scale_factor);
  }
}

void MutOp(Rng& rng, fb::OpT& op) {
  switch (rng() % 7) {
    case 0: op.kind = static_cast<fb::OpKind>(rng() % 4 ? rng() % 20 : MutInt<uint16_t>(rng, 0)); break;
    case 1: op.kernel = AnyKernelId(rng); break;
    case 2: MutVec(rng, op.inputs); break;
    case 3: MutVec(rng, op.weights); break;
    case 4: op.output = MutInt(rng, op.output); break;
    default: MutParams(rng, op); break;
  }
}

// One structural edit somewhere in the model.
void MutateModel(Rng& rng, fb::ModelT& m) {
  switch (rng() % 16) {
    case 0:
    case 1:
    case 2: {  // a tensor
      if (m.tensors.empty()) break;
      fb::TensorT& t = *m.tensors[Pick(rng, m.tensors.size())];
      switch (rng() % 7) {
        case 0: MutVec(rng, t.shape); break;
        case 1: t.encoding = MutEnum(rng, t.encoding); break;
        case 2: t.group_size = MutInt(rng, t.group_size); break;
        case 3: t.segment = MutInt(rng, t.segment); break;
        case 4: t.offset = MutInt(rng, t.offset); break;
        case 5: t.size = MutInt(rng, t.size); break;
        default: t.activation = MutEnum(rng, t.activation); break;
      }
      break;
    }
    case 3:
    case 4: {  // a value
      if (m.values.empty()) break;
      fb::ValueT& v = *m.values[Pick(rng, m.values.size())];
      switch (rng() % 6) {
        case 0: MutVec(rng, v.shape); break;
        case 1: v.dtype = MutEnum(rng, v.dtype); break;
        case 2: v.max_rows = MutInt(rng, v.max_rows); break;
        case 3: v.kind = MutEnum(rng, v.kind); break;
        case 4: v.arena_offset = MutInt(rng, v.arena_offset); break;
        default: v.size = MutInt(rng, v.size); break;
      }
      break;
    }
    case 5:
    case 6:
    case 7:
    case 8: {  // an op, or a stage's op list
      if (m.stages.empty()) break;
      fb::StageT& s = *m.stages[Pick(rng, m.stages.size())];
      if (s.ops.empty()) break;
      switch (rng() % 8) {
        case 0: s.ops.erase(s.ops.begin() + Pick(rng, s.ops.size())); break;
        case 1: s.ops.push_back(std::make_unique<fb::OpT>(*s.ops[Pick(rng, s.ops.size())])); break;
        case 2:
          if (s.ops.size() > 1) std::swap(s.ops[Pick(rng, s.ops.size())], s.ops[Pick(rng, s.ops.size())]);
          break;
        default: MutOp(rng, *s.ops[Pick(rng, s.ops.size())]); break;
      }
      break;
    }
    case 9: {  // a stage
      if (m.stages.empty()) break;
      fb::StageT& s = *m.stages[Pick(rng, m.stages.size())];
      switch (rng() % 5) {
        case 0: s.kind = MutEnum(rng, s.kind); break;
        case 1: MutVec(rng, s.inputs); break;
        case 2: MutVec(rng, s.outputs); break;
        case 3: s.arena_bytes = MutInt(rng, s.arena_bytes); break;
        default: m.stages.erase(m.stages.begin() + Pick(rng, m.stages.size())); break;
      }
      break;
    }
    case 10: {  // segments, the model's counts
      switch (rng() % 5) {
        case 0:
          if (!m.segments.empty()) {
            fb::Segment& s = m.segments[Pick(rng, m.segments.size())];
            s = rng() % 2 ? fb::Segment(MutInt(rng, s.offset()), s.size())
                          : fb::Segment(s.offset(), MutInt(rng, s.size()));
          }
          break;
        case 1: m.schema_version = MutInt(rng, m.schema_version); break;
        case 2: m.required_cpu_features = MutInt(rng, m.required_cpu_features); break;
        case 3:
          if (!m.tensors.empty()) m.tensors.pop_back();
          break;
        default:
          if (!m.values.empty()) m.values.pop_back();
          break;
      }
      break;
    }
    case 11: {  // text config
      if (!m.text) break;
      fb::TextConfigT& t = *m.text;
      switch (rng() % 10) {
        case 0: t.vocab_size = MutInt(rng, t.vocab_size); break;
        case 1: t.hidden_size = MutInt(rng, t.hidden_size); break;
        case 2: t.num_layers = MutInt(rng, t.num_layers); break;
        case 3: t.num_heads = MutInt(rng, t.num_heads); break;
        case 4: t.num_kv_heads = MutInt(rng, t.num_kv_heads); break;
        case 5: t.head_dim = MutInt(rng, t.head_dim); break;
        case 6: t.max_position_embeddings = MutInt(rng, t.max_position_embeddings); break;
        case 7: t.kv_cache_encoding = static_cast<fb::Encoding>(rng() % 9); break;
        case 8: t.kv_cache_group = MutInt(rng, t.kv_cache_group); break;
        default: t.sliding_window = MutInt(rng, t.sliding_window); break;
      }
      break;
    }
    case 12: {  // image config, preprocessing, memory plan
      switch (rng() % 8) {
        case 0:
          if (m.image) m.image->image_size = MutInt(rng, m.image->image_size);
          break;
        case 1:
          if (m.image) m.image->channels = MutInt(rng, m.image->channels);
          break;
        case 2:
          if (m.image) m.image->image_tokens = MutInt(rng, m.image->image_tokens);
          break;
        case 3:
          if (m.image) m.image->image_token_id = MutInt(rng, m.image->image_token_id);
          break;
        case 4:
          if (m.preprocess) {
            m.preprocess->shortest_edge = MutInt(rng, m.preprocess->shortest_edge);
            m.preprocess->crop_height = MutInt(rng, m.preprocess->crop_height);
          }
          break;
        case 5:
          if (m.preprocess) MutVec(rng, m.preprocess->image_mean);
          break;
        case 6:
          if (m.memory_plan) m.memory_plan->arena_bytes = MutInt(rng, m.memory_plan->arena_bytes);
          break;
        default:
          if (m.memory_plan)
            m.memory_plan->max_prefill_tokens = MutInt(rng, m.memory_plan->max_prefill_tokens);
          break;
      }
      break;
    }
    case 13:
    case 14: {  // tokenizer
      if (!m.tokenizer) break;
      fb::TokenizerT& t = *m.tokenizer;
      switch (rng() % 9) {
        case 0:
          if (!t.merges.empty()) {
            fb::Merge& g = t.merges[Pick(rng, t.merges.size())];
            g = rng() % 2 ? fb::Merge(MutInt(rng, g.left()), g.right()) : fb::Merge(g.left(), MutInt(rng, g.right()));
          }
          break;
        case 1:
          if (!t.vocab.empty()) {
            std::string& v = t.vocab[Pick(rng, t.vocab.size())];
            if (rng() % 2 && !v.empty()) v.pop_back();
            else v = t.vocab[Pick(rng, t.vocab.size())];  // a duplicate, or ""
          }
          break;
        case 2:
          if (!t.vocab.empty()) t.vocab.pop_back();
          break;
        case 3:
          if (!t.added_tokens.empty()) {
            fb::AddedTokenT& a = *t.added_tokens[Pick(rng, t.added_tokens.size())];
            a.id = MutInt(rng, a.id);
          }
          break;
        case 4:
          if (!t.added_tokens.empty()) {
            fb::AddedTokenT& a = *t.added_tokens[Pick(rng, t.added_tokens.size())];
            if (rng() % 2 && !a.content.empty()) a.content.pop_back();
            else a.content.push_back(char(rng() % 256));
          }
          break;
        case 5: t.bos_id = MutInt(rng, t.bos_id); t.add_bos = true; break;
        case 6: t.pretokenizer = MutEnum(rng, t.pretokenizer); break;
        case 7: {
          static const char* kPatterns[] = {"", "(", "\\p{L}+|\\s+", "(a*)*b", "[", "\\X", "(?<=a)b|.",
                                            "'s|\\s+(?!\\S)|\\s+"};
          t.pattern = kPatterns[Pick(rng, sizeof(kPatterns) / sizeof(kPatterns[0]))];
          t.pretokenizer = fb::PreTokenizer::Split;
          break;
        }
        default: t.ignore_merges = !t.ignore_merges; break;
      }
      break;
    }
    default: {  // generation
      if (!m.generation) break;
      fb::GenerationT& g = *m.generation;
      switch (rng() % 4) {
        case 0: MutVec(rng, g.eos_token_ids); break;
        case 1: g.max_new_tokens = MutInt(rng, g.max_new_tokens); break;
        case 2: g.top_k = MutInt(rng, g.top_k); break;
        default: g.temperature = MutFloat(rng, g.temperature); break;
      }
      break;
    }
  }
}

// Parses, edits and re-serialises; 0 when the input is not a verifiable header or the
// result does not fit.
size_t StructuredMutate(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  if (size < 8) return 0;
  uint32_t prefix;
  std::memcpy(&prefix, data, 4);
  if (uint64_t{prefix} + 4 > size) return 0;
  // Verify on an aligned copy of the header region (FlatBuffers reads scalars in place).
  std::vector<uint8_t> header(data, data + prefix + 4);
  flatbuffers::Verifier verifier(header.data(), header.size());
  if (!fb::VerifySizePrefixedModelBuffer(verifier)) return 0;
  std::unique_ptr<fb::ModelT> obj(fb::GetSizePrefixedModel(header.data())->UnPack());

  // Where the data segments start in the input: the first segment's offset, else the
  // header's end (rounded up).
  uint64_t old_start = (uint64_t{prefix} + 4 + 63) / 64 * 64;
  if (!obj->segments.empty() && obj->segments[0].offset() >= uint64_t{prefix} + 4 &&
      obj->segments[0].offset() <= size)
    old_start = obj->segments[0].offset();
  old_start = std::min<uint64_t>(old_start, size);

  Rng rng(seed);
  int edits = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < edits; ++i) MutateModel(rng, *obj);

  flatbuffers::FlatBufferBuilder b(prefix + 1024);
  b.ForceDefaults(true);
  b.FinishSizePrefixed(fb::Model::Pack(b, obj.get()), fb::ModelIdentifier());
  uint64_t new_start = old_start;
  if (b.GetSize() > old_start) {
    // The header grew past the data: move the data to the next 64-byte boundary and
    // shift every absolute offset by the same amount.
    new_start = (b.GetSize() + 63) / 64 * 64;
    uint64_t delta = new_start - old_start;
    for (auto& s : obj->segments) s = fb::Segment(s.offset() + delta, s.size());
    for (auto& t : obj->tensors) t->offset += delta;
    b.Clear();
    b.FinishSizePrefixed(fb::Model::Pack(b, obj.get()), fb::ModelIdentifier());
    if (b.GetSize() > new_start) return 0;  // offsets grew the varints? (cannot: fixed width)
  }
  uint64_t total = new_start + (size - old_start);
  if (total > max_size) return 0;
  // Move the data first (regions may overlap), then write the header and its padding.
  std::memmove(data + new_start, data + old_start, size - old_start);
  std::memcpy(data, b.GetBufferPointer(), b.GetSize());
  std::memset(data + b.GetSize(), 0, new_start - b.GetSize());
  return static_cast<size_t>(total);
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  if (seed % 8 != 0) {
    size_t n = StructuredMutate(data, size, max_size, seed);
    if (n != 0) return n;
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

#endif  // KILN_LIBFUZZER
