// kiln-bench: time a compiled model the way on-device VLM results should be reported.
//
//   kiln-bench model.kiln [more.kiln ...] [--image photo.png | --image-size 512x512]
//              [--prompt TEXT | --prompt-tokens N] [--gen-tokens N] [--threads 1,2,4]
//              [--mode warm|cold|both] [--repetitions 5] [--warmup 1] [--cold-cmd CMD]
//              [--output md|json|jsonl|csv] [-o FILE]
//   kiln-bench --compare A.json B.json
//
// For every artifact, mode and thread count: `--warmup` unrecorded answers, then
// `--repetitions` recorded ones. Warm: the model loaded and a session made once, each
// repetition one answer (image set, prompt, generation). Cold: each repetition evicts
// the artifact's pages from the page cache first (posix_fadvise DONTNEED, or
// `--cold-cmd`), then loads and verifies the model, makes a session and answers; the
// fraction of the file still cached before the load is reported. Per run: the time of
// each stage the runtime measures (kiln_stats_t), prefill and decode tokens/s, the
// whole answer, peak RSS (VmHWM, reset per run where Linux allows) and the KV cache
// and arena bytes; per configuration the thermal zones and CPU frequencies before and
// after. Statistics per metric: median, p10/p90, mean, standard deviation, min/max,
// and a warning when the spread (coefficient of variation) exceeds 10%.
// docs/benchmarking.md describes the protocol and the output.
#include <CLI/CLI.hpp>

#include "common/cli.h"
#include "common/rss.h"
#include "common/tensor_label.h"
#include "common/text.h"
#include "kiln-bench/json.h"
#include "kiln-bench/stats.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "formats/kiln_format.h"
#include "formats/kiln_generated.h"
#include "kiln/kiln.h"
#include "support/image_file.h"

namespace fb = kiln::fb;
using kiln::tools::Json;
using kiln::tools::Summary;

namespace {

constexpr const char* kTool = "kiln-bench";

double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using kiln::tools::JsonEscape;
std::string Q(const std::string& s) { return "\"" + JsonEscape(s) + "\""; }
// A number for JSON and tables: integers (byte and token counts) in full, others to 9
// significant digits (statistics recomputed from the runs agree).
std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  else
    std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}
std::string BaseName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}
std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}
bool ReadText(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

// ---------------------------------------------------------------------------------
// The machine: CPU model, features and cores (Linux/Android /proc/cpuinfo).
struct Machine {
  std::string cpu = "unknown", features, os;
  int cores = 0;
};
Machine DescribeMachine() {
  Machine m;
  m.cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  std::string info;
  if (ReadText("/proc/cpuinfo", &info)) {
    std::istringstream in(info);
    std::string line, implementer, part, hardware;
    while (std::getline(in, line)) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      const std::string key = Trim(line.substr(0, colon)), value = Trim(line.substr(colon + 1));
      if (key == "model name" && m.cpu == "unknown") m.cpu = value;
      if ((key == "flags" || key == "Features") && m.features.empty()) m.features = value;
      if (key == "CPU implementer" && implementer.empty()) implementer = value;
      if (key == "CPU part" && part.empty()) part = value;
      if (key == "Hardware") hardware = value;
    }
    if (m.cpu == "unknown" && !implementer.empty())  // AArch64: no model name; the MIDR fields
      m.cpu = "implementer " + implementer + " part " + part + (hardware.empty() ? "" : " (" + hardware + ")");
  }
  std::string release;
  if (ReadText("/proc/sys/kernel/osrelease", &release)) m.os = "Linux " + Trim(release);
  return m;
}

// Thermal zones (°C) and CPU frequencies (MHz) where sysfs exposes them (Linux, Android).
struct Thermal {
  std::vector<std::pair<std::string, double>> zones;
  std::vector<double> cpu_mhz;
};
Thermal ReadThermal() {
  Thermal t;
  for (int i = 0; i < 64; ++i) {
    const std::string dir = "/sys/class/thermal/thermal_zone" + std::to_string(i);
    std::string temp, type;
    if (!ReadText(dir + "/temp", &temp)) {
      if (i > 0 && access(dir.c_str(), F_OK) != 0) break;
      continue;
    }
    ReadText(dir + "/type", &type);
    t.zones.push_back({Trim(type).empty() ? "zone" + std::to_string(i) : Trim(type), std::atof(temp.c_str()) / 1000.0});
  }
  for (int c = 0; c < 256; ++c) {
    std::string khz;
    if (!ReadText("/sys/devices/system/cpu/cpu" + std::to_string(c) + "/cpufreq/scaling_cur_freq", &khz)) break;
    t.cpu_mhz.push_back(std::atof(khz.c_str()) / 1000.0);
  }
  return t;
}
std::string ThermalJson(const Thermal& t) {
  std::string s = "{\"thermal_c\": {";
  for (size_t i = 0; i < t.zones.size(); ++i) s += (i ? ", " : "") + Q(t.zones[i].first) + ": " + Num(t.zones[i].second);
  s += "}, \"cpu_mhz\": [";
  for (size_t i = 0; i < t.cpu_mhz.size(); ++i) s += (i ? ", " : "") + Num(t.cpu_mhz[i]);
  return s + "]}";
}

// Peak resident set: VmHWM, reset per run (tools/common/rss.h).
using kiln::tools::PeakRssBytes;
using kiln::tools::ResetPeakRss;

// Fraction of the file's pages in the page cache (mincore on a fresh mapping), or -1.
double CachedFraction(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  struct stat st;
  double fraction = -1;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
      const long page = sysconf(_SC_PAGESIZE);
      const size_t pages = (static_cast<size_t>(st.st_size) + page - 1) / page;
      std::vector<unsigned char> vec(pages);
      if (mincore(map, static_cast<size_t>(st.st_size), vec.data()) == 0) {
        size_t in = 0;
        for (unsigned char v : vec) in += v & 1;
        fraction = static_cast<double>(in) / static_cast<double>(pages);
      }
      munmap(map, static_cast<size_t>(st.st_size));
    }
  }
  close(fd);
  return fraction;
}
bool EvictFromPageCache(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  bool ok = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  close(fd);
  return ok;
}

// ---------------------------------------------------------------------------------
// What an artifact is: read from its FlatBuffer once the runtime has verified it.
struct ArtifactFacts {
  std::string path, architecture, target, features = "none", code_checksum, source_hash;
  uint64_t file_bytes = 0, weight_bytes = 0;
  int32_t image_size = 0, image_tokens = 0;
  std::map<std::string, uint64_t> precision;  // encoding label -> stored bytes
};
using kiln::tools::EncodingLabel;
std::string FeatureNames(uint64_t bits) {
  std::string s;
  for (uint64_t b = 1; b != 0; b <<= 1)
    if ((bits & b) && kiln::format::CpuFeatureName(b)) s += (s.empty() ? "" : ",") + std::string(kiln::format::CpuFeatureName(b));
  return s.empty() ? "none" : s;
}
bool DescribeArtifact(const std::string& path, ArtifactFacts* a, std::string* error) {
  kiln_error_t err;
  if (kiln_artifact_verify(path.c_str(), 0, &err) != KILN_OK) {
    *error = err.message;
    return false;
  }
  int fd = open(path.c_str(), O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    if (fd >= 0) close(fd);
    *error = path + ": " + std::strerror(errno);
    return false;
  }
  void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    *error = path + ": cannot map: " + std::strerror(errno);
    return false;
  }
  const fb::Model* m = fb::GetSizePrefixedModel(map);
  a->path = path;
  a->file_bytes = static_cast<uint64_t>(st.st_size);
  a->architecture = m->metadata() && m->metadata()->architecture() ? m->metadata()->architecture()->str() : "";
  a->features = FeatureNames(m->required_cpu_features());
  if (const fb::CodeSegment* code = m->code()) {
    char buf[24];
    std::snprintf(buf, sizeof(buf), "%016" PRIx64, code->checksum());
    a->code_checksum = buf;
  }
  for (uint32_t i = 0; m->precision() && i < m->precision()->size(); ++i) {
    const fb::PrecisionEntry* e = m->precision()->Get(i);
    a->precision[EncodingLabel(m->tensors()->Get(e->tensor()))] += e->bytes();
  }
  munmap(map, static_cast<size_t>(st.st_size));
  return true;
}

// ---------------------------------------------------------------------------------
// One benchmark configuration and its runs.
struct Params {
  std::string image_path, prompt;
  int image_w = 0, image_h = 0;  // generated image when > 0
  int prompt_tokens = 0, gen_tokens = 32, repetitions = 5, warmup = 1;
  int kv_cache = KILN_KV_CACHE_DEFAULT;  // the sessions' KV-cache encoding
  std::string cold_cmd;
};
using Run = std::map<std::string, double>;  // metric -> value
struct Result {
  const ArtifactFacts* artifact = nullptr;
  std::string mode;
  int threads = 0;  // asked (0: the runtime's default)
  std::vector<Run> runs;
  Thermal before, after;
  std::vector<std::string> warnings;
  std::string prompt_used;
};

// The metrics, in report order, and whether a run of the mode has them.
const char* const kMetrics[] = {"load_ms",        "session_ms",       "image_preprocess_ms", "vision_encoder_ms",
                                "projector_ms",   "prefill_ms",       "prefill_tokens_per_s", "first_token_ms",
                                "ttft_ms",        "decode_ms",        "decode_tokens_per_s", "answer_ms",
                                "cold_total_ms",  "peak_rss_bytes",   "peak_allocated_bytes", "kv_cache_bytes",
                                "arena_bytes",    "prompt_tokens",    "image_tokens",         "generated_tokens",
                                "decode_steps",
                                "threads_used",   "cached_fraction_before"};

// A deterministic test image: smooth gradients and a few blocks (8-bit RGB).
kiln::tools::RgbImage GeneratedImage(int w, int h) {
  kiln::tools::RgbImage img;
  img.width = w;
  img.height = h;
  img.pixels.resize(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &img.pixels[(static_cast<size_t>(y) * w + x) * 3];
      const bool block = ((x * 8 / w) + (y * 8 / h)) % 3 == 0;
      p[0] = static_cast<uint8_t>(block ? 220 : 255 * x / std::max(1, w - 1));
      p[1] = static_cast<uint8_t>(block ? 40 : 255 * y / std::max(1, h - 1));
      p[2] = static_cast<uint8_t>((x + y) * 255 / std::max(1, w + h - 2));
    }
  return img;
}

// A prompt of exactly n tokens of the model's tokenizer (a word repeated), or "".
std::string PromptOfTokens(kiln_model_t* model, int n, std::string* error) {
  for (const char* word : {" the", " a", " hello", " x"}) {
    std::string text;
    for (int reps = n; reps <= 4 * n + 8; ++reps) {
      text.clear();
      for (int i = 0; i < reps && static_cast<int>(text.size()) < 64 * n + 64; ++i) text += word;
      text.erase(0, 1);  // no leading space
      size_t count = 0;
      kiln_error_t err;
      if (kiln_tokenize(model, text.c_str(), text.size(), 0, nullptr, 0, &count, &err) != KILN_OK &&
          count == 0) {
        *error = err.message;
        return "";
      }
      if (static_cast<int>(count) == n) return text;
      if (static_cast<int>(count) > n) break;
    }
  }
  *error = "cannot build a prompt of exactly " + std::to_string(n) + " tokens with this tokenizer";
  return "";
}

struct Bench {
  Params p;
  kiln::tools::RgbImage image;
  bool has_image = false;

  // One answer on a ready session, from a cold start (the image encoded and every
  // prompt token prefilled, nothing reused from the run before); fills the stage metrics.
  bool Answer(kiln_session_t* s, const std::string& prompt, Run* run, std::string* error) {
    kiln_error_t err;
    kiln_session_reset(s);
    if (has_image &&
        kiln_session_set_image_rgb(s, image.pixels.data(), image.width, image.height,
                                   static_cast<size_t>(image.width) * 3, &err) != KILN_OK) {
      *error = err.message;
      return false;
    }
    kiln_generate_options_t go;
    kiln_generate_options_init(&go);
    go.max_new_tokens = p.gen_tokens;
    if (kiln_session_generate(s, prompt.c_str(), &go, &err) != KILN_OK) {
      *error = err.message;
      return false;
    }
    kiln_stats_t st = {};
    st.struct_size = sizeof(st);
    kiln_session_get_stats(s, &st);
    Run& r = *run;
    r["image_preprocess_ms"] = st.image_preprocess_ms;
    r["vision_encoder_ms"] = st.vision_encoder_ms;
    r["projector_ms"] = st.projector_ms;
    r["prefill_ms"] = st.prefill_ms;
    r["prefill_tokens_per_s"] = st.prefill_ms > 0 ? st.prompt_tokens / (st.prefill_ms / 1000.0) : 0;
    r["first_token_ms"] = st.first_token_ms;
    r["ttft_ms"] = st.ttft_ms;
    r["decode_ms"] = st.decode_ms;
    r["decode_tokens_per_s"] = st.decode_tokens_per_s;
    r["answer_ms"] = st.ttft_ms + st.decode_ms;
    r["peak_allocated_bytes"] = static_cast<double>(st.peak_allocated_bytes);
    r["kv_cache_bytes"] = static_cast<double>(st.kv_cache_bytes);
    r["arena_bytes"] = static_cast<double>(st.arena_bytes);
    r["prompt_tokens"] = st.prompt_tokens;
    r["image_tokens"] = st.image_tokens;
    r["generated_tokens"] = st.generated_tokens;
    r["decode_steps"] = st.decode_steps;
    r["threads_used"] = st.num_threads;
    return true;
  }

  bool Load(const std::string& path, int threads, kiln_model_t** model, kiln_session_t** session, Run* run,
            std::string* error) {
    kiln_error_t err;
    double t0 = NowMs();
    if (kiln_model_load(path.c_str(), nullptr, model, &err) != KILN_OK) {
      *error = err.message;
      return false;
    }
    double t1 = NowMs();
    kiln_session_options_t so = {};
    so.struct_size = sizeof(so);
    so.num_threads = threads;
    so.kv_cache = p.kv_cache;
    if (kiln_session_create(*model, &so, session, &err) != KILN_OK) {
      kiln_model_release(*model);
      *model = nullptr;
      *error = err.message;
      return false;
    }
    (*run)["load_ms"] = t1 - t0;
    (*run)["session_ms"] = NowMs() - t1;
    return true;
  }

  bool RunConfig(const ArtifactFacts& a, const std::string& mode, int threads, Result* out, std::string* error) {
    out->artifact = &a;
    out->mode = mode;
    out->threads = threads;
    out->before = ReadThermal();
    std::string prompt = p.prompt;
    const int total = p.warmup + p.repetitions;
    kiln_model_t* model = nullptr;
    kiln_session_t* session = nullptr;
    Run loadRun;
    auto release = [&] {
      kiln_session_release(session);
      kiln_model_release(model);
      session = nullptr;
      model = nullptr;
    };
    if (mode == "warm" && !Load(a.path, threads, &model, &session, &loadRun, error)) return false;
    for (int rep = 0; rep < total; ++rep) {
      Run run;
      const bool recorded = rep >= p.warmup;
      if (mode == "cold") {
        if (!p.cold_cmd.empty()) {
          if (std::system(p.cold_cmd.c_str()) != 0) {
            *error = "--cold-cmd '" + p.cold_cmd + "' failed";
            return false;
          }
        } else if (!EvictFromPageCache(a.path)) {
          *error = a.path + ": posix_fadvise(DONTNEED) failed: " + std::strerror(errno);
          return false;
        }
        run["cached_fraction_before"] = CachedFraction(a.path);
        ResetPeakRss();
        const double t0 = NowMs();
        if (!Load(a.path, threads, &model, &session, &run, error)) return false;
        if (p.prompt_tokens > 0 && prompt.empty() && (prompt = PromptOfTokens(model, p.prompt_tokens, error)).empty())
          return release(), false;
        if (!Answer(session, prompt, &run, error)) return release(), false;
        run["cold_total_ms"] = NowMs() - t0;
        run["peak_rss_bytes"] = PeakRssBytes();
        release();
      } else {
        if (p.prompt_tokens > 0 && prompt.empty() && (prompt = PromptOfTokens(model, p.prompt_tokens, error)).empty())
          return release(), false;
        ResetPeakRss();
        if (!Answer(session, prompt, &run, error)) return release(), false;
        run["peak_rss_bytes"] = PeakRssBytes();
        run["load_ms"] = loadRun["load_ms"];
        run["session_ms"] = loadRun["session_ms"];
      }
      std::fprintf(stderr, "%s: %s %s threads=%d %s %d/%d: TTFT %.2f ms, decode %.2f tokens/s\n", kTool,
                   BaseName(a.path).c_str(), mode.c_str(), threads, recorded ? "run" : "warm-up",
                   recorded ? rep - p.warmup + 1 : rep + 1, recorded ? p.repetitions : p.warmup, run["ttft_ms"],
                   run["decode_tokens_per_s"]);
      if (recorded) out->runs.push_back(run);
    }
    release();
    out->after = ReadThermal();
    out->prompt_used = prompt;
    for (const char* metric : {"ttft_ms", "prefill_tokens_per_s", "vision_encoder_ms", "decode_tokens_per_s",
                               "load_ms", "cold_total_ms"}) {
      std::vector<double> v;
      for (const Run& r : out->runs)
        if (r.count(metric)) v.push_back(r.at(metric));
      if (mode == "warm" && (std::string(metric) == "load_ms" || std::string(metric) == "cold_total_ms")) continue;
      const Summary s = kiln::tools::Summarize(v);
      if (kiln::tools::SpreadTooLarge(s))
        out->warnings.push_back(std::string(metric) + " varies by " + Num(100 * s.cv) + "% (coefficient of variation)");
    }
    if (mode == "cold")
      for (const Run& r : out->runs)
        if (r.count("cached_fraction_before") && r.at("cached_fraction_before") > 0.05) {
          out->warnings.push_back("the page cache still held " + Num(100 * r.at("cached_fraction_before")) +
                                  "% of the artifact before a cold load (eviction did not take; try --cold-cmd)");
          break;
        }
    return true;
  }
};

std::vector<std::string> MetricsOf(const Result& r) {
  std::vector<std::string> out;
  for (const char* m : kMetrics)
    if (!r.runs.empty() && r.runs[0].count(m)) out.push_back(m);
  return out;
}
Summary StatsOf(const Result& r, const std::string& metric) {
  std::vector<double> v;
  for (const Run& run : r.runs)
    if (run.count(metric)) v.push_back(run.at(metric));
  return kiln::tools::Summarize(v);
}

// ---------------------------------------------------------------------------------
// Output.
struct Context {
  Machine machine;
  Params params;
  std::string started, version;
  std::vector<int> threads;
  std::string image_desc;
};

std::string ArtifactJson(const ArtifactFacts& a) {
  std::string s = "{\"path\": " + Q(a.path) + ", \"name\": " + Q(BaseName(a.path)) +
                  ", \"architecture\": " + Q(a.architecture) + ", \"target\": " + Q(a.target) +
                  ", \"cpu_features\": " + Q(a.features) + ", \"code_checksum\": " + Q(a.code_checksum) +
                  ", \"source_hash\": " + Q(a.source_hash) + ", \"file_bytes\": " + std::to_string(a.file_bytes) +
                  ", \"weight_bytes\": " + std::to_string(a.weight_bytes) + ", \"precision_bytes\": {";
  bool first = true;
  for (const auto& [label, bytes] : a.precision) {
    s += (first ? "" : ", ") + Q(label) + ": " + std::to_string(bytes);
    first = false;
  }
  return s + "}}";
}
std::string MachineJson(const Machine& m) {
  return "{\"cpu\": " + Q(m.cpu) + ", \"cores\": " + std::to_string(m.cores) + ", \"os\": " + Q(m.os) +
         ", \"cpu_flags\": " + Q(m.features) + "}";
}
std::string ParamsJson(const Context& c) {
  const Params& p = c.params;
  std::string threads;
  for (size_t i = 0; i < c.threads.size(); ++i) threads += (i ? ", " : "") + std::to_string(c.threads[i]);
  return "{\"image\": " + Q(c.image_desc) + ", \"prompt\": " + Q(p.prompt) +
         ", \"prompt_tokens_asked\": " + std::to_string(p.prompt_tokens) +
         ", \"gen_tokens\": " + std::to_string(p.gen_tokens) + ", \"repetitions\": " + std::to_string(p.repetitions) +
         ", \"warmup\": " + std::to_string(p.warmup) + ", \"threads\": [" + threads + "], \"kv_cache\": " +
         Q(kiln::tools::KvCacheName(p.kv_cache)) + ", \"cold_cmd\": " + Q(p.cold_cmd) + "}";
}
std::string SummaryJson(const Summary& s) {
  return "{\"n\": " + std::to_string(s.n) + ", \"median\": " + Num(s.median) + ", \"p10\": " + Num(s.p10) +
         ", \"p90\": " + Num(s.p90) + ", \"mean\": " + Num(s.mean) + ", \"stddev\": " + Num(s.stddev) +
         ", \"min\": " + Num(s.min) + ", \"max\": " + Num(s.max) + ", \"cv\": " + Num(s.cv) + "}";
}

void WriteJson(FILE* out, const Context& c, const std::vector<Result>& results) {
  std::fprintf(out, "{\"tool\": \"kiln-bench\", \"version\": %s, \"schema\": 1, \"started\": %s,\n \"machine\": %s,\n \"params\": %s,\n \"results\": [",
               Q(c.version).c_str(), Q(c.started).c_str(), MachineJson(c.machine).c_str(), ParamsJson(c).c_str());
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::fprintf(out, "%s\n  {\"artifact\": %s,\n   \"mode\": %s, \"threads\": %d, \"prompt\": %s,\n   \"runs\": [",
                 i ? "," : "", ArtifactJson(*r.artifact).c_str(), Q(r.mode).c_str(), r.threads,
                 Q(r.prompt_used).c_str());
    const std::vector<std::string> metrics = MetricsOf(r);
    for (size_t k = 0; k < r.runs.size(); ++k) {
      std::string line;
      for (const std::string& m : metrics) line += (line.empty() ? "" : ", ") + Q(m) + ": " + Num(r.runs[k].at(m));
      std::fprintf(out, "%s{%s}", k ? ", " : "", line.c_str());
    }
    std::fprintf(out, "],\n   \"stats\": {");
    for (size_t k = 0; k < metrics.size(); ++k)
      std::fprintf(out, "%s\n    %s: %s", k ? "," : "", Q(metrics[k]).c_str(), SummaryJson(StatsOf(r, metrics[k])).c_str());
    std::string warnings;
    for (const std::string& w : r.warnings) warnings += (warnings.empty() ? "" : ", ") + Q(w);
    std::fprintf(out, "},\n   \"thermal_before\": %s, \"thermal_after\": %s,\n   \"warnings\": [%s]}",
                 ThermalJson(r.before).c_str(), ThermalJson(r.after).c_str(), warnings.c_str());
  }
  std::fprintf(out, "\n ]}\n");
}

// One line (jsonl) or row (csv) per run: every parameter beside the metrics.
void WriteRows(FILE* out, const Context& c, const std::vector<Result>& results, bool csv) {
  std::vector<std::string> columns = {"artifact", "architecture", "target", "code_checksum", "mode", "threads", "run",
                                      "cpu", "cores", "gen_tokens", "image"};
  std::vector<std::string> metrics;
  for (const char* m : kMetrics) metrics.push_back(m);
  if (csv) {
    std::string header;
    for (const std::string& col : columns) header += (header.empty() ? "" : ",") + col;
    for (const std::string& m : metrics) header += "," + m;
    std::fprintf(out, "%s\n", header.c_str());
  }
  auto csvField = [](const std::string& v) {
    if (v.find_first_of(",\"\n") == std::string::npos) return v;
    std::string q = "\"";
    for (char ch : v) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return q + "\"";
  };
  for (const Result& r : results)
    for (size_t k = 0; k < r.runs.size(); ++k) {
      const std::vector<std::string> values = {BaseName(r.artifact->path), r.artifact->architecture, r.artifact->target,
                                               r.artifact->code_checksum, r.mode, std::to_string(r.threads),
                                               std::to_string(k + 1), c.machine.cpu, std::to_string(c.machine.cores),
                                               std::to_string(c.params.gen_tokens), c.image_desc};
      std::string line;
      for (size_t i = 0; i < columns.size(); ++i) {
        const bool numeric = columns[i] == "threads" || columns[i] == "run" || columns[i] == "cores" ||
                             columns[i] == "gen_tokens";
        if (csv)
          line += (i ? "," : "") + csvField(values[i]);
        else
          line += (i ? ", " : "") + Q(columns[i]) + ": " + (numeric ? values[i] : Q(values[i]));
      }
      for (const std::string& m : metrics) {
        const bool has = r.runs[k].count(m) > 0;
        if (csv)
          line += "," + (has ? Num(r.runs[k].at(m)) : std::string());
        else if (has)
          line += ", " + Q(m) + ": " + Num(r.runs[k].at(m));
      }
      std::fprintf(out, csv ? "%s\n" : "{%s}\n", line.c_str());
    }
}

std::string Cell(const Summary& s, const char* fmt) {
  if (s.n == 0) return "-";
  char a[32], b[32], m[32];
  std::snprintf(m, sizeof(m), fmt, s.median);
  std::snprintf(a, sizeof(a), fmt, s.p10);
  std::snprintf(b, sizeof(b), fmt, s.p90);
  return std::string(m) + " (" + a + "-" + b + ")" + (kiln::tools::SpreadTooLarge(s) ? " !" : "");
}

void WriteMarkdown(FILE* out, const Context& c, const std::vector<Result>& results) {
  std::fprintf(out, "kiln-bench %s, %s: %s, %d cores, %s\n", c.version.c_str(), c.started.c_str(), c.machine.cpu.c_str(),
               c.machine.cores, c.machine.os.c_str());
  std::fprintf(out,
               "image %s; %d tokens generated at most; %s KV cache; %d repetitions after %d warm-up; medians "
               "(p10-p90)\n\n",
               c.image_desc.c_str(), c.params.gen_tokens,
               c.params.kv_cache ? kiln::tools::KvCacheName(c.params.kv_cache) : "the artifacts'", c.params.repetitions,
               c.params.warmup);
  std::fprintf(out, "| artifact | mode | threads | prompt tok (image) | load ms | vision enc ms | prefill tok/s | TTFT ms | decode tok/s | answer ms | peak RSS MB |\n");
  std::fprintf(out, "|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Result& r : results) {
    const Run& first = r.runs.front();
    Summary rss = StatsOf(r, "peak_rss_bytes");
    for (double* v : {&rss.median, &rss.p10, &rss.p90}) *v /= 1e6;
    std::fprintf(out, "| %s | %s | %d | %.0f (%.0f) | %s | %s | %s | %s | %s | %s | %s |\n", BaseName(r.artifact->path).c_str(),
                 r.mode.c_str(), static_cast<int>(first.at("threads_used")), first.at("prompt_tokens"),
                 first.at("image_tokens"), Cell(StatsOf(r, r.mode == "cold" ? "load_ms" : "load_ms"), "%.1f").c_str(),
                 Cell(StatsOf(r, "vision_encoder_ms"), "%.1f").c_str(), Cell(StatsOf(r, "prefill_tokens_per_s"), "%.1f").c_str(),
                 Cell(StatsOf(r, "ttft_ms"), "%.1f").c_str(), Cell(StatsOf(r, "decode_tokens_per_s"), "%.1f").c_str(),
                 Cell(StatsOf(r, "answer_ms"), "%.1f").c_str(), Cell(rss, "%.1f").c_str());
  }
  std::fprintf(out, "\nTTFT by stage (medians, ms): image preprocess + vision encoder + projector + prefill + first token\n\n");
  std::fprintf(out, "| artifact | mode | threads | preprocess | vision encoder | projector | prefill | first token | TTFT | cold total |\n");
  std::fprintf(out, "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Result& r : results) {
    auto med = [&](const char* m) {
      Summary s = StatsOf(r, m);
      if (s.n == 0) return std::string("-");
      char buf[32];
      std::snprintf(buf, sizeof(buf), s.median >= 100 ? "%.1f" : s.median >= 1 ? "%.2f" : "%.3f", s.median);
      return std::string(buf);
    };
    std::fprintf(out, "| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", BaseName(r.artifact->path).c_str(),
                 r.mode.c_str(), static_cast<int>(r.runs.front().at("threads_used")), med("image_preprocess_ms").c_str(),
                 med("vision_encoder_ms").c_str(), med("projector_ms").c_str(), med("prefill_ms").c_str(),
                 med("first_token_ms").c_str(), med("ttft_ms").c_str(), med("cold_total_ms").c_str());
  }
  bool any = false;
  for (const Result& r : results)
    for (const std::string& w : r.warnings) {
      if (!any) std::fprintf(out, "\nwarnings (\"!\" above: spread over 10%%):\n");
      any = true;
      std::fprintf(out, "- %s %s threads=%d: %s\n", BaseName(r.artifact->path).c_str(), r.mode.c_str(), r.threads, w.c_str());
    }
  for (const Result& r : results) {
    if (r.before.zones.empty() && r.before.cpu_mhz.empty()) {
      std::fprintf(out, "\nthermal zones and CPU frequencies: not exposed by this system\n");
      break;
    }
  }
}

// ---------------------------------------------------------------------------------
// --compare A.json B.json: ratios B / A of the medians per configuration.
std::string Ratio(double a, double b) {
  if (a == 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3fx", b / a);
  return buf;
}
int Compare(const std::string& pathA, const std::string& pathB) {
  Json docs[2];
  const std::string paths[2] = {pathA, pathB};
  for (int i = 0; i < 2; ++i) {
    std::string text, error;
    if (!ReadText(paths[i], &text)) {
      std::fprintf(stderr, "%s: cannot read %s: %s\n", kTool, paths[i].c_str(), std::strerror(errno));
      return 1;
    }
    kiln::tools::JsonReader reader(text);
    if (!reader.Parse(&docs[i], &error)) {
      std::fprintf(stderr, "%s: %s is not JSON: %s\n", kTool, paths[i].c_str(), error.c_str());
      return 1;
    }
    if (docs[i].Str("tool") != "kiln-bench" || !docs[i].Get("results")) {
      std::fprintf(stderr, "%s: %s is not kiln-bench --output json output\n", kTool, paths[i].c_str());
      return 1;
    }
  }
  auto key = [](const Json& r) {
    const Json* a = r.Get("artifact");
    return (a ? a->Str("name") : std::string("?")) + " " + r.Str("mode") + " threads=" +
           std::to_string(static_cast<int>(r.Num("threads")));
  };
  std::printf("A: %s (%s, %s)\nB: %s (%s, %s)\n\n", pathA.c_str(), docs[0].Str("started").c_str(),
              docs[0].Get("machine") ? docs[0].Get("machine")->Str("cpu").c_str() : "?", pathB.c_str(),
              docs[1].Str("started").c_str(), docs[1].Get("machine") ? docs[1].Get("machine")->Str("cpu").c_str() : "?");
  std::printf("| configuration | metric | A median | B median | B / A | hint |\n|---|---|---|---|---|---|\n");
  int matched = 0;
  for (const Json& ra : docs[0].Get("results")->items)
    for (const Json& rb : docs[1].Get("results")->items) {
      if (key(ra) != key(rb)) continue;
      ++matched;
      for (const char* metric : {"ttft_ms", "vision_encoder_ms", "prefill_tokens_per_s", "decode_tokens_per_s",
                                 "answer_ms", "load_ms", "cold_total_ms", "peak_rss_bytes"}) {
        const Json* sa = ra.Get("stats") ? ra.Get("stats")->Get(metric) : nullptr;
        const Json* sb = rb.Get("stats") ? rb.Get("stats")->Get(metric) : nullptr;
        if (!sa || !sb) continue;
        Summary a, b;
        a.median = sa->Num("median"), a.p10 = sa->Num("p10"), a.p90 = sa->Num("p90"), a.n = static_cast<size_t>(sa->Num("n"));
        b.median = sb->Num("median"), b.p10 = sb->Num("p10"), b.p90 = sb->Num("p90"), b.n = static_cast<size_t>(sb->Num("n"));
        const char* hint = a.n < 3 || b.n < 3 ? "too few runs"
                           : kiln::tools::Significant(a, b) ? "significant (p10-p90 ranges apart)"
                                                            : "within noise (ranges overlap)";
        std::printf("| %s | %s | %s | %s | %s | %s |\n", key(ra).c_str(), metric, Num(a.median).c_str(),
                    Num(b.median).c_str(), Ratio(a.median, b.median).c_str(), hint);
      }
    }
  if (matched == 0) {
    std::fprintf(stderr, "%s: no configuration (artifact name, mode, threads) is in both files\n", kTool);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln-bench: TTFT by stage, decode speed and memory of Kiln artifacts, cold and warm, with statistics "
               "over repetitions (docs/benchmarking.md)"};
  app.set_version_flag("--version", std::string("kiln-bench ") + kiln_version_string());
  std::vector<std::string> artifacts, compare;
  std::string image, imageSize, prompt, threadsArg = "0", mode = "warm", output = "md", outPath, coldCmd;
  int promptTokens = 0, genTokens = 32, repetitions = 5, warmup = 1, kvCache = KILN_KV_CACHE_DEFAULT;
  app.add_option("artifacts", artifacts, "compiled .kiln artifacts")->check(CLI::ExistingFile);
  app.add_option("--image", image, "image file for a VLM (default: a generated image of the model's input size)")
      ->check(CLI::ExistingFile);
  app.add_option("--image-size", imageSize, "generate the image at WxH pixels (e.g. 1024x768)");
  app.add_option("--prompt", prompt, "the question (default: \"Describe the image.\", or a story request without one)");
  app.add_option("--prompt-tokens", promptTokens, "a prompt of exactly N text tokens (template and image tokens on top)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--gen-tokens", genTokens, "tokens to generate at most (default 32; generation may stop at EOS)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--threads", threadsArg, "comma list of thread counts to sweep (0: the runtime's default)");
  app.add_option("--kv-cache", kvCache, "KV-cache encoding of the sessions: f32, f16, int8 or int4 "
                                                    "(default: each artifact's)")
      ->transform(CLI::CheckedTransformer(kiln::tools::KvCacheNames()));
  app.add_option("--mode", mode, "warm, cold or both (default warm)")->check(CLI::IsMember({"warm", "cold", "both"}));
  app.add_option("--repetitions,-r", repetitions, "recorded runs per configuration (default 5)")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "unrecorded runs first (default 1)")->check(CLI::Range(0, 100000));
  app.add_option("--cold-cmd", coldCmd, "shell command that empties the page cache before each cold run "
                                        "(default: posix_fadvise DONTNEED on the artifact)");
  app.add_option("--output", output, "md (default), json, jsonl or csv")->check(CLI::IsMember({"md", "json", "jsonl", "csv"}));
  app.add_option("-o", outPath, "write the output to this file (default: stdout)");
  app.add_option("--compare", compare, "print ratios between two kiln-bench JSON outputs: --compare A.json B.json")
      ->expected(2);
  const int rc = kiln::tools::ParseCommandLine(app, argc, argv, kTool);
  if (rc >= 0) return rc;

  auto usage = [](const std::string& why) {
    std::fprintf(stderr, "%s: error: %s\nRun with --help for the options.\n", kTool, why.c_str());
    return 2;
  };
  if (!compare.empty()) {
    if (!artifacts.empty()) return usage("--compare takes two JSON files and no artifacts");
    return Compare(compare[0], compare[1]);
  }
  if (artifacts.empty()) return usage("no artifact given (kiln-bench model.kiln ...)");
  if (!image.empty() && !imageSize.empty()) return usage("--image and --image-size exclude each other");
  if (!prompt.empty() && promptTokens > 0) return usage("--prompt and --prompt-tokens exclude each other");
  Context ctx;
  ctx.params.prompt = prompt;
  ctx.params.prompt_tokens = promptTokens;
  ctx.params.gen_tokens = genTokens;
  ctx.params.repetitions = repetitions;
  ctx.params.warmup = warmup;
  ctx.params.cold_cmd = coldCmd;
  ctx.params.kv_cache = kvCache;
  {
    std::stringstream ss(threadsArg);
    std::string item;
    while (std::getline(ss, item, ',')) {
      char* end = nullptr;
      const long t = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || t < 0 || t > 1024) return usage("--threads: '" + item + "' is not a thread count");
      ctx.threads.push_back(static_cast<int>(t));
    }
    if (ctx.threads.empty()) return usage("--threads: no thread count");
  }
  Bench bench;
  if (!imageSize.empty()) {
    int w = 0, h = 0;
    char x = 0, extra = 0;
    if (std::sscanf(imageSize.c_str(), "%d%c%d%c", &w, &x, &h, &extra) != 3 || (x != 'x' && x != 'X') || w < 1 ||
        h < 1 || w > 16384 || h > 16384)
      return usage("--image-size: '" + imageSize + "' is not WxH (1-16384 each)");
    ctx.params.image_w = w;
    ctx.params.image_h = h;
  }
  if (!image.empty()) {
    std::string error;
    if (!kiln::tools::LoadRgbImage(image, &bench.image, &error)) {
      std::fprintf(stderr, "%s: %s: %s\n", kTool, image.c_str(), error.c_str());
      return 1;
    }
  }
  FILE* out = stdout;
  if (!outPath.empty() && !(out = std::fopen((outPath + ".part").c_str(), "w"))) {
    std::fprintf(stderr, "%s: cannot write %s: %s\n", kTool, outPath.c_str(), std::strerror(errno));
    return 1;
  }
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "%s: %s\n", kTool, why.c_str());
    if (out != stdout) {
      std::fclose(out);
      std::remove((outPath + ".part").c_str());
    }
    return 1;
  };

  ctx.machine = DescribeMachine();
  ctx.version = kiln_version_string();
  {
    char buf[40];
    std::time_t now = std::time(nullptr);
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    ctx.started = buf;
  }
  std::vector<ArtifactFacts> facts(artifacts.size());
  std::vector<Result> results;
  const std::vector<std::string> modes = mode == "both" ? std::vector<std::string>{"cold", "warm"}
                                                        : std::vector<std::string>{mode};
  for (size_t i = 0; i < artifacts.size(); ++i) {
    ArtifactFacts& a = facts[i];
    std::string error;
    if (!DescribeArtifact(artifacts[i], &a, &error)) return fail(error);
    // What the runtime reports (target, hashes, image geometry), from a load.
    kiln_model_t* model = nullptr;
    kiln_error_t err;
    if (kiln_model_load(a.path.c_str(), nullptr, &model, &err) != KILN_OK) return fail(err.message);
    kiln_model_info_t info = {};
    info.struct_size = sizeof(info);
    kiln_model_get_info(model, &info);
    a.target = info.target ? info.target : "";
    a.source_hash = info.source_hash ? info.source_hash : "";
    a.weight_bytes = info.weight_bytes;
    a.image_size = info.image_size;
    a.image_tokens = info.image_tokens;
    kiln_model_release(model);

    Bench b = bench;
    b.p = ctx.params;
    b.has_image = a.image_tokens > 0;
    if (!b.has_image && (!image.empty() || !imageSize.empty()))
      std::fprintf(stderr, "%s: %s is text-only: the image is not used\n", kTool, a.path.c_str());
    if (b.has_image && image.empty()) {
      const int w = ctx.params.image_w ? ctx.params.image_w : a.image_size;
      const int h = ctx.params.image_h ? ctx.params.image_h : a.image_size;
      b.image = GeneratedImage(w, h);
    }
    if (b.has_image)
      ctx.image_desc = image.empty() ? "generated " + std::to_string(b.image.width) + "x" + std::to_string(b.image.height)
                                     : image + " (" + std::to_string(b.image.width) + "x" + std::to_string(b.image.height) + ")";
    else if (ctx.image_desc.empty())
      ctx.image_desc = "none";
    if (b.p.prompt.empty() && b.p.prompt_tokens == 0)
      b.p.prompt = b.has_image ? "Describe the image." : "Tell me a story about a lighthouse.";
    for (const std::string& m : modes)
      for (int threads : ctx.threads) {
        Result r;
        if (!b.RunConfig(a, m, threads, &r, &error)) return fail(a.path + ": " + error);
        results.push_back(r);
      }
  }

  if (output == "json")
    WriteJson(out, ctx, results);
  else if (output == "jsonl" || output == "csv")
    WriteRows(out, ctx, results, output == "csv");
  else
    WriteMarkdown(out, ctx, results);
  if (output != "md" && out == stdout) WriteMarkdown(stderr, ctx, results);
  if (out != stdout) {
    if (std::fclose(out) != 0 || std::rename((outPath + ".part").c_str(), outPath.c_str()) != 0) {
      std::remove((outPath + ".part").c_str());
      std::fprintf(stderr, "%s: cannot write %s: %s\n", kTool, outPath.c_str(), std::strerror(errno));
      return 1;
    }
    if (output != "md") WriteMarkdown(stderr, ctx, results);
  }
  return 0;
}
