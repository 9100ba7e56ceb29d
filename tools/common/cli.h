// Command-line parsing shared by the runtime tools (kiln-run, kiln-inspect): CLI11 with
// the tools' exit codes and a suggestion for a mistyped option.
//
// Exit codes of every tool: 0 success (also --help, --version); 1 the work failed (a
// file that cannot be read or written, an artifact the runtime refuses, a failed
// generation); 2 a usage error (unknown or malformed option, missing argument, value
// out of range), reported before any work.
#ifndef KILN_TOOLS_COMMON_CLI_H_
#define KILN_TOOLS_COMMON_CLI_H_

#include <CLI/CLI.hpp>

#include "kiln/kiln.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace kiln::tools {

// The KV-cache encodings by their command-line names (--kv-cache), kiln_kv_cache_t
// values; CLI11's transform maps the name to the value and refuses any other.
inline std::map<std::string, int> KvCacheNames() {
  return {{"f32", KILN_KV_CACHE_F32}, {"f16", KILN_KV_CACHE_F16}, {"int8", KILN_KV_CACHE_INT8},
          {"int4", KILN_KV_CACHE_INT4}};
}
inline const char* KvCacheName(int kv_cache) {
  static const char* const kNames[] = {"default", "f32", "f16", "int8", "int4"};
  return kv_cache >= KILN_KV_CACHE_DEFAULT && kv_cache <= KILN_KV_CACHE_INT4 ? kNames[kv_cache] : "unknown";
}

// --pressure KIND=LEVEL[,KIND=LEVEL...] (memory|thermal|battery = none|moderate|serious|
// critical) as (kiln_pressure_kind_t, kiln_pressure_level_t) pairs; false with a message
// naming the part it cannot read.
inline bool ParsePressure(const std::string& spec, std::vector<std::pair<int, int>>* out, std::string* error) {
  static const std::map<std::string, int> kKinds = {
      {"memory", KILN_PRESSURE_MEMORY}, {"thermal", KILN_PRESSURE_THERMAL}, {"battery", KILN_PRESSURE_BATTERY}};
  static const std::map<std::string, int> kLevels = {{"none", KILN_PRESSURE_NONE},
                                                     {"moderate", KILN_PRESSURE_MODERATE},
                                                     {"serious", KILN_PRESSURE_SERIOUS},
                                                     {"critical", KILN_PRESSURE_CRITICAL}};
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t end = std::min(spec.find(',', start), spec.size());
    const std::string part = spec.substr(start, end - start);
    const size_t eq = part.find('=');
    auto kind = kKinds.find(part.substr(0, eq));
    auto level = eq == std::string::npos ? kLevels.end() : kLevels.find(part.substr(eq + 1));
    if (kind == kKinds.end() || level == kLevels.end()) {
      *error = "'" + part + "' is not KIND=LEVEL (KIND: memory, thermal, battery; LEVEL: none, moderate, serious, "
               "critical)";
      return false;
    }
    out->emplace_back(kind->second, level->second);
    start = end + 1;
  }
  return true;
}

// Levenshtein distance.
inline size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The option of `app` nearest to `arg` ("--promt" -> "--prompt"), or "" if none is close.
inline std::string NearestOption(const CLI::App& app, const std::string& arg) {
  const std::string key = arg.substr(0, arg.find('='));
  std::string best;
  size_t best_distance = std::max<size_t>(2, key.size() / 3) + 1;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& name : o->get_lnames()) {
      const std::string flag = "--" + name;
      const size_t d = EditDistance(key, flag);
      if (d < best_distance) {
        best_distance = d;
        best = flag;
      }
    }
  }
  return best;
}

// Parses the command line. Returns -1 to go on, else the exit code: 0 after --help or
// --version, 2 after a usage error (CLI11's message, and for an unknown option the
// nearest known one).
inline int ParseCommandLine(CLI::App& app, int argc, char** argv, const char* tool) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    for (const std::string& extra : app.remaining()) {
      if (extra.size() < 2 || extra[0] != '-') continue;
      const std::string near = NearestOption(app, extra);
      if (!near.empty()) std::fprintf(stderr, "%s: did you mean %s (not %s)?\n", tool, near.c_str(), extra.c_str());
    }
    std::fprintf(stderr, "Run with --help for the options.\n");
    return 2;
  }
}

}  // namespace kiln::tools

#endif  // KILN_TOOLS_COMMON_CLI_H_
