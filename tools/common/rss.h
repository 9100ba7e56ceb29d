// Resident memory of this process, for the runtime tools' reports (Linux: from
// /proc/self/status; getrusage's ru_maxrss where that cannot be read).
#ifndef KILN_TOOLS_COMMON_RSS_H_
#define KILN_TOOLS_COMMON_RSS_H_

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln::tools {

// A field of /proc/self/status in bytes ("VmHWM:", "VmRSS:"), or -1.
inline double ProcStatusBytes(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  double bytes = -1;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof(line), f) != nullptr)
    if (std::strncmp(line, field, n) == 0) {
      bytes = std::atof(line + n) * 1024.0;
      break;
    }
  std::fclose(f);
  return bytes;
}

// Peak resident set of this process (VmHWM: since exec, or since ResetPeakRss).
inline double PeakRssBytes() {
  const double hwm = ProcStatusBytes("VmHWM:");
  if (hwm >= 0) return hwm;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0;
}

// Resets the peak to the current resident set (writing 5 to /proc/self/clear_refs,
// Linux 4.0+); false where that is not possible.
inline bool ResetPeakRss() {
  int fd = open("/proc/self/clear_refs", O_WRONLY);
  if (fd < 0) return false;
  bool ok = write(fd, "5", 1) == 1;
  close(fd);
  return ok;
}

}  // namespace kiln::tools

#endif  // KILN_TOOLS_COMMON_RSS_H_
