// POSIX (Linux, Android, macOS, iOS) implementation of platform.h.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <initializer_list>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__linux__) && defined(__aarch64__)
#include <sys/auxv.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif

#include "formats/kiln_format.h"
#include "platform/platform.h"
#include "support/error.h"

namespace kiln::rt {

kiln_status_t MapFile(const char* path, FileMapping* out, kiln_error_t* error) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Fail(error, KILN_ERROR_IO, "%s: cannot open: %s", path, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Fail(error, KILN_ERROR_IO, "%s: cannot stat: %s", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Fail(error, KILN_ERROR_IO, "%s: not a regular file", path);
  }
  if (st.st_size <= 0) {
    ::close(fd);
    return Fail(error, KILN_ERROR_ARTIFACT_TRUNCATED, "%s: file is empty", path);
  }
  if (static_cast<uint64_t>(st.st_size) > SIZE_MAX) {
    ::close(fd);
    return Fail(error, KILN_ERROR_IO, "%s: file too large for the address space", path);
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) return Fail(error, KILN_ERROR_IO, "%s: mmap failed: %s", path, std::strerror(e));
  out->data = static_cast<const uint8_t*>(p);
  out->size = size;
  return KILN_OK;
}

void UnmapFile(FileMapping* mapping) {
  if (mapping->data != nullptr) ::munmap(const_cast<uint8_t*>(mapping->data), mapping->size);
  mapping->data = nullptr;
  mapping->size = 0;
}

uint64_t DetectCpuFeatures() {
  uint64_t f = 0;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) f |= format::kCpuX86Avx2;
  if (__builtin_cpu_supports("fma")) f |= format::kCpuX86Fma;
  if (__builtin_cpu_supports("avx512f")) f |= format::kCpuX86Avx512F;
  if (__builtin_cpu_supports("avx512bw")) f |= format::kCpuX86Avx512Bw;
  if (__builtin_cpu_supports("avx512vnni")) f |= format::kCpuX86Avx512Vnni;
  if (__builtin_cpu_supports("avx512vl")) f |= format::kCpuX86Avx512Vl;
  if (__builtin_cpu_supports("f16c")) f |= format::kCpuX86F16c;
  if (__builtin_cpu_supports("avxvnni")) f |= format::kCpuX86AvxVnni;
#elif defined(__aarch64__)
  f |= format::kCpuArmNeon;
#if defined(__linux__)
  unsigned long hw = getauxval(AT_HWCAP);
  unsigned long hw2 = getauxval(AT_HWCAP2);
  if (hw & (1ul << 9)) f |= format::kCpuArmFp16;      // HWCAP_FPHP
  if (hw & (1ul << 20)) f |= format::kCpuArmDotProd;  // HWCAP_ASIMDDP
  if (hw & (1ul << 22)) f |= format::kCpuArmSve;      // HWCAP_SVE
  if (hw2 & (1ul << 13)) f |= format::kCpuArmI8mm;    // HWCAP2_I8MM
  if (hw2 & (1ul << 23)) f |= format::kCpuArmSme;     // HWCAP2_SME
  if (hw2 & (1ull << 37)) f |= format::kCpuArmSme2;   // HWCAP2_SME2
#endif
#endif
  return f;
}

int CpuCount() {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int CountPerformanceCpus(const int64_t* capacities, int n) {
  if (n <= 0) return 1;
  int64_t lo = capacities[0], hi = capacities[0];
  for (int i = 0; i < n; ++i) {
    if (capacities[i] <= 0) return n;  // unknown: every CPU
    lo = capacities[i] < lo ? capacities[i] : lo;
    hi = capacities[i] > hi ? capacities[i] : hi;
  }
  if (lo == hi) return n;
  int count = 0;
  for (int i = 0; i < n; ++i) count += capacities[i] > lo ? 1 : 0;
  return count;
}

namespace {

// The first integer in the file, or 0.
int64_t ReadInteger(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[32];
  ssize_t got = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (got <= 0) return 0;
  buf[got] = 0;
  return std::strtoll(buf, nullptr, 10);
}

}  // namespace

int PerformanceCpuCountFromSysfs(const char* sysfs_cpu_dir, const int* cpus, int n) {
  if (n <= 0) return 0;
  int64_t capacities[1024];
  if (n > 1024) n = 1024;
  char path[512];
  for (const char* file : {"cpu_capacity", "cpufreq/cpuinfo_max_freq"}) {
    bool known = true;
    for (int i = 0; i < n && known; ++i) {
      std::snprintf(path, sizeof(path), "%s/cpu%d/%s", sysfs_cpu_dir, cpus[i], file);
      capacities[i] = ReadInteger(path);
      known = capacities[i] > 0;
    }
    if (known) return CountPerformanceCpus(capacities, n);
  }
  return 0;
}

int PerformanceCpuCount() {
#if defined(__APPLE__)
  int perf = 0;
  size_t len = sizeof(perf);
  if (::sysctlbyname("hw.perflevel0.logicalcpu", &perf, &len, nullptr, 0) == 0 && perf > 0) return perf;
  return CpuCount();
#elif defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return CpuCount();
  int cpus[CPU_SETSIZE];
  int n = 0;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus[n++] = c;
  if (n == 0) return CpuCount();
  const int perf = PerformanceCpuCountFromSysfs("/sys/devices/system/cpu", cpus, n);
  return perf > 0 ? perf : n;
#else
  return CpuCount();
#endif
}

double NowSeconds() {
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void* AllocateCodePages(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

bool ProtectCodePages(void* p, size_t bytes) { return ::mprotect(p, bytes, PROT_READ | PROT_EXEC) == 0; }

void FreeCodePages(void* p, size_t bytes) {
  if (p != nullptr) ::munmap(p, bytes);
}

void DiscardPages(const void* p, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(page - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace kiln::rt
