// A conversation longer than its context (kiln_context_overflow_t: a sliding window),
// and a model told the device is under pressure (kiln_model_set_pressure): fewer
// threads, a shorter window, the pages of free KV blocks and of the vision encoder
// given back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <unistd.h>

#include "kiln/kiln.h"
#include "runtime/session_helpers.h"
#include "runtime/threads_available.h"

namespace {

kiln_session_t* SlidingSession(kiln_model_t* model, int context, int overflow, int keep,
                               const kiln_pressure_policy_t* policy = nullptr, int threads = 2) {
  kiln_session_options_t so;
  kiln_session_options_init(&so);
  so.num_threads = threads;
  so.context_length = context;
  so.context_overflow = overflow;
  so.keep_tokens = keep;
  so.pressure_policy = policy;
  kiln_session_t* s = nullptr;
  kiln_error_t err;
  EXPECT_EQ(kiln_session_create(model, &so, &s, &err), KILN_OK) << err.message;
  return s;
}

std::vector<int32_t> TextPrompt(size_t n, int32_t salt = 0) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = 1 + static_cast<int32_t>((i * 7 + salt) % 400);
  return ids;
}

paged::Answer AskGreedy(kiln_session_t* s, const std::vector<int32_t>& ids, int max_new, int reuse = 1) {
  kiln_generate_options_t go;
  kiln_generate_options_init(&go);
  go.max_new_tokens = max_new;
  go.reuse_prefix = reuse;
  return paged::AskWith(s, ids, go);
}

// Resident bytes of this process (Linux /proc/self/statm), or -1.
double ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long long size = 0, resident = -1;
  if (std::fscanf(f, "%lld %lld", &size, &resident) != 2) resident = -1;
  std::fclose(f);
  return resident < 0 ? -1 : static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// Resident bytes of the mappings of `path` (/proc/self/smaps), or -1.
double MappedResidentBytes(const std::string& path) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return -1;
  char line[4096];
  bool in = false;
  double total = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    const size_t n = std::strlen(line);
    if (n > 0 && line[n - 1] == '\n') line[n - 1] = '\0';
    unsigned long long a = 0, b = 0;
    if (std::sscanf(line, "%llx-%llx ", &a, &b) == 2 && std::strchr(line, ' ') != nullptr) {
      const std::string text(line);
      in = text.size() >= path.size() && text.compare(text.size() - path.size(), path.size(), path) == 0;
    } else if (in && std::strncmp(line, "Rss:", 4) == 0) {
      total += std::atof(line + 4) * 1024.0;
    }
  }
  std::fclose(f);
  return total;
}

// madvise(MADV_DONTNEED) shows in the resident set of a native Linux process; qemu-user
// (the aarch64 tests) does not pass every madvise through, and AddressSanitizer's
// allocator and shadow memory blur the figure.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_TEST_ASAN 1
#endif
#endif
#if defined(__linux__) && defined(__x86_64__) && !defined(KILN_TEST_ASAN) && !defined(__SANITIZE_ADDRESS__)
constexpr bool kResidentSetIsMeasurable = true;
#else
constexpr bool kResidentSetIsMeasurable = false;
#endif

// Past its context, a sliding session goes on: the oldest positions after the kept
// ones are evicted, a paged cache by dropping whole blocks from its table and an
// unpaged one by moving rows down; the two give the same tokens. Before the first
// eviction the tokens are those of a session with room for everything.
TEST(SlidingWindow, PagedAndUnpagedSlideAlike) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  kiln_model_t* flat = paged::Load(dir + "/tiny-llama.kiln", 0, 0);
  kiln_model_t* blocks = paged::Load(dir + "/tiny-llama.kiln", 256, 8);
  ASSERT_NE(flat, nullptr);
  ASSERT_NE(blocks, nullptr);
  const std::vector<int32_t> prompt = TextPrompt(20);
  // keep 8 and a 64-position window: both evict 1 + (64 - 8) / 8 = 8 positions at a time.
  kiln_session_t* a = SlidingSession(flat, 64, KILN_CONTEXT_SLIDE, 8);
  kiln_session_t* b = SlidingSession(blocks, 64, KILN_CONTEXT_SLIDE, 8);
  kiln_session_t* roomy = SlidingSession(flat, 512, KILN_CONTEXT_STOP, 0);
  kiln_session_t* stop = SlidingSession(flat, 64, KILN_CONTEXT_STOP, 0);
  const paged::Answer ua = AskGreedy(a, prompt, 160), pb = AskGreedy(b, prompt, 160);
  const paged::Answer all = AskGreedy(roomy, prompt, 160), stopped = AskGreedy(stop, prompt, 160);
  ASSERT_EQ(ua.status, KILN_OK) << ua.message;
  ASSERT_EQ(pb.status, KILN_OK) << pb.message;
  ASSERT_EQ(all.status, KILN_OK) << all.message;
  ASSERT_GT(ua.tokens.size(), 60u) << "the reference answer ended early: nothing slid";
  EXPECT_EQ(ua.tokens, pb.tokens);
  EXPECT_GT(ua.stats.evicted_tokens, 0);
  EXPECT_EQ(ua.stats.evicted_tokens, pb.stats.evicted_tokens);
  EXPECT_EQ(ua.stats.evicted_tokens % 8, 0);
  EXPECT_EQ(ua.stats.context_limit, 64);
  EXPECT_LE(pb.stats.kv_blocks, 8);
  // Up to the first eviction (prompt 20 + 44 fed tokens) nothing differs.
  const size_t before = 64 - prompt.size() + 1;
  ASSERT_GE(all.tokens.size(), before);
  EXPECT_EQ(std::vector<int32_t>(ua.tokens.begin(), ua.tokens.begin() + before),
            std::vector<int32_t>(all.tokens.begin(), all.tokens.begin() + before));
  // Without sliding the same conversation stops at the context.
  EXPECT_EQ(stopped.status, KILN_ERROR_CONTEXT_FULL);
  for (kiln_session_t* s : {a, b, roomy, stop}) kiln_session_release(s);
  kiln_model_release(flat);
  kiln_model_release(blocks);
}

// An int8 cache with spans (16 positions on tiny-llama): both mechanisms keep and evict
// whole spans (the unpaged one moves rows by spans, so every span keeps its keys'
// scales), slide alike, and a follow-up reuses the window.
TEST(SlidingWindow, QuantisedCacheSlidesWholeSpans) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  const std::string path = GeneratedArtifact(dir, "tiny-llama.kv8");
  kiln_model_t* flat = paged::Load(path, 0, 0);
  kiln_model_t* blocks = paged::Load(path, 256, 16);
  ASSERT_NE(flat, nullptr);
  ASSERT_NE(blocks, nullptr);
  const std::vector<int32_t> prompt = TextPrompt(20);
  kiln_session_t* a = SlidingSession(flat, 64, KILN_CONTEXT_SLIDE, 5);
  kiln_session_t* b = SlidingSession(blocks, 64, KILN_CONTEXT_SLIDE, 5);
  const paged::Answer ua = AskGreedy(a, prompt, 160), pb = AskGreedy(b, prompt, 160);
  ASSERT_EQ(ua.status, KILN_OK) << ua.message;
  ASSERT_EQ(pb.status, KILN_OK) << pb.message;
  ASSERT_GT(ua.stats.evicted_tokens, 0);
  EXPECT_EQ(ua.stats.evicted_tokens % 16, 0);
  EXPECT_EQ(ua.tokens, pb.tokens);
  EXPECT_EQ(ua.stats.evicted_tokens, pb.stats.evicted_tokens);
  for (kiln_session_t* s : {a, b}) {
    std::vector<int32_t> next = prompt;
    next.insert(next.end(), ua.tokens.begin(), ua.tokens.end());
    const size_t held = next.size() - 1;
    next.push_back(3);
    next.push_back(4);
    const paged::Answer again = AskGreedy(s, next, 4);
    ASSERT_EQ(again.status, KILN_OK) << again.message;
    EXPECT_EQ(again.stats.reused_tokens, static_cast<int32_t>(held));
  }
  kiln_session_release(a);
  kiln_session_release(b);
  kiln_model_release(flat);
  kiln_model_release(blocks);
}

// The next call with the whole conversation so far reuses the window: the kept
// positions, the evicted ones (known by their ids' hash) and the rest, so that only
// the new question is prefilled. A conversation that differs inside the evicted
// positions keeps only what precedes them.
TEST(SlidingWindow, FollowUpReusesAcrossTheEvictedPositions) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  for (int64_t pool : {0, 256}) {
    SCOPED_TRACE(pool == 0 ? "unpaged" : "paged");
    kiln_model_t* model = paged::Load(dir + "/tiny-llama.kiln", pool, 8);
    ASSERT_NE(model, nullptr);
    kiln_session_t* s = SlidingSession(model, 64, KILN_CONTEXT_SLIDE, 8);
    const std::vector<int32_t> prompt = TextPrompt(20);
    const paged::Answer first = AskGreedy(s, prompt, 80);
    ASSERT_EQ(first.status, KILN_OK) << first.message;
    ASSERT_GT(first.stats.evicted_tokens, 0);
    // The conversation: the prompt, the answer (its last token not fed yet), a question.
    std::vector<int32_t> next = prompt;
    next.insert(next.end(), first.tokens.begin(), first.tokens.end());
    const size_t held = next.size() - 1;
    const std::vector<int32_t> question = TextPrompt(6, 3);
    next.insert(next.end(), question.begin(), question.end());
    const paged::Answer again = AskGreedy(s, next, 4);
    ASSERT_EQ(again.status, KILN_OK) << again.message;
    EXPECT_EQ(again.stats.reused_tokens, static_cast<int32_t>(held));
    EXPECT_GE(again.stats.evicted_tokens, first.stats.evicted_tokens);
    // The same, with one id inside the evicted positions changed.
    kiln_session_t* t = SlidingSession(model, 64, KILN_CONTEXT_SLIDE, 8);
    ASSERT_EQ(AskGreedy(t, prompt, 80).status, KILN_OK);
    std::vector<int32_t> changed = next;
    changed[10] = changed[10] == 7 ? 8 : 7;
    const paged::Answer cut = AskGreedy(t, changed, 4);
    ASSERT_EQ(cut.status, KILN_OK) << cut.message;
    EXPECT_EQ(cut.stats.reused_tokens, 8);  // the kept positions: 8 and 9 were evicted
    kiln_session_release(s);
    kiln_session_release(t);
    kiln_model_release(model);
  }
}

// A full KV block pool: a stopping session fails with KILN_ERROR_RESOURCE_EXHAUSTED
// (PagedKv.OutOfBlocksIsAStatusNotACrash), a sliding one gives up its own oldest
// blocks and goes on.
TEST(SlidingWindow, FullPoolSlidesInsteadOfFailing) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  kiln_model_t* model = paged::Load(dir + "/tiny-llama.kiln", 32, 8);  // 4 blocks
  ASSERT_NE(model, nullptr);
  kiln_session_t* s = SlidingSession(model, 128, KILN_CONTEXT_SLIDE, 8);
  const paged::Answer a = AskGreedy(s, TextPrompt(12), 60);
  ASSERT_EQ(a.status, KILN_OK) << a.message;
  EXPECT_GT(a.stats.evicted_tokens, 0);
  EXPECT_LE(a.stats.kv_blocks, 4);
  // Keeping more than the pool holds cannot slide: the pool's status.
  kiln_session_t* greedy = SlidingSession(model, 128, KILN_CONTEXT_SLIDE, 40);
  kiln_session_reset(s);
  const paged::Answer b = AskGreedy(greedy, TextPrompt(60, 5), 10);
  EXPECT_EQ(b.status, KILN_ERROR_RESOURCE_EXHAUSTED) << b.message;
  kiln_session_release(s);
  kiln_session_release(greedy);
  kiln_model_release(model);
}

// The levels a model is told reach its sessions through their policies: thermal
// pressure lowers the threads (the tokens stay the same), memory pressure the window.
TEST(Pressure, ThreadsAndWindowFollowTheModelsLevels) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  if (!ThreadsWork()) GTEST_SKIP() << "threads cannot be started here";
  kiln_model_t* model = paged::Load(dir + "/tiny-llama.kiln", 0, 0);
  ASSERT_NE(model, nullptr);
  kiln_pressure_policy_t policy;
  kiln_pressure_policy_init(&policy);
  policy.max_threads[KILN_PRESSURE_SERIOUS] = 1;
  policy.max_context[KILN_PRESSURE_CRITICAL] = 96;
  kiln_session_t* s = SlidingSession(model, 256, KILN_CONTEXT_STOP, 0, &policy);
  const std::vector<int32_t> prompt = TextPrompt(30);
  const paged::Answer calm = AskGreedy(s, prompt, 120, 0);
  ASSERT_EQ(calm.status, KILN_OK) << calm.message;
  EXPECT_EQ(calm.stats.active_threads, 2);
  EXPECT_EQ(calm.stats.context_limit, 256);
  EXPECT_EQ(calm.stats.evicted_tokens, 0);

  ASSERT_EQ(kiln_model_set_pressure(model, KILN_PRESSURE_THERMAL, KILN_PRESSURE_SERIOUS), KILN_OK);
  const paged::Answer hot = AskGreedy(s, prompt, 120, 0);
  ASSERT_EQ(hot.status, KILN_OK) << hot.message;
  EXPECT_EQ(hot.stats.active_threads, 1);
  EXPECT_EQ(hot.tokens, calm.tokens);

  // Memory: the window shrinks to 96 positions at the next call; a stopping session
  // slides too.
  ASSERT_EQ(kiln_model_set_pressure(model, KILN_PRESSURE_MEMORY, KILN_PRESSURE_CRITICAL), KILN_OK);
  const paged::Answer tight = AskGreedy(s, prompt, 120, 0);
  ASSERT_EQ(tight.status, KILN_OK) << tight.message;
  EXPECT_EQ(tight.stats.context_limit, 96);
  EXPECT_GT(tight.stats.evicted_tokens, 0);
  // Up to the window's end the tokens are the same.
  const size_t before = 96 - prompt.size() + 1;
  ASSERT_GE(tight.tokens.size(), before);
  EXPECT_EQ(std::vector<int32_t>(tight.tokens.begin(), tight.tokens.begin() + before),
            std::vector<int32_t>(calm.tokens.begin(), calm.tokens.begin() + before));

  ASSERT_EQ(kiln_model_set_pressure(model, KILN_PRESSURE_MEMORY, KILN_PRESSURE_NONE), KILN_OK);
  ASSERT_EQ(kiln_model_set_pressure(model, KILN_PRESSURE_THERMAL, KILN_PRESSURE_NONE), KILN_OK);
  const paged::Answer after = AskGreedy(s, prompt, 120, 0);
  ASSERT_EQ(after.status, KILN_OK) << after.message;
  EXPECT_EQ(after.stats.context_limit, 256);
  EXPECT_EQ(after.stats.active_threads, 2);
  EXPECT_EQ(after.stats.evicted_tokens, 0);
  EXPECT_EQ(after.tokens, calm.tokens);

  // Bad arguments.
  EXPECT_EQ(kiln_model_set_pressure(model, 3, KILN_PRESSURE_SERIOUS), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_model_set_pressure(model, KILN_PRESSURE_MEMORY, 4), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_model_set_pressure(nullptr, KILN_PRESSURE_MEMORY, 1), KILN_ERROR_INVALID_ARGUMENT);
  policy.max_context[KILN_PRESSURE_MODERATE] = -1;
  kiln_session_options_t so;
  kiln_session_options_init(&so);
  so.pressure_policy = &policy;
  kiln_session_t* bad = nullptr;
  kiln_error_t err;
  EXPECT_EQ(kiln_session_create(model, &so, &bad, &err), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("max_context"), std::string::npos) << err.message;
  so.pressure_policy = nullptr;
  so.context_overflow = 2;
  EXPECT_EQ(kiln_session_create(model, &so, &bad, &err), KILN_ERROR_INVALID_ARGUMENT);
  so.context_overflow = KILN_CONTEXT_SLIDE;
  so.context_length = 64;
  so.keep_tokens = 64;
  EXPECT_EQ(kiln_session_create(model, &so, &bad, &err), KILN_ERROR_INVALID_ARGUMENT);
  kiln_session_release(s);
  kiln_model_release(model);
}

// Serious memory pressure gives the pages of the pool's free blocks back at once;
// their cached prefixes are forgotten, so that a later session prefills again and
// answers the same.
TEST(Pressure, MemoryPressureReturnsFreeKvBlocks) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  kiln_model_t* model = paged::Load(dir + "/tiny-llama.kiln", 16384, 32);
  ASSERT_NE(model, nullptr);
  std::vector<paged::Answer> answers;
  double filled = 0;
  for (int i = 0; i < 4; ++i) {
    kiln_session_t* s = paged::Session(model, 1024);
    answers.push_back(AskGreedy(s, TextPrompt(1000, i), 2));
    ASSERT_EQ(answers.back().status, KILN_OK) << answers.back().message;
    filled += static_cast<double>(answers.back().stats.kv_blocks) * 32 * answers.back().stats.kv_cache_token_bytes;
    kiln_session_release(s);  // its blocks stay in the pool, published
  }
  const double before = ResidentBytes();
  ASSERT_EQ(kiln_model_set_pressure(model, KILN_PRESSURE_MEMORY, KILN_PRESSURE_SERIOUS), KILN_OK);
  const double after = ResidentBytes();
  if (kResidentSetIsMeasurable && before > 0) {
    EXPECT_GT(before - after, 0.8 * filled) << "resident " << before << " -> " << after << " bytes, " << filled
                                            << " bytes of KV blocks were filled";
  }
  kiln_session_t* s = paged::Session(model, 1024);
  const paged::Answer again = AskGreedy(s, TextPrompt(1000, 0), 2);
  ASSERT_EQ(again.status, KILN_OK) << again.message;
  EXPECT_EQ(again.stats.reused_tokens, 0);  // nothing left to find
  EXPECT_EQ(again.tokens, answers[0].tokens);
  kiln_session_release(s);
  kiln_model_release(model);
}

// Under serious memory pressure the vision encoder's and projector's weight pages of
// a model mapped from its file are dropped after each image; the next image reads
// them again and is encoded the same.
TEST(Pressure, VisionWeightsAreDroppedAndReadAgain) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  std::vector<int32_t> prompt;
  std::vector<float> pixels;
  ASSERT_NO_FATAL_FAILURE(paged::ReadLlava(dir, &prompt, &pixels));
  const std::string path = dir + "/tiny-llava.kiln";
  kiln_model_t* model = paged::Load(path, 0, 0);
  ASSERT_NE(model, nullptr);
  const paged::Answer calm = paged::AskNew(model, pixels, prompt);
  const double mapped = MappedResidentBytes(path);
  ASSERT_EQ(kiln_model_set_pressure(model, KILN_PRESSURE_MEMORY, KILN_PRESSURE_SERIOUS), KILN_OK);
  const double dropped = MappedResidentBytes(path);
  if (kResidentSetIsMeasurable && mapped > 0) EXPECT_LT(dropped, mapped);
  const paged::Answer pressed = paged::AskNew(model, pixels, prompt);
  EXPECT_EQ(pressed.tokens, calm.tokens);
  if (kResidentSetIsMeasurable && mapped > 0) EXPECT_LT(MappedResidentBytes(path), mapped);  // dropped again
  kiln_model_release(model);
}

}  // namespace

namespace {

// Sessions of 128 positions and 2 threads: what the shared-budget tests load with.
kiln_model_options_t SmallSessionOptions(kiln_session_options_t* so) {
  kiln_session_options_init(so);
  so->num_threads = 2;
  so->context_length = 128;
  kiln_model_options_t mo;
  kiln_model_options_init(&mo);
  mo.session = so;
  return mo;
}

// A VLM and a text model under a budget that holds one of them: each acquire loads
// the model, unloading the other when nobody holds it; a held model is never
// unloaded, and the answers are those of models loaded on their own.
TEST(SharedBudget, LeastRecentlyUsedModelMakesRoom) {
  const std::string dir = ArtifactsDir();
  if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
  const std::string vlm = dir + "/tiny-llava.kiln", text = dir + "/tiny-llama.kiln";
  std::vector<int32_t> prompt;
  std::vector<float> pixels;
  ASSERT_NO_FATAL_FAILURE(paged::ReadLlava(dir, &prompt, &pixels));
  const std::vector<int32_t> question = TextPrompt(12);
  kiln_session_options_t so;
  const kiln_model_options_t mo = SmallSessionOptions(&so);
  kiln_error_t err;

  // What each counts, under a budget that holds both.
  kiln_shared_budget_t* roomy = nullptr;
  ASSERT_EQ(kiln_shared_budget_create(uint64_t{1} << 32, &roomy, &err), KILN_OK) << err.message;
  int32_t a = -1, b = -1;
  ASSERT_EQ(kiln_shared_budget_add(roomy, vlm.c_str(), &mo, &a, &err), KILN_OK) << err.message;
  ASSERT_EQ(kiln_shared_budget_add(roomy, text.c_str(), &mo, &b, &err), KILN_OK) << err.message;
  kiln_shared_budget_info_t ia = {}, ib = {};
  ia.struct_size = ib.struct_size = sizeof(ia);
  ASSERT_EQ(kiln_shared_budget_get_info(roomy, a, &ia), KILN_OK);
  ASSERT_EQ(kiln_shared_budget_get_info(roomy, b, &ib), KILN_OK);
  EXPECT_EQ(ia.loaded, 0);  // measured, not kept
  EXPECT_GT(ia.model_bytes, 0u);
  EXPECT_GT(ib.model_bytes, 0u);
  kiln_model_t *ma = nullptr, *mb = nullptr;
  ASSERT_EQ(kiln_shared_budget_acquire(roomy, a, &ma, &err), KILN_OK) << err.message;
  ASSERT_EQ(kiln_shared_budget_acquire(roomy, b, &mb, &err), KILN_OK) << err.message;
  kiln_shared_budget_info_t both = {};
  both.struct_size = sizeof(both);
  kiln_shared_budget_get_info(roomy, -1, &both);
  EXPECT_EQ(both.loaded, 2);
  EXPECT_EQ(both.unloads, 0);
  EXPECT_EQ(both.used_bytes, ia.model_bytes + ib.model_bytes);
  const paged::Answer ref_a = paged::AskNew(ma, pixels, prompt);
  kiln_session_t* s = paged::Session(mb);
  const paged::Answer ref_b = AskGreedy(s, question, 6);
  kiln_session_release(s);
  EXPECT_EQ(kiln_shared_budget_return(roomy, a), KILN_OK);
  EXPECT_EQ(kiln_shared_budget_return(roomy, b), KILN_OK);
  EXPECT_EQ(kiln_shared_budget_return(roomy, b), KILN_ERROR_INVALID_ARGUMENT);  // not held
  kiln_shared_budget_release(roomy);

  // A budget for the larger one and half the smaller.
  const uint64_t bytes = std::max(ia.model_bytes, ib.model_bytes) + std::min(ia.model_bytes, ib.model_bytes) / 2;
  kiln_shared_budget_t* tight = nullptr;
  ASSERT_EQ(kiln_shared_budget_create(bytes, &tight, &err), KILN_OK);
  ASSERT_EQ(kiln_shared_budget_add(tight, vlm.c_str(), &mo, &a, &err), KILN_OK) << err.message;
  ASSERT_EQ(kiln_shared_budget_add(tight, text.c_str(), &mo, &b, &err), KILN_OK) << err.message;
  auto info = [&] {
    kiln_shared_budget_info_t i = {};
    i.struct_size = sizeof(i);
    kiln_shared_budget_get_info(tight, -1, &i);
    return i;
  };
  ASSERT_EQ(kiln_shared_budget_acquire(tight, a, &ma, &err), KILN_OK) << err.message;
  EXPECT_EQ(paged::AskNew(ma, pixels, prompt).tokens, ref_a.tokens);
  EXPECT_EQ(kiln_shared_budget_return(tight, a), KILN_OK);
  EXPECT_EQ(info().loaded, 1);
  ASSERT_EQ(kiln_shared_budget_acquire(tight, b, &mb, &err), KILN_OK) << err.message;
  EXPECT_EQ(info().loaded, 1);
  EXPECT_EQ(info().unloads, 1);
  EXPECT_LE(info().used_bytes, bytes);
  s = paged::Session(mb);
  EXPECT_EQ(AskGreedy(s, question, 6).tokens, ref_b.tokens);
  // While the text model is held, the VLM does not fit: the status names who holds the room.
  EXPECT_EQ(kiln_shared_budget_acquire(tight, a, &ma, &err), KILN_ERROR_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(err.message).find("tiny-llama.kiln"), std::string::npos) << err.message;
  EXPECT_NE(std::string(err.message).find("1 holds"), std::string::npos) << err.message;
  kiln_session_release(s);
  EXPECT_EQ(kiln_shared_budget_return(tight, b), KILN_OK);
  ASSERT_EQ(kiln_shared_budget_acquire(tight, a, &ma, &err), KILN_OK) << err.message;
  EXPECT_EQ(paged::AskNew(ma, pixels, prompt).tokens, ref_a.tokens);
  EXPECT_EQ(info().unloads, 2);
  EXPECT_EQ(info().loads, 3);
  EXPECT_EQ(kiln_shared_budget_return(tight, a), KILN_OK);
  EXPECT_EQ(kiln_shared_budget_acquire(tight, 7, &ma, &err), KILN_ERROR_INVALID_ARGUMENT);
  kiln_shared_budget_release(tight);

  // A model that cannot fit the budget alone is refused when added.
  kiln_shared_budget_t* small = nullptr;
  ASSERT_EQ(kiln_shared_budget_create(ia.model_bytes / 2, &small, &err), KILN_OK);
  EXPECT_EQ(kiln_shared_budget_add(small, vlm.c_str(), &mo, &a, &err), KILN_ERROR_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(err.message).find("memory budget"), std::string::npos) << err.message;
  EXPECT_EQ(kiln_shared_budget_add(small, (dir + "/missing.kiln").c_str(), &mo, &a, &err), KILN_ERROR_IO);
  kiln_shared_budget_release(small);
  EXPECT_EQ(kiln_shared_budget_create(0, &small, &err), KILN_ERROR_INVALID_ARGUMENT);
}

}  // namespace
