// Helpers of the runtime tests that run sessions of the test artifacts
// (tests/unit/make_test_artifacts.py): where the artifacts are, and sessions asked
// questions (prefix reuse, paged caches, sliding windows, pressure).
#ifndef KILN_TESTS_UNIT_RUNTIME_SESSION_HELPERS_H_
#define KILN_TESTS_UNIT_RUNTIME_SESSION_HELPERS_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "support/npy.h"

namespace {

inline std::string ArtifactsDir() {
  const char* dir = std::getenv("KILN_TEST_ARTIFACTS");
#ifdef KILN_DEFAULT_TEST_ARTIFACTS
  if (dir == nullptr) dir = KILN_DEFAULT_TEST_ARTIFACTS;
#endif
  return dir != nullptr ? dir : "";
}

// `<dir>/<name>.gen-<this architecture>.kiln`: a test artifact's generated kernels for
// this CPU.
inline std::string GeneratedArtifact(const std::string& dir, const std::string& name) {
#if defined(__aarch64__)
  return dir + "/" + name + ".gen-aarch64.kiln";
#else
  return dir + "/" + name + ".gen-x86_64.kiln";
#endif
}

// Sessions asked questions, for the prefix-reuse and paged-cache tests.
namespace paged {

struct Answer {
  kiln_status_t status = KILN_OK;
  std::vector<int32_t> tokens;
  kiln_stats_t stats = {};
  std::string message;
};

inline Answer AskWith(kiln_session_t* s, const std::vector<int32_t>& ids, const kiln_generate_options_t& go) {
  Answer a;
  kiln_error_t err;
  a.status = kiln_session_generate_ids(s, ids.data(), ids.size(), &go, &err);
  if (a.status != KILN_OK) a.message = err.message;
  size_t n = 0;
  kiln_session_get_output_ids(s, nullptr, 0, &n);
  a.tokens.resize(n);
  kiln_session_get_output_ids(s, a.tokens.data(), a.tokens.size(), &n);
  a.stats.struct_size = sizeof(a.stats);
  kiln_session_get_stats(s, &a.stats);
  return a;
}

inline Answer Ask(kiln_session_t* s, const std::vector<int32_t>& ids, int max_new = 6) {
  kiln_generate_options_t go;
  kiln_generate_options_init(&go);
  go.max_new_tokens = max_new;
  return AskWith(s, ids, go);
}

// tiny-llava's reference prompt (with image tokens) and pixel values.
inline void ReadLlava(const std::string& dir, std::vector<int32_t>* prompt, std::vector<float>* pixels) {
  kiln::npy::Array ids_npy, px_npy;
  std::string error;
  ASSERT_TRUE(kiln::npy::Read(dir + "/tiny-llava.ids.npy", &ids_npy, &error)) << error;
  ASSERT_TRUE(kiln::npy::Read(dir + "/tiny-llava.pixels.npy", &px_npy, &error)) << error;
  for (int64_t v : ids_npy.AsInt()) prompt->push_back(static_cast<int32_t>(v));
  *pixels = px_npy.AsFloat();
}

inline kiln_model_t* Load(const std::string& path, int64_t pool_tokens, int block, kiln_status_t* st = nullptr,
                   std::string* message = nullptr) {
  kiln_model_options_t mo;
  kiln_model_options_init(&mo);
  mo.kv_pool_tokens = pool_tokens;
  mo.kv_block_tokens = block;
  kiln_model_t* model = nullptr;
  kiln_error_t err;
  kiln_status_t status = kiln_model_load(path.c_str(), &mo, &model, &err);
  if (st != nullptr) *st = status;
  if (message != nullptr && status != KILN_OK) *message = err.message;
  return model;
}

inline kiln_session_t* Session(kiln_model_t* model, int context = 128, int kv_cache = KILN_KV_CACHE_DEFAULT) {
  kiln_session_options_t so;
  kiln_session_options_init(&so);
  so.num_threads = 2;
  so.context_length = context;
  so.kv_cache = kv_cache;
  kiln_session_t* s = nullptr;
  kiln_error_t err;
  EXPECT_EQ(kiln_session_create(model, &so, &s, &err), KILN_OK) << err.message;
  return s;
}

// A new session of `model` (2 threads, 128 positions) asked `ids` about `pixels`;
// kept in *keep when given, else released.
inline Answer AskNew(kiln_model_t* model, const std::vector<float>& pixels, const std::vector<int32_t>& ids,
              kiln_session_t** keep = nullptr) {
  kiln_session_t* s = Session(model);
  kiln_error_t err;
  EXPECT_EQ(kiln_session_set_pixel_values(s, pixels.data(), pixels.size(), &err), KILN_OK) << err.message;
  Answer r = Ask(s, ids);
  EXPECT_EQ(r.status, KILN_OK) << r.message;
  if (keep != nullptr) *keep = s;
  else kiln_session_release(s);
  return r;
}

}  // namespace paged

}  // namespace

#endif  // KILN_TESTS_UNIT_RUNTIME_SESSION_HELPERS_H_
