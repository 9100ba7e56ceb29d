// Loading real artifacts, and a corpus of corrupted ones: every corruption must
// yield an error status (never a crash, never a read out of bounds — this suite runs
// under AddressSanitizer and UndefinedBehaviorSanitizer in scripts/test).
//
// The artifacts are tiny generated checkpoints compiled by kiln-compile
// (tests/unit/make_test_artifacts.py), with the PyTorch reference's greedy tokens:
// on any CPU (aarch64 under qemu included) the runtime must reproduce them.
#include <gtest/gtest.h>

#include "runtime/session_helpers.h"
#include "runtime/threads_available.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include "formats/kiln_format.h"
#include "formats/kiln_generated.h"
#include "platform/platform.h"
#include "kiln/kiln.h"
#include "kiln/kiln_calibration.h"
#include "support/npy.h"

namespace fb = kiln::fb;

namespace {

// A 64-byte-aligned byte buffer.
struct Buffer {
  std::vector<uint8_t> storage;
  size_t size = 0;
  uint8_t* data() { return storage.data() + Offset(); }
  size_t Offset() {
    uintptr_t p = reinterpret_cast<uintptr_t>(storage.data());
    return (64 - p % 64) % 64;
  }
  void Assign(const uint8_t* src, size_t n) {
    storage.assign(n + 64, 0);
    size = n;
    std::memcpy(data(), src, n);
  }
};

bool ReadFile(const std::string& path, std::vector<uint8_t>* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

// Loads from memory; on success also runs a short generation so that a corrupted
// artifact the verifier accepts is executed too.
kiln_status_t LoadAndRun(Buffer& b, kiln_error_t* err, bool run) {
  kiln_model_t* model = nullptr;
  kiln_status_t st = kiln_model_load_from_memory(b.data(), b.size, nullptr, &model, err);
  if (st != KILN_OK) return st;
  if (run) {
    kiln_session_options_t so = {};
    so.struct_size = sizeof(so);
    so.num_threads = 1;
    so.context_length = 64;
    kiln_session_t* s = nullptr;
    st = kiln_session_create(model, &so, &s, err);
    if (st == KILN_OK) {
      kiln_model_info_t info = {};
      info.struct_size = sizeof(info);
      kiln_model_get_info(model, &info);
      std::vector<int32_t> ids = {1, 2, 3, 4};
      kiln_generate_options_t go;
      kiln_generate_options_init(&go);
      go.max_new_tokens = 2;
      kiln_session_generate_ids(s, ids.data(), ids.size(), &go, err);
      kiln_session_release(s);
    }
  }
  kiln_model_release(model);
  return KILN_OK;
}

// Loads an artifact (without running it) that must be refused with `expected` and a
// message containing `message`; `what` names the case in failures.
void ExpectLoadRefused(const std::vector<uint8_t>& bytes, kiln_status_t expected, const char* message,
                       const char* what) {
  Buffer b;
  b.Assign(bytes.data(), bytes.size());
  kiln_error_t err;
  err.message[0] = '\0';
  EXPECT_EQ(LoadAndRun(b, &err, false), expected) << what << ": " << err.message;
  EXPECT_NE(std::strstr(err.message, message), nullptr) << what << ": " << err.message;
}

// Parameters: "tiny-llama" (portable reference kernels) or "tiny-llama@gen" (the
// kernels generated for this CPU's architecture, in the artifact's code segment).
std::string Preset(const std::string& param) { return param.substr(0, param.find('@')); }
std::string ArtifactFile(const std::string& param) {
  if (param.find("@gen") == std::string::npos) return param + ".kiln";
#if defined(__aarch64__)
  return Preset(param) + ".gen-aarch64.kiln";
#else
  return Preset(param) + ".gen-x86_64.kiln";
#endif
}

// Rewrites an artifact's header through the object API, keeps the weights, and fixes
// up every absolute offset if the header changed size.
std::vector<uint8_t> RewriteArtifact(const std::vector<uint8_t>& bytes, const std::function<void(fb::ModelT&)>& edit) {
  const fb::Model* m = fb::GetSizePrefixedModel(bytes.data());
  std::unique_ptr<fb::ModelT> obj(m->UnPack());
  edit(*obj);
  uint64_t old_start = obj->segments.empty() ? bytes.size() : obj->segments[0].offset();
  flatbuffers::FlatBufferBuilder b;
  b.ForceDefaults(true);
  b.FinishSizePrefixed(fb::Model::Pack(b, obj.get()), fb::ModelIdentifier());
  uint64_t new_start = (b.GetSize() + 63) / 64 * 64;
  int64_t delta = static_cast<int64_t>(new_start) - static_cast<int64_t>(old_start);
  if (delta != 0) {
    for (auto& s : obj->segments) s = fb::Segment(s.offset() + delta, s.size());
    for (auto& t : obj->tensors) t->offset += delta;
    b.Clear();
    b.FinishSizePrefixed(fb::Model::Pack(b, obj.get()), fb::ModelIdentifier());
  }
  std::vector<uint8_t> out(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  out.resize(new_start, 0);
  if (old_start < bytes.size()) out.insert(out.end(), bytes.begin() + old_start, bytes.end());
  return out;
}

class ArtifactTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = ArtifactsDir();
    if (dir_.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
    path_ = dir_ + "/" + ArtifactFile(GetParam());
    ASSERT_TRUE(ReadFile(path_, &bytes_)) << path_;
    vectors_ = dir_ + "/" + Preset(GetParam());
  }

  std::vector<uint8_t> Rewrite(const std::function<void(fb::ModelT&)>& edit) { return RewriteArtifact(bytes_, edit); }

  kiln_status_t Load(const std::vector<uint8_t>& bytes, kiln_error_t* err, bool run = false) {
    Buffer b;
    b.Assign(bytes.data(), bytes.size());
    return LoadAndRun(b, err, run);
  }

  std::string dir_;
  std::string path_;     // the artifact
  std::string vectors_;  // the reference's inputs and tokens: <vectors_>.ids.npy, ...
  std::vector<uint8_t> bytes_;
};

TEST_P(ArtifactTest, LoadsAndReproducesReferenceTokens) {
  kiln_error_t err;
  kiln_model_t* model = nullptr;
  ASSERT_EQ(kiln_model_load(path_.c_str(), nullptr, &model, &err), KILN_OK) << err.message;
  // The @gen artifacts run generated kernels from their code segment.
  EXPECT_EQ(fb::GetSizePrefixedModel(bytes_.data())->code() != nullptr, GetParam().find("@gen") != std::string::npos);
  kiln_session_options_t so = {};
  so.struct_size = sizeof(so);
  so.num_threads = 1;  // other counts: Threads.OutputsDoNotDependOnTheThreadCount
  kiln_session_t* s = nullptr;
  ASSERT_EQ(kiln_session_create(model, &so, &s, &err), KILN_OK) << err.message;

  kiln::npy::Array ids, greedy, px;
  std::string error;
  ASSERT_TRUE(kiln::npy::Read(vectors_ + ".ids.npy", &ids, &error)) << error;
  ASSERT_TRUE(kiln::npy::Read(vectors_ + ".greedy.npy", &greedy, &error)) << error;
  if (kiln::npy::Read(vectors_ + ".pixels.npy", &px, &error)) {
    std::vector<float> p = px.AsFloat();
    ASSERT_EQ(kiln_session_set_pixel_values(s, p.data(), p.size(), &err), KILN_OK) << err.message;
  }
  std::vector<int32_t> prompt;
  for (int64_t v : ids.AsInt()) prompt.push_back(static_cast<int32_t>(v));
  kiln_generate_options_t go;
  kiln_generate_options_init(&go);
  go.max_new_tokens = static_cast<int32_t>(greedy.count());
  kiln_status_t st = kiln_session_generate_ids(s, prompt.data(), prompt.size(), &go, &err);
  ASSERT_EQ(st, KILN_OK) << err.message;
  std::vector<int32_t> out(64);
  size_t n = 0;
  kiln_session_get_output_ids(s, out.data(), out.size(), &n);
  out.resize(n);
  std::vector<int32_t> expected;
  for (int64_t v : greedy.AsInt()) expected.push_back(static_cast<int32_t>(v));
  EXPECT_EQ(out, expected) << GetParam() << ": greedy tokens differ from the PyTorch reference";
  kiln_session_release(s);
  kiln_model_release(model);
}

TEST_P(ArtifactTest, TruncationsAreRejected) {
  const fb::Model* m = fb::GetSizePrefixedModel(bytes_.data());
  uint64_t data_start = m->segments()->Get(0)->offset();
  // Every byte of the header region, then strides through the weights.
  std::vector<size_t> cuts;
  for (size_t n = 0; n < data_start + 64 && n < bytes_.size(); ++n) cuts.push_back(n);
  for (size_t n = data_start; n < bytes_.size(); n += 997) cuts.push_back(n);
  cuts.push_back(bytes_.size() - 1);
  for (size_t n : cuts) {
    Buffer b;
    b.Assign(bytes_.data(), n);
    kiln_error_t err;
    kiln_status_t st = LoadAndRun(b, &err, false);
    ASSERT_NE(st, KILN_OK) << "truncated to " << n << " of " << bytes_.size() << " bytes was accepted";
    EXPECT_TRUE(kiln_status_is_artifact_error(st)) << n << ": " << kiln_status_message(st) << ": " << err.message;
  }
}

TEST_P(ArtifactTest, FlippedHeaderBytesNeverCrash) {
  const fb::Model* m = fb::GetSizePrefixedModel(bytes_.data());
  size_t header = static_cast<size_t>(m->segments()->Get(0)->offset());
  // A seeded sample of header positions (every one for small headers), two flip
  // patterns each; accepted corruptions (a changed name or value that is still
  // valid) are also executed, up to a bound that keeps the sanitizer run short.
  std::mt19937 rng(1234);
  const size_t kPositions = 1200;
  const int kMaxRuns = 40;
  int rejected = 0, accepted = 0, runs = 0;
  const uint8_t patterns[] = {0xFF, 0x01};
  for (size_t k = 0; k < std::min(header, kPositions); ++k) {
    size_t i = header <= kPositions ? k : rng() % header;
    for (uint8_t p : patterns) {
      std::vector<uint8_t> bad = bytes_;
      bad[i] ^= p;
      kiln_error_t err;
      bool run = runs < kMaxRuns;
      kiln_status_t st = Load(bad, &err, run);
      if (st == KILN_OK) {
        ++accepted;
        runs += run;
      } else {
        ++rejected;
      }
    }
  }
  EXPECT_GT(rejected, 0);
  RecordProperty("rejected", rejected);
  RecordProperty("accepted", accepted);
}

struct Corruption {
  const char* name;
  kiln_status_t expected;  // KILN_OK: any error status
  std::function<void(fb::ModelT&)> edit;
};

// An artifact that needs a CPU feature this CPU lacks is refused, naming the feature:
// every feature bit of the architecture the runtime knows (avxvnni among them).
TEST_P(ArtifactTest, MissingCpuFeaturesAreNamed) {
  const uint64_t cpu = kiln::rt::DetectCpuFeatures();
#if defined(__aarch64__)
  const uint64_t arch = 0x7full << 8;
#else
  const uint64_t arch = 0xffull;
#endif
  int refused = 0;
  for (uint64_t bit = 1; bit != 0; bit <<= 1) {
    if (!(bit & arch & kiln::format::kKnownCpuFeatures) || (cpu & bit)) continue;
    const std::string name = kiln::format::CpuFeatureName(bit);
    ExpectLoadRefused(Rewrite([&](fb::ModelT& m) { m.required_cpu_features |= bit; }),
                      KILN_ERROR_ARTIFACT_CPU_FEATURES, ("this CPU lacks " + name).c_str(), name.c_str());
    ++refused;
  }
  if (refused == 0) GTEST_SKIP() << "this CPU has every feature the runtime knows";
}

TEST_P(ArtifactTest, TargetedCorruptionsAreRejected) {
  const std::vector<Corruption> cases = {
      {"newer schema major", KILN_ERROR_ARTIFACT_VERSION, [](fb::ModelT& m) { m.schema_version = 2000; }},
      {"unknown cpu feature", KILN_ERROR_ARTIFACT_CPU_FEATURES,
       [](fb::ModelT& m) { m.required_cpu_features = 1ull << 60; }},
      {"tensor beyond the file", KILN_OK, [](fb::ModelT& m) { m.tensors.back()->offset += 1ull << 40; }},
      {"misaligned tensor", KILN_ERROR_ARTIFACT_ALIGNMENT, [](fb::ModelT& m) { m.tensors[0]->offset += 4; }},
      {"oversized shape", KILN_ERROR_ARTIFACT_SHAPE, [](fb::ModelT& m) { m.tensors[0]->shape[0] = int64_t{1} << 40; }},
      {"shape overflow", KILN_ERROR_ARTIFACT_SHAPE,
       [](fb::ModelT& m) {
         m.tensors[0]->shape = {int64_t{1} << 25, int64_t{1} << 25, int64_t{1} << 25};
       }},
      {"size disagrees with shape", KILN_ERROR_ARTIFACT_SHAPE, [](fb::ModelT& m) { m.tensors[0]->size += 64; }},
      {"negative dimension", KILN_ERROR_ARTIFACT_SHAPE, [](fb::ModelT& m) { m.tensors[0]->shape[0] = -5; }},
      {"unknown encoding", KILN_OK,
       [](fb::ModelT& m) { m.tensors[0]->encoding = static_cast<fb::Encoding>(77); }},
      {"segment beyond the file", KILN_ERROR_ARTIFACT_TRUNCATED,
       [](fb::ModelT& m) { m.segments[0] = fb::Segment(m.segments[0].offset(), m.segments[0].size() * 4 + 4096); }},
      {"segment overlapping the header", KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS,
       [](fb::ModelT& m) { m.segments[0] = fb::Segment(0, m.segments[0].size()); }},
      {"KV cache in bf16", KILN_ERROR_ARTIFACT_MALFORMED,
       [](fb::ModelT& m) { m.text->kv_cache_encoding = fb::Encoding::BF16; }},
      {"int8 KV cache without a group", KILN_ERROR_ARTIFACT_MALFORMED,
       [](fb::ModelT& m) {
         m.text->kv_cache_encoding = fb::Encoding::INT8;
         m.text->kv_cache_group = 0;
       }},
      {"int4 KV cache group not dividing head_dim", KILN_ERROR_ARTIFACT_MALFORMED,
       [](fb::ModelT& m) {
         m.text->kv_cache_encoding = fb::Encoding::INT4;
         m.text->kv_cache_group = m.text->head_dim + 2;
       }},
      {"unknown kernel id", KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL,
       [](fb::ModelT& m) { m.stages[0]->ops[0]->kernel = 9999; }},
      {"kernel of another op", KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL,
       [](fb::ModelT& m) {
         auto& op = m.stages[0]->ops[0];
         op->kernel = op->kernel == 5 ? 6 : 5;
       }},
      {"input index out of range", KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS,
       [](fb::ModelT& m) { m.stages.back()->ops[0]->inputs[0] = 1u << 30; }},
      {"weight index out of range", KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (!op->weights.empty()) {
               op->weights[0] = 1u << 30;
               return;
             }
       }},
      {"missing weight", KILN_ERROR_ARTIFACT_OP,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (op->kind == fb::OpKind::RmsNorm || op->kind == fb::OpKind::LayerNorm) {
               op->weights.clear();
               return;
             }
       }},
      {"read before write", KILN_ERROR_ARTIFACT_OP,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           if (s->ops.size() > 3) {
             std::swap(s->ops[1], s->ops[s->ops.size() - 1]);
             return;
           }
       }},
      {"arena value beyond the arena", KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS,
       [](fb::ModelT& m) {
         for (auto& v : m.values)
           if (v->kind == fb::ValueKind::Arena) {
             v->arena_offset += 1ull << 30;
             return;
           }
       }},
      {"value size disagrees with shape", KILN_ERROR_ARTIFACT_SHAPE, [](fb::ModelT& m) { m.values[0]->size += 64; }},
      {"huge max_rows", KILN_ERROR_ARTIFACT_SHAPE,
       [](fb::ModelT& m) {
         m.values[0]->max_rows = int64_t{1} << 40;
       }},
      {"stage missing", KILN_ERROR_ARTIFACT_MALFORMED,
       [](fb::ModelT& m) {
         for (size_t i = 0; i < m.stages.size(); ++i)
           if (m.stages[i]->kind == fb::StageKind::DecoderDecode) {
             m.stages.erase(m.stages.begin() + static_cast<long>(i));
             return;
           }
       }},
      {"wrong params kind", KILN_ERROR_ARTIFACT_OP,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (op->kind == fb::OpKind::Attention || op->kind == fb::OpKind::QkvAttention) {
               op->params.Set(fb::PatchEmbedParamsT());
               return;
             }
       }},
      {"zero epsilon", KILN_ERROR_ARTIFACT_OP,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (auto* p = op->params.AsNormParams()) {
               p->epsilon = 0.0f;
               return;
             }
       }},
      {"heads not divisible", KILN_ERROR_ARTIFACT_OP,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (auto* p = op->params.AsAttentionParams()) {
               p->num_kv_heads = p->num_heads + 1;
               return;
             }
       }},
      {"cache layer out of range", KILN_ERROR_ARTIFACT_OP,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (auto* p = op->params.AsAttentionParams())
               if (p->cache_layer >= 0) {
                 p->cache_layer = 1000;
                 return;
               }
       }},
      {"odd rope head_dim", KILN_ERROR_ARTIFACT_OP,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (auto* p = op->params.AsRopeParams()) {
               p->head_dim += 1;
               return;
             } else if (auto* a = op->params.AsAttentionParams(); a && a->rope) {
               a->rope->head_dim += 1;  // fused into the attention (kiln-fuse-qkv)
               return;
             } else if (auto* l = op->params.AsLinearParams(); l && l->qkv && l->qkv->rope) {
               l->qkv->rope->head_dim += 1;  // in the q|k|v product's epilogue (kiln-fuse-rope)
               return;
             }
       }},
      // Fusions (schema 1.5).
      {"fused norm without its weight", KILN_ERROR_ARTIFACT_OP,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops) {
             const auto* l = op->params.AsLinearParams();
             const auto* g = op->params.AsGatedMlpParams();
             const fb::NormKind norm = l ? l->norm : g ? g->norm : fb::NormKind::None;
             if (norm != fb::NormKind::None) {
               op->weights.pop_back();  // the norm's weight (and the layer norm's bias)
               if (norm == fb::NormKind::Layer) op->weights.pop_back();
               return;
             }
           }
       }},
      {"residual that is not an activation", KILN_ERROR_ARTIFACT_SHAPE,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if ((op->kind == fb::OpKind::Linear || op->kind == fb::OpKind::GatedMlp) && op->inputs.size() == 2 &&
                 !(op->params.AsLinearParams() && op->params.AsLinearParams()->qkv) &&
                 m.values[s->inputs[0]]->dtype == fb::DType::I32) {
               op->inputs[1] = s->inputs[0];  // the token ids
               return;
             }
       }},
      {"fused rope of other heads", KILN_ERROR_ARTIFACT_OP,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (auto* a = op->params.AsAttentionParams(); a && a->rope) {
               a->rope->num_heads += 1;
               return;
             } else if (auto* l = op->params.AsLinearParams(); l && l->qkv && l->qkv->rope) {
               l->qkv->rope->num_heads += 1;
               return;
             }
       }},
      // RoPE and the KV write in the q|k|v product's epilogue (schema 1.15).
      {"q|k|v epilogue dropped (its positions read as a residual)", KILN_ERROR_ARTIFACT_SHAPE,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (auto* l = op->params.AsLinearParams(); l && l->qkv) {
               l->qkv.reset();
               return;
             }
       }},
      {"attention reading keys another layer's epilogue wrote", KILN_ERROR_ARTIFACT_OP,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (auto* l = op->params.AsLinearParams(); l && l->qkv && l->qkv->cache_layer == 0) {
               l->qkv->cache_layer = 1;
               return;
             }
       }},
      {"kv_written attention after a plain product", KILN_ERROR_ARTIFACT_OP,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (auto* a = op->params.AsAttentionParams(); a && a->cache_layer < 0 && !a->kv_written) {
               a->kv_written = true;  // a vision encoder's, or a decoder's with the epilogue elsewhere
               return;
             }
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (auto* l = op->params.AsLinearParams(); l && l->qkv) {
               l->qkv->num_kv_heads *= 2;  // the epilogue no longer matches its attention
               return;
             }
       }},
      {"further function of a family the op does not call", KILN_OK,
       [](fb::ModelT& m) {
         for (auto& s : m.stages)
           for (auto& op : s->ops)
             if (!op->symbols.empty()) {
               op->symbols[0] = op->symbol;  // listed, but a matmul's or an attention's
               return;
             }
         m.stages[0]->ops[0]->symbols.push_back("kiln_uk_rope_f32_f32_1x2_gen_x86_64");
       }},
      {"vocab too large", KILN_ERROR_ARTIFACT_MALFORMED, [](fb::ModelT& m) { m.text->vocab_size = 1u << 30; }},
      {"eos outside the vocab", KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS,
       [](fb::ModelT& m) { m.generation->eos_token_ids = {int32_t{1} << 30}; }},
      {"merge outside the vocab", KILN_ERROR_ARTIFACT_TOKENIZER,
       [](fb::ModelT& m) {
         if (!m.tokenizer->merges.empty()) m.tokenizer->merges[0] = fb::Merge(1u << 28, 0);
         else m.tokenizer->bos_id = 1 << 28;
       }},
      {"precision row without tensor", KILN_ERROR_ARTIFACT_OUT_OF_BOUNDS,
       [](fb::ModelT& m) {
         if (!m.precision.empty()) m.precision[0]->tensor = 1u << 30;
         else m.schema_version = 9000;
       }},
  };
  for (const Corruption& c : cases) {
    std::vector<uint8_t> bad = Rewrite(c.edit);
    kiln_error_t err;
    err.message[0] = '\0';
    kiln_status_t st = Load(bad, &err, false);
    EXPECT_NE(st, KILN_OK) << c.name << " was accepted";
    if (c.expected != KILN_OK) EXPECT_EQ(st, c.expected) << c.name << ": " << err.message;
    EXPECT_GT(std::strlen(err.message), 0u) << c.name << ": no message";
  }
}

// ---- Issue 12: memory-safety holes in the verifier (defects 2, 3, 4, 14). Each
// crafted artifact passed the old verifier; when one is accepted it is also run the
// way that used to read or write out of bounds, so that the sanitizer build shows it.

bool Contains(const kiln_error_t& err, const std::string& what) {
  return std::strstr(err.message, what.c_str()) != nullptr;
}

uint64_t Align64(uint64_t v) { return (v + 63) / 64 * 64; }

// A generated op bound to a function of another family (a flipped header byte once
// pointed a Linear op's symbol at the attention kernel's name, which the code segment
// lists): the function would be called with the wrong parameter block. Refused.
TEST_P(ArtifactTest, GeneratedSymbolOfAnotherFamilyIsRejected) {
  std::string matmul, attention;
  const fb::Model* m = fb::GetSizePrefixedModel(bytes_.data());
  for (const fb::Stage* s : *m->stages())
    for (const fb::Op* op : *s->ops()) {
      if (op->symbol() == nullptr) continue;
      if (op->kind() == fb::OpKind::Attention || op->kind() == fb::OpKind::QkvAttention) attention = op->symbol()->str();
      if (op->kind() == fb::OpKind::Linear) matmul = op->symbol()->str();
    }
  if (matmul.empty() || attention.empty()) GTEST_SKIP() << "no generated Linear and Attention kernels";
  std::vector<uint8_t> bad = Rewrite([&](fb::ModelT& model) {
    for (auto& stage : model.stages)
      for (auto& op : stage->ops)
        if (op->kind == fb::OpKind::Linear) op->symbol = attention;
  });
  kiln_error_t err;
  EXPECT_EQ(Load(bad, &err, false), KILN_ERROR_ARTIFACT_CODE);
  EXPECT_TRUE(Contains(err, "Linear op bound to '" + attention + "', not a kiln_uk_matmul_* function")) << err.message;
}


// A generated attention over the KV cache reads the artifact's cache encoding only:
// an artifact declaring another encoding than its kernel's name says is refused (the
// kernel would read f32 keys where int8 codes are).
TEST_P(ArtifactTest, GeneratedAttentionOfAnotherCacheEncodingIsRejected) {
  std::string attention;
  const fb::Model* m = fb::GetSizePrefixedModel(bytes_.data());
  for (const fb::Stage* s : *m->stages())
    for (const fb::Op* op : *s->ops())
      if (op->symbol() != nullptr && op->params_as_AttentionParams() != nullptr &&
          op->params_as_AttentionParams()->cache_layer() >= 0)
        attention = op->symbol()->str();
  if (attention.empty()) GTEST_SKIP() << "no generated attention over the KV cache";
  std::vector<uint8_t> bad = Rewrite([&](fb::ModelT& model) {
    const bool f32 = model.text->kv_cache_encoding == fb::Encoding::F32;
    model.text->kv_cache_encoding = f32 ? fb::Encoding::INT8 : fb::Encoding::F32;
    model.text->kv_cache_group = f32 ? model.text->head_dim : 0;
  });
  kiln_error_t err;
  EXPECT_EQ(Load(bad, &err, false), KILN_ERROR_ARTIFACT_CODE);
  EXPECT_TRUE(Contains(err, "a kernel for another cache encoding")) << err.message;
}

// Creates a session and runs a prefill of `tokens` text tokens (with the image path
// first when `image` is set): what a crafted artifact the verifier accepted would do.
void RunAccepted(kiln_model_t* model, int tokens, bool image, int32_t context = 64) {
  kiln_session_options_t so = {};
  so.struct_size = sizeof(so);
  so.num_threads = 1;
  so.context_length = context;
  kiln_session_t* s = nullptr;
  kiln_error_t err;
  if (kiln_session_create(model, &so, &s, &err) != KILN_OK) return;
  kiln_model_info_t info = {};
  info.struct_size = sizeof(info);
  kiln_model_get_info(model, &info);
  if (image && info.image_size > 0) {
    std::vector<float> px(static_cast<size_t>(3) * info.image_size * info.image_size, 0.25f);
    kiln_session_set_pixel_values(s, px.data(), px.size(), &err);
  }
  std::vector<int32_t> ids;
  for (int i = 0; i < tokens; ++i) ids.push_back(1 + i % 100);
  std::vector<float> logits(ids.size() * static_cast<size_t>(info.vocab_size));
  kiln_session_prefill_logits(s, ids.data(), ids.size(), logits.data(), logits.size(), &err);
  kiln_session_release(s);
}

// Loads a crafted artifact that must be refused; runs it (see above) if it is not.
kiln_status_t LoadCrafted(const std::vector<uint8_t>& bytes, kiln_error_t* err, int tokens, bool image,
                          int32_t context = 64) {
  Buffer b;
  b.Assign(bytes.data(), bytes.size());
  kiln_model_t* model = nullptr;
  err->message[0] = '\0';
  kiln_status_t st = kiln_model_load_from_memory(b.data(), b.size, nullptr, &model, err);
  if (st != KILN_OK) return st;
  RunAccepted(model, tokens, image, context);
  kiln_model_release(model);
  return KILN_OK;
}

// Defect 2: decoder prefill binds image_features with the chunk's image-token count
// and input_ids with the chunk's token count; both are declared [-1, ...]. An Add of
// the two passed (-1 == -1) and read as many image rows as there are tokens.
TEST_P(ArtifactTest, Issue12AddOfTokenRowsAndImageRowsIsRejected) {
  bool crafted = false;
  std::vector<uint8_t> bad = Rewrite([&](fb::ModelT& m) {
    for (auto& s : m.stages) {
      if (s->kind != fb::StageKind::DecoderPrefill || s->inputs.size() < 3) continue;
      uint32_t image = s->inputs[2];
      for (size_t i = 0; i < s->ops.size(); ++i) {
        if (s->ops[i]->kind != fb::OpKind::MergeImageTokens) continue;
        auto add = std::make_unique<fb::OpT>();
        add->kind = fb::OpKind::Add;
        add->kernel = 5;  // ref_add (formats/kernels.def)
        add->name = "crafted.add_image_features";
        add->inputs = {s->ops[i]->output, image};
        add->output = s->ops[i]->output;
        s->ops.insert(s->ops.begin() + static_cast<long>(i) + 1, std::move(add));
        crafted = true;
        return;
      }
    }
  });
  if (!crafted) GTEST_SKIP() << GetParam() << " has no image path";
  kiln_error_t err;
  // 40 text tokens: the Add would read 40 rows of the 16-row image feature buffer.
  kiln_status_t st = LoadCrafted(bad, &err, 40, false);
  EXPECT_EQ(st, KILN_ERROR_ARTIFACT_SHAPE) << err.message;
  EXPECT_TRUE(Contains(err, "crafted.add_image_features")) << err.message;
}

// Defect 3: the projector's input was never compared with the vision encoder's
// output, whose buffer the session binds to it. A projector declaring twice the
// rows, then slicing off the second half, read past the vision features.
TEST_P(ArtifactTest, Issue12ProjectorInputMustMatchVisionOutput) {
  std::string input_name;
  std::vector<uint8_t> bad = Rewrite([&](fb::ModelT& m) {
    for (auto& s : m.stages) {
      if (s->kind != fb::StageKind::Projector) continue;
      uint32_t in = s->inputs[0];
      fb::ValueT& v = *m.values[in];
      input_name = v.name;
      int64_t rows = v.shape[0], cols = v.shape[1];
      v.shape[0] = v.max_rows = 2 * rows;
      v.size = Align64(static_cast<uint64_t>(2 * rows * cols) * 4);
      auto sliced = std::make_unique<fb::ValueT>();
      sliced->name = "crafted.projector_rows";
      sliced->dtype = fb::DType::F32;
      sliced->shape = {rows, cols};
      sliced->max_rows = rows;
      sliced->kind = fb::ValueKind::Arena;
      sliced->arena_offset = Align64(s->arena_bytes);
      sliced->size = Align64(static_cast<uint64_t>(rows * cols) * 4);
      s->arena_bytes = sliced->arena_offset + sliced->size;
      m.memory_plan->arena_bytes = std::max(m.memory_plan->arena_bytes, s->arena_bytes);
      uint32_t sv = static_cast<uint32_t>(m.values.size());
      m.values.push_back(std::move(sliced));
      for (auto& op : s->ops)
        for (auto& i : op->inputs)
          if (i == in) i = sv;
      auto slice = std::make_unique<fb::OpT>();
      slice->kind = fb::OpKind::SliceRows;
      slice->kernel = 17;  // ref_slice_rows
      slice->name = "crafted.projector_slice";
      slice->inputs = {in};
      slice->output = sv;
      fb::SliceRowsParamsT p;
      p.start = static_cast<uint32_t>(rows);
      slice->params.Set(p);
      s->ops.insert(s->ops.begin(), std::move(slice));
    }
  });
  if (input_name.empty()) GTEST_SKIP() << GetParam() << " has no projector";
  kiln_error_t err;
  kiln_status_t st = LoadCrafted(bad, &err, 4, true);
  EXPECT_EQ(st, KILN_ERROR_ARTIFACT_SHAPE) << err.message;
  EXPECT_TRUE(Contains(err, input_name)) << err.message;
}

// Defect 4: num_kv_heads was bounded only through cached attention ops; without
// them the session's KV-cache size (layers * context * kv_heads * head_dim * 4)
// wrapped around to 0 bytes.
TEST_P(ArtifactTest, Issue12KvCacheSizeOverflowIsRejected) {
  struct Case {
    uint32_t kv_heads, max_positions;
    int32_t context;
  };
  // 1024 layers * 2^17 positions * 2^35 floats * 4 bytes = 2^64; then a width the
  // verifier accepts (2^22 heads * 16 = 2^26 floats) with 2^26 positions: 2^64 again.
  for (Case c : {Case{1u << 31, 1u << 17, 1 << 17}, Case{1u << 22, 1u << 26, 1 << 26}}) {
    std::vector<uint8_t> bad = Rewrite([&](fb::ModelT& m) {
      m.text->num_layers = 1024;
      m.text->num_heads = m.text->num_kv_heads = c.kv_heads;
      m.text->head_dim = 16;
      m.text->max_position_embeddings = c.max_positions;
      m.text->sliding_window = 0;
      for (auto& s : m.stages)
        for (auto& op : s->ops)
          if (auto* p = op->params.AsAttentionParams())
            if (p->cache_layer >= 0) {
              p->cache_layer = -1;
              op->inputs.resize(3);
            }
    });
    kiln_error_t err;
    kiln_status_t st = LoadCrafted(bad, &err, 4, false, c.context);
    EXPECT_EQ(st, KILN_ERROR_ARTIFACT_MALFORMED) << c.kv_heads << ": " << err.message;
    EXPECT_TRUE(Contains(err, "num_kv_heads")) << err.message;
  }
}

// Defect 4: AlignUp(2^64 - 16) wrapped to 0, so a value of 2^64 - 16 bytes declared
// with size 0 passed.
TEST_P(ArtifactTest, Issue12ValueSizeAlignmentOverflowIsRejected) {
  std::vector<uint8_t> bad = Rewrite([](fb::ModelT& m) {
    auto v = std::make_unique<fb::ValueT>();
    v->name = "crafted.huge_value";
    v->dtype = fb::DType::F32;
    // 874502 * 58535905 * 90090 * 4 = 2^64 - 16.
    v->shape = {-1, 58535905, 90090};
    v->max_rows = 874502;
    v->kind = fb::ValueKind::Arena;
    v->arena_offset = 0;
    v->size = 0;
    m.values.push_back(std::move(v));
  });
  kiln_error_t err;
  kiln_status_t st = LoadCrafted(bad, &err, 4, false);
  EXPECT_EQ(st, KILN_ERROR_ARTIFACT_SHAPE) << err.message;
  EXPECT_TRUE(Contains(err, "crafted.huge_value")) << err.message;
}

// Defect 14: flatbuffers 2.0.8 checks only the 4-byte alignment of a vector's length,
// not the 8-byte alignment of [long] elements. Moves one such vector (a copy of it)
// into a string's bytes at a position where its elements are 4 mod 8.
void MisalignVector(std::vector<uint8_t>* bytes, const flatbuffers::String* room, const void* table,
                    uint16_t vt_field, const void* vector_data, size_t elem_size) {
  uint8_t* base = bytes->data();
  const uint8_t* t = static_cast<const uint8_t*>(table);
  int32_t vt_rel;
  std::memcpy(&vt_rel, t, 4);
  const uint8_t* vtable = t - vt_rel;
  uint16_t vt_size, field;
  std::memcpy(&vt_size, vtable, 2);
  ASSERT_LT(vt_field, vt_size);
  std::memcpy(&field, vtable + vt_field, 2);
  ASSERT_NE(field, 0);
  size_t field_off = static_cast<size_t>(t + field - base);
  uint32_t count;
  std::memcpy(&count, static_cast<const uint8_t*>(vector_data) - 4, 4);
  size_t room_off = static_cast<size_t>(reinterpret_cast<const uint8_t*>(room->data()) - base);
  size_t q = (room_off + 7) / 8 * 8;  // the length at 0 mod 8: elements at 4 mod 8
  ASSERT_LE(q + 4 + count * elem_size, room_off + room->size());
  ASSERT_GT(q, field_off);
  std::memmove(base + q + 4, vector_data, count * elem_size);
  std::memcpy(base + q, &count, 4);
  uint32_t rel = static_cast<uint32_t>(q - field_off);
  std::memcpy(base + field_off, &rel, 4);
}

TEST_P(ArtifactTest, Issue12MisalignedLongVectorsAreRejected) {
  enum Target { kValueShape, kTensorShape, kSegments };
  for (Target target : {kValueShape, kTensorShape, kSegments}) {
    std::vector<uint8_t> bad = Rewrite([](fb::ModelT& m) { m.metadata->compiler_version = std::string(256, 'x'); });
    const fb::Model* model = fb::GetSizePrefixedModel(bad.data());
    const flatbuffers::String* room = model->metadata()->compiler_version();
    std::string name;
    if (target == kValueShape) {
      const fb::Value* v = model->values()->Get(1);
      name = v->name()->str();
      MisalignVector(&bad, room, v, fb::Value::VT_SHAPE, v->shape()->Data(), 8);
    } else if (target == kTensorShape) {
      const fb::Tensor* t = model->tensors()->Get(1);
      name = t->name()->str();
      MisalignVector(&bad, room, t, fb::Tensor::VT_SHAPE, t->shape()->Data(), 8);
    } else {
      name = "segments";
      MisalignVector(&bad, room, model, fb::Model::VT_SEGMENTS, model->segments()->Data(), sizeof(fb::Segment));
    }
    if (HasFatalFailure()) return;
    kiln_error_t err;
    kiln_status_t st = LoadCrafted(bad, &err, 4, false);
    EXPECT_EQ(st, KILN_ERROR_ARTIFACT_ALIGNMENT) << name << ": " << err.message;
    EXPECT_TRUE(Contains(err, name)) << err.message;
  }
}

// Issue 12, defect 13: what kiln_model_session_bytes declares is what a session
// allocates (the kernels' scratch included), for several contexts and thread counts.
struct CountingAllocator {
  uint64_t live = 0, peak = 0;
  static void* Alloc(void* user, size_t size, size_t alignment) {
    auto* self = static_cast<CountingAllocator*>(user);
    void* p = nullptr;
    if (posix_memalign(&p, alignment < sizeof(void*) ? sizeof(void*) : alignment, size + 64) != 0) return nullptr;
    std::memcpy(p, &size, sizeof(size));
    self->live += size;
    self->peak = std::max(self->peak, self->live);
    return static_cast<uint8_t*>(p) + 64;
  }
  static void Free(void* user, void* ptr) {
    if (ptr == nullptr) return;
    uint8_t* base = static_cast<uint8_t*>(ptr) - 64;
    size_t size;
    std::memcpy(&size, base, sizeof(size));
    static_cast<CountingAllocator*>(user)->live -= size;
    free(base);
  }
};

TEST_P(ArtifactTest, Issue12SessionBytesCoverWhatASessionAllocates) {
  kiln_error_t err;
  kiln_model_t* model = nullptr;
  ASSERT_EQ(kiln_model_load(path_.c_str(), nullptr, &model, &err), KILN_OK) << err.message;
  static const bool threads_work = ThreadsWork();
  const std::vector<int> thread_counts = threads_work ? std::vector<int>{1, 3} : std::vector<int>{1};
  for (int context : {16, 64}) {
    for (int threads : thread_counts) {
      CountingAllocator counter;
      kiln_allocator_t a = {CountingAllocator::Alloc, CountingAllocator::Free, &counter};
      kiln_session_options_t so = {};
      so.struct_size = sizeof(so);
      so.num_threads = threads;
      so.context_length = context;
      so.allocator = &a;
      uint64_t declared = 0;
      ASSERT_EQ(kiln_model_session_bytes(model, &so, &declared, &err), KILN_OK) << err.message;
      kiln_session_t* s = nullptr;
      ASSERT_EQ(kiln_session_create(model, &so, &s, &err), KILN_OK) << err.message;
      // Everything the session allocates at creation is declared, to the byte.
      EXPECT_EQ(counter.peak, declared) << "context " << context << ", " << threads << " threads";
      kiln_session_release(s);
    }
  }
  kiln_session_options_t bad = {};
  bad.struct_size = sizeof(bad);
  bad.context_length = -5;
  uint64_t bytes = 0;
  EXPECT_EQ(kiln_model_session_bytes(model, &bad, &bytes, &err), KILN_ERROR_INVALID_ARGUMENT);
  kiln_model_release(model);
}

TEST_P(ArtifactTest, IdentifierAndEmptyFile) {
  std::vector<uint8_t> bad = bytes_;
  std::memcpy(bad.data() + 8, "GGUF", 4);
  kiln_error_t err;
  EXPECT_EQ(Load(bad, &err), KILN_ERROR_ARTIFACT_NOT_KILN);
  Buffer empty;
  empty.Assign(bytes_.data(), 0);
  EXPECT_EQ(LoadAndRun(empty, &err, false), KILN_ERROR_ARTIFACT_TRUNCATED);
  // A rewrite with no change loads: the harness itself does not corrupt.
  EXPECT_EQ(Load(Rewrite([](fb::ModelT&) {}), &err, true), KILN_OK) << err.message;
}

INSTANTIATE_TEST_SUITE_P(Tiny, ArtifactTest,
                         ::testing::Values("tiny-llama", "tiny-llava", "tiny-idefics3", "tiny-mixtral",
                                           "tiny-llama@gen", "tiny-llava@gen", "tiny-idefics3@gen",
                                           "tiny-mixtral@gen"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// Prompt logits and greedy tokens of one artifact on the preset's test vectors.
struct Outputs {
  std::vector<float> logits;
  std::vector<int32_t> tokens;
  bool generated_a8 = false;  // an op runs a generated quantised-weight matmul (ids 37-41)
};
// min_tokens: the prompt repeated up to that length (several spans of a quantised
// KV cache, whose keys then read per-channel scales); max_tokens: the prompt cut to
// that length (a text prompt only: image placeholders must stay whole).
kiln_status_t RunVectors(const std::string& path, const std::string& vectors, Outputs* out, kiln_error_t* err,
                         int threads = 1, int kv_cache = KILN_KV_CACHE_DEFAULT, size_t min_tokens = 0,
                         size_t max_tokens = 0) {
  kiln_model_t* model = nullptr;
  kiln_status_t st = kiln_model_load(path.c_str(), nullptr, &model, err);
  if (st != KILN_OK) return st;
  std::vector<uint8_t> bytes;
  EXPECT_TRUE(ReadFile(path, &bytes));
  for (const fb::Stage* stage : *fb::GetSizePrefixedModel(bytes.data())->stages())
    for (const fb::Op* op : *stage->ops()) out->generated_a8 |= op->kernel() >= 37 && op->kernel() <= 41;
  kiln_session_options_t so = {};
  so.struct_size = sizeof(so);
  so.num_threads = threads;
  so.kv_cache = kv_cache;
  kiln_session_t* s = nullptr;
  EXPECT_EQ(kiln_session_create(model, &so, &s, err), KILN_OK) << err->message;
  kiln::npy::Array ids, px;
  std::string error;
  EXPECT_TRUE(kiln::npy::Read(vectors + ".ids.npy", &ids, &error)) << error;
  std::vector<int32_t> prompt;
  for (int64_t v : ids.AsInt()) prompt.push_back(static_cast<int32_t>(v));
  for (size_t i = 0; prompt.size() < min_tokens; ++i) prompt.push_back(prompt[i]);
  if (max_tokens > 0 && prompt.size() > max_tokens) prompt.resize(max_tokens);
  const bool image = kiln::npy::Read(vectors + ".pixels.npy", &px, &error);
  auto pixels = [&] {
    if (!image) return;
    std::vector<float> p = px.AsFloat();
    EXPECT_EQ(kiln_session_set_pixel_values(s, p.data(), p.size(), err), KILN_OK) << err->message;
  };
  kiln_model_info_t info = {};
  info.struct_size = sizeof(info);
  kiln_model_get_info(model, &info);
  out->logits.assign(prompt.size() * static_cast<size_t>(info.vocab_size), 0.0f);
  pixels();
  EXPECT_EQ(kiln_session_prefill_logits(s, prompt.data(), prompt.size(), out->logits.data(), out->logits.size(), err),
            KILN_OK)
      << err->message;
  kiln_session_release(s);
  EXPECT_EQ(kiln_session_create(model, &so, &s, err), KILN_OK) << err->message;
  pixels();
  kiln_generate_options_t go;
  kiln_generate_options_init(&go);
  go.max_new_tokens = 6;
  EXPECT_EQ(kiln_session_generate_ids(s, prompt.data(), prompt.size(), &go, err), KILN_OK) << err->message;
  out->tokens.resize(64);
  size_t n = 0;
  kiln_session_get_output_ids(s, out->tokens.data(), out->tokens.size(), &n);
  out->tokens.resize(n);
  kiln_session_release(s);
  kiln_model_release(model);
  return KILN_OK;
}

// `<dir>/<name>.gen-<this architecture>.kiln`, and the portable reference kernel of an op kind.
uint32_t PortableKernelOf(fb::OpKind kind) {
  size_t count;
  const kiln::format::KernelInfo* kernels = kiln::format::AllKernels(&count);
  for (size_t i = 0; i < count; ++i)
    if (kernels[i].op_kind == static_cast<uint16_t>(kind) && std::string(kernels[i].isa) == "portable")
      return kernels[i].id;
  return 0;
}

// W8A8 / W4A8 artifacts with generated kernels (make_test_artifacts.py: A8) give the
// portable artifact's outputs of the same precision: the same integer sums, so the
// logits differ only by float rounding (RoPE, the order int4 group sums are added
// in, and an activation rounding to the other int8 code as a result), and the
// greedy tokens agree. The same for quantised weights with float activations (A16:
// W8A16, W4A16 with and without zero points, fp8), summed in another order.
TEST(GeneratedQuantized, MatchesPortableArtifactOfSamePrecision) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
#if defined(__aarch64__)
  const std::string arch = "aarch64";
#else
  const std::string arch = "x86_64";
#endif
  int ran = 0;
  const std::pair<const char*, const char*> sets[] = {
      {"tiny-llama", "a8"}, {"tiny-llava", "a8"}, {"tiny-mixtral", "a8"}, {"tiny-llama", "a16"}, {"tiny-mixtral", "a16"}};
  for (const auto& [preset, suffix] : sets) {
    SCOPED_TRACE(std::string(preset) + "." + suffix);
    const std::string base = dir + "/" + preset;
    kiln_error_t err;
    Outputs portable, generated;
    ASSERT_EQ(RunVectors(base + "." + suffix + ".kiln", base, &portable, &err), KILN_OK) << err.message;
    kiln_status_t st = RunVectors(base + "." + suffix + ".gen-" + arch + ".kiln", base, &generated, &err);
    if (st == KILN_ERROR_ARTIFACT_CPU_FEATURES) continue;  // this CPU lacks the artifact's features (named in err)
    ASSERT_EQ(st, KILN_OK) << err.message;
    EXPECT_TRUE(generated.generated_a8) << "no op runs a generated quantised-weight matmul";
    EXPECT_FALSE(portable.generated_a8);
    ASSERT_EQ(portable.logits.size(), generated.logits.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < portable.logits.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(portable.logits[i] - generated.logits[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(portable.logits[i])));
    }
    std::printf("%s.%s.gen-%s: max |generated - portable| logit %.3g, max |logit| %.3g\n", preset, suffix,
                arch.c_str(), worst, scale);
    EXPECT_LE(worst, 2e-3 * scale) << "max |generated - portable| logit, max |logit| " << scale;
    EXPECT_EQ(generated.tokens, portable.tokens);
    EXPECT_EQ(generated.tokens.size(), 6u);
    ++ran;
  }
  EXPECT_GE(ran, 1) << "no generated quantised artifact runs on this CPU";
}

// Largest |a - b| over the logits, and the largest |a|.
std::pair<double, double> LogitDiff(const Outputs& a, const Outputs& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.logits.size() && i < b.logits.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(a.logits[i] - b.logits[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(a.logits[i])));
  }
  return {worst, scale};
}

// Encoded KV caches (make_test_artifacts.py: tiny-llama.kv8 / .kv4, generated
// attention reading int8 / int4 caches): the same model with the same cache encoding
// chosen per session on the f32-cache artifact (the built-in kernels reading it)
// gives the same logits up to float rounding (and the odd code rounded the other
// way); a session asking the int8 artifact for an f32 cache (the generated kernel
// reads int8 only: the built-in one runs) gives the f32 artifact's; and the encoded
// caches stay close to f32.
TEST(KvCache, GeneratedAttentionReadsTheArtifactsEncoding) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  const std::string base = dir + "/tiny-llama", f32_artifact = GeneratedArtifact(dir, "tiny-llama");
  kiln_error_t err;
  // 56 tokens: three spans of 16 positions complete, the rest of each row's own exact.
  const size_t tokens = 56;
  Outputs f32;
  ASSERT_EQ(RunVectors(f32_artifact, base, &f32, &err, 1, KILN_KV_CACHE_DEFAULT, tokens), KILN_OK) << err.message;
  const std::pair<const char*, int> encodings[] = {{"kv8", KILN_KV_CACHE_INT8}, {"kv4", KILN_KV_CACHE_INT4}};
  for (const auto& [name, kv] : encodings) {
    SCOPED_TRACE(name);
    Outputs generated, builtin, back_to_f32;
    ASSERT_EQ(RunVectors(GeneratedArtifact(dir, std::string("tiny-llama.") + name), base, &generated, &err, 1,
                         KILN_KV_CACHE_DEFAULT, tokens),
              KILN_OK)
        << err.message;
    ASSERT_EQ(RunVectors(f32_artifact, base, &builtin, &err, 1, kv, tokens), KILN_OK) << err.message;
    ASSERT_EQ(RunVectors(GeneratedArtifact(dir, std::string("tiny-llama.") + name), base, &back_to_f32, &err, 1,
                         KILN_KV_CACHE_F32, tokens),
              KILN_OK)
        << err.message;
    auto [same, scale] = LogitDiff(generated, builtin);
    auto [exact, scale2] = LogitDiff(back_to_f32, f32);
    auto [lossy, scale3] = LogitDiff(generated, f32);
    std::printf("tiny-llama.%s: max |generated - built-in| logit %.3g, |f32 session - f32 artifact| %.3g, "
                "|encoded - f32| %.3g, max |logit| %.3g\n", name, same, exact, lossy, scale);
    EXPECT_LE(same, 2e-3 * scale);
    EXPECT_LE(exact, 1e-4 * scale2);
    EXPECT_GT(lossy, 0.0) << "the encoded cache changed nothing: was it used?";
    EXPECT_LE(lossy, (kv == KILN_KV_CACHE_INT8 ? 5e-2 : 0.3) * scale3);
  }
}

// The session's KV-cache option: its bytes per encoding (kiln_model_session_bytes and
// the stats agree), the encoding reported, and an unknown value refused.
TEST(KvCache, SessionOptionsBytesAndStats) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  kiln_error_t err;
  kiln_model_t* model = nullptr;
  ASSERT_EQ(kiln_model_load(GeneratedArtifact(dir, "tiny-llama.kv8").c_str(), nullptr, &model, &err), KILN_OK)
      << err.message;
  uint64_t token_bytes[5] = {}, session_bytes[5] = {};
  for (int kv : {KILN_KV_CACHE_DEFAULT, KILN_KV_CACHE_F32, KILN_KV_CACHE_F16, KILN_KV_CACHE_INT8, KILN_KV_CACHE_INT4}) {
    kiln_session_options_t so;
    kiln_session_options_init(&so);
    so.num_threads = 1;
    so.context_length = 256;
    so.kv_cache = kv;
    ASSERT_EQ(kiln_model_session_bytes(model, &so, &session_bytes[kv], &err), KILN_OK) << err.message;
    kiln_session_t* s = nullptr;
    ASSERT_EQ(kiln_session_create(model, &so, &s, &err), KILN_OK) << err.message;
    kiln_stats_t st = {};
    st.struct_size = sizeof(st);
    ASSERT_EQ(kiln_session_get_stats(s, &st), KILN_OK);
    EXPECT_EQ(st.kv_cache, kv == KILN_KV_CACHE_DEFAULT ? KILN_KV_CACHE_INT8 : kv);
    EXPECT_EQ(st.kv_cache_bytes, st.kv_cache_token_bytes * 256);
    token_bytes[kv] = st.kv_cache_token_bytes;
    kiln_session_release(s);
  }
  // tiny-llama: 2 layers, 2 kv heads of 16: 64 values per position and layer, keys and
  // values; int8 and int4 with one f32 scale per head (16 channels).
  EXPECT_EQ(token_bytes[KILN_KV_CACHE_F32], 2u * 2 * 32 * 4);
  EXPECT_EQ(token_bytes[KILN_KV_CACHE_F16], 2u * 2 * 32 * 2);
  EXPECT_EQ(token_bytes[KILN_KV_CACHE_INT8], 2u * 2 * (32 + 2 * 4));
  EXPECT_EQ(token_bytes[KILN_KV_CACHE_INT4], 2u * 2 * (16 + 2 * 4));
  EXPECT_EQ(token_bytes[KILN_KV_CACHE_DEFAULT], token_bytes[KILN_KV_CACHE_INT8]);
  EXPECT_GT(session_bytes[KILN_KV_CACHE_F32], session_bytes[KILN_KV_CACHE_INT8]);
  EXPECT_GT(session_bytes[KILN_KV_CACHE_INT8], session_bytes[KILN_KV_CACHE_INT4]);
  kiln_session_options_t so;
  kiln_session_options_init(&so);
  so.kv_cache = 9;
  kiln_session_t* s = nullptr;
  EXPECT_EQ(kiln_session_create(model, &so, &s, &err), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("kv_cache 9"), std::string::npos) << err.message;
  EXPECT_EQ(s, nullptr);
  kiln_model_release(model);
}

// The memory budget at load: the report's parts add up, the session part is what
// kiln_model_session_bytes says, a budget one byte short is refused naming the parts
// (and leaves no model), the exact figure loads.
TEST(MemoryBudget, RefusedBelowTheReportedNeed) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  const std::string path = GeneratedArtifact(dir, "tiny-llava");
  kiln_error_t err;
  kiln_model_t* model = nullptr;
  ASSERT_EQ(kiln_model_load(path.c_str(), nullptr, &model, &err), KILN_OK) << err.message;
  kiln_session_options_t so;
  kiln_session_options_init(&so);
  so.num_threads = 2;
  so.context_length = 512;
  so.kv_cache = KILN_KV_CACHE_INT4;
  kiln_memory_report_t r = {};
  EXPECT_EQ(kiln_model_memory_report(model, &so, &r, &err), KILN_ERROR_INVALID_ARGUMENT);  // struct_size unset
  r.struct_size = sizeof(r);
  ASSERT_EQ(kiln_model_memory_report(model, &so, &r, &err), KILN_OK) << err.message;
  uint64_t session_bytes = 0;
  ASSERT_EQ(kiln_model_session_bytes(model, &so, &session_bytes, &err), KILN_OK);
  EXPECT_EQ(r.session_bytes, session_bytes);
  EXPECT_EQ(r.total_bytes, r.weight_bytes + r.code_bytes + r.model_bytes + r.session_bytes);
  EXPECT_GT(r.weight_bytes, 0u);
  EXPECT_GT(r.code_bytes, 0u);
  EXPECT_GT(r.kv_cache_bytes, 0u);
  EXPECT_LT(r.kv_cache_bytes + r.arena_bytes, r.session_bytes);
  EXPECT_EQ(r.context_length, 512);
  EXPECT_EQ(r.kv_cache, KILN_KV_CACHE_INT4);
  kiln_model_release(model);

  kiln_model_options_t mo;
  kiln_model_options_init(&mo);
  mo.session = &so;
  mo.memory_budget = r.total_bytes - 1;
  model = nullptr;
  ASSERT_EQ(kiln_model_load(path.c_str(), &mo, &model, &err), KILN_ERROR_RESOURCE_EXHAUSTED);
  EXPECT_EQ(model, nullptr);
  for (const char* part : {"over the", "memory budget", "weights", "code", "model tables", "KV cache", "int4 for 512",
                           "arena"})
    EXPECT_NE(std::string(err.message).find(part), std::string::npos) << part << ": " << err.message;
  mo.memory_budget = r.total_bytes;
  ASSERT_EQ(kiln_model_load(path.c_str(), &mo, &model, &err), KILN_OK) << err.message;
  kiln_model_release(model);
  // Without session options the budget is for a default session.
  mo.session = nullptr;
  mo.memory_budget = 1000;
  EXPECT_EQ(kiln_model_load(path.c_str(), &mo, &model, &err), KILN_ERROR_RESOURCE_EXHAUSTED);
}

// The thread pool splits each op's work (output channels, rows, heads) in ranges; an
// output must not depend on the range it fell in: the generated and portable
// artifacts give the same logits, bit for bit, and tokens with 1, 2, 3 and 4 threads.
// (Under qemu-user too: the aarch64 tests run with the cross sysroot's glibc, see
// cmake/toolchains/aarch64-linux-clang.cmake.)
TEST(Threads, OutputsDoNotDependOnTheThreadCount) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  ASSERT_TRUE(ThreadsWork()) << "threads cannot be started here";
  int ran = 0;
  for (const std::string name : {"tiny-llama", "tiny-llava", "tiny-mixtral"})
    for (const std::string& path : {dir + "/" + name + ".kiln", GeneratedArtifact(dir, name + ".a8"),
                                   GeneratedArtifact(dir, name)}) {
      SCOPED_TRACE(path);
      kiln_error_t err;
      Outputs one;
      kiln_status_t st = RunVectors(path, dir + "/" + name, &one, &err, 1);
      if (st == KILN_ERROR_ARTIFACT_CPU_FEATURES) continue;  // this CPU lacks the artifact's features
      ASSERT_EQ(st, KILN_OK) << err.message;
      for (int threads : {2, 3, 4}) {
        Outputs many;
        ASSERT_EQ(RunVectors(path, dir + "/" + name, &many, &err, threads), KILN_OK) << err.message;
        ASSERT_EQ(many.logits.size(), one.logits.size());
        EXPECT_EQ(std::memcmp(many.logits.data(), one.logits.data(), one.logits.size() * 4), 0)
            << threads << " threads: other logits";
        EXPECT_EQ(many.tokens, one.tokens) << threads << " threads";
      }
      ++ran;
    }
  EXPECT_GE(ran, 6);
}

// SME2 (make_test_artifacts.py: SME2): the W4A8/W8A8 artifacts compiled for
// +sme,+sme2 run their many-row matmuls as outer products into ZA. Their integer
// sums and float operations are those of the NEON (i8mm) artifact of the same
// precision, so the logits are the same bit for bit, with 1 and 3 threads; and the
// greedy tokens are the portable artifact's. Skipped where the CPU (or qemu 7.2) has
// no SME2, unless KILN_REQUIRE_SME2 is set (the sme2-vl* ctest entries run this under
// an SME2 qemu at the streaming vector length KILN_EXPECT_SVL_BITS).
TEST(Sme2, GeneratedMatchesNeonArtifact) {
#if !defined(__aarch64__)
  GTEST_SKIP() << "AArch64 only";
#else
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  const bool required = std::getenv("KILN_REQUIRE_SME2") != nullptr;
#if defined(__linux__)
  // PR_SME_GET_VL: the streaming vector length in bytes (low 16 bits), or an error.
  const long vl = prctl(64, 0, 0, 0, 0);
  const int svlBits = vl < 0 ? 0 : static_cast<int>(vl & 0xffff) * 8;
  std::printf("streaming vector length: %d bits\n", svlBits);
  if (const char* expect = std::getenv("KILN_EXPECT_SVL_BITS")) EXPECT_EQ(svlBits, std::atoi(expect));
#endif
  int ran = 0;
  for (const char* preset : {"tiny-llava", "tiny-llama"}) {
    SCOPED_TRACE(preset);
    const std::string base = dir + "/" + preset;
    kiln_error_t err;
    Outputs sme, neon, portable;
    kiln_status_t st = RunVectors(base + ".a8.gen-aarch64-sme2.kiln", base, &sme, &err);
    if (st == KILN_ERROR_ARTIFACT_CPU_FEATURES && !required) GTEST_SKIP() << err.message;
    ASSERT_EQ(st, KILN_OK) << err.message;
    ASSERT_EQ(RunVectors(base + ".a8.gen-aarch64.kiln", base, &neon, &err), KILN_OK) << err.message;
    ASSERT_EQ(RunVectors(base + ".a8.kiln", base, &portable, &err), KILN_OK) << err.message;
    EXPECT_TRUE(sme.generated_a8);
    ASSERT_EQ(sme.logits.size(), neon.logits.size());
    EXPECT_EQ(std::memcmp(sme.logits.data(), neon.logits.data(), neon.logits.size() * 4), 0)
        << "SME2 logits differ from the NEON artifact's";
    EXPECT_EQ(sme.tokens, neon.tokens);
    EXPECT_EQ(sme.tokens, portable.tokens);
    Outputs threaded;
    ASSERT_EQ(RunVectors(base + ".a8.gen-aarch64-sme2.kiln", base, &threaded, &err, 3), KILN_OK) << err.message;
    EXPECT_EQ(std::memcmp(threaded.logits.data(), sme.logits.data(), sme.logits.size() * 4), 0)
        << "3 threads: other logits";
    // Prompts of fewer than 8 tokens run the SME2 GEMV (the multi-vector dot products)
    // row by row, decode's path: the same bits as NEON's.
    if (std::string(preset) == "tiny-llama")
      for (size_t cut : {1, 5}) {
        Outputs shortSme, shortNeon;
        ASSERT_EQ(RunVectors(base + ".a8.gen-aarch64-sme2.kiln", base, &shortSme, &err, 1, KILN_KV_CACHE_DEFAULT, 0,
                             cut),
                  KILN_OK)
            << err.message;
        ASSERT_EQ(RunVectors(base + ".a8.gen-aarch64.kiln", base, &shortNeon, &err, 1, KILN_KV_CACHE_DEFAULT, 0, cut),
                  KILN_OK)
            << err.message;
        ASSERT_EQ(shortSme.logits.size(), shortNeon.logits.size());
        EXPECT_EQ(std::memcmp(shortSme.logits.data(), shortNeon.logits.data(), shortNeon.logits.size() * 4), 0)
            << cut << "-token prompt: SME2 logits differ from the NEON artifact's";
        EXPECT_EQ(shortSme.tokens, shortNeon.tokens);
      }
    ++ran;
  }
  EXPECT_EQ(ran, 2);
#endif
}

// Decode speed counts forward passes: decode_steps is generated_tokens - 1, plus one when
// an end-of-sequence token (not part of the answer) ended it; decode_tokens_per_s is
// decode_steps over decode_ms. An output struct of an older, smaller size gets only its
// fields.
// tiny-llama with a 1-thread session; Answer() generates up to 6 tokens after 4 ids.
class TinyLlamaSession : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = ArtifactsDir();
    if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
    ASSERT_EQ(kiln_model_load((dir + "/tiny-llama.kiln").c_str(), nullptr, &model, &err), KILN_OK) << err.message;
    kiln_session_options_t so;
    kiln_session_options_init(&so);
    so.num_threads = 1;
    ASSERT_EQ(kiln_session_create(model, &so, &s, &err), KILN_OK) << err.message;
    kiln_generate_options_init(&go);
    go.max_new_tokens = 6;
  }
  void TearDown() override {
    kiln_session_release(s);
    kiln_model_release(model);
  }
  kiln_status_t Answer() { return kiln_session_generate_ids(s, ids, 4, &go, &err); }

  const int32_t ids[4] = {1, 5, 9, 12};
  kiln_error_t err = {};
  kiln_model_t* model = nullptr;
  kiln_session_t* s = nullptr;
  kiln_generate_options_t go = {};
};

TEST_F(TinyLlamaSession, StatsCountDecodeStepsAndRate) {
  ASSERT_EQ(Answer(), KILN_OK) << err.message;
  kiln_stats_t st = {};
  st.struct_size = sizeof(st);
  ASSERT_EQ(kiln_session_get_stats(s, &st), KILN_OK);
  EXPECT_EQ(st.struct_size, sizeof(st));
  EXPECT_GE(st.generated_tokens, 1);
  EXPECT_TRUE(st.decode_steps == st.generated_tokens - 1 ||
              (st.decode_steps == st.generated_tokens && st.generated_tokens < go.max_new_tokens))
      << st.decode_steps << " steps, " << st.generated_tokens << " tokens";
  if (st.decode_steps > 0) EXPECT_NEAR(st.decode_tokens_per_s, st.decode_steps / (st.decode_ms / 1000.0), 1e-6);
  // A caller built against a struct that ended before decode_steps.
  kiln_stats_t old = {};
  old.struct_size = offsetof(kiln_stats_t, decode_steps);
  old.decode_steps = -7;
  ASSERT_EQ(kiln_session_get_stats(s, &old), KILN_OK);
  EXPECT_EQ(old.struct_size, offsetof(kiln_stats_t, decode_steps));
  EXPECT_EQ(old.decode_steps, -7);
  EXPECT_EQ(old.generated_tokens, st.generated_tokens);
  kiln_stats_t unset = {};
  EXPECT_EQ(kiln_session_get_stats(s, &unset), KILN_ERROR_INVALID_ARGUMENT);
}

// kiln_session_get_op_profile: every op of every stage, each run counted once per
// stage run, times within the stage's; enabling again clears, disabling stops counting.
TEST_F(TinyLlamaSession, OpProfileCountsEveryOpOfEachStageRun) {
  size_t n = 0;
  EXPECT_EQ(kiln_session_get_op_profile(s, nullptr, 0, &n), KILN_ERROR_INVALID_ARGUMENT) << "never enabled";
  ASSERT_EQ(kiln_session_set_op_profiling(s, 1, &err), KILN_OK) << err.message;
  ASSERT_EQ(Answer(), KILN_OK) << err.message;
  kiln_stats_t st = {};
  st.struct_size = sizeof(st);
  ASSERT_EQ(kiln_session_get_stats(s, &st), KILN_OK);
  ASSERT_GT(st.decode_steps, 0);

  EXPECT_EQ(kiln_session_get_op_profile(s, nullptr, 3, &n), KILN_ERROR_INVALID_ARGUMENT) << "null out, capacity 3";
  ASSERT_EQ(kiln_session_get_op_profile(s, nullptr, 0, &n), KILN_OK);
  ASSERT_GT(n, 10u);  // a Llama layer alone has several ops
  std::vector<kiln_op_profile_t> ops(n + 2);
  size_t again = 0;
  ASSERT_EQ(kiln_session_get_op_profile(s, ops.data(), ops.size(), &again), KILN_OK);
  EXPECT_EQ(again, n);
  double prefill_ms = 0;
  int prefill_ops = 0, decode_ops = 0;
  for (size_t i = 0; i < n; ++i) {
    const kiln_op_profile_t& op = ops[i];
    ASSERT_TRUE(op.stage && op.name && op.kind && op.kernel) << i;
    EXPECT_GE(op.total_ms, 0.0);
    if (std::strcmp(op.stage, "DecoderPrefill") == 0) {
      EXPECT_EQ(op.calls, 1u) << op.name;  // one prefill of 4 tokens
      prefill_ms += op.total_ms;
      ++prefill_ops;
    } else if (std::strcmp(op.stage, "DecoderDecode") == 0) {
      EXPECT_EQ(op.calls, static_cast<uint64_t>(st.decode_steps)) << op.name;
      ++decode_ops;
    }
  }
  EXPECT_GT(prefill_ops, 0);
  EXPECT_GT(decode_ops, 0);
  EXPECT_LE(prefill_ms, st.prefill_ms + 1e-3);
  // A short buffer receives what fits; the count is the whole.
  kiln_op_profile_t first[2];
  ASSERT_EQ(kiln_session_get_op_profile(s, first, 2, &again), KILN_OK);
  EXPECT_EQ(again, n);
  EXPECT_STREQ(first[1].name, ops[1].name);

  // Enabled again: cleared. Disabled: nothing more is counted.
  ASSERT_EQ(kiln_session_set_op_profiling(s, 1, &err), KILN_OK);
  ASSERT_EQ(kiln_session_get_op_profile(s, ops.data(), ops.size(), &n), KILN_OK);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(ops[i].calls, 0u) << ops[i].name;
  ASSERT_EQ(kiln_session_set_op_profiling(s, 0, &err), KILN_OK);
  ASSERT_EQ(Answer(), KILN_OK) << err.message;
  ASSERT_EQ(kiln_session_get_op_profile(s, ops.data(), ops.size(), &n), KILN_OK);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(ops[i].calls, 0u) << ops[i].name;
}

// A follow-up question about the same image prefills only what differs from the
// previous call's prompt and answer; the image is encoded once. Its greedy tokens are
// a fresh session's.
TEST(PrefixReuse, FollowUpPrefillsOnlyItsNewTokens) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  kiln_error_t err;
  kiln_model_t* model = nullptr;
  ASSERT_EQ(kiln_model_load((dir + "/tiny-llava.kiln").c_str(), nullptr, &model, &err), KILN_OK) << err.message;
  kiln_model_info_t info = {};
  info.struct_size = sizeof(info);
  kiln_model_get_info(model, &info);
  std::vector<int32_t> prompt;
  std::vector<float> pixels;
  ASSERT_NO_FATAL_FAILURE(paged::ReadLlava(dir, &prompt, &pixels));
  std::vector<float> other = pixels;
  for (size_t i = 0; i < other.size(); i += 7) other[i] = -other[i] + 0.25f;
  const size_t first_image =
      std::find(prompt.begin(), prompt.end(), info.image_token_id) - prompt.begin();
  ASSERT_LT(first_image, prompt.size());
  ASSERT_GT(first_image, 0u);

  kiln_session_options_t so;
  kiln_session_options_init(&so);
  so.num_threads = 1;
  kiln_generate_options_t go;
  kiln_generate_options_init(&go);
  EXPECT_EQ(go.reuse_prefix, 1);
  go.max_new_tokens = 6;
  using Result = paged::Answer;
  auto ask = [&](kiln_session_t* s, const std::vector<int32_t>& ids, const kiln_generate_options_t& o) {
    Result r = paged::AskWith(s, ids, o);
    EXPECT_EQ(r.status, KILN_OK) << r.message;
    return r;
  };
  // What a new session answers (nothing to reuse).
  auto fresh = [&](const std::vector<float>& px, const std::vector<int32_t>& ids) {
    kiln_session_t* f = nullptr;
    EXPECT_EQ(kiln_session_create(model, &so, &f, &err), KILN_OK) << err.message;
    EXPECT_EQ(kiln_session_set_pixel_values(f, px.data(), px.size(), &err), KILN_OK) << err.message;
    Result r = ask(f, ids, go);
    EXPECT_EQ(r.stats.reused_tokens, 0);
    EXPECT_GT(r.stats.vision_encoder_ms, 0.0);
    kiln_session_release(f);
    return r.tokens;
  };

  kiln_session_t* s = nullptr;
  ASSERT_EQ(kiln_session_create(model, &so, &s, &err), KILN_OK) << err.message;
  ASSERT_EQ(kiln_session_set_pixel_values(s, pixels.data(), pixels.size(), &err), KILN_OK) << err.message;
  Result first = ask(s, prompt, go);
  EXPECT_EQ(first.stats.reused_tokens, 0);
  ASSERT_FALSE(first.tokens.empty());

  // Another question: the prompt's last token differs.
  std::vector<int32_t> second = prompt;
  second.back() = second.back() == 66 ? 67 : 66;
  Result r = ask(s, second, go);
  EXPECT_EQ(r.stats.reused_tokens, static_cast<int32_t>(prompt.size()) - 1);
  EXPECT_EQ(r.stats.prompt_tokens, static_cast<int32_t>(second.size()));
  EXPECT_EQ(r.stats.vision_encoder_ms, 0.0);
  EXPECT_EQ(r.stats.image_preprocess_ms, 0.0);
  EXPECT_EQ(r.tokens, fresh(pixels, second));

  // The same question again: everything but the last id, which gives the logits.
  r = ask(s, second, go);
  EXPECT_EQ(r.stats.reused_tokens, static_cast<int32_t>(second.size()) - 1);
  // The same pixels set again keep the encoded image and the cache.
  ASSERT_EQ(kiln_session_set_pixel_values(s, pixels.data(), pixels.size(), &err), KILN_OK) << err.message;
  r = ask(s, prompt, go);
  EXPECT_EQ(r.stats.reused_tokens, static_cast<int32_t>(prompt.size()) - 1);
  EXPECT_EQ(r.stats.vision_encoder_ms, 0.0);
  EXPECT_EQ(r.tokens, first.tokens);

  // The conversation continued: the prompt, the answer, a new turn. The answer's
  // tokens that were fed back (all but a last one that did not end it) are reused.
  const bool ended_by_eos = r.stats.decode_steps == r.stats.generated_tokens;
  const size_t fed = r.tokens.size() - (ended_by_eos ? 0 : 1);
  std::vector<int32_t> turn = prompt;
  turn.insert(turn.end(), r.tokens.begin(), r.tokens.end());
  turn.insert(turn.end(), {13, 90, 107});
  Result t = ask(s, turn, go);
  EXPECT_EQ(t.stats.reused_tokens, static_cast<int32_t>(prompt.size() + fed));
  EXPECT_EQ(t.tokens, fresh(pixels, turn));

  // Another image: only the ids before its first image token stay.
  ASSERT_EQ(kiln_session_set_pixel_values(s, other.data(), other.size(), &err), KILN_OK) << err.message;
  r = ask(s, prompt, go);
  EXPECT_EQ(r.stats.reused_tokens, static_cast<int32_t>(first_image));
  EXPECT_GT(r.stats.vision_encoder_ms, 0.0);
  EXPECT_EQ(r.tokens, fresh(other, prompt));

  // Reuse off: every id is prefilled. A caller built before reuse_prefix existed
  // gets the default.
  kiln_generate_options_t off = go;
  off.reuse_prefix = 0;
  r = ask(s, prompt, off);
  EXPECT_EQ(r.stats.reused_tokens, 0);
  kiln_generate_options_t old = go;
  old.struct_size = offsetof(kiln_generate_options_t, reuse_prefix);
  old.reuse_prefix = 0;
  r = ask(s, prompt, old);
  EXPECT_EQ(r.stats.reused_tokens, static_cast<int32_t>(prompt.size()) - 1);

  // prefill_logits and reset start over.
  std::vector<float> logits(prompt.size() * static_cast<size_t>(info.vocab_size));
  ASSERT_EQ(kiln_session_prefill_logits(s, prompt.data(), prompt.size(), logits.data(), logits.size(), &err), KILN_OK)
      << err.message;
  r = ask(s, prompt, go);
  EXPECT_EQ(r.stats.reused_tokens, static_cast<int32_t>(prompt.size()) - 1);  // prefill_logits filled the cache
  ASSERT_EQ(kiln_session_reset(s), KILN_OK);
  ASSERT_EQ(kiln_session_set_pixel_values(s, pixels.data(), pixels.size(), &err), KILN_OK) << err.message;
  r = ask(s, prompt, go);
  EXPECT_EQ(r.stats.reused_tokens, 0);
  EXPECT_GT(r.stats.vision_encoder_ms, 0.0);
  EXPECT_EQ(r.tokens, first.tokens);
  kiln_session_release(s);
  kiln_model_release(model);
}

// A paged KV cache (kiln_model_options_t.kv_pool_tokens): sessions take blocks from
// the model's pool as they fill, in any order, and answer exactly as with their own
// contiguous cache, through the built-in and the generated attention kernels (f32 and
// int8 caches).
TEST(PagedKv, BlocksInAnyOrderGiveTheContiguousCachesTokens) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  std::vector<int32_t> prompt;
  for (int i = 0; i < 29; ++i) prompt.push_back(1 + (i * 37) % 200);
  std::vector<int32_t> other = prompt;
  other.resize(13);
  other[0] = 251;  // nothing in common with the others
  // The portable artifact (reference kernels), the generated ones (f32 and int8
  // caches), and a generated one with an f16 session cache, which its generated
  // kernel does not read (the built-in one: AVX-512 on x86, the reference on Arm).
  // Blocks of 8 positions; of 16 for the int8 cache, whose blocks hold whole spans
  // (its group of 16 channels: keys per channel over 16 positions).
  struct Case {
    std::string name;
    int kv;
    int block;
  };
  const std::string gen = GeneratedArtifact(dir, "tiny-llama").substr(dir.size() + 1);
  const Case cases[] = {{"tiny-llama.kiln", KILN_KV_CACHE_DEFAULT, 8},
                        {gen, KILN_KV_CACHE_DEFAULT, 8},
                        {GeneratedArtifact(dir, "tiny-llama.kv8").substr(dir.size() + 1), KILN_KV_CACHE_DEFAULT, 16},
                        {gen, KILN_KV_CACHE_F16, 8}};
  for (const auto& [name, kv, block] : cases) {
    SCOPED_TRACE(name + " kv_cache " + std::to_string(kv));
    const std::string path = dir + "/" + name;
    kiln_model_t* flat = paged::Load(path, 0, 0);
    ASSERT_NE(flat, nullptr);
    kiln_session_t* f = paged::Session(flat, 128, kv);
    const paged::Answer expected = paged::Ask(f, prompt, 12);
    ASSERT_EQ(expected.status, KILN_OK) << expected.message;
    EXPECT_EQ(expected.stats.kv_block_tokens, 0);
    kiln_session_release(f);
    kiln_model_release(flat);

    // The pool's encoding is the budget session's (NULL: the artifact's).
    kiln_session_options_t pool_so;
    kiln_session_options_init(&pool_so);
    pool_so.kv_cache = kv;
    kiln_model_options_t mo;
    kiln_model_options_init(&mo);
    mo.kv_pool_tokens = 12 * block;
    mo.kv_block_tokens = block;
    mo.session = &pool_so;
    kiln_model_t* model = nullptr;
    kiln_error_t err;
    ASSERT_EQ(kiln_model_load(path.c_str(), &mo, &model, &err), KILN_OK) << err.message;
    // Session a takes the first blocks, b the next ones; a's return to the pool and
    // c takes the never used ones, then a's in the order they were freed, so that its
    // positions map to blocks out of order and away from row 0. (a asks something
    // else, so that c finds none of a's blocks.)
    kiln_session_t* a = paged::Session(model, 128, kv);
    kiln_session_t* b = paged::Session(model, 128, kv);
    std::vector<int32_t> shifted = prompt;
    shifted[0] = 250;
    ASSERT_EQ(paged::Ask(a, shifted, 12).status, KILN_OK);
    const paged::Answer in_b = paged::Ask(b, other, 4);
    ASSERT_EQ(in_b.status, KILN_OK) << in_b.message;
    EXPECT_EQ(in_b.stats.kv_block_tokens, block);
    EXPECT_EQ(in_b.stats.kv_pool_blocks, 12);
    EXPECT_EQ(in_b.stats.kv_blocks, (13 + in_b.stats.decode_steps + block - 1) / block);
    kiln_session_release(a);
    kiln_session_t* c = paged::Session(model, 128, kv);
    const paged::Answer got = paged::Ask(c, prompt, 12);
    ASSERT_EQ(got.status, KILN_OK) << got.message;
    EXPECT_EQ(got.stats.reused_tokens, 0);
    EXPECT_EQ(got.tokens, expected.tokens);
    EXPECT_EQ(got.stats.kv_blocks, static_cast<int32_t>((prompt.size() + got.stats.decode_steps + block - 1) / block));
    // Shorter conversations return blocks (c keeps the block it finds of b's); released
    // sessions return all of theirs.
    ASSERT_EQ(paged::Ask(c, other, 1).status, KILN_OK);
    kiln_stats_t st = {};
    st.struct_size = sizeof(st);
    kiln_session_get_stats(c, &st);
    EXPECT_EQ(st.kv_blocks, (13 + 1 + block - 1) / block);
    kiln_session_release(b);
    kiln_session_release(c);
    kiln_session_t* d = paged::Session(model, 128, kv);
    kiln_session_get_stats(d, &st);
    EXPECT_EQ(st.kv_pool_blocks_used, 0);
    kiln_session_release(d);
    kiln_model_release(model);
  }
}

TEST(PagedKv, OutOfBlocksIsAStatusNotACrash) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  kiln_model_t* model = paged::Load(dir + "/tiny-llama.kiln", 24, 8);  // 3 blocks
  ASSERT_NE(model, nullptr);
  kiln_session_t* a = paged::Session(model);
  kiln_session_t* b = paged::Session(model);
  std::vector<int32_t> prompt(20, 5);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 1 + static_cast<int32_t>(i) * 3;
  ASSERT_EQ(paged::Ask(a, prompt, 2).status, KILN_OK);  // 3 blocks
  std::vector<int32_t> other = prompt;
  other[0] = 250;  // nothing of a's to find
  paged::Answer full = paged::Ask(b, other, 2);
  EXPECT_EQ(full.status, KILN_ERROR_RESOURCE_EXHAUSTED);
  for (const char* part : {"KV block pool is full", "3 blocks of 8 tokens", "position 0"})
    EXPECT_NE(full.message.find(part), std::string::npos) << part << ": " << full.message;
  // Decode running out: a's own conversation grows past the pool.
  paged::Answer longer = paged::Ask(a, prompt, 30);
  EXPECT_EQ(longer.status, KILN_ERROR_RESOURCE_EXHAUSTED) << longer.message;
  EXPECT_NE(longer.message.find("position 24"), std::string::npos) << longer.message;
  // Blocks come back: b fits once a is reset.
  kiln_session_reset(a);
  EXPECT_EQ(paged::Ask(b, other, 2).status, KILN_OK);
  kiln_session_release(a);
  kiln_session_release(b);
  kiln_model_release(model);
  // Invalid pool settings.
  kiln_status_t st = KILN_OK;
  std::string message;
  EXPECT_EQ(paged::Load(dir + "/tiny-llama.kiln", 64, 12, &st, &message), nullptr);
  EXPECT_EQ(st, KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("power of two"), std::string::npos) << message;
  EXPECT_EQ(paged::Load(dir + "/tiny-llama.kiln", -1, 0, &st, &message), nullptr);
  EXPECT_EQ(st, KILN_ERROR_INVALID_ARGUMENT);
}

// kiln_session_fork: the fork shares the image and the prefix's blocks; each side's
// next question copies the block it writes into, so neither disturbs the other.
TEST(PagedKv, ForkSharesThePrefixCopyOnWrite) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  std::vector<int32_t> prompt;
  std::vector<float> pixels;
  ASSERT_NO_FATAL_FAILURE(paged::ReadLlava(dir, &prompt, &pixels));
  std::vector<int32_t> q2 = prompt, q3 = prompt;
  q2.back() = 66;
  q3.back() = 67;
  q3.push_back(70);
  for (int64_t pool : {int64_t{0}, int64_t{512}}) {
    SCOPED_TRACE(pool);
    kiln_model_t* model = paged::Load(dir + "/tiny-llava.kiln", pool, 16);
    ASSERT_NE(model, nullptr);
    auto fresh = [&](const std::vector<int32_t>& ids) { return paged::AskNew(model, pixels, ids).tokens; };
    const std::vector<int32_t> want2 = fresh(q2), want3 = fresh(q3), want1 = fresh(prompt);
    kiln_session_t* a = paged::Session(model);
    kiln_error_t err;
    ASSERT_EQ(kiln_session_set_pixel_values(a, pixels.data(), pixels.size(), &err), KILN_OK);
    ASSERT_EQ(paged::Ask(a, prompt).status, KILN_OK);
    kiln_session_t* b = nullptr;
    ASSERT_EQ(kiln_session_fork(a, &b, &err), KILN_OK) << err.message;
    kiln_stats_t st = {};
    st.struct_size = sizeof(st);
    if (pool > 0) {
      kiln_session_get_stats(a, &st);
      const int32_t used = st.kv_pool_blocks_used;
      kiln_session_get_stats(b, &st);
      EXPECT_EQ(st.kv_pool_blocks_used, used);  // shared, not copied
      EXPECT_EQ(st.kv_blocks, used);
    }
    paged::Answer rb = paged::Ask(b, q2);
    ASSERT_EQ(rb.status, KILN_OK) << rb.message;
    EXPECT_EQ(rb.stats.reused_tokens, static_cast<int32_t>(prompt.size()) - 1);
    EXPECT_EQ(rb.stats.vision_encoder_ms, 0.0);
    EXPECT_EQ(rb.tokens, want2);
    paged::Answer ra = paged::Ask(a, q3);
    ASSERT_EQ(ra.status, KILN_OK) << ra.message;
    // Its own prompt's, or more: with a pool, the block the session that computed
    // want3 filled is still there to be found.
    EXPECT_GE(ra.stats.reused_tokens, static_cast<int32_t>(prompt.size()) - 1);
    EXPECT_EQ(ra.tokens, want3);
    // b again, after a wrote its own question: b's blocks are b's.
    paged::Answer rb1 = paged::Ask(b, prompt);
    EXPECT_EQ(rb1.stats.reused_tokens, static_cast<int32_t>(prompt.size()) - 1);
    EXPECT_EQ(rb1.tokens, want1);
    kiln_session_release(a);
    kiln_session_release(b);
    kiln_model_release(model);
  }
}

// Sessions of a paged cache that start with the same tokens (the same image and
// prompt) find the blocks another session filled (whole ones, then the common part of
// the next, copied), also after it ended, and prefill only the rest; another image
// finds nothing past the first image token.
TEST(PagedKv, SessionsFindTheBlocksOfTheSamePrefix) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  std::vector<int32_t> prompt;
  std::vector<float> pixels;
  ASSERT_NO_FATAL_FAILURE(paged::ReadLlava(dir, &prompt, &pixels));
  std::vector<float> other = pixels;
  for (size_t i = 0; i < other.size(); i += 5) other[i] = 0.5f - other[i];
  std::vector<int32_t> q2 = prompt;
  q2.back() = q2.back() == 66 ? 67 : 66;
  const int32_t all_but_last = static_cast<int32_t>(prompt.size()) - 1;
  ASSERT_GE(all_but_last, 24);
  // The answers of sessions with their own caches.
  kiln_model_t* flat = paged::Load(dir + "/tiny-llava.kiln", 0, 0);
  ASSERT_NE(flat, nullptr);
  auto unpaged = [&](const std::vector<float>& px, const std::vector<int32_t>& ids) {
    return paged::AskNew(flat, px, ids).tokens;
  };
  kiln_model_t* model = paged::Load(dir + "/tiny-llava.kiln", 512, 8);
  ASSERT_NE(model, nullptr);
  auto ask = [&](const std::vector<float>& px, const std::vector<int32_t>& ids, kiln_session_t** keep = nullptr) {
    return paged::AskNew(model, px, ids, keep);
  };
  kiln_session_t* a = nullptr;
  const paged::Answer first = ask(pixels, prompt, &a);
  EXPECT_EQ(first.stats.reused_tokens, 0);
  EXPECT_GT(first.stats.vision_encoder_ms, 0.0);
  EXPECT_EQ(first.tokens, unpaged(pixels, prompt));
  // Another session, same image, another question: a's full blocks.
  kiln_session_t* b = nullptr;
  paged::Answer second = ask(pixels, q2, &b);
  EXPECT_EQ(second.stats.reused_tokens, all_but_last);  // whole blocks, then part of the next
  EXPECT_EQ(second.stats.vision_encoder_ms, 0.0);  // every image token was in a found block
  EXPECT_EQ(second.tokens, unpaged(pixels, q2));
  kiln_stats_t st = {};
  st.struct_size = sizeof(st);
  kiln_session_get_stats(b, &st);
  EXPECT_LT(st.kv_pool_blocks_used, first.stats.kv_blocks + st.kv_blocks);  // shared
  // b's next question writes into its own copies, a still answers as before.
  std::vector<int32_t> turn = q2;
  turn.insert(turn.end(), {13, 90, 107, 287});
  paged::Answer b2 = paged::Ask(b, turn);
  EXPECT_EQ(b2.tokens, unpaged(pixels, turn));
  paged::Answer a2 = paged::Ask(a, prompt);
  EXPECT_EQ(a2.tokens, first.tokens);
  kiln_session_release(a);
  kiln_session_release(b);
  // The blocks stay findable after their sessions ended, until they are taken again.
  paged::Answer third = ask(pixels, q2);
  EXPECT_EQ(third.stats.reused_tokens, all_but_last);
  EXPECT_EQ(third.tokens, second.tokens);
  // Another image: what comes before the first image token is found (in part of a
  // block), nothing after.
  kiln_model_info_t info = {};
  info.struct_size = sizeof(info);
  kiln_model_get_info(model, &info);
  const int64_t first_image = std::find(prompt.begin(), prompt.end(), info.image_token_id) - prompt.begin();
  paged::Answer changed = ask(other, prompt);
  EXPECT_EQ(changed.stats.reused_tokens, first_image);
  EXPECT_GT(changed.stats.vision_encoder_ms, 0.0);
  EXPECT_EQ(changed.tokens, unpaged(other, prompt));
  kiln_model_release(model);
  kiln_model_release(flat);
}

// Sampling settings out of range are refused (they were read as "off" silently).
TEST(GenerateOptions, OutOfRangeSamplingIsRejected) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  kiln_error_t err;
  kiln_model_t* model = nullptr;
  ASSERT_EQ(kiln_model_load((dir + "/tiny-llama.kiln").c_str(), nullptr, &model, &err), KILN_OK) << err.message;
  kiln_session_options_t so = {};
  so.struct_size = sizeof(so);
  so.num_threads = 1;
  kiln_session_t* s = nullptr;
  ASSERT_EQ(kiln_session_create(model, &so, &s, &err), KILN_OK) << err.message;
  const int32_t ids[] = {1, 5, 9};
  struct Case {
    float temperature, top_p;
    int32_t top_k;
    const char* message;
  };
  for (const Case& c : {Case{-1.0f, 1.0f, 0, "temperature -1"}, Case{INFINITY, 1.0f, 0, "temperature inf"},
                        Case{NAN, 1.0f, 0, "temperature nan"}, Case{0.7f, 7.0f, 0, "top_p 7"},
                        Case{0.7f, -0.5f, 0, "top_p -0.5"}, Case{0.7f, 1.0f, -3, "top_k -3"}}) {
    kiln_generate_options_t go;
    kiln_generate_options_init(&go);
    go.max_new_tokens = 2;
    go.temperature = c.temperature;
    go.top_p = c.top_p;
    go.top_k = c.top_k;
    EXPECT_EQ(kiln_session_generate_ids(s, ids, 3, &go, &err), KILN_ERROR_INVALID_ARGUMENT) << c.message;
    EXPECT_NE(std::string(err.message).find(c.message), std::string::npos) << err.message;
  }
  kiln_generate_options_t go;  // in range: sampling runs
  kiln_generate_options_init(&go);
  go.max_new_tokens = 2;
  go.temperature = 0.7f;
  go.top_p = 0.9f;
  go.top_k = 5;
  EXPECT_EQ(kiln_session_generate_ids(s, ids, 3, &go, &err), KILN_OK) << err.message;
  kiln_session_release(s);
  kiln_model_release(model);
}

// An int8 override of a [rows, cols] weight for kiln_calib_override_weight: seeded
// random codes, then one f32 scale per row.
std::vector<uint8_t> RandomInt8Weight(const fb::Tensor* t, unsigned seed, float scale) {
  const int64_t rows = t->shape()->Get(0), cols = t->shape()->Get(1);
  std::vector<uint8_t> q(rows * cols + 4 * rows);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < rows * cols; ++i) q[i] = static_cast<uint8_t>(rng() % 255);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(q.data() + rows * cols + 4 * r, &scale, 4);
  return q;
}

// Calibration replaces weights with other encodings in a loaded model
// (kiln_calib_override_weight). A generated kernel is specialised to the stored
// encoding, so ops reading an overridden weight run the reference until it is
// restored: the generated artifact then gives the portable artifact's logits.
TEST(GeneratedKernels, CalibrationOverrideRunsTheReference) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  const std::string gen = GeneratedArtifact(dir, "tiny-llama");
  std::vector<int32_t> ids = {1, 5, 9, 200, 17, 3};
  auto logits = [&](const std::string& path, bool override_table, bool restore) {
    kiln_error_t err;
    kiln_model_t* model = nullptr;
    EXPECT_EQ(kiln_model_load(path.c_str(), nullptr, &model, &err), KILN_OK) << err.message;
    std::vector<float> out;
    if (model == nullptr) return out;
    std::vector<uint8_t> bytes;
    EXPECT_TRUE(ReadFile(path, &bytes));
    const fb::Model* f = fb::GetSizePrefixedModel(bytes.data());
    uint32_t table = 0;
    for (uint32_t t = 0; t < f->tensors()->size(); ++t)
      if (f->tensors()->Get(t)->name()->str() == "model.embed_tokens.weight") table = t;
    // int8 codes and per-row scales, the same bytes for every artifact.
    const std::vector<uint8_t> q = RandomInt8Weight(f->tensors()->Get(table), 5, 0.01f);
    kiln_calib_encoding_t enc = {5 /* int8 */, 0, 1, 0};
    if (override_table) {
      EXPECT_EQ(kiln_calib_override_weight(model, table, q.data(), &enc, &err), KILN_OK) << err.message;
      if (restore) kiln_calib_restore_weight(model, table);
    }
    kiln_session_options_t so = {};
    so.struct_size = sizeof(so);
    so.num_threads = 1;
    kiln_session_t* s = nullptr;
    EXPECT_EQ(kiln_session_create(model, &so, &s, &err), KILN_OK) << err.message;
    kiln_model_info_t info = {};
    info.struct_size = sizeof(info);
    kiln_model_get_info(model, &info);
    out.assign(ids.size() * static_cast<size_t>(info.vocab_size), 0.0f);
    EXPECT_EQ(kiln_session_prefill_logits(s, ids.data(), ids.size(), out.data(), out.size(), &err), KILN_OK)
        << err.message;
    kiln_session_release(s);
    kiln_model_release(model);
    return out;
  };
  auto worst = [](const std::vector<float>& a, const std::vector<float>& b) {
    double w = 0;
    for (size_t i = 0; i < a.size(); ++i) w = std::max(w, static_cast<double>(std::fabs(a[i] - b[i])));
    return w;
  };
  const std::vector<float> want = logits(dir + "/tiny-llama.kiln", true, false);
  const std::vector<float> got = logits(gen, true, false);
  ASSERT_EQ(want.size(), got.size());
  EXPECT_LE(worst(want, got), 1e-4);
  // Restored: the generated kernels again, the artifact's own outputs.
  const std::vector<float> plain = logits(gen, false, false), restored = logits(gen, true, true);
  EXPECT_EQ(worst(plain, restored), 0.0);
  EXPECT_GT(worst(plain, got), 1e-3);  // the override did change the outputs
}

// A mixture's experts gather the tokens routed to them. Float activations read them
// where they are, so the session's scratch holds no copy of them; an observer, or int8
// activations for one of an expert's gate and up (a calibration override), still
// copies them: to the scratch's end where it has room, else to the heap. The logits
// stay those of the plain run (observer) or change and come back (override); under
// AddressSanitizer a copy past the scratch fails here.
TEST(Moe, GatheredRowsAreCopiedOnlyWhereThereIsRoom) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  for (const std::string& path : {dir + "/tiny-mixtral.kiln", GeneratedArtifact(dir, "tiny-mixtral")}) {
    SCOPED_TRACE(path);
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(ReadFile(path, &bytes));
    const fb::Model* f = fb::GetSizePrefixedModel(bytes.data());
    uint32_t gate = UINT32_MAX;
    for (uint32_t t = 0; t < f->tensors()->size(); ++t)
      if (f->tensors()->Get(t)->name()->str() == "model.layers.0.block_sparse_moe.experts.0.w1.weight") gate = t;
    ASSERT_NE(gate, UINT32_MAX);
    const std::vector<uint8_t> q = RandomInt8Weight(f->tensors()->Get(gate), 7, 0.02f);
    kiln_error_t err;
    kiln_model_t* model = nullptr;
    kiln_status_t st = kiln_model_load(path.c_str(), nullptr, &model, &err);
    if (st == KILN_ERROR_ARTIFACT_CPU_FEATURES) continue;
    ASSERT_EQ(st, KILN_OK) << err.message;
    kiln_model_info_t info = {};
    info.struct_size = sizeof(info);
    kiln_model_get_info(model, &info);
    const std::vector<int32_t> ids = {1, 5, 9, 200, 17, 3, 44, 61, 8, 120, 33, 2};
    // One session throughout, made before the override (as the sensitivity loop does):
    // its scratch was sized for float experts.
    kiln_session_options_t so = {};
    so.struct_size = sizeof(so);
    so.num_threads = 2;
    kiln_session_t* s = nullptr;
    ASSERT_EQ(kiln_session_create(model, &so, &s, &err), KILN_OK) << err.message;
    int64_t observed = 0;
    auto logits = [&](bool observe) {
      std::vector<float> out(ids.size() * static_cast<size_t>(info.vocab_size), 0.0f);
      if (observe)
        kiln_calib_set_weight_observer(
            s, [](void* user, uint32_t, const float*, int64_t, int64_t, int64_t) { ++*static_cast<int64_t*>(user); },
            &observed);
      else
        kiln_calib_set_weight_observer(s, nullptr, nullptr);
      EXPECT_EQ(kiln_session_reset(s), KILN_OK);
      EXPECT_EQ(kiln_session_prefill_logits(s, ids.data(), ids.size(), out.data(), out.size(), &err), KILN_OK)
          << err.message;
      return out;
    };
    const std::vector<float> plain = logits(false);
    EXPECT_EQ(logits(true), plain);  // copied for the observer, the same products
    EXPECT_GT(observed, 0);
    // Calibration overrides need row-major weights: the portable artifact only.
    kiln_calib_encoding_t enc = {5 /* int8 */, 0, 1, /*int8_activations=*/1};
    if (f->tensors()->Get(gate)->layout() != fb::Layout::RowMajor) {
      kiln_session_release(s);
      kiln_model_release(model);
      continue;
    }
    ASSERT_EQ(kiln_calib_override_weight(model, gate, q.data(), &enc, &err), KILN_OK) << err.message;
    const std::vector<float> mixed = logits(false), mixed_observed = logits(true);
    kiln_calib_restore_weight(model, gate);
    EXPECT_EQ(mixed, mixed_observed);
    double changed = 0;
    for (size_t i = 0; i < plain.size(); ++i) {
      ASSERT_TRUE(std::isfinite(mixed[i]));
      changed = std::max(changed, static_cast<double>(std::fabs(mixed[i] - plain[i])));
    }
    EXPECT_GT(changed, 1e-4);  // expert 0's int8 gate was used
    EXPECT_EQ(logits(false), plain);
    kiln_session_release(s);
    kiln_model_release(model);
  }
}

// Packed weight layouts (formats/encoding.h int4_p16k8): the generated W4A8 artifacts
// store their int4 weights packed, and the verifier refuses a packed weight that the
// bound kernel does not read (int4_p128k4: only SME2 code; int4_p16k16: only i8mm
// code; the artifact assumes neither) or whose encoding and
// shape the layout cannot hold.
TEST(PackedLayout, OnlyTheKernelsThatReadItMayBeBoundToIt) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  const std::string path = GeneratedArtifact(dir, "tiny-llama.a8");
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(ReadFile(path, &bytes)) << path;
  const fb::Model* m = fb::GetSizePrefixedModel(bytes.data());
  // The first op reading a packed weight, and that weight.
  int64_t stage = -1, op = -1, slot = -1;
  for (uint32_t si = 0; si < m->stages()->size() && stage < 0; ++si)
    for (uint32_t oi = 0; oi < m->stages()->Get(si)->ops()->size() && stage < 0; ++oi) {
      const fb::Op* o = m->stages()->Get(si)->ops()->Get(oi);
      for (uint32_t wi = 0; wi < o->weights()->size(); ++wi)
        if (m->tensors()->Get(o->weights()->Get(wi))->layout() == fb::Layout::Int4P16K8) {
          stage = si, op = oi, slot = wi;
          break;
        }
    }
  ASSERT_GE(stage, 0) << "no packed weight in " << path;
  const uint32_t tensor = m->stages()->Get(stage)->ops()->Get(op)->weights()->Get(slot);
  uint32_t f32Tensor = 0;
  for (uint32_t t = 0; t < m->tensors()->size(); ++t)
    if (m->tensors()->Get(t)->encoding() == fb::Encoding::F32) f32Tensor = t;
  const uint32_t portable = PortableKernelOf(m->stages()->Get(stage)->ops()->Get(op)->kind());
  struct Case {
    const char* name;
    kiln_status_t expected;
    const char* message;
    std::function<void(fb::ModelT&)> edit;
  };
  const std::vector<Case> cases = {
      {"bound to the reference kernel", KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL, "in layout int4_p16k8",
       [&](fb::ModelT& mt) { mt.stages[stage]->ops[op]->kernel = portable; }},
      {"packed f32 weight", KILN_ERROR_ARTIFACT_SHAPE, "layout int4_p16k8 ",
       [&](fb::ModelT& mt) { mt.tensors[f32Tensor]->layout = fb::Layout::Int4P16K8; }},
      {"int4_p128k4 in code that does not assume SME2", KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL, "in layout int4_p128k4",
       [&](fb::ModelT& mt) { mt.tensors[tensor]->layout = fb::Layout::Int4P128K4; }},
      {"int4_p16k16 in code that does not assume i8mm", KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL, "in layout int4_p16k16",
       [&](fb::ModelT& mt) { mt.tensors[tensor]->layout = fb::Layout::Int4P16K16; }},
      {"packed with zero points", KILN_ERROR_ARTIFACT_SHAPE, "",
       [&](fb::ModelT& mt) { mt.tensors[tensor]->symmetric = false; }},
      {"unknown layout", KILN_ERROR_UNSUPPORTED, "layout 9",
       [&](fb::ModelT& mt) { mt.tensors[tensor]->layout = static_cast<fb::Layout>(9); }},
      {"retired layout (schema 1.2's int4_p4k32)", KILN_ERROR_UNSUPPORTED, "layout 1 is not supported",
       [&](fb::ModelT& mt) { mt.tensors[tensor]->layout = fb::Layout::Int4P4K32Retired; }},
  };
  for (const Case& c : cases) {
    ExpectLoadRefused(RewriteArtifact(bytes, c.edit), c.expected, c.message, c.name);
  }
  // Calibration may not replace a weight of an op that also reads a packed one: the
  // reference kernel the op would then run reads row-major weights only.
  kiln_error_t err;
  kiln_model_t* model = nullptr;
  kiln_status_t st = kiln_model_load(path.c_str(), nullptr, &model, &err);
  if (st == KILN_ERROR_ARTIFACT_CPU_FEATURES) GTEST_SKIP() << err.message;
  ASSERT_EQ(st, KILN_OK) << err.message;
  const fb::Op* o = m->stages()->Get(stage)->ops()->Get(op);
  if (o->weights()->size() > 1) {
    const uint32_t other = o->weights()->Get(slot == 0 ? 1 : 0);
    const fb::Tensor* t = m->tensors()->Get(other);
    std::vector<uint8_t> q(t->size(), 0);
    kiln_calib_encoding_t enc = {static_cast<uint8_t>(t->encoding()), t->group_size(),
                                 static_cast<uint8_t>(t->symmetric()), 1};
    EXPECT_EQ(kiln_calib_override_weight(model, other, q.data(), &enc, &err), KILN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(err.message, "packed"), nullptr) << err.message;
  }
  kiln_model_release(model);
}

// panel16 (float weights packed for the generated float matmuls): the generated f32
// artifacts store their matmul weights so; a panel16 weight bound to the reference
// kernel, or a norm's weight marked panel16, is refused.
TEST(PackedLayout, Panel16IsReadOnlyByGeneratedFloatMatmuls) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  const std::string path = GeneratedArtifact(dir, "tiny-llama");
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(ReadFile(path, &bytes)) << path;
  const fb::Model* m = fb::GetSizePrefixedModel(bytes.data());
  int64_t stage = -1, op = -1, norm = -1, normStage = -1;
  for (uint32_t si = 0; si < m->stages()->size(); ++si)
    for (uint32_t oi = 0; oi < m->stages()->Get(si)->ops()->size(); ++oi) {
      const fb::Op* o = m->stages()->Get(si)->ops()->Get(oi);
      if (o->kind() == fb::OpKind::RmsNorm && norm < 0) norm = oi, normStage = si;
      if (stage < 0 && o->weights()->size() > 0 &&
          m->tensors()->Get(o->weights()->Get(0))->layout() == fb::Layout::Panel16)
        stage = si, op = oi;
    }
  ASSERT_GE(stage, 0) << "no panel16 weight in " << path;
  ASSERT_GE(norm, 0);
  const uint32_t portable = PortableKernelOf(m->stages()->Get(stage)->ops()->Get(op)->kind());
  const uint32_t normWeight = m->stages()->Get(normStage)->ops()->Get(norm)->weights()->Get(0);
  struct Case {
    const char* name;
    kiln_status_t expected;
    const char* message;
    std::function<void(fb::ModelT&)> edit;
  };
  const Case cases[] = {
      {"bound to the reference kernel", KILN_ERROR_ARTIFACT_UNKNOWN_KERNEL, "in layout panel16",
       [&](fb::ModelT& mt) { mt.stages[stage]->ops[op]->kernel = portable; }},
      // A vector is never packed, whichever op reads it.
      {"norm weight in panel16", KILN_ERROR_ARTIFACT_SHAPE, "layout panel16 needs a matrix",
       [&](fb::ModelT& mt) { mt.tensors[normWeight]->layout = fb::Layout::Panel16; }},
  };
  for (const Case& c : cases) {
    ExpectLoadRefused(RewriteArtifact(bytes, c.edit), c.expected, c.message, c.name);
  }
}

TEST(ModelLoad, MissingFileAndBadArguments) {
  kiln_error_t err;
  kiln_model_t* model = nullptr;
  EXPECT_EQ(kiln_model_load("/nonexistent/model.kiln", nullptr, &model, &err), KILN_ERROR_IO);
  EXPECT_NE(std::strstr(err.message, "/nonexistent/model.kiln"), nullptr) << err.message;
  EXPECT_EQ(kiln_model_load(nullptr, nullptr, &model, &err), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_model_load_from_memory(nullptr, 0, nullptr, &model, &err), KILN_ERROR_INVALID_ARGUMENT);
}

}  // namespace

// Fused weights (schema 1.9, 1.14): a gated MLP's interleaved gate/up and a patch
// embedding's position table and class embedding are checked like any other operands; a
// damaged op is refused at load, naming it, never run.
TEST(FusedWeights, DamagedGateUpPositionTablesAndClassTokensAreRefused) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  struct Case {
    const char* model;
    const char* name;
    fb::OpKind kind;
    kiln_status_t expected;
    const char* message;
    std::function<void(fb::OpT&)> edit;
  };
  const std::vector<Case> cases = {
      {"tiny-llama", "gate_up_block above 256", fb::OpKind::GatedMlp, KILN_ERROR_ARTIFACT_OP, "gate_up_block above 256",
       [](fb::OpT& op) { op.params.AsGatedMlpParams()->gate_up_block = 1024; }},
      {"tiny-llama", "unfused gate/up marked fused", fb::OpKind::GatedMlp, KILN_ERROR_ARTIFACT_SHAPE,
       "expects gate/up [I, H]", [](fb::OpT& op) { op.params.AsGatedMlpParams()->gate_up_block = 0; }},
      {"tiny-llama", "down read as gate/up", fb::OpKind::GatedMlp, KILN_ERROR_ARTIFACT_SHAPE,
       "expects gate/up [2I, H]", [](fb::OpT& op) { std::swap(op.weights[0], op.weights[1]); }},
      {"tiny-idefics3", "position table before the bias", fb::OpKind::PatchEmbed, KILN_ERROR_ARTIFACT_SHAPE,
       "an optional bias [D] and an optional position table", [](fb::OpT& op) { std::swap(op.weights[1], op.weights[2]); }},
      {"tiny-idefics3", "the kernel as its own position table", fb::OpKind::PatchEmbed, KILN_ERROR_ARTIFACT_SHAPE,
       "", [](fb::OpT& op) { op.weights[2] = op.weights[0]; }},
      // CLIP (1.14): the class embedding after the position table.
      {"tiny-llava", "a class token without its flag", fb::OpKind::PatchEmbed, KILN_ERROR_ARTIFACT_SHAPE, "output [(H/p)(W/p), D]",
       [](fb::OpT& op) { op.params.AsPatchEmbedParams()->class_token = false; }},
      {"tiny-llava", "class embedding before the table", fb::OpKind::PatchEmbed, KILN_ERROR_ARTIFACT_SHAPE,
       "a class token needs a position table", [](fb::OpT& op) { std::swap(op.weights[1], op.weights[2]); }},
      {"tiny-llava", "no class embedding", fb::OpKind::PatchEmbed, KILN_ERROR_ARTIFACT_SHAPE,
       "a class token needs a position table", [](fb::OpT& op) { op.weights.pop_back(); }},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> bytes;
    const std::string path = dir + "/" + c.model + ".kiln";
    ASSERT_TRUE(ReadFile(path, &bytes)) << path;
    bool found = false;
    std::vector<uint8_t> bad = RewriteArtifact(bytes, [&](fb::ModelT& mt) {
      for (auto& stage : mt.stages)
        for (auto& op : stage->ops)
          if (op->kind == c.kind && !found) {
            ASSERT_GE(op->weights.size(), c.kind == fb::OpKind::PatchEmbed ? 3u : 2u) << c.name;
            if (c.kind == fb::OpKind::PatchEmbed)  // tiny-llava's is CLIP's, with the class token
              ASSERT_EQ(op->params.AsPatchEmbedParams()->class_token, std::string(c.model) == "tiny-llava") << c.name;
            if (c.kind == fb::OpKind::GatedMlp) ASSERT_GT(op->params.AsGatedMlpParams()->gate_up_block, 0u);
            c.edit(*op);
            found = true;
          }
    });
    ASSERT_TRUE(found) << c.name;
    ExpectLoadRefused(bad, c.expected, c.message, c.name);
  }
}

// Visual-token pruning (SelectTokens in the projector): damaged parameters are refused
// at load, and a session may keep fewer tokens than the artifact but not more.
TEST(VisualTokens, DamagedSelectionsAreRefusedAndSessionsKeepAtMostTheArtifacts) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  std::vector<uint8_t> bytes;
  const std::string path = dir + "/tiny-llava.vt8.kiln";
  ASSERT_TRUE(ReadFile(path, &bytes)) << path;
  struct Case {
    const char* name;
    std::function<void(fb::SelectTokensParamsT&)> edit;
  };
  const std::vector<Case> cases = {
      {"keep above tokens", [](fb::SelectTokensParamsT& p) { p.keep = 17; }},
      {"keep 0", [](fb::SelectTokensParamsT& p) { p.keep = 0; }},
      {"tokens other than the input's rows", [](fb::SelectTokensParamsT& p) { p.tokens = 12; }},
      {"an unknown score", [](fb::SelectTokensParamsT& p) { p.score = static_cast<fb::TokenScore>(7); }},
  };
  for (const Case& c : cases) {
    bool found = false;
    std::vector<uint8_t> bad = RewriteArtifact(bytes, [&](fb::ModelT& mt) {
      for (auto& stage : mt.stages)
        for (auto& op : stage->ops)
          if (op->kind == fb::OpKind::SelectTokens) {
            ASSERT_EQ(op->params.AsSelectTokensParams()->keep, 8u);
            ASSERT_EQ(op->params.AsSelectTokensParams()->tokens, 16u);
            c.edit(*op->params.AsSelectTokensParams());
            found = true;
          }
    });
    ASSERT_TRUE(found) << c.name;
    ExpectLoadRefused(bad, KILN_ERROR_ARTIFACT_SHAPE, "expects [tokens, D] -> [keep, D]", c.name);
  }

  kiln_model_t* model = nullptr;
  kiln_error_t err;
  ASSERT_EQ(kiln_model_load(path.c_str(), nullptr, &model, &err), KILN_OK) << err.message;
  kiln_model_info_t info = {};
  info.struct_size = sizeof(info);
  ASSERT_EQ(kiln_model_get_info(model, &info), KILN_OK);
  EXPECT_EQ(info.image_tokens, 8);
  EXPECT_EQ(info.image_tokens_scored, 16);
  EXPECT_EQ(info.image_positions_original, 1);  // --visual-token-positions=original, the default
  for (int32_t n : {0, 1, 4, 8, 9, -1}) {
    kiln_session_options_t so;
    kiln_session_options_init(&so);
    so.image_tokens = n;
    kiln_session_t* s = nullptr;
    kiln_status_t st = kiln_session_create(model, &so, &s, &err);
    if (n >= 0 && n <= 8) {
      ASSERT_EQ(st, KILN_OK) << n << ": " << err.message;
      // The prompt holds as many image tokens as the session keeps.
      std::vector<float> px(3 * 32 * 32, 0.5f);
      ASSERT_EQ(kiln_session_set_pixel_values(s, px.data(), px.size(), &err), KILN_OK) << err.message;
      std::vector<int32_t> ids(256);
      size_t count = 0;
      ASSERT_EQ(kiln_session_prompt_ids(s, "What is it?", ids.data(), ids.size(), &count, &err), KILN_OK);
      EXPECT_EQ(std::count(ids.begin(), ids.begin() + static_cast<long>(count), info.image_token_id), n == 0 ? 8 : n);
      kiln_session_release(s);
    } else {
      EXPECT_EQ(st, KILN_ERROR_INVALID_ARGUMENT) << n;
      EXPECT_NE(std::string(err.message).find("image_tokens"), std::string::npos) << err.message;
    }
  }
  kiln_model_release(model);
}

// Sessions of one pooled model that keep different numbers of image tokens never share
// the KV blocks of their image tokens: with blocks of 8 positions the first block of
// the prompt ("<s>USER: " and one image token) has the same ids whether the session
// keeps 8 image tokens or 1, but not the same features (the earliest of the best 8,
// the best one).
TEST(VisualTokens, SessionsKeepingFewerTokensShareNoImageBlocks) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  const std::string path = dir + "/tiny-llava.vt8.kiln";
  std::vector<float> px(3 * 32 * 32);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
  kiln_error_t err;
  // A session keeping `tokens` image tokens asked "What is it?" about the picture.
  int64_t first_image = -1;  // the prompt's first image token
  auto ask = [&](kiln_model_t* model, int32_t tokens, paged::Answer* out) {
    kiln_session_options_t so;
    kiln_session_options_init(&so);
    so.image_tokens = tokens;
    so.context_length = 64;
    so.num_threads = 2;
    kiln_session_t* s = nullptr;
    ASSERT_EQ(kiln_session_create(model, &so, &s, &err), KILN_OK) << err.message;
    ASSERT_EQ(kiln_session_set_pixel_values(s, px.data(), px.size(), &err), KILN_OK) << err.message;
    std::vector<int32_t> ids(256);
    size_t count = 0;
    ASSERT_EQ(kiln_session_prompt_ids(s, "What is it?", ids.data(), ids.size(), &count, &err), KILN_OK);
    ids.resize(count);
    kiln_model_info_t info = {};
    info.struct_size = sizeof(info);
    kiln_model_get_info(model, &info);
    first_image = std::find(ids.begin(), ids.end(), info.image_token_id) - ids.begin();
    *out = paged::Ask(s, ids, 4);
    ASSERT_EQ(out->status, KILN_OK) << out->message;
    kiln_session_release(s);
  };
  kiln_model_t* flat = paged::Load(path, 0, 0);
  ASSERT_NE(flat, nullptr);
  paged::Answer expected;
  ask(flat, 1, &expected);
  kiln_model_release(flat);

  kiln_model_t* pooled = paged::Load(path, 16 * 8, 8);
  ASSERT_NE(pooled, nullptr);
  paged::Answer eight, again, one;
  ask(pooled, 0, &eight);  // publishes its blocks
  ask(pooled, 8, &again);  // the same tokens: finds them
  ask(pooled, 1, &one);    // one image token: finds none
  kiln_model_release(pooled);
  EXPECT_GE(again.stats.reused_tokens, 8);
  ASSERT_GT(first_image, 0);
  EXPECT_LE(one.stats.reused_tokens, first_image);  // the text before the image at most
  EXPECT_EQ(one.tokens, expected.tokens);
}

// Generation defaults (kiln_generate_options_init_from_model) out of range are refused
// at load, as generation would refuse them.
TEST(GenerationDefaults, OutOfRangeAreRefused) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  std::vector<uint8_t> bytes;
  const std::string path = dir + "/tiny-llama.kiln";
  ASSERT_TRUE(ReadFile(path, &bytes)) << path;
  const std::vector<std::pair<const char*, std::function<void(fb::GenerationT&)>>> cases = {
      {"negative repetition penalty", [](fb::GenerationT& g) { g.repetition_penalty = -1.0f; }},
      {"zero repetition penalty", [](fb::GenerationT& g) { g.repetition_penalty = 0.0f; }},
      {"infinite temperature", [](fb::GenerationT& g) { g.temperature = INFINITY; }},
      {"top_p above 1", [](fb::GenerationT& g) { g.top_p = 2.0f; }},
      {"negative top_k", [](fb::GenerationT& g) { g.top_k = -3; }},
  };
  for (const auto& c : cases) {
    std::vector<uint8_t> bad = RewriteArtifact(bytes, [&](fb::ModelT& mt) { c.second(*mt.generation); });
    ExpectLoadRefused(bad, KILN_ERROR_ARTIFACT_MALFORMED, "generation defaults out of range", c.first);
  }
  // In range: the defaults a session takes from the model.
  std::vector<uint8_t> good = RewriteArtifact(bytes, [](fb::ModelT& mt) {
    mt.generation->do_sample = true;
    mt.generation->temperature = 0.5f;
    mt.generation->top_k = 7;
    mt.generation->top_p = 0.8f;
    mt.generation->repetition_penalty = 1.25f;
  });
  Buffer aligned;
  aligned.Assign(good.data(), good.size());
  kiln_model_t* model = nullptr;
  kiln_error_t err;
  ASSERT_EQ(kiln_model_load_from_memory(aligned.data(), aligned.size, nullptr, &model, &err), KILN_OK)
      << err.message;
  kiln_generate_options_t go;
  kiln_generate_options_init_from_model(model, &go);
  EXPECT_EQ(go.temperature, 0.5f);
  EXPECT_EQ(go.top_k, 7);
  EXPECT_EQ(go.top_p, 0.8f);
  EXPECT_EQ(go.repetition_penalty, 1.25f);
  EXPECT_EQ(go.reuse_prefix, 1);
  kiln_model_release(model);
  kiln_generate_options_init_from_model(nullptr, &go);
  EXPECT_EQ(go.temperature, 0.0f);
  EXPECT_EQ(go.repetition_penalty, 1.0f);
}


// Non-finite image features (NaN pixels) give NaN scores, which the selection ranks
// last (the sort gets a strict order): it runs (under the sanitizers too), and
// generation reports the non-finite logits.
TEST(VisualTokens, NanFeaturesAreSelectedSafely) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  kiln_model_t* model = paged::Load(dir + "/tiny-llava.vt8.kiln", 0, 0);
  ASSERT_NE(model, nullptr);
  kiln_session_t* s = paged::Session(model, 64);
  ASSERT_NE(s, nullptr);
  std::vector<float> px(3 * 32 * 32, NAN);
  kiln_error_t err;
  ASSERT_EQ(kiln_session_set_pixel_values(s, px.data(), px.size(), &err), KILN_OK) << err.message;
  kiln_generate_options_t go;
  kiln_generate_options_init(&go);
  go.max_new_tokens = 2;
  kiln_status_t st = kiln_session_generate(s, "What is it?", &go, &err);
  EXPECT_EQ(st, KILN_ERROR_NONFINITE) << err.message;
  kiln_session_release(s);
  kiln_model_release(model);
}

// Chat templates (schema 1.13): tiny-llava carries LLaVA-1.5's template as pieces;
// without them (an older artifact) the built-in its metadata names writes one user
// message the same way.
TEST(ChatTemplate, PiecesWriteConversationsAndRefuseBadOnes) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(ReadFile(dir + "/tiny-llava.kiln", &bytes));
  auto apply = [](kiln_model_t* m, std::vector<kiln_chat_message_t> msgs, std::string* text) {
    kiln_error_t err;
    char buf[512];
    size_t n = 0;
    kiln_status_t st = kiln_model_apply_chat_template(m, msgs.data(), msgs.size(), buf, sizeof buf, &n, &err);
    *text = st == KILN_OK ? std::string(buf, n) : std::string(err.message);
    return st;
  };
  Buffer buffers[3];  // 64-byte aligned copies, alive until the end
  int used = 0;
  auto load = [&](const std::vector<uint8_t>& b, kiln_model_t** m) {
    kiln_error_t err;
    Buffer& buf = buffers[used++];
    buf.Assign(b.data(), b.size());
    return kiln_model_load_from_memory(buf.data(), buf.size, nullptr, m, &err);
  };
  kiln_model_t* model = nullptr;
  ASSERT_EQ(load(bytes, &model), KILN_OK);
  kiln_model_info_t info = {};
  info.struct_size = sizeof info;
  ASSERT_EQ(kiln_model_get_info(model, &info), KILN_OK);
  EXPECT_STREQ(info.chat_template, "built-in llava");
  std::string text;
  EXPECT_EQ(apply(model, {{"system", "Be brief.", 0}, {"user", "What is it?", 1}, {"assistant", "A valve.", 0},
                          {"user", "How?", 0}},
                  &text),
            KILN_OK);
  EXPECT_EQ(text, "Be brief. USER: <image>\nWhat is it? ASSISTANT: A valve. USER: How? ASSISTANT:");
  EXPECT_EQ(apply(model, {{"user", "a", 0}, {"assistant", "b", 0}}, &text), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(text.find("last message must be a user message"), std::string::npos) << text;
  EXPECT_EQ(apply(model, {{"user", "a", 1}, {"user", "b", 1}}, &text), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(apply(model, {{"tool", "a", 0}}, &text), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(text.find("role 'tool'"), std::string::npos) << text;
  kiln_chat_message_t one = {"user", "What is in the picture?", 0};
  char small[8];
  size_t n = 0;
  kiln_error_t err;
  EXPECT_EQ(kiln_model_apply_chat_template(model, &one, 1, small, sizeof small, &n, &err), KILN_ERROR_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, std::string("USER: What is in the picture? ASSISTANT:").size());
  EXPECT_STREQ(small, "USER: W");

  // A session: the image expands to the model's image tokens; a message cannot carry
  // an image the session does not have.
  kiln_session_options_t so;
  kiln_session_options_init(&so);
  so.num_threads = 1;
  kiln_session_t* s = nullptr;
  ASSERT_EQ(kiln_session_create(model, &so, &s, &err), KILN_OK) << err.message;
  kiln_chat_message_t img = {"user", "Hi", 1};
  kiln_generate_options_t go;
  kiln_generate_options_init(&go);
  go.max_new_tokens = 2;
  EXPECT_EQ(kiln_session_chat(s, &img, 1, &go, &err), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("no image is set"), std::string::npos) << err.message;
  kiln_chat_message_t conv[3] = {{"user", "Hi", 0}, {"assistant", "Hello", 0}, {"user", "Again", 0}};
  EXPECT_EQ(kiln_session_chat(s, conv, 3, &go, &err), KILN_OK) << err.message;
  kiln_session_release(s);
  kiln_model_release(model);

  // Without the pieces: the built-in "llava" for one message, nothing more.
  std::vector<uint8_t> old = RewriteArtifact(bytes, [](fb::ModelT& m) { m.chat.reset(); });
  ASSERT_EQ(load(old, &model), KILN_OK);
  ASSERT_EQ(kiln_model_get_info(model, &info), KILN_OK);
  EXPECT_EQ(info.chat_template, nullptr);
  EXPECT_EQ(apply(model, {{"user", "What is it?", 1}}, &text), KILN_OK);
  EXPECT_EQ(text, "USER: <image>\nWhat is it? ASSISTANT:");
  EXPECT_EQ(apply(model, {{"system", "x", 0}, {"user", "y", 0}}, &text), KILN_ERROR_UNSUPPORTED);
  kiln_model_release(model);

  // Pieces of the wrong shape are refused at load.
  std::vector<uint8_t> bad = RewriteArtifact(bytes, [](fb::ModelT& m) { m.chat->turns.pop_back(); });
  EXPECT_EQ(load(bad, &model), KILN_ERROR_ARTIFACT_MALFORMED);
}
