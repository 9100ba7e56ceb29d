// The platform layer's choices that can be checked without the hardware: the default
// thread count on heterogeneous (big.LITTLE) CPUs, read from a sysfs-like tree.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "platform/platform.h"

namespace {

using kiln::rt::CountPerformanceCpus;
using kiln::rt::PerformanceCpuCountFromSysfs;

int Count(std::vector<int64_t> capacities) {
  return CountPerformanceCpus(capacities.data(), static_cast<int>(capacities.size()));
}

TEST(Platform, PerformanceCpusLeaveOutTheSlowestCluster) {
  EXPECT_EQ(Count({1024, 1024, 1024, 1024}), 4);                  // symmetric: all
  EXPECT_EQ(Count({400, 400, 400, 400, 1024, 1024, 1024, 1024}), 4);  // 4 LITTLE + 4 big
  EXPECT_EQ(Count({350, 350, 820, 820, 820, 820, 820, 1024}), 6);   // 2 LITTLE + 5 big + 1 prime
  EXPECT_EQ(Count({1024, 0, 512}), 3);                              // one unknown: all
  EXPECT_EQ(Count({512}), 1);
  EXPECT_EQ(Count({}), 1);
}

// A fake /sys/devices/system/cpu with `files` (relative path -> contents).
class FakeSysfs {
 public:
  FakeSysfs() {
    char templ[] = "/tmp/kiln-sysfs-XXXXXX";
    root_ = mkdtemp(templ);
  }
  ~FakeSysfs() { std::system(("rm -rf '" + root_ + "'").c_str()); }
  void Write(const std::string& rel, const std::string& text) {
    size_t start = 0;
    for (size_t slash; (slash = rel.find('/', start)) != std::string::npos; start = slash + 1)
      mkdir((root_ + "/" + rel.substr(0, slash)).c_str(), 0755);
    FILE* f = std::fopen((root_ + "/" + rel).c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  const char* root() const { return root_.c_str(); }

 private:
  std::string root_;
};

TEST(Platform, PerformanceCpusFromSysfs) {
  const int cpus[] = {0, 1, 2, 3, 4, 5};
  {
    FakeSysfs fs;  // cpu_capacity (arm64 topology): 2 LITTLE, 4 big
    for (int c = 0; c < 6; ++c) fs.Write("cpu" + std::to_string(c) + "/cpu_capacity", c < 2 ? "381\n" : "1024\n");
    EXPECT_EQ(PerformanceCpuCountFromSysfs(fs.root(), cpus, 6), 4);
    EXPECT_EQ(PerformanceCpuCountFromSysfs(fs.root(), cpus, 2), 2);  // only LITTLE cores allowed: them
  }
  {
    FakeSysfs fs;  // no capacity: the cpufreq maxima
    for (int c = 0; c < 6; ++c)
      fs.Write("cpu" + std::to_string(c) + "/cpufreq/cpuinfo_max_freq", c < 4 ? "1800000\n" : "2850000\n");
    EXPECT_EQ(PerformanceCpuCountFromSysfs(fs.root(), cpus, 6), 2);
  }
  {
    FakeSysfs fs;  // nothing readable (a VM): 0, the caller counts every allowed CPU
    EXPECT_EQ(PerformanceCpuCountFromSysfs(fs.root(), cpus, 6), 0);
  }
  EXPECT_GE(kiln::rt::PerformanceCpuCount(), 1);
  EXPECT_LE(kiln::rt::PerformanceCpuCount(), kiln::rt::CpuCount());
}

}  // namespace
