// fuzz_tokenizer: the runtime's byte-level BPE tokenizer (runtime/src/tokenizer) and,
// in builds with the compiler, the compiler's tokenizer.json reader
// (compiler/importers/tokenizer/TokenizerJson.h).
//
// An input that starts with '{' is a tokenizer.json (compiler builds): it is written to
// a temporary file and read with readTokenizerJson; what it accepts is handed to the
// runtime's Tokenizer::Create, and when that accepts it too, a fixed text is encoded
// and must decode back to itself.
//
// Any other input describes a model-free tokenizer, then a text:
//   byte 0        flags: bits 0-1 pre-tokenizer (0 GPT-2, 1 Llama-3, 2/3 Split),
//                 bit 2 ignore_merges, bit 3 add_bos
//   byte 1        number of merges M (mod 64), then M pairs of bytes: the operands,
//                 as indices into the vocabulary built so far (mod its size). The
//                 vocabulary starts with the 256 byte-level symbols (ids 0..255, in
//                 byte order); each merge's concatenation is appended when new.
//   next byte     number of added tokens A (mod 8), then per token: a flags byte
//                 (bit 0 special, bit 1 id taken from the next byte instead of a new
//                 id past the vocabulary), [id byte], a length byte L (mod 16) and L
//                 content bytes (added tokens are validated by Create: may be rejected)
//   Split only:   a length byte P (mod 64) and P bytes of regex pattern (regex.h)
//   the rest      the text.
// Properties checked (what tokenizer.h promises):
//  - Encode rejects text that is not well-formed UTF-8, and accepts well-formed text
//    (unless the regex gives up: KILN_ERROR_INTERNAL, its backtracking limit with a
//    fuzzed Split pattern);
//  - every id Encode returns is in [0, vocab_size) and decodes (Decode succeeds);
//  - round trip: Decode(Encode(text, add_special = false), skip_special = false) ==
//    text for well-formed text (all vocabulary entries here are byte-level strings, and
//    added tokens decode to their content);
//  - Decode of arbitrary ids never fails other than by KILN_ERROR_INPUT_TOKENS and
//    always yields well-formed UTF-8; AppendTokenBytes agrees with Decode per token.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "support/allocator.h"
#include "support/vec.h"
#include "tokenizer/tokenizer.h"

#ifdef KILN_FUZZ_TOKENIZER_JSON
#include <unistd.h>

#include "compiler/importers/tokenizer/TokenizerJson.h"
#endif

using kiln::rt::Allocator;
using kiln::rt::Tokenizer;
using kiln::rt::TokenizerSpec;
using kiln::rt::Vec;

namespace {

#define FUZZ_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "fuzz_tokenizer: check failed at line %d: %s\n", __LINE__, \
                   #cond);                                                            \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

// GPT-2's bytes_to_unicode, as UTF-8 strings.
std::vector<std::string> ByteSymbols() {
  std::vector<std::string> out(256);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
    std::string s;
    if (cp < 0x80) {
      s.push_back(char(cp));
    } else {
      s.push_back(char(0xC0 | (cp >> 6)));
      s.push_back(char(0x80 | (cp & 0x3F)));
    }
    out[b] = s;
  }
  return out;
}

// Encodes, checks the ids, decodes, and checks the round trip.
void CheckRoundTrip(const Tokenizer* tok, const char* text, size_t length, Allocator* alloc) {
  kiln_error_t err;
  bool valid = kiln::rt::IsValidUtf8(text, length, nullptr);
  Vec<int32_t> ids(alloc);
  kiln_status_t st = tok->Encode(text, length, false, &ids, &err);
  if (!valid) {
    FUZZ_CHECK(st == KILN_ERROR_INVALID_ARGUMENT);
    FUZZ_CHECK(ids.empty());
    return;
  }
  if (st == KILN_ERROR_INTERNAL) return;  // the regex gave up (its backtracking limit)
  FUZZ_CHECK(st == KILN_OK);
  for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok->vocab_size());
  Vec<char> back(alloc);
  st = tok->Decode(ids.data(), ids.size(), false, &back, &err);
  FUZZ_CHECK(st == KILN_OK);
  if (back.size() != length || (length != 0 && std::memcmp(back.data(), text, length) != 0)) {
    std::fprintf(stderr, "fuzz_tokenizer: round trip differs: %zu bytes in, %zu out\n", length,
                 back.size());
    std::abort();
  }
  // With BOS and special tokens skipped: must still succeed.
  Vec<int32_t> ids2(alloc);
  st = tok->Encode(text, length, true, &ids2, &err);
  FUZZ_CHECK(st == KILN_OK || st == KILN_ERROR_INTERNAL);
  if (st == KILN_OK) {
    if (tok->adds_bos()) FUZZ_CHECK(ids2.size() == ids.size() + 1 && ids2[0] == tok->bos_id());
    Vec<char> skipped(alloc);
    FUZZ_CHECK(tok->Decode(ids2.data(), ids2.size(), true, &skipped, &err) == KILN_OK);
  }
}

// Arbitrary ids: Decode fails only with KILN_ERROR_INPUT_TOKENS, its text is
// well-formed UTF-8, and per-token bytes concatenate to the same text.
void CheckDecodeAny(const Tokenizer* tok, const uint8_t* data, size_t size, Allocator* alloc) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size && ids.size() < 64; i += 2)
    ids.push_back(int32_t(data[i] | (data[i + 1] << 8)) % (tok->vocab_size() + 2) - 1);
  kiln_error_t err;
  for (bool skip : {false, true}) {
    Vec<char> text(alloc);
    kiln_status_t st = tok->Decode(ids.data(), ids.size(), skip, &text, &err);
    if (st != KILN_OK) {
      FUZZ_CHECK(st == KILN_ERROR_INPUT_TOKENS);
      FUZZ_CHECK(text.empty());
      continue;
    }
    FUZZ_CHECK(kiln::rt::IsValidUtf8(text.data(), text.size(), nullptr));
    Vec<char> bytes(alloc);
    for (int32_t id : ids) FUZZ_CHECK(tok->AppendTokenBytes(id, skip, &bytes, &err) == KILN_OK);
    Vec<char> repaired(alloc);
    FUZZ_CHECK(kiln::rt::AppendUtf8Replacing(bytes.data(), bytes.size(), &repaired));
    FUZZ_CHECK(repaired.size() == text.size() &&
               (text.empty() || std::memcmp(repaired.data(), text.data(), text.size()) == 0));
    size_t complete = kiln::rt::Utf8CompleteLength(bytes.data(), bytes.size());
    FUZZ_CHECK(complete <= bytes.size() && bytes.size() - complete <= 3);
  }
}

struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t Byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  std::string Bytes(size_t k) {
    k = k < n ? k : n;
    std::string s(reinterpret_cast<const char*>(p), k);
    p += k;
    n -= k;
    return s;
  }
};

void FuzzSpec(const uint8_t* data, size_t size) {
  Reader in{data, size};
  uint8_t flags = in.Byte();
  TokenizerSpec spec;
  int pre = flags & 3;
  spec.pretokenizer = pre == 0   ? TokenizerSpec::PreTokenizer::kGpt2
                      : pre == 1 ? TokenizerSpec::PreTokenizer::kLlama3
                                 : TokenizerSpec::PreTokenizer::kSplit;
  spec.ignore_merges = (flags & 4) != 0;

  std::vector<std::string> vocab = ByteSymbols();
  std::unordered_map<std::string, uint32_t> index;
  for (uint32_t i = 0; i < 256; ++i) index[vocab[i]] = i;
  std::vector<TokenizerSpec::Merge> merges;
  int num_merges = in.Byte() % 64;
  for (int i = 0; i < num_merges; ++i) {
    uint32_t l = in.Byte() % vocab.size();
    uint32_t r = in.Byte() % vocab.size();
    std::string merged = vocab[l] + vocab[r];
    if (merged.size() > 64) continue;
    if (!index.count(merged)) {
      index[merged] = uint32_t(vocab.size());
      vocab.push_back(merged);
    }
    merges.push_back({l, r});
  }
  struct AddedSrc {
    bool special, fixed_id;
    uint8_t id;
    std::string content;
  };
  std::vector<AddedSrc> added_src;
  int num_added = in.Byte() % 8;
  for (int i = 0; i < num_added; ++i) {
    AddedSrc a;
    uint8_t f = in.Byte();
    a.special = (f & 1) != 0;
    a.fixed_id = (f & 2) != 0;
    a.id = a.fixed_id ? in.Byte() : 0;
    a.content = in.Bytes(in.Byte() % 16);
    added_src.push_back(a);
  }
  std::string pattern;
  if (spec.pretokenizer == TokenizerSpec::PreTokenizer::kSplit) pattern = in.Bytes(in.Byte() % 64);

  std::vector<TokenizerSpec::Added> added;
  size_t vocab_size = vocab.size();
  for (const AddedSrc& a : added_src) {
    int32_t id = a.fixed_id ? int32_t(a.id) : int32_t(vocab_size++);
    added.push_back({id, std::string_view(), a.special});
  }
  vocab.resize(vocab_size);  // new ids for added tokens: "" in the vocabulary
  for (size_t i = 0; i < added.size(); ++i) added[i].content = added_src[i].content;
  std::vector<std::string_view> views(vocab.begin(), vocab.end());
  spec.vocab = views.data();
  spec.vocab_size = views.size();
  spec.merges = merges.data();
  spec.num_merges = merges.size();
  spec.added = added.data();
  spec.num_added = added.size();
  spec.pattern = pattern;
  spec.add_bos = (flags & 8) != 0;
  spec.bos_id = spec.add_bos ? int32_t(flags >> 5) + 'A' : -1;  // a byte symbol

  Allocator alloc;
  Tokenizer* tok = nullptr;
  kiln_error_t err;
  kiln_status_t st = Tokenizer::Create(spec, &alloc, &tok, &err);
  if (st != KILN_OK) {
    FUZZ_CHECK(tok == nullptr);
    FUZZ_CHECK(st == KILN_ERROR_ARTIFACT_TOKENIZER);
    return;
  }
  std::string text = in.Bytes(in.n);
  CheckRoundTrip(tok, text.data(), text.size(), &alloc);
  CheckDecodeAny(tok, reinterpret_cast<const uint8_t*>(text.data()), text.size(), &alloc);
  for (const TokenizerSpec::Added& a : added) {
    FUZZ_CHECK(tok->TokenToId(a.content) == a.id);
    FUZZ_CHECK(tok->IsSpecial(a.id) == a.special);
  }
  Tokenizer::Destroy(tok);
}

#ifdef KILN_FUZZ_TOKENIZER_JSON
// A temporary file per process, removed at exit.
const std::string& TempPath() {
  static std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    std::string p = std::string(dir && *dir ? dir : "/tmp") + "/kiln-fuzz-tokenizer-" +
                    std::to_string(getpid()) + ".json";
    std::atexit([] { std::remove(TempPath().c_str()); });
    return p;
  }();
  return path;
}

void FuzzJson(const uint8_t* data, size_t size) {
  const std::string& path = TempPath();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  kiln::TokenizerData tok;
  std::optional<std::string> error = kiln::readTokenizerJson(path, tok);
  if (error) return;

  // What the compiler accepts goes into artifacts: the runtime either builds it or
  // rejects it with KILN_ERROR_ARTIFACT_TOKENIZER, and then encodes and decodes.
  if (tok.vocab.size() > (1u << 20) || tok.merges.size() > (1u << 20)) return;
  std::vector<std::string_view> views(tok.vocab.begin(), tok.vocab.end());
  std::vector<TokenizerSpec::Merge> merges;
  for (auto& m : tok.merges) merges.push_back({m.first, m.second});
  std::vector<TokenizerSpec::Added> added;
  for (auto& a : tok.added) added.push_back({a.id, a.content, a.special});
  TokenizerSpec spec;
  spec.pretokenizer = tok.pretokenizer == kiln::TokenizerData::PreTokenizer::Split ? TokenizerSpec::PreTokenizer::kSplit
                      : tok.pretokenizer == kiln::TokenizerData::PreTokenizer::Metaspace
                          ? TokenizerSpec::PreTokenizer::kMetaspace
                          : TokenizerSpec::PreTokenizer::kGpt2;
  spec.sentencepiece.prepend = tok.prepend;
  spec.sentencepiece.prepend_scheme = tok.prependScheme == kiln::TokenizerData::PrependScheme::First ? TokenizerSpec::PrependScheme::kFirst
                        : tok.prependScheme == kiln::TokenizerData::PrependScheme::Never
                            ? TokenizerSpec::PrependScheme::kNever
                            : TokenizerSpec::PrependScheme::kAlways;
  spec.sentencepiece.byte_fallback = tok.byteFallback;
  spec.sentencepiece.unk_id = tok.unkId;
  spec.sentencepiece.fuse_unk = tok.fuseUnk;
  spec.sentencepiece.decode_strip = tok.decodeStrip;
  spec.pattern = tok.pattern;
  spec.vocab = views.data();
  spec.vocab_size = views.size();
  spec.merges = merges.data();
  spec.num_merges = merges.size();
  spec.added = added.data();
  spec.num_added = added.size();
  spec.bos_id = tok.bosId;
  spec.add_bos = tok.addBos;
  spec.ignore_merges = tok.ignoreMerges;
  Allocator alloc;
  Tokenizer* rt = nullptr;
  kiln_error_t err;
  kiln_status_t st = Tokenizer::Create(spec, &alloc, &rt, &err);
  if (st != KILN_OK) {
    FUZZ_CHECK(st == KILN_ERROR_ARTIFACT_TOKENIZER);
    return;
  }
  static const char kText[] = "Hello world, it's 2024! \xc3\xa9\xe2\x82\xac  x\n<|endoftext|>";
  Vec<int32_t> ids(&alloc);
  st = rt->Encode(kText, sizeof(kText) - 1, true, &ids, &err);
  FUZZ_CHECK(st == KILN_OK || st == KILN_ERROR_INTERNAL);
  if (st == KILN_OK) {
    Vec<char> back(&alloc);
    FUZZ_CHECK(rt->Decode(ids.data(), ids.size(), false, &back, &err) == KILN_OK);
  }
  Tokenizer::Destroy(rt);
}
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
#ifdef KILN_FUZZ_TOKENIZER_JSON
  if (size > 0 && data[0] == '{') {
    FuzzJson(data, size);
    return 0;
  }
#endif
  if (size > 0 && data[0] == '{') return 0;  // tokenizer.json seeds in runtime-only builds
  FuzzSpec(data, size);
  return 0;
}
