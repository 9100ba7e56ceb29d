// kiln_session_*: buffers, the image path, prompt templates, prefill in chunks,
// the decode loop with sampling and streaming, and the stage timings.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>

#include "formats/kiln_format.h"
#include "formats/whitespace.h"
#include "kiln/kiln_calibration.h"
#include "model.h"
#include "support/error.h"
#include "support/sized_struct.h"

using namespace kiln::rt;
namespace fb = kiln::fb;
namespace format = kiln::format;

namespace {

constexpr int kVision = static_cast<int>(fb::StageKind::VisionEncoder);
constexpr int kProjector = static_cast<int>(fb::StageKind::Projector);
constexpr int kPrefill = static_cast<int>(fb::StageKind::DecoderPrefill);
constexpr int kDecode = static_cast<int>(fb::StageKind::DecoderDecode);
constexpr int kHead = static_cast<int>(fb::StageKind::LmHead);

double Ms(double seconds) { return seconds * 1000.0; }

// splitmix64: the sampler's random numbers, seeded per generate call.
struct Rng {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
};

// NaN logits are skipped: a NaN is never the maximum (a NaN at index 0 used to win
// every comparison, so a model gone NaN emitted token 0 forever). When every logit
// is NaN there is no maximum: the result is n, one past the vocabulary, which emits
// no text and which the next decode step's embedding refuses (KILN_ERROR_INPUT_TOKENS,
// "token id n ... is outside the vocabulary") instead of generating garbage. (Not
// -1: that is the embedding's "no image placeholder" id.)
int32_t Argmax(const float* logits, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
  return static_cast<int32_t>(best < 0 ? n : best);
}

// Temperature, top-k and top-p (nucleus) sampling; `order` is scratch of n ints.
// NaN logits are never chosen; when every logit is NaN the result is n (the caller
// reports it).
int32_t Sample(const float* logits, int64_t n, const kiln_generate_options_t& o, Rng* rng, int32_t* order,
               float* probs) {
  if (!(o.temperature > 0.0f)) return Argmax(logits, n);
  if (Argmax(logits, n) == n) return static_cast<int32_t>(n);  // every logit NaN
  for (int64_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
  int64_t k = o.top_k > 0 && o.top_k < n ? o.top_k : n;
  std::partial_sort(order, order + k, order + n, [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  float mx = logits[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += (probs[i] = std::exp((logits[order[i]] - mx) / o.temperature));
  int64_t keep = k;
  if (o.top_p > 0.0f && o.top_p < 1.0f) {
    double cum = 0;
    for (int64_t i = 0; i < k; ++i) {
      cum += probs[i] / sum;
      if (cum >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = 0;
    for (int64_t i = 0; i < keep; ++i) sum += probs[i];
  }
  double u = rng->Uniform() * sum;
  for (int64_t i = 0; i < keep; ++i) {
    u -= probs[i];
    if (u <= 0) return order[i];
  }
  return order[keep - 1];
}

// transformers' RepetitionPenaltyLogitsProcessor: the logit of every id seen so far
// is divided by the penalty when positive, multiplied by it otherwise.
void Penalize(float* logits, const uint8_t* seen, int64_t n, float penalty) {
  for (int64_t i = 0; i < n; ++i)
    if (seen[i]) logits[i] = logits[i] > 0.0f ? logits[i] / penalty : logits[i] * penalty;
}

// a * b * c * d bytes, false on overflow: every session buffer size comes from
// artifact fields, so none is computed unchecked.
bool SizeOf(uint64_t a, uint64_t b, uint64_t c, uint64_t d, size_t* out) {
  uint64_t n;
  if (__builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n) || __builtin_mul_overflow(n, d, &n) ||
      n > static_cast<uint64_t>(SIZE_MAX))
    return false;
  *out = static_cast<size_t>(n);
  return true;
}

// Zeroed unless `zero` is false: the KV cache, whose positions are written before they
// are read, so that its pages become resident only as the context fills.
kiln_status_t Alloc(kiln_session_t* s, size_t bytes, void** out, kiln_error_t* error, const char* what,
                    bool zero = true) {
  *out = s->allocator.Alloc(bytes == 0 ? 64 : bytes, 64);
  if (*out == nullptr)
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "cannot allocate %zu bytes for the %s", bytes, what);
  if (zero) std::memset(*out, 0, bytes == 0 ? 64 : bytes);
  return KILN_OK;
}

void ReleaseBlocks(kiln_session_t* s, int64_t keep);
void OfferBlocks(kiln_session_t* s);
int64_t FindBlocks(kiln_session_t* s, const int32_t* ids, int64_t count, int64_t reuse);
kiln_status_t MapBlocks(kiln_session_t* s, int64_t begin, int64_t end, kiln_error_t* error);
bool Slides(const kiln_session_t* s);
int64_t Limit(const kiln_session_t* s);
int64_t KeepRows(const kiln_session_t* s);
kiln_status_t MakeRoom(kiln_session_t* s, int64_t n, kiln_error_t* error);
kiln_status_t ApplyPressure(kiln_session_t* s, kiln_error_t* error);
void ClearHole(kiln_session_t* s);
int64_t ReuseWithHole(kiln_session_t* s, const int32_t* ids, int64_t count, int64_t* rows);

void FreeBuffers(kiln_session_t* s) {
  void* bufs[] = {s->arena,           s->scratch,        s->ids,        s->positions,
                  s->kv_rows,         s->hidden,         s->logits,     s->pixels,
                  s->vision_features, s->image_features, s->cached_ids, s->block_table,
                  s->kv.open_k,       s->kv.open_v,      s->kv.stage_k, s->kv.stage_v,
                  s->image_rows};
  for (void* b : bufs) s->allocator.Free(b);
  if (s->kv_pool == nullptr) {  // its own cache (else the pool's rows)
    void* kv[] = {s->kv.keys, s->kv.values, s->kv.key_scales, s->kv.value_scales};
    for (void* b : kv) s->allocator.Free(b);
  }
}

// Scratch the kernels need, over every op of every stage.
size_t ScratchFloats(const kiln_model_t* model, int64_t context, int threads) {
  const fb::Model* m = model->fb;
  size_t most = 0;
  WeightView wv[1 + 3 * 64];
  for (const fb::Stage* stage : *m->stages())
    for (const fb::Op* op : *stage->ops()) {
      const KernelEntry* k = FindKernel(op->kernel());
      if (k->scratch == nullptr) continue;
      int nw = op->weights() ? static_cast<int>(op->weights()->size()) : 0;
      for (int i = 0; i < nw; ++i) wv[i] = model->weights[op->weights()->Get(i)];
      int64_t rows = m->values()->Get(op->output())->max_rows();
      most = std::max(most, k->scratch(op, wv, nw, rows, context, threads));
    }
  return most;
}

// 128 bits of an image's pixel values (two multiply-rotate lanes over their bytes):
// setting the same image again keeps its encoded features and the cached prefix.
void HashPixels(const float* pixels, size_t count, uint64_t out[2]) {
  uint64_t a = 0x9e3779b97f4a7c15ull, b = 0xc2b2ae3d27d4eb4full ^ count;
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(pixels);
  for (size_t i = 0; i + 8 <= count * 4; i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes + i, 8);
    a = ((a ^ w) * 0xff51afd7ed558ccdull);
    a = (a << 29) | (a >> 35);
    b = ((b + w) * 0xc4ceb9fe1a85ec53ull);
    b = (b << 31) | (b >> 33);
  }
  if (count % 2 != 0) {
    uint32_t w;
    std::memcpy(&w, bytes + (count - 1) * 4, 4);
    a = (a ^ w) * 0xff51afd7ed558ccdull;
    b = (b + w) * 0xc4ceb9fe1a85ec53ull;
  }
  out[0] = a ^ (b >> 17);
  out[1] = b ^ (a >> 23);
}

// The index of the first image token in ids[begin, end), or end (none, or a text-only
// model).
int64_t FirstImageToken(const kiln_session_t* s, const int32_t* ids, int64_t begin, int64_t end) {
  if (!s->model->multimodal) return end;
  const int32_t image_id = static_cast<int32_t>(s->model->fb->image()->image_token_id());
  for (int64_t i = begin; i < end; ++i)
    if (ids[i] == image_id) return i;
  return end;
}

// The image changed: its tokens' keys and values in the cache are stale, so the
// cached prefix ends before the first image token.
void ForgetImageTokens(kiln_session_t* s) {
  s->cached = FirstImageToken(s, s->cached_ids, 0, s->cached);
  if (s->evicted > 0 && s->cached <= s->hole_at) ClearHole(s);
}

// New pixel values are in s->pixels: the encoded features stay when they are the
// same image's.
void PixelsChanged(kiln_session_t* s) {
  const int64_t size = s->model->fb->image()->image_size();
  uint64_t hash[2];
  HashPixels(s->pixels, static_cast<size_t>(3 * size * size), hash);
  const bool same = s->image_encoded && hash[0] == s->image_hash[0] && hash[1] == s->image_hash[1];
  s->image_hash[0] = hash[0];
  s->image_hash[1] = hash[1];
  s->has_image = true;
  if (!same) {
    s->image_encoded = false;
    ForgetImageTokens(s);
  }
}

kiln_status_t EncodeImage(kiln_session_t* s, kiln_error_t* error) {
  const fb::Model* m = s->model->fb;
  int64_t size = m->image()->image_size();
  double t0 = NowSeconds();
  Binding px{s->pixels, 3};
  const fb::Stage* vision = s->model->stages[kVision];
  const fb::Value* vout = m->values()->Get(vision->outputs()->Get(0));
  (void)size;
  if (kiln_status_t st = RunStage(s, vision, &px, 1, Binding{s->vision_features, vout->max_rows()}, error);
      st != KILN_OK)
    return st;
  double t1 = NowSeconds();
  Binding feats{s->vision_features, vout->max_rows()};
  if (kiln_status_t st = RunStage(s, s->model->stages[kProjector], &feats, 1,
                                  Binding{s->image_features, s->image_tokens}, error);
      st != KILN_OK)
    return st;
  double t2 = NowSeconds();
  s->stats.vision_encoder_ms = Ms(t1 - t0);
  s->stats.projector_ms = Ms(t2 - t1);
  // SelectTokens wrote the kept tokens' rows (s->image_rows); the image spans the
  // positions of all the projector's tokens.
  s->image_span = s->model->image_tokens_scored > 0 ? s->model->image_tokens_scored : s->image_tokens;
  s->image_encoded = true;
  if (s->model->pressure[KILN_PRESSURE_MEMORY].load() >= KILN_PRESSURE_SERIOUS) DiscardImageWeights(s->model);
  return KILN_OK;
}

// The RoPE position of a token minus its index in the conversation's ids, given the
// image tokens before it (`images_before`) and whether it is one: 0 but for an
// artifact that keeps visual tokens at their original positions, where the j-th image
// token is at the image's first position + its row among the projector's tokens
// (s->image_rows[j]) and the text after the image where it is unpruned.
int64_t PositionShift(const kiln_session_t* s, int64_t images_before, bool image) {
  if (!s->model->image_positions_original || s->image_tokens < 1) return 0;
  if (image) return images_before < s->image_tokens ? s->image_rows[images_before] - images_before : 0;
  if (images_before == 0) return 0;
  if (images_before >= s->image_tokens) return s->image_span - s->image_tokens;
  return s->image_rows[images_before - 1] - (images_before - 1);  // text amid the image tokens
}

// Prefills ids[begin, count) at positions begin.. (the cache already holds the keys
// and values of ids[0, begin): s->position == begin), in chunks of at most
// max_prefill tokens, feeding image features to image tokens in order; the ids the
// cache holds grow chunk by chunk. Leaves the hidden state of the last token in
// s->hidden[0]. `all_logits` (begin 0 only) receives the logits of every position.
kiln_status_t Prefill(kiln_session_t* s, const int32_t* ids, size_t count, size_t begin, float* all_logits,
                      kiln_error_t* error) {
  const fb::Model* m = s->model->fb;
  const int64_t hidden = m->text()->hidden_size();
  const int64_t vocab = m->text()->vocab_size();
  const bool mm = s->model->multimodal;
  const int64_t image_id = mm ? m->image()->image_token_id() : -1;
  int64_t image_total = 0;
  for (size_t i = 0; i < count; ++i) image_total += ids[i] == image_id;
  if (mm && image_total > 0) {
    if (!s->has_image)
      return Fail(error, KILN_ERROR_INPUT_TOKENS, "the prompt has %lld image tokens but no image was set",
                  static_cast<long long>(image_total));
    if (image_total != s->image_tokens)
      return Fail(error, KILN_ERROR_INPUT_TOKENS, "the prompt has %lld image tokens; one image takes %lld",
                  static_cast<long long>(image_total), static_cast<long long>(s->image_tokens));
  }
  for (size_t i = 0; i < count; ++i) {
    bool ok = (ids[i] >= 0 && ids[i] < vocab) || (mm && ids[i] == image_id);
    if (!ok)
      return Fail(error, KILN_ERROR_INPUT_TOKENS, "token id %d at position %zu is outside the vocabulary [0, %lld)",
                  ids[i], i, static_cast<long long>(vocab));
  }
  // The cache holds ids[0, begin) in rows [0, s->position) (fewer rows when a sliding
  // window evicted some).
  if (!Slides(s) && s->position + static_cast<int64_t>(count - begin) > Limit(s))
    return Fail(error, KILN_ERROR_CONTEXT_FULL, "%zu prompt tokens do not fit the %lld-token context", count,
                static_cast<long long>(Limit(s)));
  s->cached = s->position;
  s->position_shift = 0;
  int64_t image_used = 0;
  for (size_t i = 0; i < begin; ++i) image_used += ids[i] == image_id;
  const int64_t max_positions = m->text()->max_position_embeddings();
  for (size_t start = begin, n = 0; start < count; start += n) {
    n = std::min<size_t>(static_cast<size_t>(s->max_prefill), count - start);
    // A sliding window takes a chunk of at most half its free positions at a time.
    if (Slides(s)) n = std::min<size_t>(n, static_cast<size_t>(std::max<int64_t>((Limit(s) - KeepRows(s)) / 2, 1)));
    if (kiln_status_t st = MakeRoom(s, static_cast<int64_t>(n), error); st != KILN_OK) return st;
    int64_t chunk_images = 0;
    for (size_t i = 0; i < n; ++i) {
      const bool image = ids[start + i] == image_id;
      s->ids[i] = ids[start + i];
      s->positions[i] = static_cast<int32_t>(s->position + s->evicted + static_cast<int64_t>(i) +
                                             PositionShift(s, image_used + chunk_images, image));
      chunk_images += image;
    }
    if (s->positions[n - 1] >= max_positions)
      return Fail(error, KILN_ERROR_CONTEXT_FULL, "position %d is past the model's %lld positions",
                  s->positions[n - 1], static_cast<long long>(max_positions));
    s->kv.first_row = s->position;
    Binding in[3] = {{s->ids, static_cast<int64_t>(n)}, {s->positions, static_cast<int64_t>(n)}, {nullptr, 0}};
    int num_in = 2;
    if (mm) {
      // The image_features input has its own row count (the verifier's image-row
      // symbol): this chunk's image tokens, taken in order from the encoded image.
      if (image_used + chunk_images > s->image_tokens)
        return Fail(error, KILN_ERROR_INPUT_TOKENS, "the prompt has more image tokens than one image gives");
      in[2] = {s->image_features + image_used * hidden, chunk_images};
      num_in = 3;
    }
    const int64_t rows = static_cast<int64_t>(n);
    if (kiln_status_t st = RunStage(s, s->model->stages[kPrefill], in, num_in, Binding{s->hidden, rows}, error);
        st != KILN_OK)
      return st;
    image_used += chunk_images;
    s->position_shift = PositionShift(s, image_used, false);
    s->position += rows;
    std::memcpy(s->cached_ids + s->cached, ids + start, n * sizeof(int32_t));
    s->cached += rows;
    OfferBlocks(s);
    if (all_logits != nullptr) {
      Binding h{s->hidden, rows};
      if (kiln_status_t st = RunStage(s, s->model->stages[kHead], &h, 1,
                                      Binding{all_logits + static_cast<int64_t>(start) * vocab, rows}, error);
          st != KILN_OK)
        return st;
    }
    if (start + n >= count && n > 1)
      std::memmove(s->hidden, s->hidden + (rows - 1) * hidden, static_cast<size_t>(hidden) * 4);
  }
  s->position_shift = PositionShift(s, image_used, false);
  return KILN_OK;
}

kiln_status_t Head(kiln_session_t* s, kiln_error_t* error) {
  Binding h{s->hidden, 1};
  return RunStage(s, s->model->stages[kHead], &h, 1, Binding{s->logits, 1}, error);
}

bool IsEos(const kiln_session_t* s, int32_t token) {
  for (int32_t e : s->model->eos_ids)
    if (e == token) return true;
  return false;
}

// Appends the token's bytes to the pending ones and emits the complete characters,
// ill-formed sequences replaced by U+FFFD as Python's errors="replace" does. Ids the
// tokenizer has no token for (a model vocabulary can be larger) emit nothing, as
// Hugging Face's decode skips them.
kiln_status_t Emit(kiln_session_t* s, int32_t token, const kiln_generate_options_t& o, kiln_error_t* error) {
  const Tokenizer* tok = s->model->tokenizer;
  if (token >= 0 && token < tok->vocab_size()) {
    kiln_status_t st = tok->AppendTokenBytes(token, true, &s->text, error);
    if (st == KILN_ERROR_INPUT_TOKENS) ClearError(error);  // an id without a token: no text
    else if (st != KILN_OK) return st;
  }
  // The decoder's Strip: the answer's first leading spaces are dropped.
  if (s->strip_pending > 0 && !s->text.empty()) {
    size_t skip = 0;
    while (skip < s->text.size() && s->strip_pending > 0 && s->text[skip] == ' ') ++skip, --s->strip_pending;
    if (skip < s->text.size()) s->strip_pending = 0;  // past the start of the text
    std::memmove(s->text.data(), s->text.data() + skip, s->text.size() - skip);
    (void)s->text.resize(s->text.size() - skip);
  }
  size_t n = Utf8CompleteLength(s->text.data(), s->text.size());
  Vec<char>& clean = s->text_out;
  clean.clear();
  if (!AppendUtf8Replacing(s->text.data(), n, &clean))
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory while decoding");
  int stop = 0;
  if (o.on_token != nullptr) stop = o.on_token(o.user, token, clean.data(), clean.size());
  // Keep the incomplete tail for the next token.
  size_t rest = s->text.size() - n;
  std::memmove(s->text.data(), s->text.data() + n, rest);
  (void)s->text.resize(rest);
  if (stop != 0) return Fail(error, KILN_ERROR_CANCELLED, "generation stopped by the token callback");
  return KILN_OK;
}

kiln_status_t Generate(kiln_session_t* s, const int32_t* ids, size_t count, const kiln_generate_options_t* options,
                       double t_start, kiln_error_t* error) {
  const fb::Model* m = s->model->fb;
  kiln_generate_options_t o;
  kiln_generate_options_init(&o);
  if (options != nullptr) {
    if (options->struct_size < sizeof(uint32_t) * 2)
      return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "kiln_generate_options_t.struct_size is not set");
    std::memcpy(&o, options, std::min<size_t>(options->struct_size, sizeof(o)));
  }
  // Sampling settings out of their range were once read as "off" silently.
  if (!(o.temperature >= 0.0f) || std::isinf(o.temperature))
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "temperature %g: must be finite and >= 0 (0: greedy)",
                static_cast<double>(o.temperature));
  if (!(o.top_p >= 0.0f && o.top_p <= 1.0f))
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "top_p %g: must be in [0, 1] (0 or 1: no nucleus filter)",
                static_cast<double>(o.top_p));
  if (o.top_k < 0) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "top_k %d: must be >= 0 (0: no top-k filter)", o.top_k);
  if (!(o.repetition_penalty >= 0.0f) || std::isinf(o.repetition_penalty))
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                "repetition_penalty %g: must be finite and > 0 (0 or 1: no penalty)",
                static_cast<double>(o.repetition_penalty));
  if (o.max_new_tokens <= 0) {
    int32_t mnt = m->generation()->max_new_tokens();
    o.max_new_tokens = mnt > 0 ? mnt : 128;
  }
  const int64_t vocab = m->text()->vocab_size();
  s->output.clear();
  s->text.clear();
  s->strip_pending = s->model->tokenizer->decode_strip();
  // The cache may hold a prefix of these ids from the previous call (the same image
  // and system prompt, another question): only the rest is prefilled. The last id is
  // always run, for the logits of the first token.
  if (kiln_status_t st = ApplyPressure(s, error); st != KILN_OK) return st;
  size_t reuse = 0;
  int64_t rows = 0;  // of the cache, holding ids[0, reuse) (fewer after a sliding window)
  if (o.reuse_prefix != 0 && s->evicted > 0) {
    reuse = static_cast<size_t>(ReuseWithHole(s, ids, static_cast<int64_t>(count), &rows));
  } else if (o.reuse_prefix != 0) {
    while (reuse + 1 < count && static_cast<int64_t>(reuse) < s->cached && s->cached_ids[reuse] == ids[reuse]) ++reuse;
    // A paged cache: blocks another session published for the same tokens.
    reuse = static_cast<size_t>(FindBlocks(s, ids, static_cast<int64_t>(count), static_cast<int64_t>(reuse)));
    rows = static_cast<int64_t>(reuse);
  }
  if (static_cast<int64_t>(reuse) <= s->hole_at) ClearHole(s);  // no evicted position before the new ones
  // With spans the open rows hold the span being filled as this session wrote it: a
  // reuse that ends inside another span (of this session's or of the pool's, complete)
  // takes that span's first rows decoded from the cache.
  const bool own_span = s->kv.span > 0 && rows <= s->position && rows / s->kv.span == s->position / s->kv.span;
  s->cached = rows;
  s->position = rows;
  ReleaseBlocks(s, s->position);  // a paged cache keeps the blocks of the reused prefix
  if (s->kv.span > 0 && !own_span) s->kv.DecodeOpen(rows);
  // Reserve now so that streaming allocates nothing per token.
  if (!s->text.reserve(64) || !s->text_out.reserve(256) ||
      !s->output.reserve(static_cast<size_t>(o.max_new_tokens)))
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
  s->stats.prompt_tokens = static_cast<int32_t>(count);
  s->stats.reused_tokens = static_cast<int32_t>(reuse);
  s->stats.generated_tokens = 0;
  s->stats.num_threads = s->pool->num_threads();

  // Image: encode once per image (a follow-up question about the same image reuses it).
  s->stats.image_preprocess_ms = s->pending_preprocess_ms;  // once: a later question did not preprocess
  s->pending_preprocess_ms = 0;
  s->stats.vision_encoder_ms = s->stats.projector_ms = 0;
  s->stats.image_tokens = 0;
  if (s->model->multimodal && s->has_image) {
    int64_t new_images = 0;
    for (size_t i = 0; i < count; ++i) {
      s->stats.image_tokens += ids[i] == m->image()->image_token_id();
      new_images += i >= reuse && ids[i] == m->image()->image_token_id();
    }
    if (new_images > 0 && !s->image_encoded)
      if (kiln_status_t st = EncodeImage(s, error); st != KILN_OK) return st;
  }
  if (kiln_status_t st = Prefill(s, ids, count, reuse, nullptr, error); st != KILN_OK) return st;
  if (kiln_status_t st = Head(s, error); st != KILN_OK) return st;
  double t_prefilled = NowSeconds();
  // Everything from the call to the prefilled logits but the image's encoding: the
  // prompt's tokenizing, the cache's preparation (a reused prefix, the open span
  // decoded) and the prefill, so that the stages sum to the TTFT.
  s->stats.prefill_ms = Ms(t_prefilled - t_start) - s->stats.vision_encoder_ms - s->stats.projector_ms;

  Rng rng{o.seed ^ 0x5eedull};
  int32_t* order = reinterpret_cast<int32_t*>(s->scratch);
  float* probs = s->scratch + vocab;  // scratch holds at least 2 * vocab floats
  // The repetition penalty's ids: the prompt's, then each token chosen.
  const bool penalty = o.repetition_penalty > 0.0f && o.repetition_penalty != 1.0f;
  Vec<uint8_t> seen(&s->allocator);
  if (penalty) {
    if (!seen.resize(static_cast<size_t>(vocab))) return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
    std::memset(seen.data(), 0, seen.size());
    for (size_t i = 0; i < count; ++i)
      if (ids[i] >= 0 && ids[i] < vocab) seen[static_cast<size_t>(ids[i])] = 1;
    Penalize(s->logits, seen.data(), vocab, o.repetition_penalty);
  }
  int32_t token = Sample(s->logits, vocab, o, &rng, order, probs);
  if (token < 0 || token >= vocab)
    return Fail(error, KILN_ERROR_NONFINITE, "every logit of the first token is NaN (non-finite weights or activations)");
  kiln_status_t st = KILN_OK;
  bool done = IsEos(s, token);
  if (!done) {
    if (!s->output.push_back(token)) return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
    st = Emit(s, token, o, error);
  }
  double t_first = NowSeconds();
  s->stats.first_token_ms = Ms(t_first - t_prefilled);
  s->stats.ttft_ms = s->stats.image_preprocess_ms + Ms(t_first - t_start);
  s->stats.first_decode_ms = 0;
  double decode_start = t_first;
  int decoded = 0;
  while (st == KILN_OK && !done && static_cast<int32_t>(s->output.size()) < o.max_new_tokens) {
    double t0 = NowSeconds();
    st = ApplyPressure(s, error);  // the app may have signalled pressure while this call runs
    if (st != KILN_OK) break;
    if (!Slides(s) && s->position >= Limit(s)) {
      st = Fail(error, KILN_ERROR_CONTEXT_FULL, "the %lld-token context is full", static_cast<long long>(s->context));
      break;
    }
    st = MakeRoom(s, 1, error);
    if (st != KILN_OK) break;
    s->ids[0] = token;
    s->positions[0] = static_cast<int32_t>(s->position + s->evicted + s->position_shift);
    s->kv.first_row = s->position;
    Binding in[2] = {{s->ids, 1}, {s->positions, 1}};
    st = RunStage(s, s->model->stages[kDecode], in, 2, Binding{s->hidden, 1}, error);
    if (st != KILN_OK) break;
    ++s->position;
    s->cached_ids[s->cached++] = token;
    OfferBlocks(s);
    st = Head(s, error);
    if (st != KILN_OK) break;
    if (penalty) {
      seen[static_cast<size_t>(s->ids[0])] = 1;  // the token just decoded
      Penalize(s->logits, seen.data(), vocab, o.repetition_penalty);
    }
    token = Sample(s->logits, vocab, o, &rng, order, probs);
    if (token < 0 || token >= vocab) {
      st = Fail(error, KILN_ERROR_NONFINITE, "every logit at position %lld is NaN (non-finite weights or activations)",
                static_cast<long long>(s->position));
      break;
    }
    if (decoded == 0) s->stats.first_decode_ms = Ms(NowSeconds() - t0);
    ++decoded;
    if (IsEos(s, token)) break;
    if (!s->output.push_back(token)) {
      st = Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
      break;
    }
    st = Emit(s, token, o, error);
  }
  s->stats.decode_ms = Ms(NowSeconds() - decode_start);
  s->stats.generated_tokens = static_cast<int32_t>(s->output.size());
  s->stats.decode_steps = decoded;
  s->stats.active_threads = s->pool->active_threads();
  s->stats.decode_tokens_per_s = decoded > 0 && s->stats.decode_ms > 0 ? decoded / (s->stats.decode_ms / 1000.0) : 0;
  s->stats.peak_allocated_bytes = s->allocator.peak_bytes();
  return st;
}

const char* Str(const flatbuffers::String* s) { return s != nullptr ? s->c_str() : ""; }

// The text of a conversation: the chat template's pieces (Model.chat, schema 1.13;
// compiler/importers/hf/ChatTemplate.h), or, for an artifact without them, the
// built-in template its metadata names (tests/models/kiln_models/prompts.py) for one
// user message. An image is `image_tokens` image tokens between the template's
// image_open and image_close; with image_tokens 0, one image token (what
// transformers' apply_chat_template writes). *add_bos: the tokenizer's BOS is still
// to be added (the template does not write it).
kiln_status_t RenderChat(const kiln_model_t* model, const kiln_chat_message_t* msgs, size_t count,
                         int64_t image_tokens, Vec<char>* text, bool* add_bos, kiln_error_t* error) {
  static const char* const kRoles[3] = {"system", "user", "assistant"};
  int images = 0;
  for (size_t i = 0; i < count; ++i) {
    const kiln_chat_message_t& m = msgs[i];
    if (m.role == nullptr || m.content == nullptr)
      return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "message %zu has no role or content", i);
    if (std::strcmp(m.role, "system") != 0 && std::strcmp(m.role, "user") != 0 && std::strcmp(m.role, "assistant") != 0)
      return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "message %zu: role '%s' (system, user or assistant)", i, m.role);
    if (m.image) {
      if (!model->multimodal) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "message %zu: the model takes no image", i);
      if (std::strcmp(m.role, "user") != 0)
        return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "message %zu: only a user message carries the image", i);
      if (++images > 1) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "more than one message carries the image");
    }
  }
  if (count == 0 || std::strcmp(msgs[count - 1].role, "user") != 0)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "the last message must be a user message");
  const fb::ChatTemplate* chat = model->fb->chat();
  const char* open = chat != nullptr ? Str(chat->image_open()) : "";
  const char* close = chat != nullptr ? Str(chat->image_close()) : "";
  const char* prompt_end = "";
  const char* legacy_before = "";  // the built-in templates: text before the first message
  const char* tmpl = model->info.prompt_template;
  if (chat == nullptr) {
    if (count != 1)
      return Fail(error, KILN_ERROR_UNSUPPORTED,
                  "the model has no chat template: it takes one user message (recompile with --chat-template)");
    bool image = msgs[0].image != 0;
    if (std::strcmp(tmpl, "llava") == 0) {
      legacy_before = "USER: ";
      close = "\n";
      prompt_end = " ASSISTANT:";
    } else if (std::strcmp(tmpl, "llava-chatml") == 0) {
      legacy_before = "<|im_start|>user\n";
      close = "\n";
      prompt_end = "<|im_end|>\n<|im_start|>assistant\n";
    } else if (std::strcmp(tmpl, "idefics3") == 0) {
      legacy_before = image ? "<|im_start|>User:" : "<|im_start|>User: ";
      open = "<fake_token_around_image><global-img>";
      close = "<fake_token_around_image>";
      prompt_end = "<end_of_utterance>\nAssistant:";
    } else if (std::strcmp(tmpl, "plain") != 0) {
      return Fail(error, KILN_ERROR_UNSUPPORTED, "unknown prompt template '%s'", tmpl);
    } else if (image) {
      return Fail(error, KILN_ERROR_UNSUPPORTED, "the 'plain' prompt template has no place for an image");
    }
  } else {
    prompt_end = Str(chat->generation_prompt());
  }
  auto put = [&](const char* p, size_t n) { return text->append(p, n); };
  auto puts = [&](const char* p) { return put(p, std::strlen(p)); };
  bool ok = puts(legacy_before);
  int prev = 3;  // the first message
  for (size_t i = 0; ok && i < count; ++i) {
    const kiln_chat_message_t& m = msgs[i];
    int role = m.role[0] == 's' ? 0 : m.role[0] == 'u' ? 1 : 2;
    const char* after_image = "";
    if (chat != nullptr) {
      const fb::ChatTurn* t = chat->turns()->Get(static_cast<uint32_t>((prev * 3 + role) * 2 + (m.image ? 1 : 0)));
      if (!t->allowed())
        return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "the chat template does not accept %sa %s message %s%s%s",
                    m.image ? "an image in " : "", kRoles[role], prev == 3 ? "first" : "after a ",
                    prev == 3 ? "" : kRoles[prev], prev == 3 ? "" : " message");
      ok = puts(Str(t->text()));
      after_image = Str(t->after_image());
    }
    if (ok && m.image) {
      if (image_tokens > 0) {
        ok = puts(open);
        for (int64_t k = 0; ok && k < image_tokens; ++k) ok = put(model->image_token_text, model->image_token_text_len);
        ok = ok && puts(close);
      } else {
        ok = put(model->image_token_text, model->image_token_text_len) && (chat != nullptr || puts(close));
      }
      ok = ok && puts(after_image);
    }
    // The template's strip of the content (Jinja's trim: Python's str.strip()).
    size_t b = 0, e = std::strlen(m.content);
    const unsigned trim = chat != nullptr ? chat->trim() : 0;
    kiln::format::StripSpace(m.content, &b, &e, (trim & (1u << role)) != 0, (trim & (8u << role)) != 0);
    ok = ok && put(m.content + b, e - b);
    prev = role;
  }
  ok = ok && puts(prompt_end);
  if (!ok) return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory for the prompt");
  *add_bos = chat == nullptr || !chat->starts_with_bos();
  return KILN_OK;
}

// The ids of a conversation, the session's image expanded.
kiln_status_t ChatIds(kiln_session_t* s, const kiln_chat_message_t* msgs, size_t count, Vec<int32_t>* out,
                      kiln_error_t* error) {
  for (size_t i = 0; i < count; ++i)
    if (msgs[i].image && !s->has_image)
      return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                  "message %zu carries the image, but no image is set (kiln_session_set_image_rgb)", i);
  Vec<char> text(&s->allocator);
  bool add_bos = true;
  if (kiln_status_t st = RenderChat(s->model, msgs, count, s->image_tokens, &text, &add_bos, error); st != KILN_OK)
    return st;
  return s->model->tokenizer->Encode(text.data(), text.size(), add_bos, out, error);
}

// kiln_session_generate's prompt: one user message, with the image if one is set.
kiln_status_t BuildPrompt(kiln_session_t* s, const char* prompt, Vec<int32_t>* out, kiln_error_t* error) {
  kiln_chat_message_t m = {"user", prompt, s->model->multimodal && s->has_image ? 1 : 0};
  return ChatIds(s, &m, 1, out, error);
}

// Everything a session allocates, sized from the artifact and the options with
// checked arithmetic: what kiln_session_create allocates and what
// kiln_model_session_bytes reports, from one computation.
struct SessionPlan {
  int64_t context = 0;
  int threads = 1;
  uint8_t kv_encoding = format::kEncF32;  // formats/encodings.def id
  uint32_t kv_group = 0;
  size_t kv_half = 0, kv_scales_half = 0;  // codes and scales of keys (and of values)
  size_t arena = 0, tokens = 0, hidden = 0, logits = 0;
  size_t cached_ids = 0;  // the ids the KV cache holds: [context]
  size_t pixels = 0, vision = 0, image = 0, image_rows = 0;
  int64_t image_tokens = 0;  // image tokens per image in this session
  size_t scratch_floats = 0, scratch = 0;
  size_t value_rows = 0;  // the per-value row counts
  // Paged: the model's pool holds the cache (kv_half and kv_scales_half are what the
  // context would take unpaged); the session allocates its block table.
  bool paged = false;
  int32_t shift = 0;
  int64_t max_blocks = 0;
  size_t table = 0;
  // Spans (kv_cache.h): their length, and the bytes of the open rows and the staged
  // rows of keys (and of values).
  int64_t span = 0;
  size_t open = 0, stage = 0;

  // As allocated: every allocation carries a header of its alignment (64 bytes, the
  // thread pool's and arrays' 16; support/allocator.cc), an empty buffer still takes 64 bytes,
  // and the thread pool holds one std::thread per worker.
  uint64_t Total(bool multimodal) const {
    auto buf = [](uint64_t b) { return (b == 0 ? uint64_t{64} : b) + 64; };
    uint64_t kv = paged ? buf(table) : 2 * buf(kv_half) + 2 * buf(kv_scales_half);
    if (span > 0) kv += 2 * buf(open) + 2 * buf(stage);
    uint64_t total = buf(sizeof(kiln_session_t)) + sizeof(ThreadPool) + 16 + kv + buf(arena) +
                     3 * buf(tokens) + buf(hidden) + buf(logits) + buf(scratch) + buf(cached_ids) + value_rows + 16;
    if (threads > 1) total += buf(sizeof(std::thread) * (threads - 1));
    if (multimodal) total += buf(pixels) + buf(vision) + buf(image) + buf(image_rows);
    return total;
  }
};

kiln_status_t PlanSession(const kiln_model_t* model, const kiln_session_options_t& o, SessionPlan* p,
                          kiln_error_t* error) {
  const fb::Model* m = model->fb;
  int64_t max_ctx = m->text()->max_position_embeddings();
  if (m->text()->sliding_window() > 0) max_ctx = std::min<int64_t>(max_ctx, m->text()->sliding_window());
  if (o.context_length < 0)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "context_length %d is negative", o.context_length);
  p->context = o.context_length > 0 ? o.context_length : std::min<int64_t>(max_ctx, 4096);
  if (p->context > max_ctx)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "context_length %d exceeds the model's %lld positions",
                o.context_length, static_cast<long long>(max_ctx));
  if (o.num_threads < 0 || o.num_threads > 256)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "num_threads %d out of range", o.num_threads);
  p->threads = o.num_threads > 0 ? o.num_threads : PerformanceCpuCount();
  if (o.context_overflow != KILN_CONTEXT_STOP && o.context_overflow != KILN_CONTEXT_SLIDE)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "context_overflow %d is not a kiln_context_overflow_t",
                o.context_overflow);
  if (o.keep_tokens < 0 || o.keep_tokens >= p->context)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "keep_tokens %d: must be >= 0 and below the %lld-token context",
                o.keep_tokens, static_cast<long long>(p->context));
  // The KV cache's encoding: the artifact's, or the session's choice (with the
  // artifact's group when it has one for that encoding, else formats/kv_codec.h's).
  const uint32_t head_dim = m->text()->head_dim();
  p->kv_encoding = static_cast<uint8_t>(m->text()->kv_cache_encoding());
  p->kv_group = m->text()->kv_cache_group();
  if (o.kv_cache != KILN_KV_CACHE_DEFAULT) {
    static constexpr uint8_t kEncodings[] = {format::kEncF32, format::kEncF16, format::kEncINT8, format::kEncINT4};
    if (o.kv_cache < KILN_KV_CACHE_F32 || o.kv_cache > KILN_KV_CACHE_INT4)
      return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "kv_cache %d is not a kiln_kv_cache_t", o.kv_cache);
    const uint8_t chosen = kEncodings[o.kv_cache - KILN_KV_CACHE_F32];
    if (!format::KvEncodingValid(chosen, p->kv_group, head_dim)) p->kv_group = format::KvDefaultGroup(chosen, head_dim);
    p->kv_encoding = chosen;
  }
  if (!format::KvEncodingValid(p->kv_encoding, p->kv_group, head_dim))
    return Fail(error, o.kv_cache != KILN_KV_CACHE_DEFAULT ? KILN_ERROR_INVALID_ARGUMENT : KILN_ERROR_ARTIFACT_MALFORMED,
                "a KV cache of encoding %u with group %u cannot hold heads of head_dim %u", p->kv_encoding,
                p->kv_group, head_dim);
  const uint64_t hidden = m->text()->hidden_size(), vocab = m->text()->vocab_size();
  const uint64_t max_prefill = m->memory_plan()->max_prefill_tokens();
  const uint64_t kv_width = static_cast<uint64_t>(m->text()->num_kv_heads()) * m->text()->head_dim();
  size_t kv_total = 0;
  bool sized = SizeOf(m->text()->num_layers(), static_cast<uint64_t>(p->context),
                      format::KvRowBytes(p->kv_encoding, kv_width), 1, &p->kv_half) &&
               SizeOf(m->text()->num_layers(), static_cast<uint64_t>(p->context),
                      format::KvRowScales(p->kv_encoding, kv_width, p->kv_group), sizeof(float), &p->kv_scales_half) &&
               SizeOf(p->kv_half + p->kv_scales_half, 2, 1, 1, &kv_total) &&
               kv_total <= static_cast<uint64_t>(INT64_MAX) &&
               SizeOf(max_prefill, sizeof(int32_t), 1, 1, &p->tokens) &&
               SizeOf(p->context, sizeof(int32_t), 1, 1, &p->cached_ids) &&
               SizeOf(max_prefill, hidden, sizeof(float), 1, &p->hidden) &&
               SizeOf(vocab, sizeof(float), 1, 1, &p->logits) &&
               SizeOf(m->values()->size(), sizeof(int64_t), 1, 1, &p->value_rows);
  p->arena = m->memory_plan()->arena_bytes();
  if (model->multimodal) {
    const int64_t planned = m->image()->image_tokens();
    if (o.image_tokens < 0 || o.image_tokens > planned)
      return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "image_tokens %d: must lie in [0, %lld], the artifact's",
                  o.image_tokens, static_cast<long long>(planned));
    if (o.image_tokens > 0 && o.image_tokens < planned && model->image_tokens_scored == 0)
      return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                  "image_tokens %d: this artifact gives every image %lld tokens; only one compiled with "
                  "visual-token pruning (kiln-compile --visual-tokens) can keep fewer",
                  o.image_tokens, static_cast<long long>(planned));
    p->image_tokens = o.image_tokens > 0 ? o.image_tokens : planned;
  } else if (o.image_tokens != 0) {
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "image_tokens %d: the model takes no images", o.image_tokens);
  }
  if (sized && model->multimodal) {
    uint64_t size = m->image()->image_size();
    sized = SizeOf(3, size, size, sizeof(float), &p->pixels) &&
            SizeOf(m->image()->image_tokens(), hidden, sizeof(float), 1, &p->image) &&
            SizeOf(m->image()->image_tokens(), sizeof(int32_t), 1, 1, &p->image_rows);
    p->vision = m->values()->Get(model->stages[kVision]->outputs()->Get(0))->size();
  }
  if (!sized)
    return Fail(error, KILN_ERROR_ARTIFACT_MALFORMED,
                "the session's buffers for a %lld-token context overflow (num_layers %u, num_kv_heads %u, head_dim %u)",
                static_cast<long long>(p->context), m->text()->num_layers(), m->text()->num_kv_heads(),
                m->text()->head_dim());
  p->scratch_floats = std::max<size_t>(ScratchFloats(model, p->context, p->threads), static_cast<size_t>(2 * vocab));
  if (!SizeOf(p->scratch_floats, sizeof(float), 1, 1, &p->scratch))
    return Fail(error, KILN_ERROR_ARTIFACT_MALFORMED, "kernel scratch of %zu floats overflows", p->scratch_floats);
  // The model's pool, when the session's encoding is the pool's.
  if (model->kv_pool_blocks > 0 && p->kv_encoding == model->kv_pool_encoding && p->kv_group == model->kv_pool_group) {
    p->paged = true;
    p->shift = model->kv_block_shift;
    p->max_blocks = (p->context + (int64_t{1} << p->shift) - 1) >> p->shift;
    p->table = static_cast<size_t>(p->max_blocks) * sizeof(int32_t);
  }
  // Keys per channel over spans of the group's length, the span being filled exact
  // (kv_cache.h): quantised caches whose group is a power of two that divides a paged
  // cache's block; others keep per-row scales.
  const bool pow2 = p->kv_group > 0 && (p->kv_group & (p->kv_group - 1)) == 0;
  if ((p->kv_encoding == format::kEncINT8 || p->kv_encoding == format::kEncINT4) && pow2 &&
      (!p->paged || (int64_t{1} << p->shift) % p->kv_group == 0)) {
    p->span = p->kv_group;
    if (!SizeOf(m->text()->num_layers(), static_cast<uint64_t>(p->span) * kv_width, sizeof(float), 1, &p->open) ||
        !SizeOf(static_cast<uint64_t>(p->span) + std::min<uint64_t>(max_prefill, static_cast<uint64_t>(p->context)),
                kv_width, sizeof(float), 1, &p->stage))
      return Fail(error, KILN_ERROR_ARTIFACT_MALFORMED, "the KV cache's exact rows overflow");
  }
  return KILN_OK;
}

// The shape of a model's KV cache of `plan`'s encoding (no storage).
KvCache KvShape(const kiln_model_t* model, const SessionPlan& plan) {
  KvCache c;
  c.layers = model->fb->text()->num_layers();
  c.width = static_cast<int64_t>(model->fb->text()->num_kv_heads()) * model->fb->text()->head_dim();
  c.encoding = plan.kv_encoding;
  c.group = plan.kv_group;
  c.context = c.rows = plan.context;
  c.span = plan.span;
  return c;
}

// The kiln_kv_cache_t of a cache encoding.
int32_t KvCacheOption(uint8_t encoding) {
  switch (encoding) {
    case format::kEncF16: return KILN_KV_CACHE_F16;
    case format::kEncINT8: return KILN_KV_CACHE_INT8;
    case format::kEncINT4: return KILN_KV_CACHE_INT4;
    default: return KILN_KV_CACHE_F32;
  }
}

// Reads the caller's options (of any struct size) into `o` and plans the session.
kiln_status_t PlanFromOptions(const kiln_model_t* model, const kiln_session_options_t* options,
                              kiln_session_options_t* o, SessionPlan* plan, kiln_error_t* error) {
  *o = {};
  o->struct_size = sizeof(*o);
  if (options != nullptr) {
    if (options->struct_size < sizeof(uint32_t) || options->struct_size > 4096)
      return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "kiln_session_options_t.struct_size is not set");
    std::memcpy(o, options, std::min<size_t>(options->struct_size, sizeof(*o)));
  }
  return PlanSession(model, *o, plan, error);
}

// ---- A paged cache's blocks (kv_pool.h) ----

// Keeps blocks for positions [0, keep) and returns the others to the pool.
void ReleaseBlocks(kiln_session_t* s, int64_t keep) {
  if (s->kv_pool == nullptr) return;
  const int64_t shift = s->kv_pool->shift();
  const int64_t kept = std::min<int64_t>(s->held, (keep + (int64_t{1} << shift) - 1) >> shift);
  for (int64_t b = kept; b < s->held; ++b) s->kv_pool->Release(s->block_table[b]);
  s->held = kept;
  s->offered = std::min(s->offered, keep >> shift);
  s->kv.mapped = s->held << shift;
}

// Makes positions [begin, end) writable: blocks taken for positions not mapped yet,
// and a block another session still reads, or a published one, copied first (the
// positions before `begin` in it).
kiln_status_t MapBlocks(kiln_session_t* s, int64_t begin, int64_t end, kiln_error_t* error) {
  KvPool* pool = s->kv_pool;
  if (pool == nullptr || begin >= end) return KILN_OK;
  const int64_t shift = pool->shift();
  for (int64_t b = begin >> shift; b <= (end - 1) >> shift; ++b) {
    const bool fresh = b >= s->held;
    if (!fresh && pool->Writable(s->block_table[b])) {
      pool->Forget(s->block_table[b]);  // written in place: blocks naming it as parent go stale
      continue;
    }
    const int32_t got = pool->Acquire();
    if (got < 0) {
      ReleaseBlocks(s, begin);  // what was taken for this call goes back
      const double block_mb = static_cast<double>(s->kv.token_bytes() << shift) / 1e6;
      return Fail(error, KILN_ERROR_RESOURCE_EXHAUSTED,
                  "the KV block pool is full: its %d blocks of %lld tokens (%.1f MB) are taken, %lld of them by this "
                  "session, which needs one more for position %lld; a larger pool (kiln_model_options_t."
                  "kv_pool_tokens or memory_budget), fewer sessions or a shorter conversation fits",
                  pool->capacity(), static_cast<long long>(int64_t{1} << shift), block_mb * pool->capacity(),
                  static_cast<long long>(s->held), static_cast<long long>(std::max(begin, b << shift)));
    }
    if (fresh) {
      s->block_table[b] = got;
      s->held = b + 1;
    } else {  // copy on write: the positions before `begin` in the block are kept
      const int64_t keep = std::min<int64_t>(std::max<int64_t>(begin - (b << shift), 0), int64_t{1} << shift);
      const KvCache& rows = pool->store();
      rows.CopyRows(rows, static_cast<int64_t>(s->block_table[b]) << shift, static_cast<int64_t>(got) << shift,
                    s->kv.SpanEnd(keep, shift));
      pool->Release(s->block_table[b]);
      s->block_table[b] = got;
    }
  }
  s->kv.mapped = s->held << shift;
  return KILN_OK;
}

// What block b's keys and values depend on besides its ids (kv_pool.h), for its ids
// before `end`; false when they depend on image features the session has no hash of.
bool BlockTag(const kiln_session_t* s, const int32_t* ids, int64_t end, int64_t b, KvPool::Tag* tag) {
  const int64_t shift = s->kv_pool->shift();
  *tag = KvPool::Tag();
  if (b > 0) {
    tag->parent = s->block_table[b - 1];
    tag->parent_generation = s->kv_pool->Generation(tag->parent);
  }
  const int64_t stop = std::min(end, (b + 1) << shift);
  if (FirstImageToken(s, ids, b << shift, stop) < stop) {
    if (!s->has_image || (s->image_hash[0] == 0 && s->image_hash[1] == 0)) return false;
    tag->image[0] = s->image_hash[0];
    // The tokens of the image a session keeps (kiln_session_options_t.image_tokens)
    // are other features for the same ids: only sessions keeping as many share.
    tag->image[1] = s->image_hash[1] ^ (static_cast<uint64_t>(s->image_tokens) * 0x9E3779B97F4A7C15ull);
  }
  return true;
}

// Offers the session's newly full blocks to the pool, for sessions that start with
// the same tokens.
void OfferBlocks(kiln_session_t* s) {
  if (s->kv_pool == nullptr) return;
  const int64_t shift = s->kv_pool->shift();
  // After a window slid, the blocks after its start are not the prefix their ids say.
  const int64_t prefix = s->evicted > 0 ? s->hole_at : s->cached;
  for (; (s->offered + 1) << shift <= prefix && s->offered < s->held; ++s->offered) {
    KvPool::Tag tag;
    if (BlockTag(s, s->cached_ids, s->cached, s->offered, &tag))
      s->kv_pool->Publish(s->block_table[s->offered], s->cached_ids + (s->offered << shift), tag);
  }
}

// Extends a reuse of `reuse` ids with the pool's published blocks that continue
// them (whole blocks, ending before the last id); returns the new reuse.
int64_t FindBlocks(kiln_session_t* s, const int32_t* ids, int64_t count, int64_t reuse) {
  if (s->kv_pool == nullptr) return reuse;
  const int64_t shift = s->kv_pool->shift();
  int64_t b = reuse >> shift;
  for (; ((b + 1) << shift) <= count - 1; ++b) {
    KvPool::Tag tag;
    if (!BlockTag(s, ids, count, b, &tag)) break;
    const int32_t found = s->kv_pool->Find(ids + (b << shift), tag);
    if (found < 0) break;
    if (b < s->held) {
      s->kv_pool->Release(s->block_table[b]);
    } else {
      s->held = b + 1;  // b == held: the blocks before b are mapped
    }
    s->block_table[b] = found;
  }
  int64_t found = b << shift;
  // The next block in part: the longest prefix of it another session's block of the
  // same parent holds, copied into a block of this session's (image tokens past a
  // block boundary, then another question).
  KvPool::Tag tag;
  const int64_t room = std::min<int64_t>(int64_t{1} << shift, count - 1 - found);
  if (room > 0 && found + room > reuse && b <= s->held && BlockTag(s, ids, found + room, b, &tag)) {
    const int64_t first_image = FirstImageToken(s, ids, found, found + room) - found;
    int64_t common = 0;
    const int32_t from = s->kv_pool->FindPrefix(ids + found, room, first_image, tag, &common);
    if (from >= 0) {
      if (found + common > reuse) {
        const int32_t to = s->kv_pool->Acquire();
        if (to >= 0) {
          const KvCache& rows = s->kv_pool->store();
          rows.CopyRows(rows, static_cast<int64_t>(from) << shift, static_cast<int64_t>(to) << shift,
                        s->kv.SpanEnd(common, shift));
          if (b < s->held) s->kv_pool->Release(s->block_table[b]);
          else s->held = b + 1;
          s->block_table[b] = to;
          found += common;
        }
      }
      s->kv_pool->Release(from);
    }
  }
  if (found <= reuse) return reuse;
  std::memcpy(s->cached_ids, ids, static_cast<size_t>(found) * sizeof(int32_t));
  s->kv.mapped = s->held << shift;
  return found;
}

// ---- A sliding window and pressure (kiln_context_overflow_t, kiln_pressure_policy_t) ----

constexpr uint64_t kHashSeed[2] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full};

// Continues a 128-bit hash of ids (two multiply-rotate lanes, as HashPixels).
void HashIds(uint64_t h[2], const int32_t* ids, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t w = static_cast<uint32_t>(ids[i]);
    h[0] = (h[0] ^ w) * 0xff51afd7ed558ccdull;
    h[0] = (h[0] << 29) | (h[0] >> 35);
    h[1] = (h[1] + w) * 0xc4ceb9fe1a85ec53ull;
    h[1] = (h[1] << 31) | (h[1] >> 33);
  }
}

void ClearHole(kiln_session_t* s) {
  s->hole_at = s->evicted = 0;
  s->evicted_hash[0] = kHashSeed[0];
  s->evicted_hash[1] = kHashSeed[1];
}

// Whether a full context evicts positions instead of failing: the session's choice,
// or a pressure policy's shorter context.
bool Slides(const kiln_session_t* s) {
  return s->options.context_overflow == KILN_CONTEXT_SLIDE || s->limit < s->context;
}

// The unit a sliding window keeps and evicts in: a paged cache's block, else a span
// (whose keys share their scales), else a row.
int64_t BlockTokens(const kiln_session_t* s) {
  return s->kv_pool != nullptr ? int64_t{1} << s->kv_pool->shift() : std::max<int64_t>(s->kv.span, 1);
}

// The rows at the start a window keeps: keep_tokens, or through the last image token
// the cache holds (at least 4), in whole blocks; once it slid, where it slid from.
int64_t KeepRows(const kiln_session_t* s) {
  if (s->evicted > 0) return s->hole_at;
  int64_t keep = s->options.keep_tokens;
  if (keep <= 0) {
    keep = 4;
    if (s->model->multimodal) {
      const int32_t image_id = static_cast<int32_t>(s->model->fb->image()->image_token_id());
      for (int64_t i = s->cached - 1; i >= keep; --i)
        if (s->cached_ids[i] == image_id) {
          keep = i + 1;
          break;
        }
    }
  }
  const int64_t block = BlockTokens(s);
  return (keep + block - 1) / block * block;
}

// The rows the session may hold now: its context, or the pressure policy's shorter
// one, never less than the kept rows and 64 more (two blocks when larger).
int64_t Limit(const kiln_session_t* s) {
  if (s->limit >= s->context) return s->context;
  return std::min(s->context, std::max(s->limit, KeepRows(s) + std::max<int64_t>(64, 2 * BlockTokens(s))));
}

// Evicts at least `at_least` rows' positions, the oldest after the kept rows, and an
// eighth of the window more so that the next tokens do not slide again at once. A
// paged cache drops whole blocks from its table (no copy); an unpaged one moves the
// later rows down.
kiln_status_t Evict(kiln_session_t* s, int64_t at_least, kiln_error_t* error) {
  const int64_t keep = KeepRows(s), block = BlockTokens(s), limit = Limit(s);
  const int64_t most = (s->position - keep) / block * block;
  int64_t n = at_least + std::max<int64_t>((limit - keep) / 8, 1);
  n = std::min((n + block - 1) / block * block, most);
  if (n < at_least || n <= 0)
    return Fail(error, KILN_ERROR_CONTEXT_FULL,
                "the sliding window cannot make room for %lld more positions: it keeps the first %lld (the image "
                "and the system prompt, keep_tokens) and holds %lld of its %lld",
                static_cast<long long>(at_least), static_cast<long long>(keep), static_cast<long long>(s->position),
                static_cast<long long>(limit));
  HashIds(s->evicted_hash, s->cached_ids + keep, n);
  if (s->kv_pool != nullptr) {
    const int64_t shift = s->kv_pool->shift(), first = keep >> shift, count = n >> shift;
    for (int64_t b = first; b < first + count; ++b) s->kv_pool->Release(s->block_table[b]);
    std::memmove(s->block_table + first, s->block_table + first + count,
                 static_cast<size_t>(s->held - first - count) * sizeof(int32_t));
    s->held -= count;
    s->offered = std::min(s->offered, first);  // blocks after the window's start are not a prefix
    s->kv.mapped = s->held << shift;
    if (s->model->pressure[KILN_PRESSURE_MEMORY].load() >= KILN_PRESSURE_SERIOUS) s->kv_pool->Trim();
  } else {
    s->kv.CopyRows(s->kv, keep + n, keep, s->position - keep - n);
    if (s->limit < s->context)  // under memory pressure: the rows past the window go back
      s->kv.DiscardRows(s->position - n, s->kv.rows - (s->position - n));
  }
  std::memmove(s->cached_ids + keep, s->cached_ids + keep + n, static_cast<size_t>(s->cached - keep - n) * sizeof(int32_t));
  s->position -= n;
  s->cached -= n;
  s->hole_at = keep;
  s->evicted += n;
  return KILN_OK;
}

// Makes rows [position, position + n) writable: positions evicted first when the
// window is full (a caller that does not slide checked the limit), and, with
// KILN_CONTEXT_SLIDE, when the KV block pool is full.
kiln_status_t MakeRoom(kiln_session_t* s, int64_t n, kiln_error_t* error) {
  const int64_t max_positions = s->model->fb->text()->max_position_embeddings();
  if (s->position + s->evicted + s->position_shift + n > max_positions)
    return Fail(error, KILN_ERROR_CONTEXT_FULL, "position %lld is past the model's %lld positions",
                static_cast<long long>(s->position + s->evicted + s->position_shift + n - 1),
                static_cast<long long>(max_positions));
  if (const int64_t over = s->position + n - Limit(s); over > 0)
    if (kiln_status_t st = Evict(s, over, error); st != KILN_OK) return st;
  for (;;) {
    kiln_status_t st = MapBlocks(s, s->position, s->position + n, error);
    if (st != KILN_ERROR_RESOURCE_EXHAUSTED || s->options.context_overflow != KILN_CONTEXT_SLIDE) return st;
    // The pool is full: the session's own oldest positions make room, while it has
    // any to give.
    kiln_error_t ignored;
    if (Evict(s, 1, &ignored) != KILN_OK) return st;
    ClearError(error);
  }
}

// Applies the model's pressure levels if they changed since the last call: the
// thread count, and the window (positions past it are evicted now).
kiln_status_t ApplyPressure(kiln_session_t* s, kiln_error_t* error) {
  kiln_model_t* model = s->model;
  const uint32_t epoch = model->pressure_epoch.load(std::memory_order_acquire);
  if (epoch == s->pressure_epoch) return KILN_OK;
  s->pressure_epoch = epoch;
  const int32_t memory = model->pressure[KILN_PRESSURE_MEMORY].load();
  const int32_t heat = std::max(model->pressure[KILN_PRESSURE_THERMAL].load(), model->pressure[KILN_PRESSURE_BATTERY].load());
  const int32_t threads = s->policy.max_threads[heat];
  s->pool->SetActiveThreads(threads > 0 ? threads : s->pool->num_threads());
  const int32_t cap = s->policy.max_context[memory];
  s->limit = cap > 0 ? std::min<int64_t>(cap, s->context) : s->context;
  if (const int64_t over = s->position - Limit(s); over > 0) return Evict(s, over, error);
  return KILN_OK;
}

// The reuse of ids[0, count) by a cache whose window slid: its kept rows, the evicted
// positions (by their hash), then its later rows, as far as they match. *rows gets
// the rows that hold the reused ids.
int64_t ReuseWithHole(kiln_session_t* s, const int32_t* ids, int64_t count, int64_t* rows) {
  int64_t i = 0;
  while (i < s->hole_at && i + 1 < count && s->cached_ids[i] == ids[i]) ++i;
  *rows = i;
  if (i < s->hole_at || s->hole_at + s->evicted + 1 >= count) return i;
  uint64_t h[2] = {kHashSeed[0], kHashSeed[1]};
  HashIds(h, ids + s->hole_at, s->evicted);
  if (h[0] != s->evicted_hash[0] || h[1] != s->evicted_hash[1]) return i;
  int64_t j = 0;
  while (s->hole_at + j < s->cached && s->hole_at + s->evicted + j + 1 < count &&
         s->cached_ids[s->hole_at + j] == ids[s->hole_at + s->evicted + j])
    ++j;
  *rows = s->hole_at + j;
  return s->hole_at + s->evicted + j;
}

}  // namespace

namespace kiln::rt {

void DiscardImageWeights(kiln_model_t* model) {
  if (!model->multimodal || model->mapping.data == nullptr) return;  // not a file: the app's memory
  const fb::Model* m = model->fb;
  for (int stage : {kVision, kProjector})
    for (const fb::Op* op : *model->stages[stage]->ops()) {
      if (op->weights() == nullptr) continue;
      for (uint32_t w : *op->weights()) {
        if (model->weights[w].overridden) continue;
        const fb::Tensor* t = m->tensors()->Get(w);
        DiscardPages(model->data + t->offset(), static_cast<size_t>(t->size()));
      }
    }
}

kiln_status_t SetUpKvPool(kiln_model_t* m, kiln_error_t* error) {
  if (m->kv_pool_tokens < 0)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "kv_pool_tokens %lld: must be >= 0",
                static_cast<long long>(m->kv_pool_tokens));
  if (m->kv_pool_tokens == 0 && (m->memory_budget == 0 || !m->pool_from_budget)) return KILN_OK;  // no pool
  const int32_t block = m->kv_block_tokens == 0 ? 32 : m->kv_block_tokens;
  if (block < 8 || block > 1024 || (block & (block - 1)) != 0)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "kv_block_tokens %d: must be a power of two in [8, 1024]", block);
  int32_t shift = 0;
  while ((1 << shift) < block) ++shift;
  // The pool holds caches of the budget's session's encoding.
  kiln_session_options_t o;
  SessionPlan plan;
  const kiln_session_options_t* so = m->budget_session_given ? &m->budget_session : nullptr;
  if (kiln_status_t st = PlanFromOptions(m, so, &o, &plan, error); st != KILN_OK) return st;
  const KvCache shape = KvShape(m, plan);
  // + its bookkeeping (kv_pool.cc: counts, tag, key, table slots, its positions' ids)
  const uint64_t per_block = (shape.token_bytes() << shift) + (uint64_t{4} << shift) + 72;
  int64_t blocks = 0;
  if (m->kv_pool_tokens > 0) {
    blocks = (m->kv_pool_tokens + block - 1) >> shift;
  } else {
    // What the budget leaves after the weights, code, tables and the session's other
    // buffers (its table included), in whole blocks: the budget check passed, so about
    // its context or more (a last partial block may not fit).
    kiln_memory_report_t r = {};
    r.struct_size = sizeof(r);
    if (kiln_status_t st = kiln_model_memory_report(m, so, &r, error); st != KILN_OK) return st;
    const uint64_t table = static_cast<uint64_t>((plan.context + block - 1) >> shift) * 4 + 128;
    const uint64_t others = r.total_bytes - r.kv_cache_bytes + table + sizeof(KvPool) + 16 * 128;  // + allocation headers
    blocks = m->memory_budget > others ? static_cast<int64_t>((m->memory_budget - others) / per_block) : 0;
    if (blocks < 1)
      return Fail(error, KILN_ERROR_RESOURCE_EXHAUSTED,
                  "the %.1f MB memory budget leaves no room for one KV block of %d tokens (%.1f MB)",
                  m->memory_budget / 1e6, block, per_block / 1e6);
  }
  if (blocks > (int64_t{1} << 30) || static_cast<uint64_t>(blocks) > UINT64_MAX / 2 / per_block ||
      (blocks << shift) > INT32_MAX)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "a KV pool of %lld blocks of %d tokens is too large",
                static_cast<long long>(blocks), block);
  m->kv_pool_blocks = static_cast<int32_t>(blocks);
  m->kv_block_shift = shift;
  m->kv_pool_encoding = plan.kv_encoding;
  m->kv_pool_group = plan.kv_group;
  if (m->memory_budget > 0 && m->kv_pool_tokens > 0) {
    // An explicit pool instead of the session's own cache: the budget again.
    kiln_memory_report_t r = {};
    r.struct_size = sizeof(r);
    if (kiln_status_t st = kiln_model_memory_report(m, so, &r, error); st != KILN_OK) return st;
    if (r.total_bytes > m->memory_budget) {
      m->kv_pool_blocks = 0;
      return Fail(error, KILN_ERROR_RESOURCE_EXHAUSTED,
                  "needs %.1f MB, over the %.1f MB memory budget: weights %.1f MB (mapped), code %.1f MB, model "
                  "tables %.1f MB, KV pool %.1f MB (%lld blocks of %d tokens), session %.1f MB; a smaller "
                  "kv_pool_tokens fits",
                  r.total_bytes / 1e6, m->memory_budget / 1e6, r.weight_bytes / 1e6, r.code_bytes / 1e6,
                  r.model_bytes / 1e6, r.kv_pool_bytes / 1e6, static_cast<long long>(blocks), block,
                  r.session_bytes / 1e6);
    }
  }
  const uint64_t before = m->allocator.current_bytes();
  m->kv_pool = KvPool::Create(shape, m->kv_pool_blocks, shift, &m->allocator);
  m->kv_pool_allocated = m->allocator.current_bytes() - before;
  if (m->kv_pool == nullptr) {
    m->kv_pool_blocks = 0;
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "out of memory for a KV pool of %lld blocks of %d tokens (%.1f MB)",
                static_cast<long long>(blocks), block, KvPool::Bytes(shape, blocks, shift) / 1e6);
  }
  return KILN_OK;
}

}  // namespace kiln::rt

// The calibration seam (kiln/kiln_calibration.h).
extern "C" {

kiln_status_t kiln_calib_set_weight_observer(kiln_session_t* session, kiln_weight_input_observer_t observer,
                                             void* user) {
  if (session == nullptr) return KILN_ERROR_INVALID_ARGUMENT;
  session->observer = observer;
  session->observer_user = user;
  return KILN_OK;
}

kiln_status_t kiln_calib_get_pixel_values(kiln_session_t* s, float* out, size_t capacity, kiln_error_t* error) {
  ClearError(error);
  if (s == nullptr || out == nullptr) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "null argument");
  if (!s->model->multimodal || !s->has_image) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "no image set");
  size_t n = 3 * static_cast<size_t>(s->model->fb->image()->image_size()) * s->model->fb->image()->image_size();
  if (capacity < n) return Fail(error, KILN_ERROR_BUFFER_TOO_SMALL, "pixel values need %zu floats", n);
  std::memcpy(out, s->pixels, n * 4);
  return KILN_OK;
}

kiln_status_t kiln_calib_get_image_features(kiln_session_t* s, float* out, size_t capacity, kiln_error_t* error) {
  ClearError(error);
  if (s == nullptr || out == nullptr) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "null argument");
  if (!s->model->multimodal || !s->has_image) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "no image set");
  if (!s->image_encoded)
    if (kiln_status_t st = EncodeImage(s, error); st != KILN_OK) return st;
  size_t n = static_cast<size_t>(s->image_tokens) * s->model->fb->text()->hidden_size();
  if (capacity < n) return Fail(error, KILN_ERROR_BUFFER_TOO_SMALL, "image features need %zu floats", n);
  std::memcpy(out, s->image_features, n * 4);
  return KILN_OK;
}

kiln_status_t kiln_calib_set_image_features(kiln_session_t* s, const float* features, size_t count,
                                            kiln_error_t* error) {
  ClearError(error);
  if (s == nullptr || features == nullptr) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "null argument");
  if (!s->model->multimodal) return Fail(error, KILN_ERROR_INPUT_NOT_MULTIMODAL, "model takes no images");
  size_t n = static_cast<size_t>(s->image_tokens) * s->model->fb->text()->hidden_size();
  if (count != n) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "image features need %zu floats, got %zu", n, count);
  std::memcpy(s->image_features, features, n * 4);
  // Features without their selection: the kept tokens take consecutive positions.
  for (int64_t j = 0; j < s->image_tokens; ++j) s->image_rows[j] = static_cast<int32_t>(j);
  s->image_span = s->image_tokens;
  s->has_image = true;
  s->image_encoded = true;
  s->image_hash[0] = s->image_hash[1] = 0;  // features of no pixels: the next image is new
  ForgetImageTokens(s);
  s->pending_preprocess_ms = 0;
  return KILN_OK;
}

}  // extern "C"

extern "C" {

void kiln_session_options_init(kiln_session_options_t* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
}

void kiln_pressure_policy_init(kiln_pressure_policy_t* policy) {
  if (policy == nullptr) return;
  *policy = {};
  policy->struct_size = sizeof(*policy);
  policy->max_threads[KILN_PRESSURE_SERIOUS] = 2;
  policy->max_threads[KILN_PRESSURE_CRITICAL] = 1;
  policy->max_context[KILN_PRESSURE_SERIOUS] = 1024;
  policy->max_context[KILN_PRESSURE_CRITICAL] = 512;
}

kiln_status_t kiln_model_set_pressure(kiln_model_t* model, int32_t kind, int32_t level) {
  if (model == nullptr || kind < KILN_PRESSURE_MEMORY || kind > KILN_PRESSURE_BATTERY || level < KILN_PRESSURE_NONE ||
      level > KILN_PRESSURE_CRITICAL)
    return KILN_ERROR_INVALID_ARGUMENT;
  model->pressure[kind].store(level);
  model->pressure_epoch.fetch_add(1, std::memory_order_release);
  if (kind == KILN_PRESSURE_MEMORY && level >= KILN_PRESSURE_SERIOUS) {
    if (model->kv_pool != nullptr) model->kv_pool->Trim();
    DiscardImageWeights(model);
  }
  return KILN_OK;
}

void kiln_generate_options_init(kiln_generate_options_t* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->temperature = 0.0f;
  options->top_k = 0;
  options->top_p = 1.0f;
  options->reuse_prefix = 1;
  options->repetition_penalty = 1.0f;
}

void kiln_generate_options_init_from_model(const kiln_model_t* model, kiln_generate_options_t* options) {
  kiln_generate_options_init(options);
  if (model == nullptr || options == nullptr) return;
  const fb::Generation* g = model->fb->generation();  // verified at load
  if (g->do_sample()) {
    options->temperature = g->temperature();
    options->top_k = g->top_k();
    options->top_p = g->top_p();
  }
  options->repetition_penalty = g->repetition_penalty();
}

kiln_status_t kiln_model_session_bytes(const kiln_model_t* model, const kiln_session_options_t* options,
                                       uint64_t* out_bytes, kiln_error_t* out_error) {
  ClearError(out_error);
  if (model == nullptr || out_bytes == nullptr)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_model_session_bytes: model and out_bytes are required");
  kiln_memory_report_t r = {};
  r.struct_size = sizeof(r);
  if (kiln_status_t st = kiln_model_memory_report(model, options, &r, out_error); st != KILN_OK) return st;
  *out_bytes = r.session_bytes;
  return KILN_OK;
}

kiln_status_t kiln_model_memory_report(const kiln_model_t* model, const kiln_session_options_t* options,
                                       kiln_memory_report_t* out_report, kiln_error_t* out_error) {
  ClearError(out_error);
  if (model == nullptr || out_report == nullptr)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_model_memory_report: model and out_report are required");
  kiln_session_options_t o;
  SessionPlan plan;
  if (kiln_status_t st = PlanFromOptions(model, options, &o, &plan, out_error); st != KILN_OK) return st;
  kiln_memory_report_t r = {};
  r.struct_size = sizeof(r);
  r.weight_bytes = model->fb->memory_plan()->weight_bytes();
  r.code_bytes = model->code.mapped_bytes();
  r.model_bytes = model->allocator.current_bytes() + sizeof(kiln_model_t);
  r.session_bytes = plan.Total(model->multimodal);
  r.kv_cache_bytes = 2 * (static_cast<uint64_t>(plan.kv_half) + plan.kv_scales_half);
  r.arena_bytes = plan.arena;
  r.total_bytes = r.weight_bytes + r.code_bytes + r.model_bytes + r.session_bytes;
  if (plan.paged) {  // the model's pool instead of the session's own cache
    r.kv_pool_bytes = KvPool::Bytes(KvShape(model, plan), model->kv_pool_blocks, plan.shift);
    r.kv_block_tokens = 1 << plan.shift;
    r.kv_pool_blocks = model->kv_pool_blocks;
    r.kv_cache_bytes = r.kv_pool_bytes;
    if (model->kv_pool != nullptr) r.model_bytes -= std::min(r.model_bytes, model->kv_pool_allocated);
    r.total_bytes = r.weight_bytes + r.code_bytes + r.model_bytes + r.session_bytes + r.kv_pool_bytes;
  }
  r.context_length = static_cast<int32_t>(plan.context);
  r.kv_cache = KvCacheOption(plan.kv_encoding);
  if (!CopySizedOut(r, out_report))
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_memory_report_t.struct_size is not set");
  return KILN_OK;
}

kiln_status_t kiln_session_create(kiln_model_t* model, const kiln_session_options_t* options,
                                  kiln_session_t** out_session, kiln_error_t* out_error) {
  ClearError(out_error);
  if (model == nullptr || out_session == nullptr)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_session_create: model and out_session are required");
  kiln_session_options_t o;
  SessionPlan plan;
  if (kiln_status_t st = PlanFromOptions(model, options, &o, &plan, out_error); st != KILN_OK) return st;
  const fb::Model* m = model->fb;

  const kiln_allocator_t* a = o.allocator != nullptr ? o.allocator : &model->allocator.raw();
  Allocator bootstrap(a);
  void* mem = bootstrap.Alloc(sizeof(kiln_session_t), 64);
  if (mem == nullptr) return Fail(out_error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
  kiln_session_t* s = new (mem) kiln_session_t(model, a);
  s->context = plan.context;
  s->image_tokens = plan.image_tokens;
  s->max_prefill = m->memory_plan()->max_prefill_tokens();
  s->pool = ThreadPool::Create(plan.threads, &s->allocator);
  kiln_status_t st = KILN_OK;
  if (s->pool == nullptr) st = Fail(out_error, KILN_ERROR_OUT_OF_MEMORY, "cannot create the thread pool");
  auto alloc = [&](size_t bytes, void** out, const char* what) {
    if (st == KILN_OK) st = Alloc(s, bytes, out, out_error, what);
  };
  s->options = o;
  s->kv = KvShape(model, plan);
  if (plan.paged) {
    // The model's pool holds the rows; the session maps its positions to blocks.
    s->kv_pool = model->kv_pool;
    const KvCache& store = s->kv_pool->store();
    s->kv.keys = store.keys;
    s->kv.values = store.values;
    s->kv.key_scales = store.key_scales;
    s->kv.value_scales = store.value_scales;
    s->kv.rows = store.rows;
    s->kv.block_shift = s->kv_pool->shift();
    alloc(plan.table, reinterpret_cast<void**>(&s->block_table), "KV block table");
    s->kv.blocks = s->block_table;
    s->kv.mapped = 0;
  } else {
    auto alloc_kv = [&](size_t bytes, void** out, const char* what) {
      if (st == KILN_OK) st = Alloc(s, bytes, out, out_error, what, /*zero=*/false);
    };
    alloc_kv(plan.kv_half, reinterpret_cast<void**>(&s->kv.keys), "KV cache (keys)");
    alloc_kv(plan.kv_half, reinterpret_cast<void**>(&s->kv.values), "KV cache (values)");
    alloc_kv(plan.kv_scales_half, reinterpret_cast<void**>(&s->kv.key_scales), "KV cache (key scales)");
    alloc_kv(plan.kv_scales_half, reinterpret_cast<void**>(&s->kv.value_scales), "KV cache (value scales)");
    s->kv.mapped = plan.context;
  }
  if (plan.span > 0) {
    alloc(plan.open, reinterpret_cast<void**>(&s->kv.open_k), "KV cache (open keys)");
    alloc(plan.open, reinterpret_cast<void**>(&s->kv.open_v), "KV cache (open values)");
    alloc(plan.stage, reinterpret_cast<void**>(&s->kv.stage_k), "KV cache (staged keys)");
    alloc(plan.stage, reinterpret_cast<void**>(&s->kv.stage_v), "KV cache (staged values)");
  }
  alloc(plan.arena, reinterpret_cast<void**>(&s->arena), "activation arena");
  alloc(plan.tokens, reinterpret_cast<void**>(&s->ids), "token buffer");
  alloc(plan.tokens, reinterpret_cast<void**>(&s->positions), "position buffer");
  alloc(plan.tokens, reinterpret_cast<void**>(&s->kv_rows), "KV row buffer");
  s->kv.row_scratch = s->kv_rows;
  ClearHole(s);
  s->limit = s->context;
  kiln_pressure_policy_init(&s->policy);
  if (o.pressure_policy != nullptr) {
    if (o.pressure_policy->struct_size < sizeof(uint32_t) || o.pressure_policy->struct_size > 4096)
      st = Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_pressure_policy_t.struct_size is not set");
    else
      std::memcpy(&s->policy, o.pressure_policy, std::min<size_t>(o.pressure_policy->struct_size, sizeof(s->policy)));
    s->policy.struct_size = sizeof(s->policy);
    for (int level = 0; level < 4 && st == KILN_OK; ++level)
      if (s->policy.max_threads[level] < 0 || s->policy.max_context[level] < 0)
        st = Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_pressure_policy_t level %d: max_threads %d and "
                  "max_context %d must be >= 0", level, s->policy.max_threads[level], s->policy.max_context[level]);
  }
  s->options.pressure_policy = nullptr;  // copied: the caller's may go
  alloc(plan.hidden, reinterpret_cast<void**>(&s->hidden), "hidden states");
  alloc(plan.logits, reinterpret_cast<void**>(&s->logits), "logits");
  alloc(plan.cached_ids, reinterpret_cast<void**>(&s->cached_ids), "ids of the KV cache");
  if (model->multimodal) {
    // The verifier checked that the projector reads exactly the vision encoder's
    // output and writes [image_tokens, hidden]: these buffers are what they bind.
    alloc(plan.pixels, reinterpret_cast<void**>(&s->pixels), "pixel values");
    alloc(plan.vision, reinterpret_cast<void**>(&s->vision_features), "vision features");
    alloc(plan.image, reinterpret_cast<void**>(&s->image_features), "image features");
    alloc(plan.image_rows, reinterpret_cast<void**>(&s->image_rows), "kept image rows");
  }
  s->scratch_floats = plan.scratch_floats;
  alloc(plan.scratch, reinterpret_cast<void**>(&s->scratch), "kernel scratch");
  s->value_rows.set_allocator(&s->allocator);
  s->prompt.set_allocator(&s->allocator);
  s->output.set_allocator(&s->allocator);
  s->text.set_allocator(&s->allocator);
  s->text_out.set_allocator(&s->allocator);
  if (st == KILN_OK && !s->value_rows.resize(m->values()->size()))
    st = Fail(out_error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
  if (st != KILN_OK) {
    kiln_session_release(s);
    return st;
  }
  s->stats.arena_bytes = m->memory_plan()->arena_bytes();
  s->stats.kv_cache_bytes = s->kv.bytes();
  s->stats.kv_cache_token_bytes = s->kv.token_bytes();
  s->stats.kv_cache = KvCacheOption(s->kv.encoding);
  s->stats.weight_bytes = m->memory_plan()->weight_bytes();
  s->stats.num_threads = s->pool->num_threads();
  *out_session = s;
  return KILN_OK;
}

void kiln_session_release(kiln_session_t* session) {
  if (session == nullptr) return;
  ReleaseBlocks(session, 0);
  ThreadPool::Destroy(session->pool);
  FreeBuffers(session);
  for (Vec<OpTime>& times : session->op_time) times.set_allocator(nullptr);
  session->value_rows.set_allocator(nullptr);
  session->prompt.set_allocator(nullptr);
  session->output.set_allocator(nullptr);
  session->text.set_allocator(nullptr);
  session->text_out.set_allocator(nullptr);
  kiln_allocator_t raw = session->allocator.raw();
  session->~kiln_session_t();
  Allocator(&raw).Free(session);
}

kiln_status_t kiln_session_set_image_rgb(kiln_session_t* s, const uint8_t* rgb, int32_t width, int32_t height,
                                         size_t stride, kiln_error_t* out_error) {
  ClearError(out_error);
  if (s == nullptr) return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "null session");
  if (!s->model->multimodal)
    return Fail(out_error, KILN_ERROR_INPUT_NOT_MULTIMODAL, "%s takes no images", s->model->info.architecture);
  double t0 = NowSeconds();
  int64_t size = s->model->fb->image()->image_size();
  kiln_status_t st = PreprocessImage(s->model->preprocess, rgb, width, height, stride, &s->allocator, s->pixels,
                                     static_cast<size_t>(3 * size * size), out_error, s->pool);
  if (st != KILN_OK) {
    s->has_image = false;
    s->image_encoded = false;  // the pixels may be half overwritten
    ForgetImageTokens(s);
    return st;
  }
  PixelsChanged(s);
  s->pending_preprocess_ms = Ms(NowSeconds() - t0);
  return KILN_OK;
}

kiln_status_t kiln_session_set_pixel_values(kiln_session_t* s, const float* pixel_values, size_t count,
                                            kiln_error_t* out_error) {
  ClearError(out_error);
  if (s == nullptr || pixel_values == nullptr) return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "null argument");
  if (!s->model->multimodal)
    return Fail(out_error, KILN_ERROR_INPUT_NOT_MULTIMODAL, "%s takes no images", s->model->info.architecture);
  int64_t size = s->model->fb->image()->image_size();
  if (count != static_cast<size_t>(3 * size * size))
    return Fail(out_error, KILN_ERROR_INPUT_IMAGE, "pixel values must be [3, %lld, %lld] (%lld floats), got %zu",
                static_cast<long long>(size), static_cast<long long>(size), static_cast<long long>(3 * size * size),
                count);
  std::memcpy(s->pixels, pixel_values, count * 4);
  s->pending_preprocess_ms = 0;
  PixelsChanged(s);
  return KILN_OK;
}

kiln_status_t kiln_session_reset(kiln_session_t* s) {
  if (s == nullptr) return KILN_ERROR_INVALID_ARGUMENT;
  s->has_image = false;
  s->image_encoded = false;
  s->position = 0;
  s->cached = 0;
  ClearHole(s);
  ReleaseBlocks(s, 0);
  s->output.clear();
  return KILN_OK;
}

kiln_status_t kiln_session_generate_ids(kiln_session_t* s, const int32_t* ids, size_t count,
                                        const kiln_generate_options_t* options, kiln_error_t* out_error) {
  ClearError(out_error);
  if (s == nullptr || ids == nullptr || count == 0)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_session_generate_ids needs a session and ids");
  return Generate(s, ids, count, options, NowSeconds(), out_error);
}

kiln_status_t kiln_session_prompt_ids(kiln_session_t* s, const char* prompt, int32_t* out_ids, size_t capacity,
                                     size_t* out_count, kiln_error_t* out_error) {
  ClearError(out_error);
  if (s == nullptr || prompt == nullptr || out_count == nullptr || (out_ids == nullptr && capacity > 0))
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_session_prompt_ids: invalid arguments");
  Vec<int32_t> ids(&s->allocator);
  if (kiln_status_t st = BuildPrompt(s, prompt, &ids, out_error); st != KILN_OK) return st;
  *out_count = ids.size();
  if (const size_t n = std::min(capacity, ids.size()); n > 0)  // a size query passes no buffer
    std::memcpy(out_ids, ids.data(), n * sizeof(int32_t));
  if (ids.size() > capacity)
    return Fail(out_error, KILN_ERROR_BUFFER_TOO_SMALL, "%zu ids do not fit in %zu", ids.size(), capacity);
  return KILN_OK;
}

kiln_status_t kiln_session_generate(kiln_session_t* s, const char* prompt, const kiln_generate_options_t* options,
                                    kiln_error_t* out_error) {
  ClearError(out_error);
  if (s == nullptr || prompt == nullptr)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_session_generate needs a session and a prompt");
  double t0 = NowSeconds();
  s->prompt.clear();
  if (kiln_status_t st = BuildPrompt(s, prompt, &s->prompt, out_error); st != KILN_OK) return st;
  return Generate(s, s->prompt.data(), s->prompt.size(), options, t0, out_error);
}

kiln_status_t kiln_session_chat(kiln_session_t* s, const kiln_chat_message_t* messages, size_t count,
                                const kiln_generate_options_t* options, kiln_error_t* out_error) {
  ClearError(out_error);
  if (s == nullptr || messages == nullptr || count == 0)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_session_chat needs a session and messages");
  double t0 = NowSeconds();
  s->prompt.clear();
  if (kiln_status_t st = ChatIds(s, messages, count, &s->prompt, out_error); st != KILN_OK) return st;
  return Generate(s, s->prompt.data(), s->prompt.size(), options, t0, out_error);
}

kiln_status_t kiln_model_apply_chat_template(const kiln_model_t* model, const kiln_chat_message_t* messages,
                                             size_t count, char* out, size_t capacity, size_t* out_length,
                                             kiln_error_t* out_error) {
  ClearError(out_error);
  if (model == nullptr || messages == nullptr || count == 0 || out_length == nullptr || (out == nullptr && capacity > 0))
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_model_apply_chat_template: invalid arguments");
  kiln::rt::Allocator scratch(&model->allocator.raw());
  Vec<char> text(&scratch);
  bool add_bos = true;
  if (kiln_status_t st = RenderChat(model, messages, count, 0, &text, &add_bos, out_error); st != KILN_OK) return st;
  *out_length = text.size();
  if (capacity > 0) {
    const size_t n = std::min(capacity - 1, text.size());
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  }
  if (text.size() >= capacity)
    return Fail(out_error, KILN_ERROR_BUFFER_TOO_SMALL, "%zu bytes do not fit in %zu", text.size() + 1, capacity);
  return KILN_OK;
}

kiln_status_t kiln_session_prefill_logits(kiln_session_t* s, const int32_t* ids, size_t count, float* out_logits,
                                          size_t capacity, kiln_error_t* out_error) {
  ClearError(out_error);
  if (s == nullptr || ids == nullptr || count == 0 || out_logits == nullptr)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_session_prefill_logits: invalid arguments");
  size_t vocab = s->model->fb->text()->vocab_size();
  if (capacity / vocab < count)
    return Fail(out_error, KILN_ERROR_BUFFER_TOO_SMALL, "%zu x %zu logits do not fit in %zu floats", count, vocab,
                capacity);
  s->position = 0;
  s->cached = 0;
  ClearHole(s);
  ReleaseBlocks(s, 0);
  if (kiln_status_t st = ApplyPressure(s, out_error); st != KILN_OK) return st;
  if (s->model->multimodal && s->has_image && !s->image_encoded)
    if (kiln_status_t st = EncodeImage(s, out_error); st != KILN_OK) return st;
  return Prefill(s, ids, count, 0, out_logits, out_error);
}

kiln_status_t kiln_session_get_output_ids(const kiln_session_t* s, int32_t* out_ids, size_t capacity,
                                          size_t* out_count) {
  if (s == nullptr || out_count == nullptr || (out_ids == nullptr && capacity > 0)) return KILN_ERROR_INVALID_ARGUMENT;
  *out_count = s->output.size();
  if (const size_t n = std::min(capacity, s->output.size()); n > 0)  // a size query passes no buffer
    std::memcpy(out_ids, s->output.data(), n * sizeof(int32_t));
  return KILN_OK;
}

kiln_status_t kiln_session_get_stats(const kiln_session_t* s, kiln_stats_t* out_stats) {
  if (s == nullptr) return KILN_ERROR_INVALID_ARGUMENT;
  kiln_stats_t stats = s->stats;
  stats.context_limit = static_cast<int32_t>(Limit(s));
  stats.evicted_tokens = static_cast<int32_t>(s->evicted);
  if (s->kv_pool != nullptr) {  // as of now
    stats.kv_block_tokens = 1 << s->kv_pool->shift();
    stats.kv_blocks = static_cast<int32_t>(s->held);
    stats.kv_pool_blocks = s->kv_pool->capacity();
    stats.kv_pool_blocks_used = s->kv_pool->used();
  }
  if (!kiln::rt::CopySizedOut(stats, out_stats)) return KILN_ERROR_INVALID_ARGUMENT;
  return KILN_OK;
}

kiln_status_t kiln_session_fork(kiln_session_t* src, kiln_session_t** out_session, kiln_error_t* out_error) {
  ClearError(out_error);
  if (src == nullptr || out_session == nullptr)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_session_fork: session and out_session are required");
  kiln_session_t* s = nullptr;
  if (kiln_status_t st = kiln_session_create(src->model, &src->options, &s, out_error); st != KILN_OK) return st;
  s->policy = src->policy;
  // The image: its pixels and, once encoded, its features.
  const kiln_model_t* model = src->model;
  if (model->multimodal) {
    const size_t size = model->fb->image()->image_size();
    std::memcpy(s->pixels, src->pixels, 3 * size * size * sizeof(float));
    if (src->image_encoded) {
      std::memcpy(s->image_features, src->image_features,
                  static_cast<size_t>(s->image_tokens) * model->fb->text()->hidden_size() * 4);
      std::memcpy(s->image_rows, src->image_rows, static_cast<size_t>(s->image_tokens) * sizeof(int32_t));
      s->image_span = src->image_span;
    }
  }
  s->position_shift = src->position_shift;
  s->has_image = src->has_image;
  s->image_encoded = src->image_encoded;
  s->image_hash[0] = src->image_hash[0];
  s->image_hash[1] = src->image_hash[1];
  s->pending_preprocess_ms = src->pending_preprocess_ms;
  // The conversation: the ids the cache holds and their keys and values.
  std::memcpy(s->cached_ids, src->cached_ids, static_cast<size_t>(src->cached) * sizeof(int32_t));
  s->cached = src->cached;
  if (s->kv_pool != nullptr) {  // the same pool (same options): share the blocks
    for (int64_t b = 0; b < src->held; ++b) {
      s->kv_pool->Retain(src->block_table[b]);
      s->block_table[b] = src->block_table[b];
    }
    s->held = src->held;
    s->kv.mapped = s->held << s->kv_pool->shift();
  } else {
    s->kv.CopyRows(src->kv, 0, 0, src->cached);  // unpaged: the same rows
  }
  if (s->kv.span > 0 && s->kv.span == src->kv.span) {  // the exact rows of the span being filled
    const size_t bytes = static_cast<size_t>(s->kv.layers * s->kv.span * s->kv.width) * sizeof(float);
    std::memcpy(s->kv.open_k, src->kv.open_k, bytes);
    std::memcpy(s->kv.open_v, src->kv.open_v, bytes);
  }
  s->position = s->cached;
  s->hole_at = src->hole_at;  // and the same window
  s->evicted = src->evicted;
  s->evicted_hash[0] = src->evicted_hash[0];
  s->evicted_hash[1] = src->evicted_hash[1];
  *out_session = s;
  return KILN_OK;
}

kiln_status_t kiln_session_set_op_profiling(kiln_session_t* s, int enable, kiln_error_t* out_error) {
  ClearError(out_error);
  if (s == nullptr) return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "null session");
  s->profile_ops = false;
  if (enable == 0) return KILN_OK;
  for (int k = 0; k < kNumStages; ++k) {
    Vec<OpTime>& times = s->op_time[k];
    times.set_allocator(&s->allocator);
    times.clear();
    const fb::Stage* stage = s->model->stages[k];
    if (stage != nullptr && !times.resize(stage->ops()->size()))
      return Fail(out_error, KILN_ERROR_OUT_OF_MEMORY, "out of memory for the op profile");
  }
  s->profile_ops = true;
  return KILN_OK;
}

kiln_status_t kiln_session_get_op_profile(const kiln_session_t* s, kiln_op_profile_t* out, size_t capacity,
                                          size_t* out_count) {
  if (s == nullptr || out_count == nullptr || (out == nullptr && capacity > 0)) return KILN_ERROR_INVALID_ARGUMENT;
  bool enabled = false;
  for (const Vec<OpTime>& times : s->op_time) enabled = enabled || times.size() > 0;
  if (!enabled) return KILN_ERROR_INVALID_ARGUMENT;
  size_t n = 0;
  for (const fb::Stage* stage : *s->model->fb->stages()) {
    const Vec<OpTime>& times = s->op_time[static_cast<int>(stage->kind())];
    for (uint32_t i = 0; i < stage->ops()->size(); ++i, ++n) {
      if (n >= capacity) continue;
      const fb::Op* op = stage->ops()->Get(i);
      kiln_op_profile_t& e = out[n];
      e.stage = fb::EnumNameStageKind(stage->kind());
      e.name = op->name() != nullptr ? op->name()->c_str() : "";
      e.kind = fb::EnumNameOpKind(op->kind());
      e.kernel = FindKernel(op->kernel())->name;
      e.calls = i < times.size() ? times[i].calls : 0;
      e.total_ms = i < times.size() ? times[i].ms : 0.0;
    }
  }
  *out_count = n;
  return KILN_OK;
}

}  // extern "C"
