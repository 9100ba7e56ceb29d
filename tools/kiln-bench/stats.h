// Statistics of repeated measurements for kiln-bench: median and percentiles by
// linear interpolation between order statistics (NumPy's default, "linear"), the
// sample standard deviation, and the spread warning of the benchmark protocol.
#ifndef KILN_TOOLS_KILN_BENCH_STATS_H_
#define KILN_TOOLS_KILN_BENCH_STATS_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace kiln::tools {

struct Summary {
  size_t n = 0;
  double median = 0, p10 = 0, p90 = 0, mean = 0, stddev = 0, min = 0, max = 0;
  // Coefficient of variation: stddev / |mean| (0 when the mean is 0).
  double cv = 0;
};

// The p-quantile (0 <= p <= 1) of sorted values: position p (n - 1), interpolated.
inline double Quantile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

inline Summary Summarize(std::vector<double> v) {
  Summary s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = Quantile(v, 0.5);
  s.p10 = Quantile(v, 0.1);
  s.p90 = Quantile(v, 0.9);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  double sq = 0;
  for (double x : v) sq += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(sq / static_cast<double>(v.size() - 1)) : 0;
  s.cv = s.mean != 0 ? s.stddev / std::fabs(s.mean) : 0;
  return s;
}

// The protocol's warning: a spread above 10% (coefficient of variation) makes a
// median untrustworthy (throttling, other load).
inline bool SpreadTooLarge(const Summary& s) { return s.n > 1 && s.cv > 0.10; }

// Whether two measurements differ beyond their spread: their p10-p90 ranges do not
// overlap (with few runs, min-max ranges are the p10-p90 ones nearly).
inline bool Significant(const Summary& a, const Summary& b) { return a.p90 < b.p10 || b.p90 < a.p10; }

}  // namespace kiln::tools

#endif  // KILN_TOOLS_KILN_BENCH_STATS_H_
