// support/sort.h: the runtime's one out-of-line sort for its cold paths, against
// std::sort on random arrays of the element types it serves (ints, pairs of pointers,
// string views with ties broken by position).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

#include "support/sort.h"

namespace {

TEST(Sort, OrdersAsStdSortDoes) {
  std::mt19937 rng(3);
  for (size_t n : {0, 1, 2, 3, 7, 16, 100, 1000, 4097}) {
    std::vector<int32_t> a(n);
    for (auto& v : a) v = static_cast<int32_t>(rng() % (n / 2 + 1)) - 5;  // with ties
    std::vector<int32_t> want = a;
    std::sort(want.begin(), want.end());
    kiln::rt::Sort(a.data(), a.data() + a.size(), [](int32_t x, int32_t y) { return x < y; });
    EXPECT_EQ(a, want) << n;
  }
}

TEST(Sort, LargerElementsAndAComparatorWithState) {
  struct Entry {
    std::string_view name;
    int32_t id;
    bool flag;
  };
  static_assert(sizeof(Entry) > 16, "an element wider than two words");
  const char* words[] = {"b", "a", "ab", "ba", "abc", "", "zz", "a", "b"};
  std::vector<Entry> e;
  for (int32_t i = 0; i < 9; ++i) e.push_back({words[i], i, i % 2 == 0});
  // Descending length, then text, then position: a strict total order.
  int32_t bias = 100;  // state the comparator carries (Sort passes it by pointer)
  auto less = [bias](const Entry& x, const Entry& y) {
    if (x.name.size() != y.name.size()) return x.name.size() > y.name.size();
    if (x.name != y.name) return x.name < y.name;
    return x.id + bias < y.id + bias;
  };
  std::vector<Entry> want = e;
  std::sort(want.begin(), want.end(), less);
  kiln::rt::Sort(e.data(), e.data() + e.size(), less);
  for (size_t i = 0; i < e.size(); ++i) {
    EXPECT_EQ(e[i].name, want[i].name) << i;
    EXPECT_EQ(e[i].id, want[i].id) << i;
    EXPECT_EQ(e[i].flag, want[i].flag) << i;
  }
}

}  // namespace
