// kiln-inspect: what a .kiln artifact contains — header, stages, tensors, the
// per-layer precision table, the memory plan and the CPU features its kernels need.
//
//   kiln-inspect model.kiln [--ops] [--json]
//
// The artifact is verified by the runtime first: a corrupt file is reported, not
// printed.
#include <vector>
#include <cstring>
#include <algorithm>
#include <CLI/CLI.hpp>

#include "common/cli.h"
#include "common/tensor_label.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fcntl.h>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/kiln_format.h"
#include "formats/kiln_generated.h"
#include "kiln/kiln.h"

namespace fb = kiln::fb;

namespace {

// Bytes of f32 activations an op reads and writes (its inputs and output as planned,
// the token dimension counted as 1 row): its activation traffic per token, or per
// image in a vision stage. Scratch and the KV cache are not counted.
uint64_t ActivationBytes(const fb::Model* m, const fb::Op* op) {
  auto bytes = [&](uint32_t v) -> uint64_t {
    const fb::Value* val = m->values()->Get(v);
    if (val->dtype() != fb::DType::F32 || val->shape() == nullptr) return 0;
    uint64_t n = 4;
    for (uint32_t k = 0; k < val->shape()->size(); ++k) {
      const int64_t d = val->shape()->Get(k);
      n *= d < 0 ? 1 : static_cast<uint64_t>(d);
    }
    return n;
  };
  uint64_t total = bytes(op->output());
  for (uint32_t i = 0; op->inputs() && i < op->inputs()->size(); ++i) total += bytes(op->inputs()->Get(i));
  return total;
}

// Ops of a stage before fusion (Op.fused lists every op of the unfused model a fused
// op computes) and the most
// ops of one layer (ops named <...>.layers.<n>.<...>, by their prefix).
struct FusionCount {
  uint32_t before = 0;
  uint32_t max_per_layer = 0;
  uint32_t layers = 0;
};
FusionCount CountFusion(const fb::Stage* s) {
  FusionCount f;
  std::vector<std::pair<std::string, uint32_t>> per_layer;
  for (const fb::Op* op : *s->ops()) {
    f.before += op->fused() && op->fused()->size() > 1 ? op->fused()->size() : 1;
    const std::string name = op->name() ? op->name()->str() : "";
    const size_t at = name.find(".layers.");
    if (at == std::string::npos) continue;
    size_t end = at + 8;
    while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
    if (end == at + 8) continue;
    const std::string layer = name.substr(0, end);
    auto it = std::find_if(per_layer.begin(), per_layer.end(), [&](const auto& e) { return e.first == layer; });
    if (it == per_layer.end()) per_layer.push_back({layer, 1});
    else ++it->second;
  }
  for (const auto& e : per_layer) f.max_per_layer = std::max(f.max_per_layer, e.second);
  f.layers = static_cast<uint32_t>(per_layer.size());
  return f;
}

// The projector's visual-token selection (kiln-compile --visual-tokens), or null.
const fb::SelectTokensParams* SelectTokensOf(const fb::Model* m) {
  for (const fb::Stage* s : *m->stages())
    if (s->kind() == fb::StageKind::Projector)
      for (const fb::Op* op : *s->ops())
        if (op->kind() == fb::OpKind::SelectTokens) return op->params_as_SelectTokensParams();
  return nullptr;
}

// The name of a visual-token score.
const char* ScoreName(const fb::SelectTokensParams* sel) {
  return sel->score() == fb::TokenScore::Norm ? "norm" : "distinct";
}

// The end-of-sequence ids, joined by `sep`.
std::string EosIds(const fb::Generation* g, const char* sep) {
  std::string eos;
  for (uint32_t i = 0; g->eos_token_ids() != nullptr && i < g->eos_token_ids()->size(); ++i)
    eos += (i ? sep : "") + std::to_string(g->eos_token_ids()->Get(i));
  return eos;
}

// The generation defaults (generation_config.json) in one line.
std::string GenerationText(const fb::Generation* g) {
  char buf[256];
  if (g->do_sample())
    std::snprintf(buf, sizeof(buf), "sampling (temperature %g, top_k %d, top_p %g)", static_cast<double>(g->temperature()),
                  g->top_k(), static_cast<double>(g->top_p()));
  else
    std::snprintf(buf, sizeof(buf), "greedy");
  std::string out = buf;
  if (g->repetition_penalty() != 1.0f)
    out += ", repetition_penalty " + std::to_string(g->repetition_penalty()).substr(0, 6);
  if (g->max_new_tokens() > 0) out += ", max_new_tokens " + std::to_string(g->max_new_tokens());
  out += ", bos " + std::to_string(g->bos_token_id()) + ", eos [" + EosIds(g, ",") + "]";
  if (g->pad_token_id() >= 0) out += ", pad " + std::to_string(g->pad_token_id());
  return out;
}

std::string Shape(const flatbuffers::Vector<int64_t>* shape) {
  std::string s = "[";
  for (uint32_t i = 0; shape && i < shape->size(); ++i) {
    if (i) s += ", ";
    int64_t d = shape->Get(i);
    s += d < 0 ? "?" : std::to_string(d);
  }
  return s + "]";
}

std::string Features(uint64_t bits) {
  std::string s;
  for (uint64_t b = 1; b != 0; b <<= 1)
    if (bits & b) s += (s.empty() ? "" : ",") + std::string(kiln::format::CpuFeatureName(b));
  return s.empty() ? "none" : s;
}

const char* S(const flatbuffers::String* s) { return s ? s->c_str() : ""; }

// The name of a kernel id of formats/kernels.def ("linear_bias_f32_f32_wany_1x16_ref_portable").
const char* KernelName(uint32_t id) {
  const kiln::format::KernelInfo* k = kiln::format::FindKernelInfo(id);
  return k != nullptr ? k->name : "unknown";
}

// Its ISA column ("portable", "x86_avx512", ...).
const char* KernelIsa(uint32_t id) {
  const kiln::format::KernelInfo* k = kiln::format::FindKernelInfo(id);
  return k != nullptr ? k->isa : "unknown";
}

// How a tensor's bytes are arranged: row_major, panel16, int4_p16k8, int8_p16k4
// (formats/encoding.h).
const char* LayoutOf(const fb::Tensor* t) {
  const char* name = kiln::format::LayoutName(static_cast<uint8_t>(t->layout()));
  return name ? name : "unknown";
}

using kiln::tools::EncodingLabel;

// JSON string escaping for names (printable ASCII in practice; escape the rest).
std::string J(const char* s) {
  std::string out = "\"";
  for (const unsigned char* p = reinterpret_cast<const unsigned char*>(s); *p; ++p) {
    if (*p == '"' || *p == '\\') {
      out += '\\';
      out += static_cast<char>(*p);
    } else if (*p < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", *p);
      out += buf;
    } else {
      out += static_cast<char>(*p);
    }
  }
  return out + "\"";
}

std::string Num(double v) {
  if (std::isnan(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

uint64_t ParamCount(const fb::Model* m) {
  uint64_t n = 0;
  for (const fb::Tensor* t : *m->tensors()) {
    uint64_t e = 1;
    for (int64_t d : *t->shape()) e *= static_cast<uint64_t>(d);
    n += e;
  }
  return n ? n : 1;
}

// How an int8/int4 cache of `group` scales its codes (formats/kv_codec.h): values per
// group of channels of a position, keys per channel over spans of `group` positions
// when the group is a power of two.
std::string KvScalesText(uint32_t group) {
  if (group == 0) return "";
  const std::string g = std::to_string(group);
  if ((group & (group - 1)) != 0) return ", one scale per " + g + " channels";
  return ", values one scale per " + g + " channels, keys one per channel over " + g +
         " positions, the positions being filled exact";
}

// What a session for the --context/--threads/--kv-cache asked for needs.
struct SessionMemory {
  int context = 0;  // 0: the runtime's default
  int threads = 0;  // 0: the performance cores (the runtime's default)
  int kv_cache = KILN_KV_CACHE_DEFAULT;
  // kiln_model_memory_report: what --memory-budget is checked against; its session
  // part is what kiln_model_session_bytes reports.
  kiln_memory_report_t report = {};
  bool runs_here = true;  // false: an artifact for another CPU (verified for its own)
  std::string why_not;
  const fb::Model* root = nullptr;  // a tiered artifact's root header (its tier table)
  int tier = 0;                     // the tier shown
};

// A tiered artifact's tiers (kiln-compile --tiers), one "tier K: ..." per tier.
std::vector<std::string> TierLines(const SessionMemory& mem) {
  std::vector<std::string> lines;
  if (mem.root == nullptr || mem.root->tiers() == nullptr) return lines;
  for (uint32_t k = 0; k < mem.root->tiers()->size(); ++k) {
    const fb::Tier* t = mem.root->tiers()->Get(k);
    char buf[160];
    std::snprintf(buf, sizeof(buf), "tier %u: weight budget %.2f MB, weights %.2f MB, header at %" PRIu64 "%s", k,
                  t->weight_budget() / 1e6, t->weight_bytes() / 1e6, t->header_offset(),
                  static_cast<int>(k) == mem.tier ? " (shown)" : "");
    lines.push_back(buf);
  }
  return lines;
}

void PrintText(const fb::Model* m, const std::string& path, uint64_t file_size, bool ops, const SessionMemory& mem) {
  const fb::Metadata* md = m->metadata();
  std::printf("%s: Kiln artifact, schema %u.%u, %.1f MB\n", path.c_str(), m->schema_version() / 1000,
              m->schema_version() % 1000, file_size / 1e6);
  std::printf("  architecture     %s\n", S(md->architecture()));
  std::printf("  target           %s\n", S(md->target_triple()));
  std::printf("  cpu features     %s\n", Features(m->required_cpu_features()).c_str());
  if (!mem.runs_here) std::printf("  runs here        no: %s\n", mem.why_not.c_str());
  std::printf("  compiler         %s\n", S(md->compiler_version()));
  std::printf("  source hash      %s\n", S(md->source_hash()));
  std::printf("  prompt template  %s\n", S(md->prompt_template()));
  if (const fb::ChatTemplate* chat = m->chat()) {
    std::printf("  chat template    %s (%zu bytes of Jinja)\n", S(chat->source()),
                chat->jinja() != nullptr ? static_cast<size_t>(chat->jinja()->size()) : size_t{0});
    std::printf("  chat reply after %s\n", J(S(chat->generation_prompt())).c_str());
  } else {
    std::printf("  chat template    none (prompts are tokenized as they are)\n");
  }
  for (const std::string& line : TierLines(mem)) std::printf("  tiers            %s\n", line.c_str());
  if (const fb::CodeSegment* code = m->code()) {
    const fb::Segment* seg = !code->library() && code->segment() < m->segments()->size()
                                 ? m->segments()->Get(code->segment())
                                 : nullptr;
    if (seg)
      std::printf("  code segment     %.1f KB of generated kernels for %s (%s), %u functions, checksum %016" PRIx64
                  "\n",
                  seg->size() / 1e3, S(code->triple()), Features(code->cpu_features()).c_str(),
                  code->symbols() ? code->symbols()->size() : 0, code->checksum());
    else
      std::printf("  code segment     none: generated kernels for %s (%s) in a static library, %u functions, hash "
                  "%016" PRIx64 "\n",
                  S(code->triple()), Features(code->cpu_features()).c_str(),
                  code->symbols() ? code->symbols()->size() : 0, code->checksum());
  }
  const fb::TextConfig* t = m->text();
  std::printf("  text             %u layers, hidden %u, heads %u/%u kv, head_dim %u, vocab %u, max positions %u\n",
              t->num_layers(), t->hidden_size(), t->num_heads(), t->num_kv_heads(), t->head_dim(), t->vocab_size(),
              t->max_position_embeddings());
  if (m->image()) {
    const fb::ImagePreprocess* p = m->preprocess();
    std::printf("  image            %ux%u, %u tokens (id %" PRId64 "), %s preprocessing, resample %u\n",
                m->image()->image_size(), m->image()->image_size(), m->image()->image_tokens(),
                m->image()->image_token_id(), fb::EnumNameImageProcessor(p->processor()), p->resample());
    if (const fb::SelectTokensParams* sel = SelectTokensOf(m))
      std::printf("  visual tokens    %u of %u kept (score %s) at %s positions; a session may keep fewer\n",
                  sel->keep(), sel->tokens(), ScoreName(sel), sel->original_positions() ? "their original" : "consecutive");
  }
  const fb::Tokenizer* tok = m->tokenizer() != nullptr ? m->tokenizer() : mem.root->tokenizer();  // a tier shares the root's
  std::printf("  tokenizer        byte-level BPE (%s), %u ids, %u merges, %u added tokens, bos %d%s\n",
              fb::EnumNamePreTokenizer(tok->pretokenizer()), tok->vocab()->size(),
              tok->merges() ? tok->merges()->size() : 0, tok->added_tokens() ? tok->added_tokens()->size() : 0,
              tok->bos_id(), tok->add_bos() ? " (added)" : "");
  std::printf("  generation       %s\n", GenerationText(m->generation()).c_str());
  const fb::MemoryPlan* mp = m->memory_plan();
  std::printf("\nmemory plan\n");
  std::printf("  weights          %12.1f MB (mapped)\n", mp->weight_bytes() / 1e6);
  std::printf("  arena            %12.1f MB (max over stages, prefill of %u tokens)\n", mp->arena_bytes() / 1e6,
              mp->max_prefill_tokens());
  std::printf("  stage buffers    %12.1f MB\n", mp->io_bytes() / 1e6);
  std::printf("  KV cache         %12.1f KB per token (%s%s)\n", mp->kv_bytes_per_token() / 1e3,
              fb::EnumNameEncoding(t->kv_cache_encoding()),
              KvScalesText(t->kv_cache_group()).c_str());
  if (mem.runs_here)
    std::printf("  session          %12.1f MB allocated by a session (context %s, %s threads, %s KV cache): KV cache, "
                "arena, kernel scratch, stage buffers\n",
                mem.report.session_bytes / 1e6, mem.context ? std::to_string(mem.context).c_str() : "default",
                mem.threads ? std::to_string(mem.threads).c_str() : "all",
                mem.kv_cache ? kiln::tools::KvCacheName(mem.kv_cache) : "the artifact's");
  else
    std::printf("  session          not computed: the artifact cannot be loaded here\n");
  if (mem.runs_here) {
    const kiln_memory_report_t& r = mem.report;
    const double MB = 1e6;
    std::printf("\nmemory with one session of %d tokens (%s KV cache): what kiln_model_options_t.memory_budget and "
                "kiln-run --memory-budget check\n",
                r.context_length, kiln::tools::KvCacheName(r.kv_cache));
    std::printf("  weights          %12.1f MB (mapped)\n", r.weight_bytes / MB);
    std::printf("  code             %12.1f MB (generated kernels)\n", r.code_bytes / MB);
    std::printf("  model tables     %12.1f MB (tokenizer, kernel bindings)\n", r.model_bytes / MB);
    if (r.kv_pool_bytes > 0) {
      std::printf("  KV pool          %12.1f MB (paged: %d blocks of %d tokens, shared by the sessions)\n",
                  r.kv_pool_bytes / MB, r.kv_pool_blocks, r.kv_block_tokens);
      std::printf("  session          %12.1f MB: arena %.1f MB, scratch, buffers and block table %.1f MB\n",
                  r.session_bytes / MB, r.arena_bytes / MB, (r.session_bytes - r.arena_bytes) / MB);
    } else {
      std::printf("  session          %12.1f MB: KV cache %.1f MB, arena %.1f MB, scratch and buffers %.1f MB\n",
                  r.session_bytes / MB, r.kv_cache_bytes / MB, r.arena_bytes / MB,
                  (r.session_bytes - r.kv_cache_bytes - r.arena_bytes) / MB);
    }
    std::printf("  total            %12.1f MB\n", r.total_bytes / MB);
  }
  std::printf("\nstages\n");
  for (const fb::Stage* s : *m->stages()) {
    std::printf("  %-16s %5u ops, arena %10.1f KB", fb::EnumNameStageKind(s->kind()), s->ops()->size(),
                s->arena_bytes() / 1e3);
    const FusionCount fc = CountFusion(s);
    std::printf("  in:");
    for (uint32_t v : *s->inputs()) std::printf(" %s%s", S(m->values()->Get(v)->name()), Shape(m->values()->Get(v)->shape()).c_str());
    uint32_t o = s->outputs()->Get(0);
    std::printf("  out: %s%s\n", S(m->values()->Get(o)->name()), Shape(m->values()->Get(o)->shape()).c_str());
    if (fc.before != s->ops()->size() || fc.layers > 0)
      std::printf("  %-16s %5u ops before fusion%s\n", "", fc.before,
                  fc.layers ? (", at most " + std::to_string(fc.max_per_layer) + " per layer (" +
                               std::to_string(fc.layers) + " layers)")
                                  .c_str()
                            : "");
    if (ops)
      for (const fb::Op* op : *s->ops()) {
        std::printf("    %-18s %-44s %-11s %s%s%s", fb::EnumNameOpKind(op->kind()), KernelName(op->kernel()),
                    KernelIsa(op->kernel()), S(op->name()), op->symbol() ? "  -> " : "", S(op->symbol()));
        for (uint32_t i = 0; op->symbols() && i < op->symbols()->size(); ++i)
          std::printf(", %s", S(op->symbols()->Get(i)));
        for (uint32_t i = 0; op->fused() && i < op->fused()->size(); ++i)
          std::printf("%s%s", i ? ", " : "  fused: ", S(op->fused()->Get(i)));
        std::printf("\n");
      }
  }
  std::printf("\nprecision (%u tensors)\n", m->precision() ? m->precision()->size() : 0);
  std::printf("  %-64s %-16s %-14s %-10s %14s %12s %12s\n", "tensor", "stage", "encoding", "layout", "shape", "source",
              "stored");
  uint64_t src_total = 0, total = 0;
  for (uint32_t i = 0; m->precision() && i < m->precision()->size(); ++i) {
    const fb::PrecisionEntry* e = m->precision()->Get(i);
    const fb::Tensor* tn = m->tensors()->Get(e->tensor());
    std::printf("  %-64s %-16s %-14s %-10s %14s %12" PRIu64 " %12" PRIu64 "%s\n", S(tn->name()),
                fb::EnumNameStageKind(e->stage()), EncodingLabel(tn).c_str(), LayoutOf(tn), Shape(tn->shape()).c_str(),
                e->source_bytes(), e->bytes(),
                std::isnan(e->sensitivity()) ? "" : ("  sensitivity " + Num(e->sensitivity())).c_str());
    src_total += e->source_bytes();
    total += e->bytes();
  }
  std::printf("  %-64s %-16s %-14s %-10s %14s %12" PRIu64 " %12" PRIu64 "  (%.2f bits per weight)\n", "total", "", "",
              "", "",
              src_total, total, 8.0 * static_cast<double>(total) / static_cast<double>(ParamCount(m)));
}

void PrintJson(const fb::Model* m, const std::string& path, uint64_t file_size, bool ops, const SessionMemory& mem) {
  const fb::Metadata* md = m->metadata();
  const fb::TextConfig* t = m->text();
  const fb::MemoryPlan* mp = m->memory_plan();
  std::printf("{\n  \"file\": %s, \"file_bytes\": %" PRIu64 ", \"schema_version\": %u,\n", J(path.c_str()).c_str(),
              file_size, m->schema_version());
  std::printf("  \"architecture\": %s, \"target\": %s, \"required_cpu_features\": %s,\n",
              J(S(md->architecture())).c_str(), J(S(md->target_triple())).c_str(),
              J(Features(m->required_cpu_features()).c_str()).c_str());
  std::printf("  \"compiler\": %s, \"source_hash\": %s, \"prompt_template\": %s,\n", J(S(md->compiler_version())).c_str(),
              J(S(md->source_hash())).c_str(), J(S(md->prompt_template())).c_str());
  if (const fb::ChatTemplate* chat = m->chat())
    std::printf("  \"chat_template\": {\"source\": %s, \"generation_prompt\": %s, \"jinja\": %s},\n",
                J(S(chat->source())).c_str(), J(S(chat->generation_prompt())).c_str(), J(S(chat->jinja())).c_str());
  else
    std::printf("  \"chat_template\": null,\n");
  if (mem.root != nullptr && mem.root->tiers() != nullptr) {
    std::printf("  \"tier\": %d, \"tiers\": [", mem.tier);
    for (uint32_t k = 0; k < mem.root->tiers()->size(); ++k) {
      const fb::Tier* t = mem.root->tiers()->Get(k);
      std::printf("%s{\"weight_budget\": %" PRIu64 ", \"weight_bytes\": %" PRIu64 ", \"header_offset\": %" PRIu64
                  ", \"header_bytes\": %" PRIu64 "}",
                  k ? ", " : "", t->weight_budget(), t->weight_bytes(), t->header_offset(), t->header_size());
    }
    std::printf("],\n");
  }
  if (const fb::CodeSegment* code = m->code()) {
    const fb::Segment* seg = !code->library() && code->segment() < m->segments()->size()
                                 ? m->segments()->Get(code->segment())
                                 : nullptr;
    std::printf("  \"code\": {\"library\": %s, \"offset\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"triple\": %s, \"cpu_features\": %s, \"machine\": %u, "
                "\"checksum\": \"%016" PRIx64 "\", \"symbols\": [",
                code->library() ? "true" : "false", seg ? seg->offset() : 0, seg ? seg->size() : 0,
                J(S(code->triple())).c_str(), J(Features(code->cpu_features()).c_str()).c_str(),
                code->machine(), code->checksum());
    for (uint32_t i = 0; code->symbols() && i < code->symbols()->size(); ++i)
      std::printf("%s%s", i ? ", " : "", J(S(code->symbols()->Get(i))).c_str());
    std::printf("]},\n");
  }
  std::printf("  \"text\": {\"num_layers\": %u, \"hidden_size\": %u, \"num_heads\": %u, \"num_kv_heads\": %u, "
              "\"head_dim\": %u, \"vocab_size\": %u, \"max_position_embeddings\": %u},\n",
              t->num_layers(), t->hidden_size(), t->num_heads(), t->num_kv_heads(), t->head_dim(), t->vocab_size(),
              t->max_position_embeddings());
  if (m->image()) {
    const fb::SelectTokensParams* sel = SelectTokensOf(m);
    std::printf("  \"image\": {\"image_size\": %u, \"image_tokens\": %u, \"image_tokens_scored\": %u, "
                "\"visual_token_score\": %s, \"visual_token_positions\": %s, \"image_token_id\": %" PRId64
                ", \"processor\": %s},\n",
                m->image()->image_size(), m->image()->image_tokens(), sel ? sel->tokens() : 0,
                sel ? J(ScoreName(sel)).c_str() : "null",
                sel ? (sel->original_positions() ? "\"original\"" : "\"consecutive\"") : "null",
                m->image()->image_token_id(), J(fb::EnumNameImageProcessor(m->preprocess()->processor())).c_str());
  }
  {
    const fb::Generation* g = m->generation();
    std::printf("  \"generation\": {\"bos_token_id\": %d, \"eos_token_ids\": [%s], \"pad_token_id\": %d, "
                "\"do_sample\": %s, \"temperature\": %s, \"top_k\": %d, \"top_p\": %s, \"repetition_penalty\": %s, "
                "\"max_new_tokens\": %d},\n",
                g->bos_token_id(), EosIds(g, ", ").c_str(), g->pad_token_id(), g->do_sample() ? "true" : "false",
                Num(g->temperature()).c_str(), g->top_k(), Num(g->top_p()).c_str(), Num(g->repetition_penalty()).c_str(),
                g->max_new_tokens());
  }
  std::printf("  \"memory_plan\": {\"weight_bytes\": %" PRIu64 ", \"arena_bytes\": %" PRIu64
              ", \"max_prefill_tokens\": %u, \"io_bytes\": %" PRIu64 ", \"kv_bytes_per_token\": %" PRIu64
              ", \"kv_cache_encoding\": %s, \"kv_cache_group\": %u},\n",
              mp->weight_bytes(), mp->arena_bytes(), mp->max_prefill_tokens(), mp->io_bytes(), mp->kv_bytes_per_token(),
              J(fb::EnumNameEncoding(t->kv_cache_encoding())).c_str(), t->kv_cache_group());
  std::printf("  \"runs_here\": %s,\n", mem.runs_here ? "true" : "false");
  if (mem.runs_here) {
    std::printf("  \"session\": {\"bytes\": %" PRIu64 ", \"context\": %d, \"threads\": %d, \"kv_cache\": %s},\n",
                mem.report.session_bytes, mem.context, mem.threads, J(kiln::tools::KvCacheName(mem.kv_cache)).c_str());
    const kiln_memory_report_t& r = mem.report;
    std::printf("  \"memory\": {\"weight_bytes\": %" PRIu64 ", \"code_bytes\": %" PRIu64 ", \"model_bytes\": %" PRIu64
                ", \"session_bytes\": %" PRIu64 ", \"kv_cache_bytes\": %" PRIu64 ", \"arena_bytes\": %" PRIu64
                ", \"total_bytes\": %" PRIu64 ", \"context\": %d, \"kv_cache\": %s, \"kv_pool_bytes\": %" PRIu64
                ", \"kv_block_tokens\": %d, \"kv_pool_blocks\": %d},\n",
                r.weight_bytes, r.code_bytes, r.model_bytes, r.session_bytes, r.kv_cache_bytes, r.arena_bytes,
                r.total_bytes, r.context_length, J(kiln::tools::KvCacheName(r.kv_cache)).c_str(), r.kv_pool_bytes,
                r.kv_block_tokens, r.kv_pool_blocks);
  }
  std::printf("  \"stages\": [\n");
  for (uint32_t i = 0; i < m->stages()->size(); ++i) {
    const fb::Stage* s = m->stages()->Get(i);
    const FusionCount fc = CountFusion(s);
    std::printf("    {\"kind\": %s, \"ops\": %u, \"ops_before_fusion\": %u, \"layers\": %u, "
                "\"max_ops_per_layer\": %u, \"arena_bytes\": %" PRIu64,
                J(fb::EnumNameStageKind(s->kind())).c_str(), s->ops()->size(), fc.before, fc.layers,
                fc.max_per_layer, s->arena_bytes());
    if (ops) {
      std::printf(", \"op_list\": [");
      for (uint32_t j = 0; j < s->ops()->size(); ++j) {
        const fb::Op* op = s->ops()->Get(j);
        const std::string isa = KernelIsa(op->kernel());
        std::printf("%s{\"kind\": %s, \"kernel\": %u, \"kernel_name\": %s, \"isa\": %s, \"portable\": %s, "
                    "\"name\": %s",
                    j ? ", " : "", J(fb::EnumNameOpKind(op->kind())).c_str(), op->kernel(),
                    J(KernelName(op->kernel())).c_str(), J(isa.c_str()).c_str(), isa == "portable" ? "true" : "false",
                    J(S(op->name())).c_str());
        std::printf(", \"activation_bytes\": %" PRIu64, ActivationBytes(m, op));
        if (op->symbol()) std::printf(", \"symbol\": %s", J(S(op->symbol())).c_str());
        auto strings = [&](const char* field, const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* list) {
          if (list == nullptr) return;
          std::printf(", \"%s\": [", field);
          for (uint32_t k = 0; k < list->size(); ++k) std::printf("%s%s", k ? ", " : "", J(S(list->Get(k))).c_str());
          std::printf("]");
        };
        strings("symbols", op->symbols());
        strings("fused", op->fused());
        // The tensors it reads, in slot order (docs/artifact-format.md, weights per kind).
        std::printf(", \"weights\": [");
        for (uint32_t k = 0; op->weights() && k < op->weights()->size(); ++k) {
          const uint32_t t = op->weights()->Get(k);
          const fb::Tensor* w = t < m->tensors()->size() ? m->tensors()->Get(t) : nullptr;
          std::printf("%s%s", k ? ", " : "", J(w ? S(w->name()) : "").c_str());
        }
        std::printf("]");
        std::printf("}");
      }
      std::printf("]");
    }
    std::printf("}%s\n", i + 1 < m->stages()->size() ? "," : "");
  }
  std::printf("  ],\n  \"precision\": [\n");
  for (uint32_t i = 0; m->precision() && i < m->precision()->size(); ++i) {
    const fb::PrecisionEntry* e = m->precision()->Get(i);
    const fb::Tensor* tn = m->tensors()->Get(e->tensor());
    std::printf("    {\"tensor\": %s, \"stage\": %s, \"encoding\": %s, \"group_size\": %u, \"layout\": %s, "
                "\"shape\": %s, \"source_bytes\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"offset\": %" PRIu64
                ", \"sensitivity\": %s}%s\n",
                J(S(tn->name())).c_str(), J(fb::EnumNameStageKind(e->stage())).c_str(),
                J(EncodingLabel(tn).c_str()).c_str(), tn->group_size(), J(LayoutOf(tn)).c_str(), Shape(tn->shape()).c_str(),
                e->source_bytes(), e->bytes(), tn->offset(), Num(e->sensitivity()).c_str(),
                i + 1 < m->precision()->size() ? "," : "");
  }
  std::printf("  ]\n}\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln-inspect: show what a .kiln artifact contains"};
  app.set_version_flag("--version", std::string("kiln-inspect ") + kiln_version_string());
  std::string path;
  bool json = false, ops = false;
  int context = 0, threads = 0, kv_cache = KILN_KV_CACHE_DEFAULT;
  app.add_option("model", path, "compiled model (.kiln)")->required()->check(CLI::ExistingFile);
  app.add_option("--context", context, "KV-cache length the session memory is reported for (default: the runtime's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "threads the session memory is reported for (default: the performance cores, as kiln-run)")
      ->check(CLI::Range(0, 256));
  int memory_context = 0;
  CLI::Option* memory_opt =
      app.add_option("--memory", memory_context,
                     "CONTEXT: the memory report for a session of CONTEXT tokens (the same as --context CONTEXT)")
          ->check(CLI::PositiveNumber);
  app.add_option("--kv-cache", kv_cache, "KV-cache encoding the session memory is reported for (default: the artifact's)")
      ->transform(CLI::CheckedTransformer(kiln::tools::KvCacheNames()));
  int64_t kv_pool = 0;
  int kv_block = 0;
  app.add_option("--kv-pool", kv_pool,
                 "TOKENS: the memory report with a paged KV cache, a pool of TOKENS positions shared by the sessions "
                 "(kiln-run --kv-pool)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kv-block", kv_block, "positions per KV block with --kv-pool (default 32)");
  int tier = 0;
  app.add_option("--tier", tier, "a tiered artifact (kiln-compile --tiers): the tier shown (default 0, the largest)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--json", json, "machine-readable output");
  app.add_flag("--ops", ops, "list every op of every stage");
  if (int rc = kiln::tools::ParseCommandLine(app, argc, argv, "kiln-inspect"); rc >= 0) return rc;

  if (memory_opt->count() > 0) {
    if (context != 0 && context != memory_context) {
      std::fprintf(stderr, "kiln-inspect: error: --memory %d and --context %d disagree\n", memory_context, context);
      return 2;
    }
    context = memory_context;
  }
  kiln_error_t err;
  kiln_model_t* model = nullptr;
  SessionMemory mem;
  mem.context = context;
  mem.threads = threads;
  mem.kv_cache = kv_cache;
  // The session the report is for; with --kv-pool, the pool holds its encoding.
  kiln_session_options_t so = {};
  so.struct_size = sizeof(so);
  so.context_length = context;
  so.num_threads = threads;
  so.kv_cache = mem.kv_cache;
  kiln_model_options_t mo;
  kiln_model_options_init(&mo);
  mo.session = &so;
  mo.kv_pool_tokens = kv_pool;
  mo.kv_block_tokens = kv_block;
  mo.tier = tier;
  mem.tier = tier;
  if (kiln_model_load(path.c_str(), &mo, &model, &err) != KILN_OK) {
    // An artifact for another device (verified for the CPU it was built for), or
    // one whose kernels are in a static library an app links (kiln-run cannot).
    kiln_error_t any;
    const bool other_cpu = err.status == KILN_ERROR_ARTIFACT_CPU_FEATURES;
    if ((!other_cpu && err.status != KILN_ERROR_ARTIFACT_CODE) ||
        kiln_artifact_verify(path.c_str(), other_cpu ? 0 : 1, &any) != KILN_OK) {
      std::fprintf(stderr, "kiln-inspect: error: %s (%s)\n", err.message, kiln_status_message(err.status));
      return 1;
    }
    mem.runs_here = false;
    mem.why_not = err.message;
  } else {
    // Everything a session will allocate (KV cache, arena, kernel scratch, buffers).
    mem.report.struct_size = sizeof(mem.report);
    if (kiln_model_memory_report(model, &so, &mem.report, &err) != KILN_OK) {
      std::fprintf(stderr, "kiln-inspect: error: %s (%s)\n", err.message, kiln_status_message(err.status));
      kiln_model_release(model);
      return 1;
    }
    kiln_model_release(model);
  }
  // Verified: read the header directly.
  int fd = open(path.c_str(), O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    std::perror(path.c_str());
    return 1;
  }
  void* data = mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (data == MAP_FAILED) {
    std::perror(path.c_str());
    return 1;
  }
  const fb::Model* m = fb::GetSizePrefixedModel(data);
  if (m->tiers() != nullptr && m->tiers()->size() > 0) {  // verified: the tier asked for exists
    mem.root = m;
    m = fb::GetSizePrefixedModel(static_cast<const uint8_t*>(data) + m->tiers()->Get(tier)->header_offset());
  }
  if (json)
    PrintJson(m, path, static_cast<uint64_t>(st.st_size), ops, mem);
  else
    PrintText(m, path, static_cast<uint64_t>(st.st_size), ops, mem);
  munmap(data, st.st_size);
  return 0;
}
