// A quantised KV cache's spans (runtime/src/kv_cache.h): keys per channel over spans
// of the group's positions, the span being filled read at full precision. A row's
// result does not depend on how the prompt reached the cache (one call, or a
// conversation continued inside a span); a reuse that ends inside a complete span
// decodes that span's first rows; paged caches, sliding windows and forks keep them.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "session_helpers.h"

namespace {

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(1 + (i * 37 + seed * 11) % 250);
  return ids;
}

std::vector<int32_t> Head(const std::vector<int32_t>& ids, size_t n) { return {ids.begin(), ids.begin() + n}; }


// tiny-llama (head_dim 16: spans of 16 positions) with int8 and int4 caches, unpaged
// and paged (blocks of 16 and 32).
TEST(KvSpans, AConversationContinuedInsideASpanAnswersAsOneCall) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  for (const std::string& path : {dir + "/tiny-llama.kiln", GeneratedArtifact(dir, "tiny-llama.kv8")})
    for (int kv : {KILN_KV_CACHE_INT8, KILN_KV_CACHE_INT4})
      for (int block : {0, 16, 32}) {
        SCOPED_TRACE(path + " kv_cache " + std::to_string(kv) + " block " + std::to_string(block));
        kiln_model_t* model = paged::Load(path, block ? 40 * block : 0, block);
        ASSERT_NE(model, nullptr);
        const std::vector<int32_t> prompt = Prompt(45, 1);
        kiln_session_t* fresh = paged::Session(model, 128, kv);
        const paged::Answer want = paged::Ask(fresh, prompt, 10);
        ASSERT_EQ(want.status, KILN_OK) << want.message;
        // The prompt in steps: 20 positions then the rest (position 20 continues span
        // [16, 32)); steps that end on a span's last position, start a span, stay inside
        // one, or cross several.
        for (const std::vector<size_t>& steps :
             {std::vector<size_t>{20}, std::vector<size_t>{16, 17, 31, 32}, std::vector<size_t>{3, 9, 40}}) {
          kiln_session_t* t = paged::Session(model, 128, kv);
          for (size_t n : steps) ASSERT_EQ(paged::Ask(t, Head(prompt, n), 1).status, KILN_OK);
          const paged::Answer stepped = paged::Ask(t, prompt, 10);
          ASSERT_EQ(stepped.status, KILN_OK) << stepped.message;
          // (paged: also the blocks the first session published)
          EXPECT_GE(stepped.stats.reused_tokens, static_cast<int32_t>(steps.back()));
          EXPECT_EQ(stepped.tokens, want.tokens) << "steps ending at " << steps.back();
          kiln_session_release(t);
        }
        kiln_session_t* s = paged::Session(model, 128, kv);
        ASSERT_EQ(paged::Ask(s, Head(prompt, 20), 1).status, KILN_OK);
        const paged::Answer got = paged::Ask(s, prompt, 10);
        ASSERT_EQ(got.status, KILN_OK) << got.message;
        EXPECT_GE(got.stats.reused_tokens, 20);
        EXPECT_EQ(got.tokens, want.tokens);
        // A fork continues the conversation as its source would.
        kiln_session_t* f = nullptr;
        kiln_error_t err;
        ASSERT_EQ(kiln_session_fork(s, &f, &err), KILN_OK) << err.message;
        std::vector<int32_t> more = prompt;
        more.insert(more.end(), got.tokens.begin(), got.tokens.end());
        more.push_back(7);
        const paged::Answer a = paged::Ask(s, more, 6), b = paged::Ask(f, more, 6);
        ASSERT_EQ(a.status, KILN_OK) << a.message;
        ASSERT_EQ(b.status, KILN_OK) << b.message;
        EXPECT_EQ(a.tokens, b.tokens);
        EXPECT_EQ(a.stats.reused_tokens, b.stats.reused_tokens);
        // Back to 24 positions of the first prompt (inside the complete span [16, 32)):
        // its first rows come decoded from the cache; the answer stays close.
        std::vector<int32_t> other = Head(prompt, 24);
        for (int i = 0; i < 12; ++i) other.push_back(200 + i);
        const paged::Answer back = paged::Ask(s, other, 4);
        ASSERT_EQ(back.status, KILN_OK) << back.message;
        EXPECT_EQ(back.stats.reused_tokens, 24);
        EXPECT_EQ(back.tokens.size(), 4u);
        kiln_session_release(f);
        kiln_session_release(s);
        kiln_session_release(fresh);
        kiln_model_release(model);
      }
}

// The prefill logits of a prompt of several spans against an f32 cache: the first
// span's rows (their keys and values all exact) equal up to rounding; the others
// within 2% (int8) or 35% (int4, an untrained model) of the logits' scale, and not exact (the complete
// spans are read quantised).
TEST(KvSpans, QuantisedCachesStayCloseToF32) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  kiln_model_t* model = paged::Load(dir + "/tiny-llama.kiln", 0, 0);
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = Prompt(70, 3);
  kiln_model_info_t info = {};
  info.struct_size = sizeof(info);
  kiln_model_get_info(model, &info);
  auto logits = [&](int kv) {
    std::vector<float> out(prompt.size() * static_cast<size_t>(info.vocab_size));
    kiln_session_t* s = paged::Session(model, 128, kv);
    kiln_error_t err;
    EXPECT_EQ(kiln_session_prefill_logits(s, prompt.data(), prompt.size(), out.data(), out.size(), &err), KILN_OK)
        << err.message;
    kiln_session_release(s);
    return out;
  };
  const std::vector<float> f32 = logits(KILN_KV_CACHE_F32);
  float scale = 0.0f;
  for (float x : f32) scale = std::max(scale, std::fabs(x));
  for (auto [kv, bound] : {std::pair{KILN_KV_CACHE_INT8, 0.02f}, std::pair{KILN_KV_CACHE_INT4, 0.35f}}) {
    const std::vector<float> q = logits(kv);
    float first = 0.0f, most = 0.0f;  // the first span's rows read it exactly
    for (size_t i = 0; i < q.size(); ++i) {
      const float d = std::fabs(q[i] - f32[i]);
      ASSERT_TRUE(std::isfinite(q[i]));
      if (i < 16 * static_cast<size_t>(info.vocab_size)) first = std::max(first, d);
      most = std::max(most, d);
    }
    std::printf("kv_cache %d: max |logit - f32| %.3g (first span %.3g), max |logit| %.3g\n", kv, most, first, scale);
    EXPECT_LE(first, 1e-5f * scale);
    EXPECT_GT(most, 0.0f);
    EXPECT_LE(most, bound * scale);
  }
  kiln_model_release(model);
}

}  // namespace
