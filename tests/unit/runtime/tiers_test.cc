// Tiered artifacts (formats/tiers.h, kiln-compile --tiers): the tiny model at f32 and
// at int8 merged into one file. Each tier answers as its own artifact does, the
// runtime picks the largest that fits a memory budget (or the one asked for), and a
// damaged tier table is an error status, never a crash.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "formats/kiln_generated.h"
#include "formats/tiers.h"
#include "kiln/kiln.h"
#include "runtime/session_helpers.h"

namespace {

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// 64-byte-aligned copy of the bytes (the runtime's requirement for in-memory artifacts).
struct Aligned {
  std::vector<uint8_t> storage;
  uint8_t* data = nullptr;
  size_t size = 0;
  explicit Aligned(const std::vector<uint8_t>& bytes) : storage(bytes.size() + 64), size(bytes.size()) {
    data = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
    std::memcpy(data, bytes.data(), bytes.size());
  }
};

// The session every load here is measured for: one thread, 128 positions.
kiln_session_options_t SmallSession() {
  kiln_session_options_t so;
  kiln_session_options_init(&so);
  so.num_threads = 1;
  so.context_length = 128;
  return so;
}

kiln_status_t LoadTier(const Aligned& a, int tier, uint64_t budget, kiln_model_t** model, std::string* message) {
  const kiln_session_options_t so = SmallSession();
  kiln_model_options_t mo;
  kiln_model_options_init(&mo);
  mo.tier = tier;
  mo.memory_budget = budget;
  mo.session = &so;
  kiln_error_t err;
  kiln_status_t st = kiln_model_load_from_memory(a.data, a.size, &mo, model, &err);
  if (st != KILN_OK && message != nullptr) *message = err.message;
  return st;
}

std::vector<int32_t> Answer(kiln_model_t* model) {
  kiln_session_t* s = paged::Session(model);
  const paged::Answer a = paged::Ask(s, {1, 5, 9, 14, 20, 27}, 8);
  EXPECT_EQ(a.status, KILN_OK) << a.message;
  kiln_session_release(s);
  return a.tokens;
}

uint64_t Need(kiln_model_t* model) {
  const kiln_session_options_t so = SmallSession();
  kiln_memory_report_t r = {};
  r.struct_size = sizeof(r);
  kiln_error_t err;
  EXPECT_EQ(kiln_model_memory_report(model, &so, &r, &err), KILN_OK) << err.message;
  return r.total_bytes;
}

class Tiers : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = ArtifactsDir();
    if (dir.empty()) GTEST_SKIP() << "no test artifacts (KILN_TEST_ARTIFACTS)";
    f32 = ReadFile(dir + "/tiny-llama.kiln");
    int8 = ReadFile(dir + "/tiny-llama.a8.kiln");
    ASSERT_FALSE(f32.empty());
    ASSERT_FALSE(int8.empty());
    std::string error;
    ASSERT_TRUE(kiln::format::MergeTiers({{f32.data(), f32.size(), 600000}, {int8.data(), int8.size(), 200000}},
                                         &merged, &error))
        << error;
  }
  std::vector<uint8_t> f32, int8, merged;
};

TEST_F(Tiers, EachTierAnswersAsItsOwnArtifact) {
  // The tokenizer (in the root only), norms and other tensors of equal bytes are stored once.
  EXPECT_LT(merged.size(), f32.size() + int8.size());
  const auto* root = kiln::fb::GetSizePrefixedModel(merged.data());
  ASSERT_NE(root->tiers(), nullptr);
  EXPECT_NE(root->tokenizer(), nullptr);
  EXPECT_EQ(kiln::fb::GetSizePrefixedModel(merged.data() + root->tiers()->Get(1)->header_offset())->tokenizer(), nullptr);
  Aligned tiered(merged), alone0(f32), alone1(int8);
  kiln_model_t *m0 = nullptr, *m1 = nullptr, *r0 = nullptr, *r1 = nullptr;
  ASSERT_EQ(LoadTier(tiered, 0, 0, &m0, nullptr), KILN_OK);
  ASSERT_EQ(LoadTier(tiered, 1, 0, &m1, nullptr), KILN_OK);
  ASSERT_EQ(LoadTier(alone0, -1, 0, &r0, nullptr), KILN_OK);
  ASSERT_EQ(LoadTier(alone1, -1, 0, &r1, nullptr), KILN_OK);
  kiln_model_info_t i0 = {}, i1 = {}, ir = {};
  i0.struct_size = i1.struct_size = ir.struct_size = sizeof(i0);
  kiln_model_get_info(m0, &i0);
  kiln_model_get_info(m1, &i1);
  kiln_model_get_info(r1, &ir);
  EXPECT_EQ(i0.tier, 0);
  EXPECT_EQ(i1.tier, 1);
  EXPECT_EQ(i1.tier_count, 2);
  EXPECT_EQ(i1.tier_weight_budget, 200000u);
  EXPECT_EQ(ir.tier_count, 1);
  EXPECT_EQ(i1.weight_bytes, ir.weight_bytes);
  EXPECT_EQ(Answer(m0), Answer(r0));
  EXPECT_EQ(Answer(m1), Answer(r1));

  // A budget between the two tiers' needs loads the smaller; one above both the larger.
  const uint64_t need0 = Need(m0), need1 = Need(m1);
  ASSERT_GT(need0, need1);
  for (kiln_model_t* m : {m0, m1, r0, r1}) kiln_model_release(m);
  kiln_model_t* picked = nullptr;
  ASSERT_EQ(LoadTier(tiered, -1, need1 + (need0 - need1) / 2, &picked, nullptr), KILN_OK);
  kiln_model_get_info(picked, &i1);
  EXPECT_EQ(i1.tier, 1);
  kiln_model_release(picked);
  ASSERT_EQ(LoadTier(tiered, -1, need0, &picked, nullptr), KILN_OK);
  kiln_model_get_info(picked, &i0);
  EXPECT_EQ(i0.tier, 0);
  kiln_model_release(picked);
  // None fits: the smallest tier's parts are named.
  std::string message;
  EXPECT_EQ(LoadTier(tiered, -1, need1 - 1, &picked, &message), KILN_ERROR_RESOURCE_EXHAUSTED);
  EXPECT_NE(message.find("no tier of 2 fits; the smallest, tier 1"), std::string::npos) << message;
  // Asked for a tier, it is that one or an error.
  EXPECT_EQ(LoadTier(tiered, 0, need1 + 1, &picked, &message), KILN_ERROR_RESOURCE_EXHAUSTED);
  EXPECT_EQ(LoadTier(tiered, 2, 0, &picked, &message), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("tier 2: the artifact has 2"), std::string::npos) << message;
  EXPECT_EQ(LoadTier(tiered, -2, 0, &picked, &message), KILN_ERROR_INVALID_ARGUMENT);
}

// Under a shared budget a tiered artifact is loaded at the largest tier that fits the
// room left.
TEST_F(Tiers, SharedBudgetLoadsTheTierThatFits) {
  const std::string path = ::testing::TempDir() + "/kiln-tiers-test.kiln";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(merged.data()), static_cast<std::streamsize>(merged.size()));
  }
  Aligned tiered(merged);
  kiln_model_t *m0 = nullptr, *m1 = nullptr;
  ASSERT_EQ(LoadTier(tiered, 0, 0, &m0, nullptr), KILN_OK);
  ASSERT_EQ(LoadTier(tiered, 1, 0, &m1, nullptr), KILN_OK);
  const uint64_t need0 = Need(m0), need1 = Need(m1);
  kiln_model_release(m0);
  kiln_model_release(m1);
  const kiln_session_options_t so = SmallSession();
  kiln_model_options_t mo;
  kiln_model_options_init(&mo);
  mo.session = &so;
  for (const auto& [bytes, tier] : {std::pair<uint64_t, int>{need0, 0}, {need1 + (need0 - need1) / 2, 1}}) {
    kiln_shared_budget_t* budget = nullptr;
    kiln_error_t err;
    ASSERT_EQ(kiln_shared_budget_create(bytes, &budget, &err), KILN_OK);
    int32_t id = -1;
    ASSERT_EQ(kiln_shared_budget_add(budget, path.c_str(), &mo, &id, &err), KILN_OK) << err.message;
    kiln_model_t* m = nullptr;
    ASSERT_EQ(kiln_shared_budget_acquire(budget, id, &m, &err), KILN_OK) << err.message;
    kiln_model_info_t info = {};
    info.struct_size = sizeof(info);
    kiln_model_get_info(m, &info);
    EXPECT_EQ(info.tier, tier);
    kiln_shared_budget_info_t bi = {};
    bi.struct_size = sizeof(bi);
    kiln_shared_budget_get_info(budget, id, &bi);
    EXPECT_EQ(bi.model_bytes, tier == 0 ? need0 : need1);
    EXPECT_LE(bi.used_bytes, bytes);
    kiln_shared_budget_return(budget, id);
    kiln_shared_budget_release(budget);
  }
  std::remove(path.c_str());
}

// Every entry of the root's tier table, damaged: an artifact error status.
TEST_F(Tiers, DamagedTierTableIsAnErrorNotACrash) {
  const auto* root = kiln::fb::GetSizePrefixedModel(merged.data());
  ASSERT_NE(root->tiers(), nullptr);
  ASSERT_EQ(root->tiers()->size(), 2u);
  std::unique_ptr<kiln::fb::ModelT> model(root->UnPack());
  const kiln::fb::Tier good = model->tiers[1];
  struct Damage {
    const char* what;
    kiln::fb::Tier tier;
  };
  const Damage damages[] = {
      {"misaligned", kiln::fb::Tier(good.header_offset() + 8, good.header_size(), 0, 0)},
      {"past the end", kiln::fb::Tier(merged.size() - 64, good.header_size(), 0, 0)},
      {"overlapping the root", kiln::fb::Tier(0, good.header_size(), 0, 0)},
      {"wrong size", kiln::fb::Tier(good.header_offset(), good.header_size() - 8, 0, 0)},
      {"huge size", kiln::fb::Tier(good.header_offset(), ~uint64_t{0} - 4, 0, 0)},
      {"at a weight", kiln::fb::Tier((merged.size() - 4096) / 64 * 64, 4096, 0, 0)},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    model->tiers[1] = d.tier;
    const std::vector<uint8_t> header = kiln::format::tiers_detail::Pack(*model);
    std::vector<uint8_t> bytes = merged;
    ASSERT_EQ(header.size(), root->tiers()->Get(0)->header_size());  // the same size: written in place
    std::memcpy(bytes.data(), header.data(), header.size());
    Aligned a(bytes);
    kiln_model_t* m = nullptr;
    std::string message;
    for (int tier : {1, -1}) {
      const kiln_status_t st = LoadTier(a, tier, tier < 0 ? 1 : 0, &m, &message);
      EXPECT_TRUE(kiln_status_is_artifact_error(st) || st == KILN_ERROR_RESOURCE_EXHAUSTED) << st << ": " << message;
    }
  }
  // Inputs the merge refuses.
  std::vector<uint8_t> out;
  std::string error;
  EXPECT_FALSE(kiln::format::MergeTiers({}, &out, &error));
  EXPECT_FALSE(kiln::format::MergeTiers({{merged.data(), merged.size(), 0}}, &out, &error));
  EXPECT_NE(error.find("tiered artifact already"), std::string::npos) << error;
  EXPECT_FALSE(kiln::format::MergeTiers({{f32.data(), 100, 0}}, &out, &error));
}

}  // namespace
