// One-line progress of a long compile step on a terminal: what, how many of how many,
// the current item, the time so far and the time left (extrapolated from the items
// done). Draws nothing when disabled (not a terminal, kiln-compile --quiet).
#ifndef KILN_SUPPORT_PROGRESS_H_
#define KILN_SUPPORT_PROGRESS_H_

#include <chrono>
#include <cstdio>
#include <string>

namespace kiln::tools {

class Progress {
 public:
  Progress(bool enabled, const char* what, size_t total)
      : enabled_(enabled), what_(what), total_(total), start_(Clock::now()) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `done` of the total are finished; `detail` names the one being worked on. Redraws
  // at most every 100 ms (and always for the last).
  void update(size_t done, const std::string& detail = "") {
    if (!enabled_) return;
    const Clock::time_point now = Clock::now();
    if (done < total_ && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
    drawn_ = true;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    std::string eta = "";
    if (done > 0 && done < total_)
      eta = ", " + Duration(elapsed / static_cast<double>(done) * static_cast<double>(total_ - done)) + " left";
    std::fprintf(stderr, "\r\033[K%s: %zu/%zu %s (%s%s)", what_, done, total_, detail.c_str(),
                 Duration(elapsed).c_str(), eta.c_str());
    std::fflush(stderr);
  }
  ~Progress() {
    if (enabled_ && drawn_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  using Clock = std::chrono::steady_clock;
  static std::string Duration(double seconds) {
    char buf[32];
    if (seconds < 60)
      std::snprintf(buf, sizeof(buf), "%.0fs", seconds);
    else if (seconds < 3600)
      std::snprintf(buf, sizeof(buf), "%dm%02ds", static_cast<int>(seconds) / 60, static_cast<int>(seconds) % 60);
    else
      std::snprintf(buf, sizeof(buf), "%dh%02dm", static_cast<int>(seconds) / 3600,
                    static_cast<int>(seconds) / 60 % 60);
    return buf;
  }
  bool enabled_;
  const char* what_;
  size_t total_;
  Clock::time_point start_, last_;
  bool drawn_ = false;
};

}  // namespace kiln::tools

#endif  // KILN_SUPPORT_PROGRESS_H_
