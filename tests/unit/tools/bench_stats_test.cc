// kiln-bench's statistics and JSON reader (tools/kiln-bench/stats.h, json.h).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln-bench/json.h"
#include "kiln-bench/stats.h"

namespace {

using kiln::tools::Summarize;

// NumPy's np.percentile(v, [10, 50, 90]) (linear interpolation) and np.std(v, ddof=1).
TEST(BenchStats, MatchesNumpyDefinitions) {
  const kiln::tools::Summary s = Summarize({4, 1, 100, 3, 2});
  EXPECT_EQ(s.n, 5u);
  EXPECT_DOUBLE_EQ(s.median, 3);
  EXPECT_DOUBLE_EQ(s.p10, 1.4);
  EXPECT_DOUBLE_EQ(s.p90, 61.6);
  EXPECT_DOUBLE_EQ(s.mean, 22);
  EXPECT_NEAR(s.stddev, std::sqrt(7610.0 / 4), 1e-9);  // squared deviations 324+441+6084+361+400
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 100);
  EXPECT_NEAR(s.cv, std::sqrt(7610.0 / 4) / 22, 1e-12);
  const kiln::tools::Summary even = Summarize({10, 20, 30, 40});
  EXPECT_DOUBLE_EQ(even.median, 25);
  EXPECT_DOUBLE_EQ(even.p10, 13);
  EXPECT_DOUBLE_EQ(even.p90, 37);
}

TEST(BenchStats, OneAndNoValues) {
  const kiln::tools::Summary one = Summarize({7});
  EXPECT_DOUBLE_EQ(one.median, 7);
  EXPECT_DOUBLE_EQ(one.p10, 7);
  EXPECT_DOUBLE_EQ(one.p90, 7);
  EXPECT_DOUBLE_EQ(one.stddev, 0);
  EXPECT_FALSE(kiln::tools::SpreadTooLarge(one));
  EXPECT_EQ(Summarize({}).n, 0u);
}

TEST(BenchStats, SpreadWarningAndSignificance) {
  EXPECT_FALSE(kiln::tools::SpreadTooLarge(Summarize({100, 101, 99, 100, 102})));
  EXPECT_TRUE(kiln::tools::SpreadTooLarge(Summarize({100, 130, 80, 100, 120})));
  const auto a = Summarize({10, 11, 10.5, 10.2, 10.8}), b = Summarize({20, 21, 20.5, 19.8, 20.2});
  const auto c = Summarize({10.4, 11.5, 10.9, 10.1, 11.2});
  EXPECT_TRUE(kiln::tools::Significant(a, b));
  EXPECT_FALSE(kiln::tools::Significant(a, c));
}

TEST(BenchJson, ReadsNestedDocuments) {
  kiln::tools::Json j;
  std::string error;
  kiln::tools::JsonReader r(R"({"tool": "kiln-bench", "n": -1.5e2, "ok": true, "none": null,
    "list": [1, {"a": "x\"y\u00e9"}], "empty": {}, "e2": []})");
  ASSERT_TRUE(r.Parse(&j, &error)) << error;
  EXPECT_EQ(j.Str("tool"), "kiln-bench");
  EXPECT_DOUBLE_EQ(j.Num("n"), -150);
  EXPECT_TRUE(j.Get("ok")->b);
  EXPECT_EQ(j.Get("none")->kind, kiln::tools::Json::Null);
  ASSERT_EQ(j.Get("list")->items.size(), 2u);
  EXPECT_EQ(j.Get("list")->items[1].Str("a"), "x\"y\xc3\xa9");
  EXPECT_EQ(j.Get("missing"), nullptr);
}

TEST(BenchJson, RejectsMalformedText) {
  for (const char* bad : {"{", "{\"a\" 1}", "[1, 2", "{\"a\": tru}", "\"open", "{\"a\": 1} x", "", "[1,]"}) {
    kiln::tools::Json j;
    std::string error;
    kiln::tools::JsonReader r(bad);
    EXPECT_FALSE(r.Parse(&j, &error)) << bad;
    EXPECT_NE(error.find("byte"), std::string::npos) << bad << ": " << error;
  }
}

}  // namespace
