// Operating-system services the runtime needs: file mapping, CPU features, time.
#ifndef KILN_RUNTIME_PLATFORM_PLATFORM_H_
#define KILN_RUNTIME_PLATFORM_PLATFORM_H_

#include <cstddef>
#include <cstdint>

#include "kiln/kiln.h"

namespace kiln::rt {

// A read-only mapping of a whole file.
struct FileMapping {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// Maps `path` read-only. Empty files and files larger than the address space fail
// with KILN_ERROR_IO / KILN_ERROR_ARTIFACT_TRUNCATED and a message naming the file.
kiln_status_t MapFile(const char* path, FileMapping* out, kiln_error_t* error);
void UnmapFile(FileMapping* mapping);

// kiln::format::CpuFeature bits this CPU has.
uint64_t DetectCpuFeatures();

// Online CPUs (at least 1).
int CpuCount();

// The default thread count of a session: the CPUs this process may run on, without
// the slowest cluster of a heterogeneous (big.LITTLE) CPU, whose cores would hold up
// every parallel loop's end. Linux/Android read each allowed CPU's capacity
// (/sys/devices/system/cpu/cpuN/cpu_capacity, else cpufreq/cpuinfo_max_freq);
// Apple counts the performance cores (hw.perflevel0.logicalcpu). At least 1.
int PerformanceCpuCount();

// The CPUs to use among `capacities` (one per allowed CPU; 0 = unknown): all of them
// when they are equal or any is unknown, else those above the lowest capacity.
int CountPerformanceCpus(const int64_t* capacities, int n);

// Linux/Android: PerformanceCpuCount's reading of `sysfs_cpu_dir` (normally
// /sys/devices/system/cpu) for the CPUs `cpus` ([n] ids); 0 if nothing is readable.
int PerformanceCpuCountFromSysfs(const char* sysfs_cpu_dir, const int* cpus, int n);

// Monotonic clock in seconds.
double NowSeconds();

// Pages for loaded machine code, never writable and executable at once:
// AllocateCodePages maps `bytes` (rounded up to whole pages) zero-filled and
// read+write, or returns nullptr; ProtectCodePages turns them read+execute (false if
// the system refuses); FreeCodePages unmaps them (`bytes` as allocated).
void* AllocateCodePages(size_t bytes);
bool ProtectCodePages(void* p, size_t bytes);
void FreeCodePages(void* p, size_t bytes);

// Gives the whole pages inside [p, p + bytes) back to the system (madvise
// MADV_DONTNEED): anonymous pages read as zeros afterwards, a private file mapping's
// are read from the file again. For memory whose contents are no longer needed, or
// can be read again.
void DiscardPages(const void* p, size_t bytes);

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_PLATFORM_PLATFORM_H_
