// kiln-run: ask a compiled model a question about a photo.
//
//   kiln-run model.kiln --image photo.png --prompt "How do I install this?"
//   kiln-run model.kiln --input-ids 1,2,3 --pixel-values pv.npy --dump-logits logits.npy
//   kiln-run model.kiln --batch questions.jsonl > answers.jsonl
//   kiln-run model.kiln --batch questions.jsonl --score > scores.jsonl
//   kiln-run model.kiln --tokenize "How do I install this?"
//
// Streams the answer to stdout and prints the time-to-first-token breakdown by
// stage, decode speed and memory to stderr (or as JSON with --json).
#include <CLI/CLI.hpp>

#include "common/cli.h"
#include "common/rss.h"
#include "formats/byte_size.h"
#include "common/text.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "kiln/kiln.h"
#include "support/image_file.h"
#include "support/npy.h"

namespace {

int Die(const char* what, const kiln_error_t& err) {
  std::fprintf(stderr, "kiln-run: error: %s: %s (%s)\n", what, err.message, kiln_status_message(err.status));
  return 1;
}

bool ParseIds(const std::string& spec, std::vector<int32_t>* ids, std::string* error) {
  ids->clear();
  if (spec.size() > 4 && spec.compare(spec.size() - 4, 4, ".npy") == 0) {
    kiln::npy::Array a;
    if (!kiln::npy::Read(spec, &a, error)) return false;
    if (a.dtype == "f4") {
      *error = spec + ": token ids must be integers";
      return false;
    }
    for (int64_t v : a.AsInt()) ids->push_back(static_cast<int32_t>(v));
    return true;
  }
  size_t p = 0;
  while (p < spec.size()) {
    size_t q = spec.find(',', p);
    std::string item = spec.substr(p, q == std::string::npos ? std::string::npos : q - p);
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || end == nullptr || *end != '\0') {
      *error = "--input-ids: '" + item + "' is not an integer";
      return false;
    }
    ids->push_back(static_cast<int32_t>(v));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  return true;
}

// The answer as it streams: printed unless quiet, and kept (--chat feeds it back).
struct Streamed {
  bool quiet = false;
  std::string text;
};

int OnToken(void* user, int32_t, const char* text, size_t length) {
  Streamed* s = static_cast<Streamed*>(user);
  s->text.append(text, length);
  if (!s->quiet && length > 0) {
    std::fwrite(text, 1, length, stdout);
    std::fflush(stdout);
  }
  return 0;
}

// A minimal reader for the flat JSON objects of --batch lines: string values only.
bool JsonString(const std::string& line, const std::string& key, std::string* out) {
  std::string pat = "\"" + key + "\"";
  size_t p = line.find(pat);
  if (p == std::string::npos) return false;
  p = line.find(':', p + pat.size());
  if (p == std::string::npos) return false;
  p = line.find('"', p);
  if (p == std::string::npos) return false;
  out->clear();
  for (++p; p < line.size() && line[p] != '"'; ++p) {
    if (line[p] == '\\' && p + 1 < line.size()) {
      char c = line[++p];
      out->push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
    } else {
      out->push_back(line[p]);
    }
  }
  return p < line.size();
}

using kiln::tools::JsonEscape;

int AppendText(void* user, int32_t, const char* text, size_t length) {
  static_cast<std::string*>(user)->append(text, length);
  return 0;
}

// --batch: one JSON object per line, {"prompt": "...", "image": "path"} (image
// optional, relative to the file's directory; "id" echoed back). One session
// answers them all; each answer is a JSON line on stdout with its timings.
// --score: instead of generating, scores each line's "answer" as the continuation
// of its templated prompt (teacher forcing): the continuation is delimiter +
// answer + suffix, tokenized without BOS. Each line reports the continuation's
// log-probability, its token count and whether greedy decoding would have
// produced every token of it; `logits_out` (if set) receives the logits of the
// positions that predict the continuation, every line's rows in order.
struct ScoreOptions {
  bool enabled = false;
  std::string delimiter = " ";
  std::string suffix;
  std::vector<float>* logits_out = nullptr;
};

// Calls `fill(data, capacity, &count)`, an API that writes token ids and reports
// KILN_ERROR_BUFFER_TOO_SMALL with the full count, growing `ids` once if needed;
// `ids` ends at the count.
template <typename Fill>
kiln_status_t FillIds(std::vector<int32_t>* ids, Fill fill) {
  size_t count = 0;
  kiln_status_t st = fill(ids->data(), ids->size(), &count);
  if (st == KILN_ERROR_BUFFER_TOO_SMALL) {
    ids->resize(count);
    st = fill(ids->data(), ids->size(), &count);
  }
  if (st == KILN_OK) ids->resize(count);
  return st;
}

bool ScoreLine(kiln_model_t* model, kiln_session_t* session, int32_t vocab, const std::string& prompt,
               const std::string& answer, const ScoreOptions& so, std::string* json, std::string* error) {
  kiln_error_t err;
  std::vector<int32_t> ids(1024);
  if (FillIds(&ids, [&](int32_t* out, size_t cap, size_t* n) {
        return kiln_session_prompt_ids(session, prompt.c_str(), out, cap, n, &err);
      }) != KILN_OK) {
    *error = err.message;
    return false;
  }
  const size_t n_prompt = ids.size();
  std::string text = so.delimiter + answer + so.suffix;
  std::vector<int32_t> cont(text.size() + 1);
  if (FillIds(&cont, [&](int32_t* out, size_t cap, size_t* n) {
        return kiln_tokenize(model, text.data(), text.size(), 0, out, cap, n, &err);
      }) != KILN_OK) {
    *error = err.message;
    return false;
  }
  const size_t n_cont = cont.size();
  if (n_cont == 0 || n_prompt == 0) {
    *error = "nothing to score (empty prompt or answer)";
    return false;
  }
  ids.insert(ids.end(), cont.begin(), cont.end());
  std::vector<float> logits(ids.size() * static_cast<size_t>(vocab));
  if (kiln_session_prefill_logits(session, ids.data(), ids.size(), logits.data(), logits.size(), &err) != KILN_OK) {
    *error = err.message;
    return false;
  }
  double logprob = 0.0;
  bool greedy = true;
  for (size_t t = 0; t < n_cont; ++t) {
    const float* row = logits.data() + (n_prompt - 1 + t) * static_cast<size_t>(vocab);
    int32_t target = cont[t];
    if (target < 0 || target >= vocab) {
      *error = "answer token " + std::to_string(target) + " is outside the vocabulary";
      return false;
    }
    float mx = row[0];
    int32_t best = 0;
    for (int32_t v = 1; v < vocab; ++v)
      if (row[v] > mx) mx = row[v], best = v;
    double sum = 0.0;
    for (int32_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
    logprob += static_cast<double>(row[target]) - mx - std::log(sum);
    greedy = greedy && best == target;
    if (so.logits_out != nullptr) so.logits_out->insert(so.logits_out->end(), row, row + vocab);
  }
  char buf[160];
  std::snprintf(buf, sizeof(buf), "\"answer_tokens\": %zu, \"logprob\": %.6f, \"greedy_match\": %s", n_cont, logprob,
                greedy ? "true" : "false");
  *json = buf;
  return true;
}

// Resident set when main() began (the binary and its libraries): --json reports it
// beside the peak, so that what the model and session added can be told apart.
double g_start_rss = 0;

// The statistics of the last answer as JSON members (no braces): what --json prints
// and what every --batch line carries.
std::string StatsJson(const kiln_stats_t& s, const kiln_model_info_t& info, const std::string& model) {
  char buf[2048];
  std::snprintf(buf, sizeof(buf),
                "\"model\": \"%s\", \"architecture\": \"%s\", \"threads\": %d, \"prompt_tokens\": %d, "
                "\"reused_tokens\": %d, \"image_tokens\": %d, \"generated_tokens\": %d, \"image_preprocess_ms\": %.3f, "
                "\"vision_encoder_ms\": %.3f, \"projector_ms\": %.3f, \"prefill_ms\": %.3f, "
                "\"first_token_ms\": %.3f, \"ttft_ms\": %.3f, \"first_decode_ms\": %.3f, \"decode_ms\": %.3f, "
                "\"decode_tokens_per_s\": %.3f, \"decode_steps\": %d, \"arena_bytes\": %" PRIu64
                ", \"kv_cache_bytes\": %" PRIu64 ", \"kv_cache\": \"%s\", \"kv_cache_token_bytes\": %" PRIu64
                ", \"peak_allocated_bytes\": %" PRIu64 ", \"weight_bytes\": %" PRIu64
                ", \"kv_block_tokens\": %d, \"kv_blocks\": %d, \"kv_pool_blocks\": %d, \"kv_pool_blocks_used\": %d"
                ", \"context_limit\": %d, \"evicted_tokens\": %d, \"active_threads\": %d, \"tier\": %d, \"tiers\": %d"
                ", \"start_rss_bytes\": %.0f, \"peak_rss_bytes\": %.0f, \"rss_bytes\": %.0f",
                JsonEscape(model).c_str(), info.architecture, s.num_threads, s.prompt_tokens, s.reused_tokens,
                s.image_tokens, s.generated_tokens, s.image_preprocess_ms, s.vision_encoder_ms, s.projector_ms,
                s.prefill_ms, s.first_token_ms, s.ttft_ms, s.first_decode_ms, s.decode_ms, s.decode_tokens_per_s,
                s.decode_steps, s.arena_bytes, s.kv_cache_bytes, kiln::tools::KvCacheName(s.kv_cache),
                s.kv_cache_token_bytes, s.peak_allocated_bytes, s.weight_bytes, s.kv_block_tokens, s.kv_blocks,
                s.kv_pool_blocks, s.kv_pool_blocks_used, s.context_limit, s.evicted_tokens, s.active_threads,
                info.tier, info.tier_count,
                g_start_rss, kiln::tools::PeakRssBytes(), kiln::tools::ProcStatusBytes("VmRSS:"));
  return buf;
}

// Several models under one --memory-budget (--model): a --batch line's "model" picks
// the one that answers it; the runtime loads it, unloading the least recently used.
struct SharedModels {
  kiln_shared_budget_t* budget = nullptr;
  std::vector<std::string> paths;  // by id
  const kiln_session_options_t* session_options = nullptr;
  std::vector<std::pair<int, int>> pressure;  // --pressure, told to every model loaded
  int current = -1;

  // The id of `name`: a path as given, or its file name.
  int Find(const std::string& name) const {
    for (size_t i = 0; i < paths.size(); ++i) {
      const std::string& p = paths[i];
      const std::string base = p.substr(p.rfind('/') == std::string::npos ? 0 : p.rfind('/') + 1);
      if (name == p || name == base) return static_cast<int>(i);
    }
    return -1;
  }
  // Makes model `id` the current one, with a new session (the previous one's released
  // and its model given back to the budget).
  bool Use(int id, kiln_model_t** model, kiln_session_t** session, kiln_error_t* err) {
    if (id == current) return true;
    kiln_session_release(*session);
    *session = nullptr;
    if (current >= 0) kiln_shared_budget_return(budget, current);
    current = -1;
    if (kiln_shared_budget_acquire(budget, id, model, err) != KILN_OK) return false;
    current = id;
    for (const auto& [kind, level] : pressure) kiln_model_set_pressure(*model, kind, level);
    return kiln_session_create(*model, session_options, session, err) == KILN_OK;
  }
  std::string Json() const {
    kiln_shared_budget_info_t i = {};
    i.struct_size = sizeof(i);
    kiln_shared_budget_get_info(budget, -1, &i);
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  ", \"shared_budget_bytes\": %" PRIu64 ", \"shared_budget_used_bytes\": %" PRIu64
                  ", \"models_loaded\": %d, \"model_loads\": %d, \"model_unloads\": %d",
                  i.budget_bytes, i.used_bytes, i.loaded, i.loads, i.unloads);
    return buf;
  }
};

// Lines about the image of the line before keep it (the session neither preprocesses
// nor encodes it again) and, with reuse_prefix, the cached prefix of their prompt; a
// line without an image forgets the image. With several models, a line's "model"
// picks the one that answers (default: the line before's).
int RunBatch(kiln_model_t* model, kiln_session_t* session, const std::string& path, std::string model_path,
             const kiln_generate_options_t& base, const ScoreOptions& score, SharedModels* shared,
             kiln_session_t** session_out) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    std::fprintf(stderr, "kiln-run: error: cannot open %s\n", path.c_str());
    return 1;
  }
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  kiln_model_info_t info = {};
  info.struct_size = sizeof(info);
  kiln_model_get_info(model, &info);
  char buf[1 << 16];
  int line_no = 0, failures = 0;
  std::string current_image;  // the image the session holds ("" none)
  while (std::fgets(buf, sizeof(buf), f) != nullptr) {
    ++line_no;
    std::string line(buf), prompt, image, id;
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    if (!JsonString(line, "prompt", &prompt)) {
      std::fprintf(stderr, "kiln-run: error: %s:%d: no \"prompt\"\n", path.c_str(), line_no);
      ++failures;
      continue;
    }
    JsonString(line, "id", &id);
    kiln_error_t err;
    std::string full, which;
    if (JsonString(line, "model", &which)) {
      const int wanted = shared != nullptr ? shared->Find(which) : -1;
      if (wanted < 0) {
        std::fprintf(stderr, "kiln-run: error: %s:%d: model '%s' is not one of the models given (--model)\n",
                     path.c_str(), line_no, which.c_str());
        ++failures;
        continue;
      }
      if (wanted != shared->current) {
        current_image.clear();
        if (!shared->Use(wanted, &model, &session, &err)) {
          *session_out = session;
          std::fprintf(stderr, "kiln-run: error: %s:%d: %s\n", path.c_str(), line_no, err.message);
          ++failures;
          if (session == nullptr) break;  // no model to answer the next lines with
          continue;
        }
        *session_out = session;
        model_path = shared->paths[static_cast<size_t>(wanted)];
        kiln_model_get_info(model, &info);
      }
    }
    if (JsonString(line, "image", &image)) full = image.empty() || image[0] == '/' ? image : dir + "/" + image;
    if (base.reuse_prefix == 0 || full != current_image) {
      kiln_session_reset(session);
      current_image.clear();
    }
    if (!full.empty() && full != current_image) {
      kiln::tools::RgbImage img;
      std::string error;
      if (!kiln::tools::LoadRgbImage(full, &img, &error) ||
          kiln_session_set_image_rgb(session, img.pixels.data(), img.width, img.height,
                                     3 * static_cast<size_t>(img.width), &err) != KILN_OK) {
        std::fprintf(stderr, "kiln-run: error: %s:%d: %s\n", path.c_str(), line_no,
                     error.empty() ? err.message : error.c_str());
        ++failures;
        continue;
      }
      current_image = full;
    }
    if (score.enabled) {
      std::string expected, json, error;
      if (!JsonString(line, "answer", &expected)) {
        std::fprintf(stderr, "kiln-run: error: %s:%d: --score needs an \"answer\"\n", path.c_str(), line_no);
        ++failures;
        continue;
      }
      if (!ScoreLine(model, session, info.vocab_size, prompt, expected, score, &json, &error)) {
        std::fprintf(stderr, "kiln-run: error: %s:%d: %s\n", path.c_str(), line_no, error.c_str());
        ++failures;
        continue;
      }
      std::printf("{\"id\": \"%s\", %s}\n", JsonEscape(id).c_str(), json.c_str());
      std::fflush(stdout);
      continue;
    }
    std::string answer;
    kiln_generate_options_t go = base;
    go.on_token = AppendText;
    go.user = &answer;
    if (kiln_session_generate(session, prompt.c_str(), &go, &err) != KILN_OK) {
      std::fprintf(stderr, "kiln-run: error: %s:%d: %s\n", path.c_str(), line_no, err.message);
      ++failures;
      continue;
    }
    kiln_stats_t s = {};
    s.struct_size = sizeof(s);
    kiln_session_get_stats(session, &s);
    std::printf("{\"id\": \"%s\", \"answer\": \"%s\", %s%s}\n", JsonEscape(id).c_str(), JsonEscape(answer).c_str(),
                StatsJson(s, info, model_path).c_str(), shared != nullptr ? shared->Json().c_str() : "");
    std::fflush(stdout);
  }
  std::fclose(f);
  return failures == 0 ? 0 : 1;
}

void PrintStats(const kiln_stats_t& s, const kiln_model_info_t& info, const std::string& model, bool json, FILE* out,
                const std::string& json_extra = "") {
  if (json) {
    std::fprintf(out, "{%s%s}\n", StatsJson(s, info, model).c_str(), json_extra.c_str());
    return;
  }
  std::fprintf(out, "\n-- %s, %d thread(s), %d prompt tokens (%d image, %d reused from the cache), %d generated\n",
               info.architecture, s.num_threads, s.prompt_tokens, s.image_tokens, s.reused_tokens,
               s.generated_tokens);
  if (info.tier_count > 1)
    std::fprintf(out, "   tier %d of %d (compiled for %.1f MB of weights, %.1f MB mapped)\n", info.tier,
                 info.tier_count, info.tier_weight_budget / 1e6, info.weight_bytes / 1e6);
  std::fprintf(out, "   image preprocess %9.2f ms\n", s.image_preprocess_ms);
  std::fprintf(out, "   vision encoder   %9.2f ms\n", s.vision_encoder_ms);
  std::fprintf(out, "   projector        %9.2f ms\n", s.projector_ms);
  std::fprintf(out, "   prefill          %9.2f ms\n", s.prefill_ms);
  std::fprintf(out, "   first token      %9.2f ms\n", s.first_token_ms);
  std::fprintf(out, "   time to first token %6.2f ms\n", s.ttft_ms);
  std::fprintf(out, "   decode           %9.2f tokens/s (first step %.2f ms)\n", s.decode_tokens_per_s,
               s.first_decode_ms);
  std::fprintf(out,
               "   memory: weights %.1f MB mapped, arena %.1f MB, KV cache %.1f MB (%s, %" PRIu64
               " bytes/token), peak allocated %.1f MB\n",
               s.weight_bytes / 1e6, s.arena_bytes / 1e6, s.kv_cache_bytes / 1e6, kiln::tools::KvCacheName(s.kv_cache),
               s.kv_cache_token_bytes, s.peak_allocated_bytes / 1e6);
}

// kiln_session_get_op_profile summed by (stage, op kind, kernel), the largest first:
// a table for stderr, or JSON members ("op_profile": [...]) for --json.
struct ProfileRow {
  std::string stage, kind, kernel;
  uint64_t ops = 0, calls = 0;
  double ms = 0;
};
std::vector<ProfileRow> ProfileRows(const kiln_session_t* session) {
  size_t n = 0;
  if (kiln_session_get_op_profile(session, nullptr, 0, &n) != KILN_OK) return {};
  std::vector<kiln_op_profile_t> ops(n);
  if (kiln_session_get_op_profile(session, ops.data(), ops.size(), &n) != KILN_OK) return {};
  std::vector<ProfileRow> rows;
  for (const kiln_op_profile_t& op : ops) {
    if (op.calls == 0) continue;
    auto it = std::find_if(rows.begin(), rows.end(), [&](const ProfileRow& r) {
      return r.stage == op.stage && r.kind == op.kind && r.kernel == op.kernel;
    });
    if (it == rows.end()) it = rows.insert(rows.end(), ProfileRow{op.stage, op.kind, op.kernel});
    it->ops += 1;
    it->calls += op.calls;
    it->ms += op.total_ms;
  }
  std::sort(rows.begin(), rows.end(), [](const ProfileRow& a, const ProfileRow& b) {
    return std::tie(b.ms, a.stage, a.kind, a.kernel) < std::tie(a.ms, b.stage, b.kind, b.kernel);
  });
  return rows;
}

void PrintProfile(const std::vector<ProfileRow>& rows, FILE* out) {
  double total = 0;
  for (const ProfileRow& r : rows) total += r.ms;
  std::fprintf(out, "\n-- time per op kind and kernel (%.2f ms in ops)\n", total);
  std::fprintf(out, "   %-15s %-18s %-44s %5s %7s %10s %6s\n", "stage", "op", "kernel", "ops", "calls", "ms", "share");
  for (const ProfileRow& r : rows)
    std::fprintf(out, "   %-15s %-18s %-44s %5" PRIu64 " %7" PRIu64 " %10.2f %5.1f%%\n", r.stage.c_str(), r.kind.c_str(),
                 r.kernel.c_str(), r.ops, r.calls, r.ms, total > 0 ? 100.0 * r.ms / total : 0.0);
}

std::string ProfileJson(const std::vector<ProfileRow>& rows) {
  std::string j = ", \"op_profile\": [";
  char buf[512];
  for (size_t i = 0; i < rows.size(); ++i) {
    const ProfileRow& r = rows[i];
    std::snprintf(buf, sizeof buf,
                  "%s{\"stage\": \"%s\", \"kind\": \"%s\", \"kernel\": \"%s\", \"ops\": %" PRIu64
                  ", \"calls\": %" PRIu64 ", \"ms\": %.3f}",
                  i > 0 ? ", " : "", JsonEscape(r.stage).c_str(), JsonEscape(r.kind).c_str(),
                  JsonEscape(r.kernel).c_str(), r.ops, r.calls, r.ms);
    j += buf;
  }
  return j + "]";
}
}  // namespace

// --tokenize: the ids of `text` and the text of each (as llama-tokenize prints them), or
// {"ids": [...], "pieces": [...]} with --json.
int Tokenize(kiln_model_t* model, const std::string& text, bool add_special, bool json) {
  kiln_error_t err;
  size_t count = 0;
  std::vector<int32_t> ids(text.size() + 8);
  kiln_status_t st = kiln_tokenize(model, text.data(), text.size(), add_special ? 1 : 0, ids.data(), ids.size(),
                                   &count, &err);
  if (st == KILN_ERROR_BUFFER_TOO_SMALL) {
    ids.resize(count);
    st = kiln_tokenize(model, text.data(), text.size(), add_special ? 1 : 0, ids.data(), ids.size(), &count, &err);
  }
  if (st != KILN_OK) return Die("tokenizing", err);
  ids.resize(count);
  std::vector<std::string> pieces;
  for (int32_t id : ids) {
    size_t length = 0;
    std::string piece(32, '\0');
    st = kiln_detokenize(model, &id, 1, 0, piece.data(), piece.size(), &length, &err);
    if (st == KILN_ERROR_BUFFER_TOO_SMALL) {
      piece.resize(length + 1);
      st = kiln_detokenize(model, &id, 1, 0, piece.data(), piece.size(), &length, &err);
    }
    if (st != KILN_OK) return Die("detokenizing", err);
    piece.resize(length);
    pieces.push_back(piece);
  }
  if (json) {
    std::string out = "{\"ids\": [";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
    out += "], \"pieces\": [";
    for (size_t i = 0; i < pieces.size(); ++i) out += (i ? ", \"" : "\"") + JsonEscape(pieces[i]) + "\"";
    out += "]}\n";
    std::fputs(out.c_str(), stdout);
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%6d -> '%s'\n", ids[i], pieces[i].c_str());
  }
  return 0;
}

int main(int argc, char** argv) {
  g_start_rss = kiln::tools::ProcStatusBytes("VmRSS:");
  CLI::App app{"kiln-run: run a compiled Kiln model"};
  app.set_version_flag("--version", std::string("kiln-run ") + kiln_version_string());
  std::string model_path, image_path, prompt, ids_spec, pixels_path, logits_path, batch_path;
  int max_new_tokens = 0, threads = 0, context = 0, top_k = 0, kv_cache = KILN_KV_CACHE_DEFAULT;
  std::string memory_budget, pressure_spec;
  std::vector<std::string> more_models;
  std::string pressure_threads, pressure_context;
  int context_overflow = KILN_CONTEXT_STOP, keep_tokens = 0, tier = -1, image_tokens = 0;
  int64_t kv_pool_tokens = 0;
  int kv_block_tokens = 0;
  float temperature = 0.0f, top_p = 1.0f, repetition_penalty = 1.0f;
  uint64_t seed = 0;
  bool json = false, quiet = false, no_special = false, no_prefix_reuse = false;
  std::string tokenize_text;
  ScoreOptions score;
  app.add_option("model", model_path, "compiled model (.kiln)")->required()->check(CLI::ExistingFile);
  app.add_option("--image", image_path, "photo (PNG, JPEG, BMP, ...)")->check(CLI::ExistingFile);
  CLI::Option* prompt_opt = app.add_option("--prompt", prompt, "question (the model's prompt template is applied)");
  app.add_option("--input-ids", ids_spec, "prompt token ids: 1,2,3 or a .npy file (template bypassed)");
  app.add_option("--pixel-values", pixels_path, "preprocessed image [3,S,S] or [1,3,S,S] float32 .npy")
      ->check(CLI::ExistingFile);
  app.add_option("--dump-logits", logits_path,
                 "write the logits of every prompt position here (.npy); with --score, of every scored position");
  app.add_option("--batch", batch_path, "answer every {\"prompt\", \"image\"} line of a JSONL file")
      ->check(CLI::ExistingFile);
  CLI::Option* score_flag = app.add_flag("--score", score.enabled,
               "with --batch: score each line's \"answer\" as the continuation of its prompt (log-probability, "
               "greedy match) instead of generating");
  app.add_option("--answer-delimiter", score.delimiter,
                 "--score: text between the prompt and the answer (default: a space)")
      ->needs(score_flag);
  app.add_option("--answer-suffix", score.suffix, "--score: text scored after the answer, e.g. '</s>'")
      ->needs(score_flag);
  CLI::Option* max_new_opt = app.add_option("--max-new-tokens", max_new_tokens,
                                            "tokens to generate (default: the checkpoint's, else 128)");
  // Unset: the checkpoint's generation config (kiln_generate_options_init_from_model).
  CLI::Option* temperature_opt = app.add_option(
      "--temperature", temperature, "0 = greedy (default: the checkpoint's generation config: greedy unless it samples)");
  CLI::Option* top_k_opt = app.add_option("--top-k", top_k, "top-k filter (0 = off; default: the checkpoint's)");
  CLI::Option* top_p_opt = app.add_option("--top-p", top_p, "nucleus filter (1 = off; default: the checkpoint's)");
  CLI::Option* penalty_opt = app.add_option(
      "--repetition-penalty", repetition_penalty,
      "divide the logits of ids already in the sequence by this when positive, multiply when negative (1 = off; "
      "default: the checkpoint's)");
  app.add_option("--seed", seed, "sampling seed");
  app.add_option("--threads", threads, "threads (default: the performance cores this process may run on; a big.LITTLE CPU's slowest cluster is left out)");
  CLI::Option* context_opt = app.add_option("--context", context, "KV-cache length in tokens");
  app.add_option("--memory-budget", memory_budget,
                 "refuse to run unless the model and its session fit this many bytes (800MB, 1.2GB, 512MiB): the "
                 "arithmetic of kiln-inspect --memory");
  app.add_option("--kv-pool", kv_pool_tokens,
                 "a paged KV cache: a pool of this many token positions shared by the sessions (default: none, or "
                 "what --memory-budget leaves)");
  app.add_option("--kv-block", kv_block_tokens, "positions per KV block of a paged cache: a power of two in [8, 1024] "
                 "(default 32)");
  app.add_option("--kv-cache", kv_cache,
                 "KV-cache encoding: f32, f16, int8 or int4 (default: the artifact's, kiln-compile --kv-cache)")
      ->transform(CLI::CheckedTransformer(kiln::tools::KvCacheNames()));
  app.add_option("--model", more_models,
                 "more models (.kiln) under the same --memory-budget, loaded when a --batch line's \"model\" (a "
                 "path as given or a file name) asks for one, the least recently used unloaded to make room")
      ->check(CLI::ExistingFile);
  app.add_option("--tier", tier,
                 "a tiered artifact (kiln-compile --tiers): the precision tier to load, 0 the largest (default: the "
                 "largest that fits --memory-budget)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--context-overflow", context_overflow,
                 "when the conversation outgrows the context (or a full --kv-pool): stop (an error, the default) or "
                 "slide (evict the oldest positions after --keep-tokens and go on)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, int>{{"stop", KILN_CONTEXT_STOP},
                                                                     {"slide", KILN_CONTEXT_SLIDE}}));
  app.add_option("--keep-tokens", keep_tokens,
                 "positions at the start a sliding window keeps (default: through the image, at least 4)");
  app.add_option("--image-tokens", image_tokens,
                 "image tokens one image becomes in this session: fewer than the artifact's keeps the best-scoring "
                 "ones (artifacts compiled with --visual-tokens; default: the artifact's)");
  app.add_option("--pressure", pressure_spec,
                 "simulate device pressure before answering: KIND=LEVEL[,...] with KIND memory, thermal or battery "
                 "and LEVEL none, moderate, serious or critical (the session's default pressure policy reacts)");
  app.add_option("--pressure-threads", pressure_threads,
                 "the session's threads at each pressure level none,moderate,serious,critical (0: all; default "
                 "0,0,2,1; thermal or battery)");
  app.add_option("--pressure-context", pressure_context,
                 "the positions the session keeps at each memory pressure level none,moderate,serious,critical (0: "
                 "its context; default 0,0,1024,512)");
  app.add_flag("--no-prefix-reuse", no_prefix_reuse,
               "prefill every prompt whole: --batch lines and the answer after --dump-logits do not reuse the "
               "image or the cached prefix of the line before");
  app.add_flag("--json", json, "print the stats as JSON on stdout after the answer");
  app.add_flag("--quiet", quiet, "do not print the answer");
  bool profile = false;
  app.add_flag("--profile", profile,
               "time every op: after the answer, the time per op kind and kernel of each stage (to stderr; "
               "with --json as \"op_profile\" in the stats)");
  bool perf_map = false;
  app.add_flag("--perf-map", perf_map,
               "profiling: write /tmp/perf-<pid>.map naming the code segment's functions, so that "
               "`perf record kiln-run ... --perf-map` then `perf report` names the generated kernels");
  CLI::Option* tokenize_opt = app.add_option(
      "--tokenize", tokenize_text, "print the token ids of TEXT and the text of each, then exit (no template)");
  app.add_flag("--no-special", no_special, "--tokenize: do not add the tokenizer's BOS")->needs(tokenize_opt);
  std::string system_prompt, prompt_file;
  CLI::Option* system_opt =
      app.add_option("--system", system_prompt, "system message before the prompt (the chat template's system turn)");
  CLI::Option* prompt_file_opt =
      app.add_option("--prompt-file", prompt_file, "read the prompt from a file (as --prompt)")->check(CLI::ExistingFile);
  bool chat_mode = false, show_prompt = false;
  app.add_flag("--chat", chat_mode,
               "a conversation: after --prompt (if given), every line of standard input is the next user message; "
               "each answer is printed on its own line and becomes an assistant message (its KV cache prefix reused)");
  app.add_flag("--show-prompt", show_prompt,
               "print the text the prompt becomes in the model's chat template (an image as one image token), then "
               "exit");
  if (int rc = kiln::tools::ParseCommandLine(app, argc, argv, "kiln-run"); rc >= 0) return rc;
  if (prompt_file_opt->count() > 0) {
    if (prompt_opt->count() > 0) {
      std::fprintf(stderr, "kiln-run: error: give --prompt or --prompt-file, not both\n");
      return 2;
    }
    std::ifstream f(prompt_file, std::ios::binary);
    std::stringstream text;
    text << f.rdbuf();
    if (!f) {
      std::fprintf(stderr, "kiln-run: error: cannot read --prompt-file '%s'\n", prompt_file.c_str());
      return 2;
    }
    prompt = text.str();
  }
  const bool have_prompt = prompt_opt->count() > 0 || prompt_file_opt->count() > 0;
  if ((system_opt->count() > 0 || chat_mode || show_prompt) && (!ids_spec.empty() || !batch_path.empty() ||
                                                               tokenize_opt->count() > 0)) {
    std::fprintf(stderr, "kiln-run: error: --system, --chat and --show-prompt take --prompt (or --prompt-file), not "
                         "--input-ids, --batch or --tokenize\n");
    return 2;
  }

  if (tokenize_opt->count() > 0) {
    if (prompt_opt->count() > 0 || !ids_spec.empty() || !batch_path.empty()) {
      std::fprintf(stderr, "kiln-run: error: --tokenize takes no --prompt, --input-ids or --batch\n");
      return 2;
    }
    kiln_error_t err;
    kiln_model_t* model = nullptr;
    if (kiln_model_load(model_path.c_str(), nullptr, &model, &err) != KILN_OK) return Die("loading the model", err);
    int rc = Tokenize(model, tokenize_text, !no_special, json);
    kiln_model_release(model);
    return rc;
  }

  // An empty --prompt is a prompt (the template alone): count the option, not its text.
  // --chat reads its messages from standard input and may start without one.
  if ((have_prompt || (chat_mode && ids_spec.empty() && batch_path.empty()) ? 1 : 0) + (ids_spec.empty() ? 0 : 1) +
          (batch_path.empty() ? 0 : 1) != 1) {
    std::fprintf(stderr, "kiln-run: error: give exactly one of --prompt (or --prompt-file), --input-ids and --batch\n");
    return 2;
  }
  if (show_prompt && chat_mode) {
    std::fprintf(stderr, "kiln-run: error: --show-prompt prints one prompt: give it without --chat\n");
    return 2;
  }
  // 0 and negative values used to mean "the default" silently: a value given must be one.
  if (context_opt->count() > 0 && context < 1) {
    std::fprintf(stderr, "kiln-run: error: --context must be a positive number of tokens, got %d\n", context);
    return 2;
  }
  if (max_new_opt->count() > 0 && max_new_tokens < 1) {
    std::fprintf(stderr, "kiln-run: error: --max-new-tokens must be positive, got %d\n", max_new_tokens);
    return 2;
  }
  if (!(temperature >= 0.0f) || std::isinf(temperature)) {
    std::fprintf(stderr, "kiln-run: error: --temperature must be finite and >= 0 (0 = greedy), got %g\n",
                 static_cast<double>(temperature));
    return 2;
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    std::fprintf(stderr, "kiln-run: error: --top-p must be in (0, 1] (1 = off), got %g\n", static_cast<double>(top_p));
    return 2;
  }
  if (!(repetition_penalty > 0.0f) || std::isinf(repetition_penalty)) {
    std::fprintf(stderr, "kiln-run: error: --repetition-penalty must be finite and > 0 (1 = off), got %g\n",
                 static_cast<double>(repetition_penalty));
    return 2;
  }
  if (top_k < 0) {
    std::fprintf(stderr, "kiln-run: error: --top-k must be >= 0 (0 = off), got %d\n", top_k);
    return 2;
  }
  if (threads < 0) {
    std::fprintf(stderr, "kiln-run: error: --threads must be >= 1 (or 0 for the default), got %d\n", threads);
    return 2;
  }
  if (!image_path.empty() && !pixels_path.empty()) {
    std::fprintf(stderr, "kiln-run: error: give at most one of --image and --pixel-values\n");
    return 2;
  }
  if (score.enabled && batch_path.empty()) {
    std::fprintf(stderr, "kiln-run: error: --score needs --batch\n");
    return 2;
  }
  if (profile && !batch_path.empty()) {
    std::fprintf(stderr, "kiln-run: error: --profile times one answer: give --prompt or --input-ids, not --batch\n");
    return 2;
  }
  if (!logits_path.empty() && ids_spec.empty() && !score.enabled) {
    std::fprintf(stderr, "kiln-run: error: --dump-logits needs --input-ids, or --batch with --score\n");
    return 2;
  }

  if (keep_tokens < 0) {
    std::fprintf(stderr, "kiln-run: error: --keep-tokens must be >= 0, got %d\n", keep_tokens);
    return 2;
  }
  std::vector<std::pair<int, int>> pressure;
  if (!pressure_spec.empty()) {
    std::string error;
    if (!kiln::tools::ParsePressure(pressure_spec, &pressure, &error)) {
      std::fprintf(stderr, "kiln-run: error: --pressure: %s\n", error.c_str());
      return 2;
    }
  }

  kiln_pressure_policy_t policy;
  kiln_pressure_policy_init(&policy);
  for (auto [spec, levels, name] : {std::tuple{&pressure_threads, policy.max_threads, "--pressure-threads"},
                                    std::tuple{&pressure_context, policy.max_context, "--pressure-context"}}) {
    if (spec->empty()) continue;
    int v[4], end = 0;
    if (std::sscanf(spec->c_str(), "%d,%d,%d,%d%n", &v[0], &v[1], &v[2], &v[3], &end) != 4 ||
        static_cast<size_t>(end) != spec->size() || v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0) {
      std::fprintf(stderr, "kiln-run: error: %s takes four numbers >= 0 (none,moderate,serious,critical), got '%s'\n",
                   name, spec->c_str());
      return 2;
    }
    for (int i = 0; i < 4; ++i) levels[i] = v[i];
  }

  kiln_session_options_t so;
  kiln_session_options_init(&so);
  so.pressure_policy = &policy;
  so.num_threads = threads;
  so.context_length = context;
  so.kv_cache = kv_cache;
  so.context_overflow = context_overflow;
  so.keep_tokens = keep_tokens;
  so.image_tokens = image_tokens;
  // --memory-budget: the runtime checks the model and this session against it at load.
  kiln_model_options_t mo;
  kiln_model_options_init(&mo);
  mo.session = &so;
  mo.kv_pool_tokens = kv_pool_tokens;
  mo.kv_block_tokens = kv_block_tokens;
  mo.tier = tier;
  const std::string perf_map_path = "/tmp/perf-" + std::to_string(static_cast<long>(getpid())) + ".map";
  if (perf_map) mo.perf_map = perf_map_path.c_str();
  if (!memory_budget.empty()) {
    std::optional<uint64_t> budget = kiln::format::ParseByteSize(memory_budget);
    if (!budget) {
      std::fprintf(stderr, "kiln-run: error: --memory-budget must be a size such as 800MB, 1.2GB or 512MiB, got '%s'\n",
                   memory_budget.c_str());
      return 2;
    }
    mo.memory_budget = *budget;
  }
  if (!more_models.empty() && (batch_path.empty() || !logits_path.empty())) {
    std::fprintf(stderr, "kiln-run: error: --model needs --batch (its lines' \"model\" pick the model) and no "
                         "--dump-logits\n");
    return 2;
  }
  kiln_generate_options_t go;
  kiln_generate_options_init(&go);
  go.max_new_tokens = max_new_tokens;
  go.temperature = temperature;
  go.top_k = top_k;
  go.top_p = top_p;
  go.repetition_penalty = repetition_penalty;
  go.seed = seed;
  // The checkpoint's sampling settings where no flag gave one.
  auto model_defaults = [&](const kiln_model_t* m) {
    kiln_generate_options_t d;
    kiln_generate_options_init_from_model(m, &d);
    if (temperature_opt->count() == 0) go.temperature = d.temperature;
    if (top_k_opt->count() == 0) go.top_k = d.top_k;
    if (top_p_opt->count() == 0) go.top_p = d.top_p;
    if (penalty_opt->count() == 0) go.repetition_penalty = d.repetition_penalty;
  };
  go.reuse_prefix = no_prefix_reuse ? 0 : 1;
  kiln_error_t err;
  kiln_model_t* model = nullptr;
  SharedModels shared;
  if (!more_models.empty()) {
    // The positional model and the others, under one budget (none: unlimited).
    shared.session_options = &so;
    shared.pressure = pressure;
    shared.paths.push_back(model_path);
    shared.paths.insert(shared.paths.end(), more_models.begin(), more_models.end());
    const uint64_t bytes = mo.memory_budget > 0 ? mo.memory_budget : UINT64_MAX / 4;
    mo.memory_budget = 0;
    if (kiln_shared_budget_create(bytes, &shared.budget, &err) != KILN_OK) return Die("creating the budget", err);
    for (const std::string& p : shared.paths) {
      int32_t id = -1;
      if (kiln_shared_budget_add(shared.budget, p.c_str(), &mo, &id, &err) != KILN_OK) {
        kiln_shared_budget_release(shared.budget);
        return Die("adding a model to the budget", err);
      }
    }
    kiln_session_t* session = nullptr;
    int rc = 1;
    if (!shared.Use(0, &model, &session, &err)) {
      rc = Die("loading the model", err);
    } else {
      model_defaults(model);
      rc = RunBatch(model, session, batch_path, model_path, go, score, &shared, &session);
    }
    kiln_session_release(session);
    if (shared.current >= 0) kiln_shared_budget_return(shared.budget, shared.current);
    kiln_shared_budget_release(shared.budget);
    return rc;
  }
  if (kiln_model_load(model_path.c_str(), &mo, &model, &err) != KILN_OK) return Die("loading the model", err);
  model_defaults(model);
  // The conversation (--system, --chat): the model's chat template, one turn at a time.
  std::vector<std::pair<std::string, std::string>> turns;  // role, content
  if (system_opt->count() > 0) turns.emplace_back("system", system_prompt);
  const bool has_image = !image_path.empty() || !pixels_path.empty();
  auto messages = [&]() {
    std::vector<kiln_chat_message_t> m;
    bool image_given = false;
    for (const auto& [role, content] : turns) {
      int image = has_image && role == "user" && !image_given ? 1 : 0;
      image_given = image_given || image;
      m.push_back({role.c_str(), content.c_str(), image});
    }
    return m;
  };
  if (show_prompt) {  // the text only: no session, no image
    turns.emplace_back("user", prompt);
    std::vector<kiln_chat_message_t> m = messages();
    size_t length = 0;
    kiln_model_apply_chat_template(model, m.data(), m.size(), nullptr, 0, &length, &err);
    std::string text(length + 1, '\0');
    kiln_status_t st = kiln_model_apply_chat_template(model, m.data(), m.size(), text.data(), text.size(), &length, &err);
    if (st == KILN_OK) {
      std::fwrite(text.data(), 1, length, stdout);
      std::fputc('\n', stdout);
    }
    kiln_model_release(model);
    return st == KILN_OK ? 0 : Die("applying the chat template", err);
  }
  kiln_model_info_t info = {};
  info.struct_size = sizeof(info);
  kiln_model_get_info(model, &info);
  for (const auto& [kind, level] : pressure) kiln_model_set_pressure(model, kind, level);
  kiln_session_t* session = nullptr;
  if (kiln_session_create(model, &so, &session, &err) != KILN_OK) {
    kiln_model_release(model);
    return Die("creating a session", err);
  }
  int rc = 0;
  auto fail = [&](const char* what) {
    rc = Die(what, err);
    kiln_session_release(session);
    kiln_model_release(model);
    return rc;
  };
  if (profile && kiln_session_set_op_profiling(session, 1, &err) != KILN_OK) return fail("enabling the op profile");

  // More new tokens than the context holds can never be generated, and the session
  // reserves its output buffer for max_new_tokens up front: cap it at the context
  // (the session's default context is the model's, at most 4096).
  {
    int64_t ctx = context > 0 ? context : std::min<int64_t>(info.max_position_embeddings, 4096);
    if (ctx > 0 && go.max_new_tokens > ctx && context_overflow != KILN_CONTEXT_SLIDE)
      go.max_new_tokens = static_cast<int32_t>(ctx);
  }
  if (!batch_path.empty()) {
    std::vector<float> scored_logits;
    if (!logits_path.empty()) score.logits_out = &scored_logits;
    rc = RunBatch(model, session, batch_path, model_path, go, score, nullptr, &session);
    if (!logits_path.empty() && rc == 0) {  // rows of failed lines would be missing
      std::string error;
      const size_t vocab = static_cast<size_t>(info.vocab_size);
      if (!kiln::npy::WriteF32(logits_path, scored_logits.data(), {scored_logits.size() / vocab, vocab}, &error)) {
        std::fprintf(stderr, "kiln-run: error: %s\n", error.c_str());
        rc = 1;
      }
    }
    kiln_session_release(session);
    kiln_model_release(model);
    return rc;
  }

  if (!image_path.empty()) {
    kiln::tools::RgbImage img;
    std::string error;
    if (!kiln::tools::LoadRgbImage(image_path, &img, &error)) {
      std::fprintf(stderr, "kiln-run: error: %s\n", error.c_str());
      kiln_session_release(session);
      kiln_model_release(model);
      return 1;
    }
    if (kiln_session_set_image_rgb(session, img.pixels.data(), img.width, img.height, 3 * static_cast<size_t>(img.width),
                                   &err) != KILN_OK)
      return fail("setting the image");
  } else if (!pixels_path.empty()) {
    kiln::npy::Array a;
    std::string error;
    if (!kiln::npy::Read(pixels_path, &a, &error) || a.dtype != "f4") {
      std::fprintf(stderr, "kiln-run: error: %s\n", error.empty() ? (pixels_path + ": must be float32").c_str() : error.c_str());
      kiln_session_release(session);
      kiln_model_release(model);
      return 1;
    }
    std::vector<float> px = a.AsFloat();
    if (kiln_session_set_pixel_values(session, px.data(), px.size(), &err) != KILN_OK)
      return fail("setting the pixel values");
  }

  std::vector<int32_t> ids;
  if (!ids_spec.empty()) {
    std::string error;
    if (!ParseIds(ids_spec, &ids, &error)) {
      std::fprintf(stderr, "kiln-run: error: %s\n", error.c_str());
      kiln_session_release(session);
      kiln_model_release(model);
      return 1;
    }
  }

  if (!logits_path.empty()) {
    std::vector<float> logits(ids.size() * static_cast<size_t>(info.vocab_size));
    if (kiln_session_prefill_logits(session, ids.data(), ids.size(), logits.data(), logits.size(), &err) != KILN_OK)
      return fail("computing logits");
    std::string error;
    if (!kiln::npy::WriteF32(logits_path, logits.data(), {1, ids.size(), static_cast<size_t>(info.vocab_size)}, &error)) {
      std::fprintf(stderr, "kiln-run: error: %s\n", error.c_str());
      rc = 1;
    }
  }

  Streamed streamed;
  streamed.quiet = quiet;
  go.on_token = OnToken;
  go.user = &streamed;
  kiln_status_t st = KILN_OK;
  if (chat_mode) {
    // One user message per line; each answer joins the conversation as the assistant's.
    std::string line = prompt;
    bool first = have_prompt;
    while (first || std::getline(std::cin, line)) {
      first = false;
      turns.emplace_back("user", line);
      std::vector<kiln_chat_message_t> m = messages();
      streamed.text.clear();
      st = kiln_session_chat(session, m.data(), m.size(), &go, &err);
      if (st != KILN_OK) break;
      if (!quiet) std::fputc('\n', stdout);
      std::fflush(stdout);
      turns.emplace_back("assistant", streamed.text);
    }
  } else if (!ids.empty()) {
    st = kiln_session_generate_ids(session, ids.data(), ids.size(), &go, &err);
  } else if (!turns.empty()) {
    turns.emplace_back("user", prompt);
    std::vector<kiln_chat_message_t> m = messages();
    st = kiln_session_chat(session, m.data(), m.size(), &go, &err);
  } else {
    st = kiln_session_generate(session, prompt.c_str(), &go, &err);
  }
  if (st != KILN_OK) return fail("generating");
  if (!quiet && !chat_mode) std::fputc('\n', stdout);
  if (!ids.empty() && !quiet) {
    std::vector<int32_t> out(4096);
    size_t n = 0;
    kiln_session_get_output_ids(session, out.data(), out.size(), &n);
    std::printf("tokens:");
    for (size_t i = 0; i < n && i < out.size(); ++i) std::printf(" %d", out[i]);
    std::printf("\n");
  }
  kiln_stats_t stats = {};
  stats.struct_size = sizeof(stats);
  kiln_session_get_stats(session, &stats);
  const std::vector<ProfileRow> profile_rows = profile ? ProfileRows(session) : std::vector<ProfileRow>();
  PrintStats(stats, info, model_path, json, json ? stdout : stderr, profile ? ProfileJson(profile_rows) : "");
  if (profile && !json) PrintProfile(profile_rows, stderr);
  kiln_session_release(session);
  kiln_model_release(model);
  return rc;
}
