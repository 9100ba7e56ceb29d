// byte_size.h — byte counts as people write them ("1.2GB", "800MB", "512MiB",
// "123456"): the one parser of kiln-compile's and kiln-run's --memory-budget.
// Header-only, C++17, no dependencies.
#ifndef KILN_FORMATS_BYTE_SIZE_H_
#define KILN_FORMATS_BYTE_SIZE_H_

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

namespace kiln::format {

// Decimal units (KB, MB, GB, or K, M, G) are powers of 1000, binary ones (KiB, MiB,
// GiB) of 1024, B or none bytes; the number may have a fraction and must be positive.
inline std::optional<uint64_t> ParseByteSize(std::string text) {
  auto trim = [](std::string& s) {
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.pop_back();
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.erase(s.begin());
  };
  trim(text);
  struct Unit {
    const char* suffix;
    double factor;
  };
  static const Unit kUnits[] = {{"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0}, {"GB", 1e9},
                                {"MB", 1e6},           {"KB", 1e3},        {"G", 1e9},       {"M", 1e6},
                                {"K", 1e3},            {"B", 1.0}};
  double factor = 1.0;
  for (const Unit& u : kUnits) {
    const std::string suffix = u.suffix;
    if (text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0) {
      text.resize(text.size() - suffix.size());
      factor = u.factor;
      break;
    }
  }
  trim(text);
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !(value > 0) || value * factor >= 1.8e19) return std::nullopt;
  return static_cast<uint64_t>(value * factor);
}

}  // namespace kiln::format

#endif  // KILN_FORMATS_BYTE_SIZE_H_
