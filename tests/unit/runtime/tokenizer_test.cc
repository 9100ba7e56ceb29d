// The runtime's byte-level BPE tokenizer (runtime/src/tokenizer).
//
// Two kinds of tests:
//  - against the Python reference (tests/models/kiln_models/tokenizer.py), through
//    vectors that gen_tokenizer_vectors.py writes into the directory named by the
//    environment variable KILN_TOKENIZER_VECTORS (skipped when it is unset);
//  - on small tokenizers built here: invalid specs, invalid input, allocation failure,
//    streaming, long and random inputs.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include "runtime/threads_available.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::rt {
namespace {

// ---------------------------------------------------------------------------- helpers

std::string FromHex(const std::string& hex) {
  std::string out;
  if (hex == "-") return out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<int32_t> ParseIds(const std::string& field) {
  std::vector<int32_t> ids;
  if (field == "-") return ids;
  std::stringstream ss(field);
  std::string item;
  while (std::getline(ss, item, ',')) ids.push_back(static_cast<int32_t>(std::stoll(item)));
  return ids;
}

std::string Printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
    if (out.size() > 160) return out + "...";
  }
  return out;
}

std::vector<int32_t> ToStd(const Vec<int32_t>& v) { return std::vector<int32_t>(v.begin(), v.end()); }
std::string ToStd(const Vec<char>& v) { return std::string(v.begin(), v.end()); }

// GPT-2's bytes_to_unicode as UTF-8 strings: the byte-level form of each byte.
const std::vector<std::string>& ByteLevelChars() {
  static const std::vector<std::string> chars = [] {
    std::vector<std::string> c(256);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      int cp = printable ? b : 256 + extra++;
      if (cp < 0x80)
        c[b] = std::string(1, static_cast<char>(cp));
      else
        c[b] = std::string{static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    return c;
  }();
  return chars;
}

std::string ToByteLevel(const std::string& raw) {
  std::string out;
  for (unsigned char c : raw) out += ByteLevelChars()[c];
  return out;
}

// A TokenizerSpec together with the storage its views point at.
struct OwnedSpec {
  struct AddedEntry {
    int32_t id;
    std::string content;
    bool special;
  };
  std::vector<std::string> vocab_text;
  std::vector<TokenizerSpec::Merge> merges;
  std::vector<AddedEntry> added_entries;
  TokenizerSpec spec;
  std::vector<std::string_view> vocab_views;
  std::vector<TokenizerSpec::Added> added_views;

  // Points `spec` at the storage; call after every change.
  const TokenizerSpec& Build() {
    vocab_views.assign(vocab_text.begin(), vocab_text.end());
    added_views.clear();
    for (const AddedEntry& a : added_entries) added_views.push_back({a.id, a.content, a.special});
    spec.vocab = vocab_views.data();
    spec.vocab_size = vocab_views.size();
    spec.merges = merges.data();
    spec.num_merges = merges.size();
    spec.added = added_views.data();
    spec.num_added = added_views.size();
    return spec;
  }
  int32_t Id(const std::string& byte_level) const {
    for (size_t i = 0; i < vocab_text.size(); ++i)
      if (!byte_level.empty() && vocab_text[i] == byte_level) return static_cast<int32_t>(i);
    return -1;
  }
  int32_t RawId(const std::string& raw) const { return Id(ToByteLevel(raw)); }
  // Adds the merge of two raw strings (and their concatenation to the vocabulary).
  void AddMerge(const std::string& left_raw, const std::string& right_raw) {
    int32_t l = RawId(left_raw), r = RawId(right_raw);
    if (l < 0 || r < 0) std::abort();
    std::string joined = vocab_text[l] + vocab_text[r];
    if (Id(joined) < 0) vocab_text.push_back(joined);
    merges.push_back({static_cast<uint32_t>(l), static_cast<uint32_t>(r)});
  }
  // An added token with a fresh id (vocab entry "").
  int32_t AddAdded(const std::string& content, bool special) {
    auto id = static_cast<int32_t>(vocab_text.size());
    vocab_text.emplace_back();
    added_entries.push_back({id, content, special});
    return id;
  }
};

// 256 byte tokens (id = byte value), merges making "he", "ll", "hell", "hello", " w",
// an added special BOS "<s>" and an added non-special "[SEP]".
OwnedSpec SmallSpec() {
  OwnedSpec s;
  s.vocab_text = ByteLevelChars();
  s.AddMerge("h", "e");
  s.AddMerge("l", "l");
  s.AddMerge("he", "ll");
  s.AddMerge("hell", "o");
  s.AddMerge(" ", "w");
  s.spec.bos_id = s.AddAdded("<s>", true);
  s.AddAdded("[SEP]", false);
  s.spec.add_bos = true;
  s.Build();
  return s;
}

// An allocator that fails after a given number of allocations (thread-safe).
struct FailingAllocator {
  std::atomic<long> remaining{1L << 40};
  kiln_allocator_t raw{&FailingAllocator::AllocFn, &FailingAllocator::FreeFn, this};

  static void* AllocFn(void* user, size_t size, size_t alignment) {
    auto* self = static_cast<FailingAllocator*>(user);
    if (self->remaining.fetch_sub(1) <= 0) return nullptr;
    void* p = nullptr;
    if (alignment < sizeof(void*)) alignment = sizeof(void*);
    if (posix_memalign(&p, alignment, size == 0 ? 1 : size) != 0) return nullptr;
    return p;
  }
  static void FreeFn(void*, void* ptr) { std::free(ptr); }
};

struct TokenizerDeleter {
  void operator()(Tokenizer* t) const { Tokenizer::Destroy(t); }
};
using TokenizerPtr = std::unique_ptr<Tokenizer, TokenizerDeleter>;

TokenizerPtr MakeTokenizer(const TokenizerSpec& spec, Allocator* allocator) {
  Tokenizer* t = nullptr;
  kiln_error_t error{};
  kiln_status_t status = Tokenizer::Create(spec, allocator, &t, &error);
  EXPECT_EQ(status, KILN_OK) << error.message;
  return TokenizerPtr(t);
}

kiln_status_t CreateStatus(const TokenizerSpec& spec, std::string* message = nullptr) {
  Allocator allocator;
  Tokenizer* t = reinterpret_cast<Tokenizer*>(0x1);
  kiln_error_t error{};
  kiln_status_t status = Tokenizer::Create(spec, &allocator, &t, &error);
  if (status == KILN_OK) {
    Tokenizer::Destroy(t);
  } else {
    EXPECT_EQ(t, nullptr);
    EXPECT_EQ(error.status, status);
    EXPECT_GT(std::strlen(error.message), 0u);
  }
  EXPECT_EQ(allocator.current_bytes(), 0u) << "leak";
  if (message != nullptr) *message = error.message;
  return status;
}

std::vector<int32_t> EncodeOk(const Tokenizer& t, const std::string& text, bool add_special = false) {
  Allocator allocator;
  Vec<int32_t> ids(&allocator);
  kiln_error_t error{};
  kiln_status_t status = t.Encode(text.data(), text.size(), add_special, &ids, &error);
  EXPECT_EQ(status, KILN_OK) << error.message << " for '" << Printable(text) << "'";
  return ToStd(ids);
}

std::string DecodeOk(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special = false) {
  Allocator allocator;
  Vec<char> text(&allocator);
  kiln_error_t error{};
  kiln_status_t status = t.Decode(ids.data(), ids.size(), skip_special, &text, &error);
  EXPECT_EQ(status, KILN_OK) << error.message;
  return ToStd(text);
}

// Streams `ids` the way a generation loop would: raw token bytes, text emitted only for
// complete characters, the rest flushed with replacement at the end.
std::string DecodeStreaming(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
  Allocator allocator;
  Vec<char> pending(&allocator);
  Vec<char> text(&allocator);
  for (int32_t id : ids) {
    kiln_error_t error{};
    EXPECT_EQ(t.AppendTokenBytes(id, skip_special, &pending, &error), KILN_OK) << error.message;
    size_t ready = Utf8CompleteLength(pending.data(), pending.size());
    EXPECT_TRUE(AppendUtf8Replacing(pending.data(), ready, &text));
    std::string rest(pending.data() + ready, pending.size() - ready);
    pending.clear();
    EXPECT_TRUE(pending.append(rest.data(), rest.size()));
  }
  EXPECT_TRUE(AppendUtf8Replacing(pending.data(), pending.size(), &text));
  return ToStd(text);
}

// ---------------------------------------------------------------------------- vectors

struct VectorCase {
  enum Kind { kEncode, kDecode, kDecodeError } kind;
  bool flag = false;  // add_special / skip_special
  std::string text;
  std::vector<int32_t> ids;
};

struct VectorTokenizer {
  std::string name;
  std::string pattern;  // the Python pattern text (for the kSplit variant)
  OwnedSpec owned;
  std::vector<VectorCase> cases;
};

struct Utf8Case {
  std::string bytes;
  bool valid;
  size_t complete;
  std::string replaced;
};

const char* VectorsDir() {
  const char* dir = std::getenv("KILN_TOKENIZER_VECTORS");
#ifdef KILN_DEFAULT_TOKENIZER_VECTORS
  if (dir == nullptr) dir = KILN_DEFAULT_TOKENIZER_VECTORS;  // the ctest fixture's output
#endif
  return dir;
}

std::vector<std::string> SplitFields(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream ss(line);
  std::string f;
  while (ss >> f) fields.push_back(f);
  return fields;
}

bool LoadTokenizer(const std::string& path, VectorTokenizer* out, std::string* why) {
  std::ifstream in(path);
  if (!in) {
    *why = "cannot open " + path;
    return false;
  }
  std::string line;
  if (!std::getline(in, line) || line != "kiln-tokenizer-vectors 1") {
    *why = path + ": not a version-1 vector file";
    return false;
  }
  OwnedSpec& s = out->owned;
  while (std::getline(in, line)) {
    std::vector<std::string> f = SplitFields(line);
    if (f.empty()) continue;
    const std::string& k = f[0];
    if (k == "pretokenizer" && f.size() == 2) {
      s.spec.pretokenizer = f[1] == "llama3" ? TokenizerSpec::PreTokenizer::kLlama3
                                             : TokenizerSpec::PreTokenizer::kGpt2;
    } else if (k == "pattern" && f.size() == 2) {
      out->pattern = FromHex(f[1]);
    } else if (k == "vocab_size" && f.size() == 2) {
      s.vocab_text.assign(std::stoul(f[1]), std::string());
    } else if (k == "bos_id" && f.size() == 2) {
      s.spec.bos_id = std::stoi(f[1]);
    } else if (k == "add_bos" && f.size() == 2) {
      s.spec.add_bos = f[1] == "1";
    } else if (k == "ignore_merges" && f.size() == 2) {
      s.spec.ignore_merges = f[1] == "1";
    } else if (k == "vocab" && f.size() == 3) {
      size_t id = std::stoul(f[1]);
      if (id >= s.vocab_text.size()) {
        *why = path + ": vocab id beyond vocab_size";
        return false;
      }
      s.vocab_text[id] = FromHex(f[2]);
    } else if (k == "merge" && f.size() == 3) {
      s.merges.push_back({static_cast<uint32_t>(std::stoul(f[1])), static_cast<uint32_t>(std::stoul(f[2]))});
    } else if (k == "added" && f.size() == 4) {
      s.added_entries.push_back({std::stoi(f[1]), FromHex(f[3]), f[2] == "1"});
    } else if (k == "encode" && f.size() == 4) {
      out->cases.push_back({VectorCase::kEncode, f[1] == "1", FromHex(f[2]), ParseIds(f[3])});
    } else if (k == "decode" && f.size() == 4) {
      out->cases.push_back({VectorCase::kDecode, f[1] == "1", FromHex(f[3]), ParseIds(f[2])});
    } else if (k == "decode_error" && f.size() == 2) {
      out->cases.push_back({VectorCase::kDecodeError, false, std::string(), ParseIds(f[1])});
    } else {
      *why = path + ": cannot parse '" + line.substr(0, 80) + "'";
      return false;
    }
  }
  s.Build();
  return true;
}

// Loaded once for all tests (nullptr when the variable is unset).
const std::vector<VectorTokenizer>* Vectors() {
  static const std::vector<VectorTokenizer>* vectors = []() -> const std::vector<VectorTokenizer>* {
    const char* dir = VectorsDir();
    if (dir == nullptr) return nullptr;
    auto* all = new std::vector<VectorTokenizer>();
    std::ifstream manifest(std::string(dir) + "/manifest.txt");
    std::string name;
    while (std::getline(manifest, name)) {
      if (name.empty()) continue;
      all->emplace_back();
      all->back().name = name;
      std::string why;
      if (!LoadTokenizer(std::string(dir) + "/" + name + ".txt", &all->back(), &why)) {
        ADD_FAILURE() << why;
        all->pop_back();
      }
    }
    return all;
  }();
  return vectors;
}

#define REQUIRE_VECTORS()                                                       \
  do {                                                                          \
    if (VectorsDir() == nullptr) GTEST_SKIP() << "KILN_TOKENIZER_VECTORS is not set"; \
    ASSERT_NE(Vectors(), nullptr);                                              \
    ASSERT_GE(Vectors()->size(), 5u) << "manifest.txt lists too few tokenizers"; \
  } while (0)

const VectorTokenizer& VectorNamed(const std::string& name) {
  for (const VectorTokenizer& v : *Vectors())
    if (v.name == name) return v;
  std::abort();
}

TEST(TokenizerVectors, EncodeAndDecodeMatchPythonReference) {
  REQUIRE_VECTORS();
  size_t checked = 0;
  for (const VectorTokenizer& v : *Vectors()) {
    ASSERT_FALSE(v.pattern.empty()) << v.name;
    // 0: the built-in pre-tokenizer; 1: the same regex given as a kSplit pattern.
    for (int variant : {0, 1}) {
      SCOPED_TRACE(v.name + (variant == 0 ? " (built-in)" : " (kSplit)"));
      OwnedSpec owned = v.owned;
      if (variant == 1) {
        owned.spec.pretokenizer = TokenizerSpec::PreTokenizer::kSplit;
        owned.spec.pattern = v.pattern;
      }
      Allocator allocator;
      TokenizerPtr t = MakeTokenizer(owned.Build(), &allocator);
      ASSERT_NE(t, nullptr);
      for (const VectorCase& c : v.cases) {
        Allocator out_allocator;
        kiln_error_t error{};
        if (c.kind == VectorCase::kEncode) {
          Vec<int32_t> ids(&out_allocator);
          ASSERT_TRUE(ids.push_back(-7));  // Encode appends
          ASSERT_EQ(t->Encode(c.text.data(), c.text.size(), c.flag, &ids, &error), KILN_OK)
              << error.message;
          std::vector<int32_t> got = ToStd(ids);
          ASSERT_EQ(got.front(), -7);
          got.erase(got.begin());
          EXPECT_EQ(got, c.ids) << "encode(add_special=" << c.flag << ") of '" << Printable(c.text) << "'";
        } else if (c.kind == VectorCase::kDecode) {
          Vec<char> text(&out_allocator);
          ASSERT_TRUE(text.append("pre", 3));  // Decode appends
          ASSERT_EQ(t->Decode(c.ids.data(), c.ids.size(), c.flag, &text, &error), KILN_OK)
              << error.message;
          EXPECT_EQ(ToStd(text), "pre" + c.text) << "decode(skip_special=" << c.flag << ")";
        } else {
          Vec<char> text(&out_allocator);
          ASSERT_TRUE(text.append("pre", 3));
          EXPECT_EQ(t->Decode(c.ids.data(), c.ids.size(), false, &text, &error), KILN_ERROR_INPUT_TOKENS);
          EXPECT_EQ(error.status, KILN_ERROR_INPUT_TOKENS);
          EXPECT_EQ(ToStd(text), "pre") << "output changed on error";
          if (c.ids.size() == 1) {
            EXPECT_EQ(t->AppendTokenBytes(c.ids[0], false, &text, &error), KILN_ERROR_INPUT_TOKENS);
            EXPECT_FALSE(t->IsSpecial(c.ids[0]));
          }
        }
        ++checked;
      }
      t.reset();
      EXPECT_EQ(allocator.current_bytes(), 0u) << "leak";
    }
  }
  EXPECT_GT(checked, 10000u);
  std::printf("[          ] %zu vector cases checked\n", checked);
}

TEST(TokenizerVectors, StreamingDecodeMatchesDecode) {
  REQUIRE_VECTORS();
  for (const VectorTokenizer& v : *Vectors()) {
    SCOPED_TRACE(v.name);
    Allocator allocator;
    TokenizerPtr t = MakeTokenizer(v.owned.spec, &allocator);
    ASSERT_NE(t, nullptr);
    for (const VectorCase& c : v.cases) {
      if (c.kind != VectorCase::kDecode) continue;
      EXPECT_EQ(DecodeStreaming(*t, c.ids, c.flag), c.text);
    }
  }
}

TEST(TokenizerVectors, LookupsMatchSpec) {
  REQUIRE_VECTORS();
  for (const VectorTokenizer& v : *Vectors()) {
    SCOPED_TRACE(v.name);
    Allocator allocator;
    TokenizerPtr t = MakeTokenizer(v.owned.spec, &allocator);
    ASSERT_NE(t, nullptr);
    const OwnedSpec& s = v.owned;
    EXPECT_EQ(t->vocab_size(), static_cast<int32_t>(s.vocab_text.size()));
    std::map<std::string, int32_t> added;
    for (const auto& a : s.added_entries) added[a.content] = a.id;
    for (size_t id = 0; id < s.vocab_text.size(); ++id) {
      const std::string& tok = s.vocab_text[id];
      if (tok.empty()) continue;
      int32_t expected = added.count(tok) ? added[tok] : static_cast<int32_t>(id);
      EXPECT_EQ(t->TokenToId(tok), expected) << Printable(tok);
    }
    for (const auto& a : s.added_entries) {
      EXPECT_EQ(t->TokenToId(a.content), a.id);
      EXPECT_TRUE(t->IsSpecial(a.id));
    }
    EXPECT_EQ(t->TokenToId(""), -1);
    EXPECT_EQ(t->TokenToId("definitely not a token \x01"), -1);
    EXPECT_FALSE(t->IsSpecial(-1));
    EXPECT_FALSE(t->IsSpecial(t->vocab_size()));
    EXPECT_FALSE(t->IsSpecial(s.RawId("a")));
  }
}

TEST(TokenizerVectors, ConcurrentEncodeIsConsistent) {
  REQUIRE_VECTORS();
  if (!ThreadsWork()) GTEST_SKIP() << "threads cannot be started here (qemu-user?)";
  const VectorTokenizer& v = VectorNamed("llama3");
  {
    OwnedSpec owned = v.owned;
    Allocator allocator;
    TokenizerPtr t = MakeTokenizer(owned.Build(), &allocator);
    ASSERT_NE(t, nullptr);
    std::atomic<int> mismatches{0};
    std::vector<std::thread> threads;
    for (int k = 0; k < 4; ++k) {
      threads.emplace_back([&, k] {
        for (size_t i = k; i < v.cases.size(); i += 2) {
          const VectorCase& c = v.cases[i];
          if (c.kind != VectorCase::kEncode) continue;
          Allocator out_allocator;
          Vec<int32_t> ids(&out_allocator);
          kiln_error_t error{};
          if (t->Encode(c.text.data(), c.text.size(), c.flag, &ids, &error) != KILN_OK ||
              ToStd(ids) != c.ids)
            ++mismatches;
        }
      });
    }
    for (std::thread& th : threads) th.join();
    EXPECT_EQ(mismatches.load(), 0);
  }
}

// tokenizer.py's merge loop, written naively (quadratic) over ids.
std::vector<int32_t> NaiveBpe(const OwnedSpec& s, const std::string& raw) {
  std::unordered_map<std::string, int32_t> ids;
  for (size_t i = 0; i < s.vocab_text.size(); ++i)
    if (!s.vocab_text[i].empty()) ids[s.vocab_text[i]] = static_cast<int32_t>(i);
  std::map<std::pair<int32_t, int32_t>, size_t> ranks;
  for (size_t r = 0; r < s.merges.size(); ++r)
    ranks[{static_cast<int32_t>(s.merges[r].left), static_cast<int32_t>(s.merges[r].right)}] = r;
  std::vector<int32_t> word;
  for (unsigned char c : raw) word.push_back(ids.at(ByteLevelChars()[c]));
  while (word.size() > 1) {
    size_t best = SIZE_MAX;
    std::pair<int32_t, int32_t> pair;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = ranks.find({word[i], word[i + 1]});
      if (it != ranks.end() && it->second < best) {
        best = it->second;
        pair = it->first;
      }
    }
    if (best == SIZE_MAX) break;
    int32_t merged = ids.at(s.vocab_text[pair.first] + s.vocab_text[pair.second]);
    std::vector<int32_t> out;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == pair.first && word[i + 1] == pair.second) {
        out.push_back(merged);
        i += 2;
      } else {
        out.push_back(word[i]);
        i += 1;
      }
    }
    word.swap(out);
  }
  return word;
}

TEST(TokenizerVectors, HeapBpeMatchesNaiveBpeOnRandomWords) {
  REQUIRE_VECTORS();
  std::mt19937 rng(7);
  for (const char* name : {"gpt2", "handmade"}) {
    SCOPED_TRACE(name);
    const VectorTokenizer& v = VectorNamed(name);
    Allocator allocator;
    TokenizerPtr t = MakeTokenizer(v.owned.spec, &allocator);
    ASSERT_NE(t, nullptr);
    // Letters only: each word is a single GPT-2 pre-token.
    const std::string alphabet = std::string(name) == "handmade" ? "abc" : "etaoinshrdlcu";
    for (int trial = 0; trial < 300; ++trial) {
      size_t n = 1 + rng() % (trial < 250 ? 40 : 1500);
      std::string word;
      for (size_t i = 0; i < n; ++i) word.push_back(alphabet[rng() % alphabet.size()]);
      ASSERT_EQ(EncodeOk(*t, word), NaiveBpe(v.owned, word)) << word;
    }
  }
}

TEST(TokenizerVectors, Utf8HelpersMatchPython) {
  REQUIRE_VECTORS();
  std::ifstream in(std::string(VectorsDir()) + "/utf8.txt");
  ASSERT_TRUE(in) << "utf8.txt missing";
  std::string line;
  size_t count = 0;
  while (std::getline(in, line)) {
    std::vector<std::string> f = SplitFields(line);
    ASSERT_EQ(f.size(), 5u) << line;
    std::string bytes = FromHex(f[1]);
    bool valid = f[2] == "1";
    size_t complete = std::stoul(f[3]);
    std::string replaced = FromHex(f[4]);
    SCOPED_TRACE(f[1]);
    size_t bad = 12345;
    EXPECT_EQ(IsValidUtf8(bytes.data(), bytes.size(), &bad), valid);
    if (!valid) EXPECT_LT(bad, bytes.size());
    EXPECT_EQ(Utf8CompleteLength(bytes.data(), bytes.size()), complete);
    Allocator allocator;
    Vec<char> out(&allocator);
    ASSERT_TRUE(AppendUtf8Replacing(bytes.data(), bytes.size(), &out));
    EXPECT_EQ(ToStd(out), replaced);
    ++count;
  }
  EXPECT_GT(count, 1000u);
}

std::string EnglishText(size_t bytes) {
  const std::string paragraph =
      "How do I install this part? Start by switching off the power at the breaker and "
      "checking that the old fitting is cold. Remove the two screws that hold the cover, "
      "lift the cover away, and keep the screws in a small cup so that none of them rolls "
      "under the cabinet. The new bracket has 4 holes; line up the two larger holes with "
      "the marks on the wall (don't tighten them all the way yet).\n\n";
  std::string text;
  while (text.size() < bytes) text += paragraph;
  return text;
}

double Millis(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

// Long inputs must round-trip and finish (no quadratic blow-up). Times are printed,
// not asserted: speed is for benchmarks.
TEST(TokenizerVectors, LongInputsRoundTrip) {
  REQUIRE_VECTORS();
  std::mt19937 rng(11);
  std::string random_word;
  for (int i = 0; i < 10000; ++i) random_word.push_back(static_cast<char>('a' + rng() % 26));
  std::string long_random_word;
  for (int i = 0; i < 100000; ++i) long_random_word.push_back(static_cast<char>('a' + rng() % 26));
  const std::pair<const char*, std::string> inputs[] = {
      {"100 KB English", EnglishText(100 * 1024)},
      {"10,000 spaces", std::string(10000, ' ')},
      {"200,000 spaces then a word", std::string(200000, ' ') + "word"},
      {"200,000 newlines and spaces", [] {
         std::string s;
         for (int i = 0; i < 50000; ++i) s += " \n \r";
         return s;
       }()},
      {"10,000-letter random word", random_word},
      {"100,000-letter random word", long_random_word},
      {"100,000 digits", std::string(100000, '7')},
      {"100,000 punctuation", std::string(100000, '!')},
      {"100,000 < (added-token prefixes)", std::string(100000, '<')},
  };
  for (const char* name : {"gpt2", "llama3", "llama3_ignore"}) {
    const VectorTokenizer& v = VectorNamed(name);
    {
      OwnedSpec owned = v.owned;
      Allocator allocator;
      TokenizerPtr t = MakeTokenizer(owned.Build(), &allocator);
      ASSERT_NE(t, nullptr);
      for (const auto& [label, text] : inputs) {
        SCOPED_TRACE(std::string(name) + ": " + label);
        auto start = std::chrono::steady_clock::now();
        std::vector<int32_t> ids = EncodeOk(*t, text);
        double ms = Millis(start);
        EXPECT_EQ(DecodeOk(*t, ids), text);
        std::printf("[          ] %-14s %-34s %8zu bytes -> %7zu ids in %8.2f ms\n", name, label, text.size(),
                    ids.size(), ms);
      }
    }
  }
}

// ---------------------------------------------------------------------------- small specs

TEST(Tokenizer, EncodesDecodesAndAddsBos) {
  OwnedSpec s = SmallSpec();
  Allocator allocator;
  TokenizerPtr t = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(t, nullptr);
  const int32_t hello = s.RawId("hello"), space_w = s.RawId(" w"), bos = s.spec.bos_id;
  const int32_t sep = t->TokenToId("[SEP]");
  ASSERT_GE(hello, 0);
  ASSERT_GE(sep, 0);
  EXPECT_EQ(EncodeOk(*t, "hello world"),
            (std::vector<int32_t>{hello, space_w, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(EncodeOk(*t, "hello", true), (std::vector<int32_t>{bos, hello}));
  EXPECT_EQ(EncodeOk(*t, "", true), (std::vector<int32_t>{bos}));
  EXPECT_EQ(EncodeOk(*t, ""), (std::vector<int32_t>{}));
  EXPECT_EQ(EncodeOk(*t, "<s>hello[SEP]<s"), (std::vector<int32_t>{bos, hello, sep, '<', 's'}));
  EXPECT_EQ(DecodeOk(*t, {bos, hello, sep, space_w}), "<s>hello[SEP] w");
  // Only special added tokens are skipped.
  EXPECT_EQ(DecodeOk(*t, {bos, hello, sep, space_w}, true), "hello[SEP] w");
  EXPECT_TRUE(t->IsSpecial(bos));
  EXPECT_FALSE(t->IsSpecial(sep));
  EXPECT_EQ(t->bos_id(), bos);
  EXPECT_TRUE(t->adds_bos());
  Vec<char> bytes(&allocator);
  EXPECT_EQ(t->AppendTokenBytes(bos, true, &bytes, nullptr), KILN_OK);
  EXPECT_EQ(bytes.size(), 0u);
  EXPECT_EQ(t->AppendTokenBytes(space_w, true, &bytes, nullptr), KILN_OK);
  EXPECT_EQ(ToStd(bytes), " w");
}

TEST(Tokenizer, MergesFollowTheReferenceOrder) {
  // Rank 0 merges "ab"+"a" before rank 1 makes "ab". tokenizer.py merges every "a b"
  // first, giving [ab, ab] for "abab" (Hugging Face's heap would give [aba, b]).
  OwnedSpec s;
  s.vocab_text = ByteLevelChars();
  s.vocab_text.push_back("ab");
  s.vocab_text.push_back("aba");
  s.merges.push_back({static_cast<uint32_t>(s.Id("ab")), 'a'});
  s.merges.push_back({'a', 'b'});
  s.Build();
  Allocator allocator;
  TokenizerPtr t = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(t, nullptr);
  const int32_t ab = s.Id("ab"), aba = s.Id("aba");
  EXPECT_EQ(EncodeOk(*t, "abab"), (std::vector<int32_t>{ab, ab}));
  EXPECT_EQ(EncodeOk(*t, "aba"), (std::vector<int32_t>{aba}));
  EXPECT_EQ(EncodeOk(*t, "ababa"), (std::vector<int32_t>{ab, aba}));
}

TEST(Tokenizer, IgnoreMergesEmitsWholeWords) {
  OwnedSpec s = SmallSpec();
  s.vocab_text.push_back(ToByteLevel("world"));  // no merge makes it
  s.spec.ignore_merges = true;
  s.Build();
  Allocator allocator;
  TokenizerPtr t = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(EncodeOk(*t, "world"), (std::vector<int32_t>{s.RawId("world")}));
  EXPECT_EQ(EncodeOk(*t, "worlds"), (std::vector<int32_t>{'w', 'o', 'r', 'l', 'd', 's'}));
  s.spec.ignore_merges = false;
  TokenizerPtr plain = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(EncodeOk(*plain, "world"), (std::vector<int32_t>{'w', 'o', 'r', 'l', 'd'}));
}

TEST(Tokenizer, SplitPatternFromTheArtifact) {
  OwnedSpec s = SmallSpec();
  s.AddMerge("1", "2");
  s.Build();
  s.spec.pretokenizer = TokenizerSpec::PreTokenizer::kSplit;
  Allocator allocator;
  // Qwen2's regex takes one digit at a time (Llama-3's up to three).
  s.spec.pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  TokenizerPtr qwen2 = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(qwen2, nullptr);
  EXPECT_EQ(EncodeOk(*qwen2, "123"), (std::vector<int32_t>{'1', '2', '3'}));
  s.spec.pretokenizer = TokenizerSpec::PreTokenizer::kLlama3;
  TokenizerPtr llama3 = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(llama3, nullptr);
  EXPECT_EQ(EncodeOk(*llama3, "123"), (std::vector<int32_t>{s.RawId("12"), '3'}));

  // Text no alternative matches is a pre-token of its own (Hugging Face's Split).
  s.spec.pretokenizer = TokenizerSpec::PreTokenizer::kSplit;
  s.spec.pattern = R"(\d+)";
  TokenizerPtr digits = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(digits, nullptr);
  const int32_t hello = s.RawId("hello");
  EXPECT_EQ(EncodeOk(*digits, "hello"), (std::vector<int32_t>{hello}));
  EXPECT_EQ(EncodeOk(*digits, "hello12hello"), (std::vector<int32_t>{hello, s.RawId("12"), hello}));

  // Empty matches make no pre-token and do not stall.
  s.spec.pattern = "a*";
  TokenizerPtr empty = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(empty, nullptr);
  for (const std::string text : {"", "b", "baab", "aaa", "xyz", "日本a"})
    EXPECT_EQ(DecodeOk(*empty, EncodeOk(*empty, text)), text);

  // \s and \S mean Unicode White_Space (U+180E is not one); \Q..\E stays literal.
  s.vocab_text.push_back(ToByteLevel("a\u180e" "b"));
  s.vocab_text.push_back(ToByteLevel("\\s"));
  s.spec.ignore_merges = true;
  s.spec.pattern = R"(\S+|\s+)";
  s.Build();
  TokenizerPtr spaces = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(spaces, nullptr);
  EXPECT_EQ(EncodeOk(*spaces, "a\u180e" "b"), (std::vector<int32_t>{s.Id(ToByteLevel("a\u180e" "b"))}));
  s.spec.pattern = R"(\Q\s\E|[\s\]x]+)";
  TokenizerPtr literal = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(literal, nullptr);
  EXPECT_EQ(EncodeOk(*literal, "\\s"), (std::vector<int32_t>{s.Id(ToByteLevel("\\s"))}));
  EXPECT_EQ(EncodeOk(*literal, " ]x"), (std::vector<int32_t>{s.RawId(" "), ']', 'x'}));

  // A regex the engine refuses, and a Split without one.
  s.spec.pattern = "(unclosed";
  std::string message;
  EXPECT_EQ(CreateStatus(s.spec, &message), KILN_ERROR_ARTIFACT_TOKENIZER);
  EXPECT_NE(message.find("(unclosed"), std::string::npos) << message;
  s.spec.pattern = std::string_view();
  EXPECT_EQ(CreateStatus(s.spec), KILN_ERROR_ARTIFACT_TOKENIZER);
  s.spec.pattern = "\xff";
  EXPECT_EQ(CreateStatus(s.spec), KILN_ERROR_ARTIFACT_TOKENIZER);
}

TEST(Tokenizer, RejectsInvalidUtf8) {
  OwnedSpec s = SmallSpec();
  Allocator allocator;
  TokenizerPtr t = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(t, nullptr);
  const std::string bad[] = {
      "\x80",         "abc\xff",          "\xc0\xaf",          "\xc1\xbf",     "\xe0\x80\xaf",
      "\xed\xa0\x80", /* surrogate */     "\xf4\x90\x80\x80", /* > U+10FFFF */ "\xf5\x80\x80\x80",
      "\xe6\x97",     /* truncated */     "hello \xf0\x9f\x91", "\xc3",       "\xc3\x28",
      "ok<s>\xfe",    std::string("a\0\x80", 3),
  };
  for (const std::string& text : bad) {
    Vec<int32_t> ids(&allocator);
    ASSERT_TRUE(ids.push_back(42));
    kiln_error_t error{};
    EXPECT_EQ(t->Encode(text.data(), text.size(), true, &ids, &error), KILN_ERROR_INVALID_ARGUMENT)
        << Printable(text);
    EXPECT_EQ(error.status, KILN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(error.message, "UTF-8"), nullptr) << error.message;
    EXPECT_EQ(ToStd(ids), std::vector<int32_t>{42}) << "output changed on error";
  }
  // NUL is a character like any other.
  std::string nul("a\0b", 3);
  EXPECT_EQ(DecodeOk(*t, EncodeOk(*t, nul)), nul);
}

TEST(Tokenizer, RejectsBadIdsAndArguments) {
  OwnedSpec s = SmallSpec();
  Allocator allocator;
  TokenizerPtr t = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(t, nullptr);
  const int32_t n = t->vocab_size();
  const std::vector<int32_t> bad[] = {{-1}, {n}, {INT32_MAX}, {INT32_MIN}, {'a', n + 5, 'b'}};
  for (const auto& ids : bad) {
    Vec<char> text(&allocator);
    ASSERT_TRUE(text.append("x", 1));
    kiln_error_t error{};
    EXPECT_EQ(t->Decode(ids.data(), ids.size(), false, &text, &error), KILN_ERROR_INPUT_TOKENS);
    EXPECT_EQ(error.status, KILN_ERROR_INPUT_TOKENS);
    EXPECT_EQ(ToStd(text), "x");
  }
  Vec<char> text(&allocator);
  EXPECT_EQ(t->AppendTokenBytes(-3, false, &text, nullptr), KILN_ERROR_INPUT_TOKENS);
  EXPECT_EQ(t->AppendTokenBytes(n, false, &text, nullptr), KILN_ERROR_INPUT_TOKENS);
  // Null arguments.
  Vec<int32_t> ids(&allocator);
  kiln_error_t error{};
  EXPECT_EQ(t->Encode(nullptr, 3, false, &ids, &error), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(t->Encode("abc", 3, false, nullptr, &error), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(t->Encode(nullptr, 0, false, &ids, nullptr), KILN_OK);
  EXPECT_EQ(t->Decode(nullptr, 2, false, &text, &error), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(t->Decode(nullptr, 0, false, &text, &error), KILN_OK);
  EXPECT_EQ(t->Decode(ids.data(), 0, false, nullptr, &error), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(t->AppendTokenBytes('a', false, nullptr, &error), KILN_ERROR_INVALID_ARGUMENT);
  Tokenizer* out = nullptr;
  EXPECT_EQ(Tokenizer::Create(s.spec, nullptr, &out, &error), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(Tokenizer::Create(s.spec, &allocator, nullptr, &error), KILN_ERROR_INVALID_ARGUMENT);
  Tokenizer::Destroy(nullptr);
}

TEST(TokenizerSpecValidation, AcceptsTheSmallSpec) {
  OwnedSpec s = SmallSpec();
  EXPECT_EQ(CreateStatus(s.spec), KILN_OK);
}

TEST(TokenizerSpecValidation, MergeResultNotInVocabulary) {
  OwnedSpec s = SmallSpec();
  s.merges.push_back({'x', 'y'});  // "xy" is not a token
  s.Build();
  std::string message;
  EXPECT_EQ(CreateStatus(s.spec, &message), KILN_ERROR_ARTIFACT_TOKENIZER);
  EXPECT_NE(message.find("merge 5"), std::string::npos) << message;
}

TEST(TokenizerSpecValidation, DuplicateAddedTokens) {
  OwnedSpec s = SmallSpec();
  s.AddAdded("<s>", true);  // same content, new id
  s.Build();
  EXPECT_EQ(CreateStatus(s.spec), KILN_ERROR_ARTIFACT_TOKENIZER);

  OwnedSpec t = SmallSpec();
  t.added_entries.push_back({t.spec.bos_id, "<other>", true});  // same id
  t.Build();
  EXPECT_EQ(CreateStatus(t.spec), KILN_ERROR_ARTIFACT_TOKENIZER);
}

TEST(TokenizerSpecValidation, OtherInconsistencies) {
  using Edit = void (*)(OwnedSpec*);
  const std::pair<const char*, Edit> edits[] = {
      {"empty added token", [](OwnedSpec* s) { s->AddAdded("", true); }},
      {"added id out of range", [](OwnedSpec* s) { s->added_entries.push_back({100000, "<z>", true}); }},
      {"negative added id", [](OwnedSpec* s) { s->added_entries.push_back({-1, "<z>", true}); }},
      {"added id of another token", [](OwnedSpec* s) { s->added_entries.push_back({'a', "<z>", true}); }},
      {"added token not UTF-8", [](OwnedSpec* s) { s->AddAdded("<\xff>", true); }},
      {"merge id out of range", [](OwnedSpec* s) { s->merges.push_back({'a', 1000000}); }},
      {"merge of an unused id", [](OwnedSpec* s) {
         s->merges.push_back({static_cast<uint32_t>(s->spec.bos_id), 'a'});
       }},
      {"missing byte token", [](OwnedSpec* s) { s->vocab_text[0x20] = ""; }},
      {"duplicate vocabulary entry", [](OwnedSpec* s) { s->vocab_text.push_back("he"); }},
      {"vocabulary entry not UTF-8", [](OwnedSpec* s) { s->vocab_text.push_back("\xc3"); }},
      {"BOS out of range", [](OwnedSpec* s) { s->spec.bos_id = 1 << 30; }},
      {"BOS unused id", [](OwnedSpec* s) {
         s->vocab_text.emplace_back();
         s->spec.bos_id = static_cast<int32_t>(s->vocab_text.size() - 1);
       }},
      {"empty vocabulary", [](OwnedSpec* s) {
         s->vocab_text.clear();
         s->merges.clear();
         s->added_entries.clear();
       }},
      {"unknown pre-tokenizer", [](OwnedSpec* s) {
         s->spec.pretokenizer = static_cast<TokenizerSpec::PreTokenizer>(7);
       }},
  };
  for (const auto& [name, edit] : edits) {
    OwnedSpec s = SmallSpec();
    edit(&s);
    s.Build();
    std::string message;
    EXPECT_EQ(CreateStatus(s.spec, &message), KILN_ERROR_ARTIFACT_TOKENIZER) << name;
    std::printf("[          ] %-28s -> %s\n", name, message.c_str());
  }
  // Null tables with non-zero counts.
  OwnedSpec s = SmallSpec();
  TokenizerSpec spec = s.spec;
  spec.merges = nullptr;
  EXPECT_EQ(CreateStatus(spec), KILN_ERROR_ARTIFACT_TOKENIZER);
  spec = s.spec;
  spec.added = nullptr;
  EXPECT_EQ(CreateStatus(spec), KILN_ERROR_ARTIFACT_TOKENIZER);
  spec = s.spec;
  spec.vocab = nullptr;
  EXPECT_EQ(CreateStatus(spec), KILN_ERROR_ARTIFACT_TOKENIZER);
}

TEST(TokenizerSpecValidation, AddedContentMayEqualItsOwnVocabularyEntry) {
  // GPT-2 keeps <|endoftext|> in the model vocabulary and as an added token.
  OwnedSpec s = SmallSpec();
  int32_t id = static_cast<int32_t>(s.vocab_text.size());
  s.vocab_text.push_back("<|endoftext|>");
  s.added_entries.push_back({id, "<|endoftext|>", true});
  s.Build();
  ASSERT_EQ(CreateStatus(s.spec), KILN_OK);
  Allocator allocator;
  TokenizerPtr t = MakeTokenizer(s.spec, &allocator);
  EXPECT_EQ(EncodeOk(*t, "a<|endoftext|>"), (std::vector<int32_t>{'a', id}));
  EXPECT_EQ(DecodeOk(*t, {id}, true), "");
  EXPECT_EQ(t->TokenToId("<|endoftext|>"), id);
}

TEST(TokenizerSpecValidation, DuplicateMergeKeepsLaterRank) {
  // (l, l) listed first and last: its rank is the last one, after (h, e) and (he, l).
  OwnedSpec s;
  s.vocab_text = ByteLevelChars();
  s.AddMerge("l", "l");
  s.AddMerge("h", "e");
  s.AddMerge("he", "l");
  s.AddMerge("l", "l");
  s.Build();
  Allocator allocator;
  TokenizerPtr t = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(EncodeOk(*t, "hell"), (std::vector<int32_t>{s.RawId("hel"), 'l'}));
}

TEST(Tokenizer, TokenOutsideTheByteAlphabetDecodesAsItself) {
  OwnedSpec s = SmallSpec();
  s.vocab_text.push_back("日本");  // not byte-level characters
  s.Build();
  Allocator allocator;
  TokenizerPtr t = MakeTokenizer(s.spec, &allocator);
  ASSERT_NE(t, nullptr);
  int32_t id = static_cast<int32_t>(s.vocab_text.size() - 1);
  EXPECT_EQ(DecodeOk(*t, {'a', id, 'b'}), "a日本b");
  EXPECT_EQ(t->TokenToId("日本"), id);
}

TEST(Tokenizer, OutOfMemoryIsReportedAndLeaksNothing) {
  OwnedSpec s = SmallSpec();
  // Create fails cleanly at every allocation until it succeeds.
  int failures = 0;
  for (long budget = 0;; ++budget) {
    FailingAllocator failing;
    failing.remaining = budget;
    Allocator allocator(&failing.raw);
    Tokenizer* t = nullptr;
    kiln_error_t error{};
    kiln_status_t status = Tokenizer::Create(s.spec, &allocator, &t, &error);
    if (status == KILN_OK) {
      // Encode with the allocator exhausted: scratch memory cannot be had.
      Allocator out_allocator;
      Vec<int32_t> ids(&out_allocator);
      ASSERT_TRUE(ids.push_back(9));
      failing.remaining = 0;
      std::string text = "hello world hello";
      EXPECT_EQ(t->Encode(text.data(), text.size(), true, &ids, &error), KILN_ERROR_OUT_OF_MEMORY);
      EXPECT_EQ(ToStd(ids), std::vector<int32_t>{9});
      std::vector<int32_t> dec = {'a', 'b'};
      Vec<char> out(&out_allocator);
      EXPECT_EQ(t->Decode(dec.data(), dec.size(), false, &out, &error), KILN_ERROR_OUT_OF_MEMORY);
      // Output vectors that cannot grow.
      failing.remaining = 1L << 40;
      FailingAllocator failing_out;
      failing_out.remaining = 0;
      Allocator no_memory(&failing_out.raw);
      Vec<int32_t> no_ids(&no_memory);
      EXPECT_EQ(t->Encode(text.data(), text.size(), false, &no_ids, &error), KILN_ERROR_OUT_OF_MEMORY);
      Vec<char> no_text(&no_memory);
      EXPECT_EQ(t->Decode(dec.data(), dec.size(), false, &no_text, &error), KILN_ERROR_OUT_OF_MEMORY);
      EXPECT_EQ(t->AppendTokenBytes('a', false, &no_text, &error), KILN_ERROR_OUT_OF_MEMORY);
      Tokenizer::Destroy(t);
      EXPECT_EQ(allocator.current_bytes(), 0u);
      break;
    }
    EXPECT_EQ(status, KILN_ERROR_OUT_OF_MEMORY) << "budget " << budget << ": " << error.message;
    EXPECT_EQ(t, nullptr);
    EXPECT_EQ(allocator.current_bytes(), 0u) << "budget " << budget;
    ++failures;
    ASSERT_LT(budget, 10000);
  }
  EXPECT_GT(failures, 3);
}

TEST(Tokenizer, RandomInputNeverCrashes) {
  OwnedSpec s = SmallSpec();
  for (bool llama3 : {false, true}) {
    s.spec.pretokenizer =
        llama3 ? TokenizerSpec::PreTokenizer::kLlama3 : TokenizerSpec::PreTokenizer::kGpt2;
    Allocator allocator;
    TokenizerPtr t = MakeTokenizer(s.spec, &allocator);
    ASSERT_NE(t, nullptr);
    std::mt19937 rng(llama3 ? 3 : 4);
    const std::string pieces[] = {"<s>", "[SEP]", "hello", " ", "\n", "\r\n", "'s", "'S", "12345",
                                  "é", "日本", "👍", "\xcc\x81", "\xe2\x80\x83", "!?", "\t"};
    for (int trial = 0; trial < 3000; ++trial) {
      std::string text;
      int n = static_cast<int>(rng() % 20);
      for (int i = 0; i < n; ++i) {
        if (rng() % 4 == 0)
          text.push_back(static_cast<char>(rng() % 256));
        else
          text += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
      }
      Vec<int32_t> ids(&allocator);
      kiln_error_t error{};
      kiln_status_t status = t->Encode(text.data(), text.size(), trial % 2 == 0, &ids, &error);
      if (IsValidUtf8(text.data(), text.size(), nullptr)) {
        ASSERT_EQ(status, KILN_OK) << error.message;
        std::vector<int32_t> v = ToStd(ids);
        if (trial % 2 == 0) v.erase(v.begin());  // BOS
        ASSERT_EQ(DecodeOk(*t, v), text);
      } else {
        ASSERT_EQ(status, KILN_ERROR_INVALID_ARGUMENT);
      }
      // Random ids, some out of range.
      std::vector<int32_t> random_ids;
      for (int i = 0; i < n; ++i)
        random_ids.push_back(static_cast<int32_t>(rng() % (t->vocab_size() + 3)) - 1);
      Vec<char> out(&allocator);
      status = t->Decode(random_ids.data(), random_ids.size(), trial % 3 == 0, &out, &error);
      ASSERT_TRUE(status == KILN_OK || status == KILN_ERROR_INPUT_TOKENS);
      if (status == KILN_OK)
        ASSERT_TRUE(IsValidUtf8(out.data(), out.size(), nullptr));
    }
    t.reset();
    EXPECT_EQ(allocator.current_bytes(), 0u);
  }
}

TEST(Utf8, CompleteLengthHoldsBackOnlyIncompleteCharacters) {
  struct Case {
    std::string bytes;
    size_t complete;
  } cases[] = {
      {"", 0},
      {"abc", 3},
      {"a\xe6", 1},              // lead of a 3-byte character
      {"a\xe6\x97", 1},          // 2 of 3
      {"a\xe6\x97\xa5", 4},      // complete
      {"\xf0\x9f\x91", 0},       // 3 of 4
      {"\xf0\x9f", 0},
      {"\xf0", 0},
      {"\xf0\x80", 2},           // ill-formed second byte: nothing to wait for
      {"\xed\xa0", 2},           // surrogate: ill-formed
      {"\xc3", 0},
      {"\xc0", 1},               // never valid
      {"\xff", 1},
      {"\x80", 1},               // stray continuation
      {"\x80\x80\x80\x80", 4},
      {"\xe6\x97\xa5\xe6", 3},
      {"\xf4\x8f\xbf", 0},       // U+10FFFF prefix
      {"\xf4\x90", 2},           // above U+10FFFF
  };
  for (const Case& c : cases)
    EXPECT_EQ(Utf8CompleteLength(c.bytes.data(), c.bytes.size()), c.complete) << Printable(c.bytes);
}


// SentencePiece-style BPE (Llama-2, Mistral): "\u2581" for spaces, prepended to each
// segment between added tokens; characters outside the vocabulary as <0xXX> byte
// tokens (byte_fallback) or one fused unknown; the decoder drops the leading space.
namespace metaspace {
struct SpSpec {
  std::vector<std::string> tokens;
  std::vector<std::string_view> views;
  std::vector<TokenizerSpec::Merge> merges;
  std::vector<TokenizerSpec::Added> added;
  TokenizerSpec spec;
  int32_t Id(const std::string& t) const {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == t) return static_cast<int32_t>(i);
    return -1;
  }
};
const std::string kSp = "\xE2\x96\x81";  // U+2581

std::unique_ptr<SpSpec> MakeSp(bool byte_fallback) {
  auto s = std::make_unique<SpSpec>();
  s->tokens = {"<unk>", "<s>", "a", "b", kSp, kSp + "a", kSp + "ab", "\xC3\xA9"};  // é
  for (int b = 0; b < 256 && byte_fallback; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    s->tokens.push_back(name);
  }
  for (const std::string& t : s->tokens) s->views.push_back(t);
  s->merges = {{static_cast<uint32_t>(s->Id(kSp)), static_cast<uint32_t>(s->Id("a"))},
               {static_cast<uint32_t>(s->Id(kSp + "a")), static_cast<uint32_t>(s->Id("b"))}};
  s->added = {{1, "<s>", true}};
  TokenizerSpec& spec = s->spec;
  spec.pretokenizer = TokenizerSpec::PreTokenizer::kMetaspace;
  spec.sentencepiece.prepend = kSp;
  spec.sentencepiece.byte_fallback = byte_fallback;
  spec.sentencepiece.unk_id = 0;
  spec.sentencepiece.fuse_unk = true;
  spec.sentencepiece.decode_strip = 1;
  spec.vocab = s->views.data();
  spec.vocab_size = s->views.size();
  spec.merges = s->merges.data();
  spec.num_merges = s->merges.size();
  spec.added = s->added.data();
  spec.num_added = s->added.size();
  spec.bos_id = 1;
  spec.add_bos = true;
  return s;
}
}  // namespace metaspace

TEST(Tokenizer, SentencePieceStyleBpe) {
  using metaspace::kSp;
  auto s = metaspace::MakeSp(true);
  Allocator allocator;
  TokenizerPtr t = MakeTokenizer(s->spec, &allocator);
  ASSERT_NE(t, nullptr);
  const int32_t ab = s->Id(kSp + "ab"), sp = s->Id(kSp), a = s->Id("a"), b = s->Id("b"), e = s->Id("\xC3\xA9");
  const int32_t x78 = s->Id("<0x78>"), e2 = s->Id("<0xE2>"), x82 = s->Id("<0x82>"), xAC = s->Id("<0xAC>");
  // "ab b" -> "▁ab▁b": merges make ▁ab; "b" has no merge after ▁.
  EXPECT_EQ(EncodeOk(*t, "ab b"), (std::vector<int32_t>{ab, sp, b}));
  EXPECT_EQ(EncodeOk(*t, "ab", true), (std::vector<int32_t>{1, ab}));
  // Outside the vocabulary: x as <0x78>, € (E2 82 AC) as three byte tokens; é is in it.
  EXPECT_EQ(EncodeOk(*t, "x\xE2\x82\xAC\xC3\xA9"), (std::vector<int32_t>{sp, x78, e2, x82, xAC, e}));
  // Each segment between added tokens gets the prefix (scheme Always); empty ones none.
  EXPECT_EQ(EncodeOk(*t, "a<s>a<s>"), (std::vector<int32_t>{s->Id(kSp + "a"), 1, s->Id(kSp + "a"), 1}));
  EXPECT_EQ(EncodeOk(*t, " a"), (std::vector<int32_t>{sp, s->Id(kSp + "a")}));
  // Decoding: ▁ -> space, bytes joined, the leading space dropped once.
  EXPECT_EQ(DecodeOk(*t, {ab, sp, b}), "ab b");
  EXPECT_EQ(DecodeOk(*t, {sp, x78, e2, x82, xAC, e}), "x\xE2\x82\xAC\xC3\xA9");
  EXPECT_EQ(DecodeOk(*t, {sp, sp, a}), " a");
  EXPECT_EQ(DecodeOk(*t, {1, ab}), "<s> ab");
  EXPECT_EQ(DecodeOk(*t, {1, ab}, true), "ab");
  EXPECT_EQ(t->decode_strip(), 1);
  // Round trip of text without added tokens.
  for (const std::string text : {"ab b", "  ab", "x y\xE2\x82\xAC", "\xC3\xA9\xC3\xA9 a"})
    EXPECT_EQ(DecodeOk(*t, EncodeOk(*t, text)), text);
}

TEST(Tokenizer, SentencePiecePrependSchemesAndUnknowns) {
  using metaspace::kSp;
  auto s = metaspace::MakeSp(false);  // no byte tokens: unknowns fuse into one <unk>
  s->spec.sentencepiece.prepend_scheme = TokenizerSpec::PrependScheme::kFirst;
  Allocator allocator;
  TokenizerPtr t = MakeTokenizer(s->spec, &allocator);
  ASSERT_NE(t, nullptr);
  const int32_t spa = s->Id(kSp + "a"), a = s->Id("a");
  EXPECT_EQ(EncodeOk(*t, "a<s>a"), (std::vector<int32_t>{spa, 1, a}));  // only the first segment
  EXPECT_EQ(EncodeOk(*t, "axyz"), (std::vector<int32_t>{spa, 0}));      // x, y, z fused
  EXPECT_EQ(EncodeOk(*t, "xaz"), (std::vector<int32_t>{s->Id(kSp), 0, a, 0}));
  s->spec.sentencepiece.prepend_scheme = TokenizerSpec::PrependScheme::kNever;
  TokenizerPtr never = MakeTokenizer(s->spec, &allocator);
  EXPECT_EQ(EncodeOk(*never, "a a"), (std::vector<int32_t>{a, spa}));
  // Neither byte fallback nor an unknown id: refused.
  s->spec.sentencepiece.unk_id = -1;
  std::string message;
  EXPECT_EQ(CreateStatus(s->spec, &message), KILN_ERROR_ARTIFACT_TOKENIZER);
  EXPECT_NE(message.find("byte_fallback or an unk id"), std::string::npos) << message;
  // byte_fallback without the byte tokens: refused.
  s->spec.sentencepiece.unk_id = 0;
  s->spec.sentencepiece.byte_fallback = true;
  EXPECT_EQ(CreateStatus(s->spec, &message), KILN_ERROR_ARTIFACT_TOKENIZER);
  EXPECT_NE(message.find("<0x00>"), std::string::npos) << message;
}

}  // namespace
}  // namespace kiln::rt
