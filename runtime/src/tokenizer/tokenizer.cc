#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <climits>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "support/error.h"
#include "support/sort.h"
#include "tokenizer/utf8.h"

namespace kiln::rt {
namespace {

// The two pre-tokenizer regexes of tests/models/kiln_models/tokenizer.py, verbatim as
// they appear in tokenizer.json files.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr uint32_t kEmptyKey = 0xFFFFFFFFu;
constexpr size_t kMaxTextBytes = 0x7FFFFFFF;
constexpr int kMessageBytes = 48;  // bytes of a token quoted in an error message

// ---- hashing ----

inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

inline uint64_t HashBytes(const char* data, size_t size) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a, then a finaliser
  for (size_t i = 0; i < size; ++i) {
    h ^= static_cast<uint8_t>(data[i]);
    h *= 0x100000001B3ull;
  }
  return Mix64(h ^ size);
}

inline uint64_t HashPair(uint32_t left, uint32_t right) {
  return Mix64((static_cast<uint64_t>(left) << 32) | right);
}

// A power of two holding `n` keys at a load factor of at most 2/3.
bool TableCapacity(size_t n, size_t* capacity) {
  if (n > (SIZE_MAX / 4)) return false;
  size_t c = 16;
  while (c < n + n / 2 + 1) c <<= 1;
  *capacity = c;
  return true;
}

// ---- UTF-8 ----

using utf8::LeadInfo;
using utf8::SequenceLength;

// ---- per-call BPE state ----

struct Symbol {
  int32_t id;  // -1 once merged into its left neighbour
  int32_t prev;
  int32_t next;  // -1 at the end
};

struct PairEntry {
  uint32_t rank;
  uint32_t pos;  // index of the left symbol
  int32_t left, right, merged;
};

// Heap order: std::*_heap keep the greatest element first, so "greater" means
// "merged later": higher rank, or the same rank further right.
inline bool MergesLater(const PairEntry& a, const PairEntry& b) {
  return a.rank > b.rank || (a.rank == b.rank && a.pos > b.pos);
}

// Makes room for `extra` more elements, growing geometrically (Vec::reserve and
// Vec::resize allocate exactly what they are asked for).
template <typename T>
bool GrowBy(Vec<T>* v, size_t extra) {
  size_t needed = v->size() + extra;
  if (needed <= v->capacity()) return true;
  size_t doubled = v->capacity() > SIZE_MAX / 2 ? SIZE_MAX : 2 * v->capacity();
  return v->reserve(needed > doubled ? needed : doubled);
}

}  // namespace

// ---- UTF-8 helpers ----

bool IsValidUtf8(const char* data, size_t size, size_t* bad_offset) {
  const auto* s = reinterpret_cast<const uint8_t*>(data);
  size_t i = 0;
  while (i < size) {
    if (s[i] < 0x80) {
      // Skip ASCII eight bytes at a time.
      while (i + 8 <= size) {
        uint64_t word;
        std::memcpy(&word, s + i, 8);
        if (word & 0x8080808080808080ull) break;
        i += 8;
      }
      while (i < size && s[i] < 0x80) ++i;
      continue;
    }
    size_t subpart;
    size_t len = SequenceLength(s, size, i, &subpart);
    if (len == 0) {
      if (bad_offset != nullptr) *bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

bool AppendUtf8Replacing(const char* data, size_t size, Vec<char>* out) {
  const auto* s = reinterpret_cast<const uint8_t*>(data);
  const size_t original = out->size();
  size_t run = 0;  // start of the well-formed bytes not yet copied
  size_t i = 0;
  while (i < size) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    size_t subpart;
    size_t len = SequenceLength(s, size, i, &subpart);
    if (len != 0) {
      i += len;
      continue;
    }
    if (!out->append(data + run, i - run) || !out->append("\xEF\xBF\xBD", 3)) {
      (void)out->resize(original);
      return false;
    }
    i += subpart;
    run = i;
  }
  if (!out->append(data + run, size - run)) {
    (void)out->resize(original);
    return false;
  }
  return true;
}

size_t Utf8CompleteLength(const char* data, size_t size) {
  if (size == 0) return 0;
  const auto* s = reinterpret_cast<const uint8_t*>(data);
  // The last byte that is not a continuation byte, looking back at most 4 bytes.
  size_t p = size;
  size_t looked = 0;
  while (p > 0 && looked < 4) {
    --p;
    ++looked;
    if ((s[p] & 0xC0) != 0x80) break;
  }
  if ((s[p] & 0xC0) == 0x80) return size;  // stray continuation bytes: ill-formed
  size_t need;
  uint8_t lo, hi;
  if (!LeadInfo(s[p], &need, &lo, &hi)) return size;  // ASCII or never-valid byte
  size_t have = size - p;
  if (have > need) return size;  // complete (or ill-formed): nothing to wait for
  if (have >= 2 && (s[p + 1] < lo || s[p + 1] > hi)) return size;
  return p;  // a proper prefix of a character: hold it back
}

// ---- Tokenizer ----

struct Tokenizer::EncodeScratch {
  explicit EncodeScratch(Allocator* allocator)
      : symbols(allocator), heap(allocator), batch(allocator), chars(allocator), normalized(allocator),
        codepoints(allocator) {}
  EncodeScratch(const EncodeScratch&) = delete;
  EncodeScratch& operator=(const EncodeScratch&) = delete;

  Vec<Symbol> symbols;
  Vec<PairEntry> heap;
  Vec<PairEntry> batch;
  Vec<char> chars;
  Vec<char> normalized;       // the NFC of a segment
  Vec<uint32_t> codepoints;   // its code points while normalising
};

Tokenizer::Tokenizer(Allocator* allocator)
    : allocator_(allocator),
      vocab_slots_(allocator),
      merge_slots_(allocator),
      added_(allocator),
      added_by_id_(allocator),
      regex_(allocator) {}

Tokenizer::~Tokenizer() = default;

kiln_status_t Tokenizer::Create(const TokenizerSpec& spec, Allocator* allocator, Tokenizer** out,
                                kiln_error_t* error) {
  if (out == nullptr) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "tokenizer: out is NULL");
  *out = nullptr;
  if (allocator == nullptr)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "tokenizer: allocator is NULL");
  void* memory = allocator->Alloc(sizeof(Tokenizer), alignof(Tokenizer));
  if (memory == nullptr)
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
  auto* tokenizer = new (memory) Tokenizer(allocator);
  kiln_status_t status = tokenizer->Init(spec, error);
  if (status != KILN_OK) {
    Destroy(tokenizer);
    return status;
  }
  *out = tokenizer;
  return KILN_OK;
}

void Tokenizer::Destroy(Tokenizer* tokenizer) {
  if (tokenizer == nullptr) return;
  Allocator* allocator = tokenizer->allocator_;
  tokenizer->~Tokenizer();
  allocator->Free(tokenizer);
}

kiln_status_t Tokenizer::Init(const TokenizerSpec& spec, kiln_error_t* error) {
  const kiln_status_t kBad = KILN_ERROR_ARTIFACT_TOKENIZER;
  const kiln_status_t kOom = KILN_ERROR_OUT_OF_MEMORY;
  if (spec.pretokenizer != TokenizerSpec::PreTokenizer::kGpt2 &&
      spec.pretokenizer != TokenizerSpec::PreTokenizer::kLlama3 &&
      spec.pretokenizer != TokenizerSpec::PreTokenizer::kSplit &&
      spec.pretokenizer != TokenizerSpec::PreTokenizer::kMetaspace)
    return Fail(error, kBad, "tokenizer: unknown pre-tokenizer %d",
                static_cast<int>(spec.pretokenizer));
  if (spec.pretokenizer == TokenizerSpec::PreTokenizer::kSplit && spec.pattern.empty())
    return Fail(error, kBad, "tokenizer: a Split pre-tokenizer needs a pattern");
  if (spec.vocab_size == 0 || spec.vocab_size > static_cast<size_t>(INT32_MAX))
    return Fail(error, kBad, "tokenizer: vocabulary size %zu is not in [1, 2^31)", spec.vocab_size);
  if (spec.vocab == nullptr) return Fail(error, kBad, "tokenizer: no vocabulary");
  if (spec.num_merges > 0 && spec.merges == nullptr)
    return Fail(error, kBad, "tokenizer: %zu merges but no merge table", spec.num_merges);
  if (spec.num_merges >= kEmptyKey)
    return Fail(error, kBad, "tokenizer: too many merges (%zu)", spec.num_merges);
  if (spec.num_added > 0 && spec.added == nullptr)
    return Fail(error, kBad, "tokenizer: %zu added tokens but no table", spec.num_added);
  if (spec.num_added > spec.vocab_size)
    return Fail(error, kBad, "tokenizer: %zu added tokens for %zu ids", spec.num_added,
                spec.vocab_size);

  pretokenizer_ = spec.pretokenizer;
  metaspace_ = spec.pretokenizer == TokenizerSpec::PreTokenizer::kMetaspace;
  if (metaspace_) {
    size_t bad;
    if (!IsValidUtf8(spec.sentencepiece.prepend.data(), spec.sentencepiece.prepend.size(), &bad))
      return Fail(error, kBad, "tokenizer: the prepended text is not valid UTF-8");
    if (spec.sentencepiece.unk_id >= static_cast<int64_t>(spec.vocab_size))
      return Fail(error, kBad, "tokenizer: unk id %d outside the vocabulary", spec.sentencepiece.unk_id);
    if (!spec.sentencepiece.byte_fallback && spec.sentencepiece.unk_id < 0)
      return Fail(error, kBad, "tokenizer: SentencePiece-style BPE needs byte_fallback or an unk id");
    if (spec.sentencepiece.decode_strip < 0 || spec.sentencepiece.decode_strip > 8)
      return Fail(error, kBad, "tokenizer: decode strip %d outside [0, 8]", spec.sentencepiece.decode_strip);
    sp_ = spec.sentencepiece;
  }
  if (spec.nfc.enabled) {
    // The tables drive binary searches: sorted, strictly, and within Unicode.
    if (spec.nfc.decompositions == nullptr || spec.nfc.num_decompositions == 0 || spec.nfc.compositions == nullptr ||
        spec.nfc.classes == nullptr)
      return Fail(error, kBad, "tokenizer: NFC without its Unicode tables");
    for (size_t i = 0; i < spec.nfc.num_decompositions; ++i) {
      const uint64_t e = spec.nfc.decompositions[i];
      if ((e >> 42) > 0x10FFFF || ((e >> 21) & 0x1FFFFF) > 0x10FFFF || (e & 0x1FFFFF) > 0x10FFFF ||
          ((e >> 21) & 0x1FFFFF) == 0 || (i > 0 && (e >> 42) <= (spec.nfc.decompositions[i - 1] >> 42)))
        return Fail(error, kBad, "tokenizer: NFC decomposition %zu is malformed or out of order", i);
    }
    for (size_t i = 0; i < spec.nfc.num_compositions; ++i) {
      const uint64_t e = spec.nfc.compositions[i];
      if ((e >> 42) > 0x10FFFF || (e & 0x1FFFFF) > 0x10FFFF ||
          (i > 0 && (e >> 21) <= (spec.nfc.compositions[i - 1] >> 21)))
        return Fail(error, kBad, "tokenizer: NFC composition %zu is malformed or out of order", i);
    }
    for (size_t i = 0; i < spec.nfc.num_classes; ++i)
      if ((spec.nfc.classes[i] >> 8) > 0x10FFFF || (spec.nfc.classes[i] & 0xFF) == 0 ||
          (i > 0 && (spec.nfc.classes[i] >> 8) <= (spec.nfc.classes[i - 1] >> 8)))
        return Fail(error, kBad, "tokenizer: NFC combining class %zu is malformed or out of order", i);
    nfc_ = spec.nfc;
  }
  vocab_ = spec.vocab;
  vocab_size_ = static_cast<int32_t>(spec.vocab_size);
  bos_id_ = spec.bos_id;
  add_bos_ = spec.add_bos;
  ignore_merges_ = spec.ignore_merges;

  // GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to 256+n.
  std::fill(cp_to_byte_, cp_to_byte_ + 0x144, static_cast<int16_t>(-1));
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    int cp = printable ? b : 256 + extra++;
    byte_to_cp_[b] = static_cast<uint16_t>(cp);
    cp_to_byte_[cp] = static_cast<int16_t>(b);
  }

  // Vocabulary: string -> id.
  size_t capacity;
  if (!TableCapacity(spec.vocab_size, &capacity) || !vocab_slots_.resize(capacity))
    return Fail(error, kOom, "tokenizer: out of memory (vocabulary of %zu)", spec.vocab_size);
  std::fill(vocab_slots_.begin(), vocab_slots_.end(), -1);
  vocab_mask_ = capacity - 1;
  for (int32_t id = 0; id < vocab_size_; ++id) {
    std::string_view token = vocab_[id];
    if (token.empty()) continue;
    size_t bad;
    if (!IsValidUtf8(token.data(), token.size(), &bad))
      return Fail(error, kBad, "tokenizer: vocabulary entry %d is not valid UTF-8 (byte %zu)", id,
                  bad);
    size_t slot = HashBytes(token.data(), token.size()) & vocab_mask_;
    for (;;) {
      int32_t other = vocab_slots_[slot];
      if (other < 0) break;
      if (vocab_[other] == token)
        return Fail(error, kBad, "tokenizer: vocabulary entries %d and %d are both '%.*s'", other,
                    id, static_cast<int>(std::min<size_t>(token.size(), kMessageBytes)),
                    token.data());
      slot = (slot + 1) & vocab_mask_;
    }
    vocab_slots_[slot] = id;
  }

  // Every byte needs a token: a pre-token can contain any byte. SentencePiece style
  // with byte_fallback: the <0xXX> tokens.
  for (int b = 0; b < 256 && metaspace_; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = FindVocab(name, 6);
    if (byte_ids_[b] < 0 && sp_.byte_fallback)
      return Fail(error, kBad, "tokenizer: byte_fallback without the byte token %s", name);
  }
  for (int b = 0; b < 256 && !metaspace_; ++b) {
    const uint16_t cp = byte_to_cp_[b];
    char chars[4];
    const size_t n = utf8::Encode(cp, chars);
    byte_ids_[b] = FindVocab(chars, n);
    if (byte_ids_[b] < 0)
      return Fail(error, kBad, "tokenizer: the vocabulary has no token for byte 0x%02X (U+%04X)",
                  b, cp);
  }

  // Added tokens.
  if (!added_.reserve(spec.num_added) || !added_by_id_.reserve(spec.num_added))
    return Fail(error, kOom, "tokenizer: out of memory (%zu added tokens)", spec.num_added);
  for (size_t i = 0; i < spec.num_added; ++i) {
    const TokenizerSpec::Added& a = spec.added[i];
    if (a.id < 0 || a.id >= vocab_size_)
      return Fail(error, kBad, "tokenizer: added token %zu has id %d outside [0, %d)", i, a.id,
                  vocab_size_);
    if (a.content.empty())
      return Fail(error, kBad, "tokenizer: added token %zu (id %d) is empty", i, a.id);
    size_t bad;
    if (!IsValidUtf8(a.content.data(), a.content.size(), &bad))
      return Fail(error, kBad, "tokenizer: added token %zu (id %d) is not valid UTF-8", i, a.id);
    if (!vocab_[a.id].empty() && vocab_[a.id] != a.content)
      return Fail(error, kBad,
                  "tokenizer: added token '%.*s' has id %d, which the vocabulary gives to '%.*s'",
                  static_cast<int>(std::min<size_t>(a.content.size(), kMessageBytes)),
                  a.content.data(), a.id,
                  static_cast<int>(std::min<size_t>(vocab_[a.id].size(), kMessageBytes)),
                  vocab_[a.id].data());
    (void)added_.push_back(AddedToken{a.content, a.id, a.special});  // reserved above
  }
  Sort(added_.begin(), added_.end(), [](const AddedToken& x, const AddedToken& y) {
    auto fx = static_cast<uint8_t>(x.content[0]), fy = static_cast<uint8_t>(y.content[0]);
    if (fx != fy) return fx < fy;
    if (x.content.size() != y.content.size()) return x.content.size() > y.content.size();
    return x.content != y.content ? x.content < y.content : x.id < y.id;  // a repeat: by id
  });
  for (size_t i = 1; i < added_.size(); ++i) {
    if (added_[i].content == added_[i - 1].content)
      return Fail(error, kBad, "tokenizer: added token '%.*s' is listed twice (ids %d and %d)",
                  static_cast<int>(std::min<size_t>(added_[i].content.size(), kMessageBytes)),
                  added_[i].content.data(), added_[i - 1].id, added_[i].id);
  }
  {
    size_t i = 0;
    for (int b = 0; b <= 256; ++b) {
      while (i < added_.size() && static_cast<uint8_t>(added_[i].content[0]) < b) ++i;
      added_first_[b] = static_cast<uint32_t>(i);
    }
    added_first_[256] = static_cast<uint32_t>(added_.size());
  }
  for (size_t i = 0; i < added_.size(); ++i)
    (void)added_by_id_.push_back(static_cast<int32_t>(i));  // reserved above
  Sort(added_by_id_.begin(), added_by_id_.end(),
       [this](int32_t x, int32_t y) { return added_[x].id != added_[y].id ? added_[x].id < added_[y].id : x < y; });
  for (size_t i = 1; i < added_by_id_.size(); ++i) {
    const AddedToken& x = added_[added_by_id_[i - 1]];
    const AddedToken& y = added_[added_by_id_[i]];
    if (x.id == y.id)
      return Fail(error, kBad, "tokenizer: added tokens '%.*s' and '%.*s' share id %d",
                  static_cast<int>(std::min<size_t>(x.content.size(), kMessageBytes)),
                  x.content.data(),
                  static_cast<int>(std::min<size_t>(y.content.size(), kMessageBytes)),
                  y.content.data(), x.id);
  }

  // Merges: (left, right) -> (rank, merged id).
  if (!TableCapacity(spec.num_merges, &capacity) || !merge_slots_.resize(capacity))
    return Fail(error, kOom, "tokenizer: out of memory (%zu merges)", spec.num_merges);
  std::fill(merge_slots_.begin(), merge_slots_.end(), MergeSlot{kEmptyKey, kEmptyKey, 0, -1});
  merge_mask_ = capacity - 1;
  Vec<char> joined(allocator_);
  for (size_t r = 0; r < spec.num_merges; ++r) {
    const TokenizerSpec::Merge& m = spec.merges[r];
    if (m.left >= spec.vocab_size || m.right >= spec.vocab_size)
      return Fail(error, kBad, "tokenizer: merge %zu (%u, %u) has an id outside [0, %d)", r,
                  m.left, m.right, vocab_size_);
    std::string_view left = vocab_[m.left], right = vocab_[m.right];
    if (left.empty() || right.empty())
      return Fail(error, kBad, "tokenizer: merge %zu (%u, %u) uses an id with no token", r, m.left,
                  m.right);
    joined.clear();
    if (!joined.append(left.data(), left.size()) || !joined.append(right.data(), right.size()))
      return Fail(error, kOom, "tokenizer: out of memory");
    int32_t merged = FindVocab(joined.data(), joined.size());
    if (merged < 0)
      return Fail(error, kBad, "tokenizer: merge %zu ('%.*s' '%.*s') makes a token not in the vocabulary",
                  r, static_cast<int>(std::min<size_t>(left.size(), kMessageBytes)), left.data(),
                  static_cast<int>(std::min<size_t>(right.size(), kMessageBytes)), right.data());
    size_t slot = HashPair(m.left, m.right) & merge_mask_;
    for (;;) {
      MergeSlot& s = merge_slots_[slot];
      if (s.left == kEmptyKey || (s.left == m.left && s.right == m.right)) {
        // A pair listed again takes its later rank, as tokenizer.py's dict does.
        s = MergeSlot{m.left, m.right, static_cast<uint32_t>(r), merged};
        break;
      }
      slot = (slot + 1) & merge_mask_;
    }
  }

  if (add_bos_) {
    if (bos_id_ < 0 || bos_id_ >= vocab_size_ ||
        (FindAddedById(bos_id_) == nullptr && vocab_[bos_id_].empty()))
      return Fail(error, kBad, "tokenizer: BOS id %d is not a token", bos_id_);
  }

  if (metaspace_) return KILN_OK;  // no regex

  // The pre-tokenizer regex. kSplit's pattern is checked to be non-empty above.
  std::string_view source = pretokenizer_ == TokenizerSpec::PreTokenizer::kSplit ? spec.pattern
                            : pretokenizer_ == TokenizerSpec::PreTokenizer::kGpt2
                                ? std::string_view(kGpt2Pattern)
                                : std::string_view(kLlama3Pattern);
  kiln_status_t status = regex_.Compile(source, error);
  if (status == KILN_ERROR_ARTIFACT_TOKENIZER && pretokenizer_ != TokenizerSpec::PreTokenizer::kSplit)
    status = KILN_ERROR_INTERNAL;  // a built-in pattern
  return status;
}

int32_t Tokenizer::FindVocab(const char* data, size_t size) const {
  if (size == 0) return -1;
  size_t slot = HashBytes(data, size) & vocab_mask_;
  for (;;) {
    int32_t id = vocab_slots_[slot];
    if (id < 0) return -1;
    std::string_view token = vocab_[id];
    if (token.size() == size && std::memcmp(token.data(), data, size) == 0) return id;
    slot = (slot + 1) & vocab_mask_;
  }
}

bool Tokenizer::FindMerge(int32_t left, int32_t right, uint32_t* rank, int32_t* merged) const {
  auto l = static_cast<uint32_t>(left), r = static_cast<uint32_t>(right);
  size_t slot = HashPair(l, r) & merge_mask_;
  for (;;) {
    const MergeSlot& s = merge_slots_[slot];
    if (s.left == kEmptyKey) return false;
    if (s.left == l && s.right == r) {
      *rank = s.rank;
      *merged = s.merged;
      return true;
    }
    slot = (slot + 1) & merge_mask_;
  }
}

const Tokenizer::AddedToken* Tokenizer::FindAddedById(int32_t id) const {
  size_t lo = 0, hi = added_by_id_.size();
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const AddedToken& t = added_[added_by_id_[mid]];
    if (t.id == id) return &t;
    if (t.id < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return nullptr;
}

const Tokenizer::AddedToken* Tokenizer::MatchAdded(const char* text, size_t length,
                                                   size_t pos) const {
  auto first = static_cast<uint8_t>(text[pos]);
  size_t rest = length - pos;
  for (uint32_t i = added_first_[first]; i < added_first_[first + 1]; ++i) {
    const AddedToken& t = added_[i];  // longest first
    if (t.content.size() <= rest && std::memcmp(t.content.data(), text + pos, t.content.size()) == 0)
      return &t;
  }
  return nullptr;
}

kiln_status_t Tokenizer::Encode(const char* text, size_t length, bool add_special,
                                Vec<int32_t>* out_ids, kiln_error_t* error) const {
  if (out_ids == nullptr) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "encode: out_ids is NULL");
  if (text == nullptr && length > 0)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "encode: text is NULL");
  if (length > kMaxTextBytes)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "encode: text of %zu bytes is too long",
                length);
  size_t bad;
  if (!IsValidUtf8(text, length, &bad))
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                "encode: text is not valid UTF-8 (ill-formed sequence at byte %zu)", bad);

  const size_t original = out_ids->size();
  kiln_status_t status = KILN_OK;
  if (add_special && add_bos_ && !out_ids->push_back(bos_id_))
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");

  EncodeScratch scratch(allocator_);
  size_t segment = 0;
  if (!added_.empty()) {
    size_t pos = 0;
    while (pos < length) {
      auto b = static_cast<uint8_t>(text[pos]);
      const AddedToken* token =
          added_first_[b] == added_first_[b + 1] ? nullptr : MatchAdded(text, length, pos);
      if (token == nullptr) {
        ++pos;
        continue;
      }
      status = EncodeSegment(text + segment, pos - segment, segment == 0, &scratch, out_ids, error);
      if (status != KILN_OK) break;
      if (!out_ids->push_back(token->id)) {
        status = Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");
        break;
      }
      pos += token->content.size();
      segment = pos;
    }
  }
  if (status == KILN_OK)
    status = EncodeSegment(text + segment, length - segment, segment == 0, &scratch, out_ids, error);
  if (status != KILN_OK) (void)out_ids->resize(original);
  return status;
}

// Splits one stretch of text without added tokens into pre-tokens and encodes each.
// The stretch is the whole subject, so look-aheads stop at its end. Pre-tokens are the
// successive leftmost matches (Python's `regex.findall`); empty matches make none.
// Text that no alternative matches (never, with the two built-in patterns) becomes a
// pre-token of its own, as with Hugging Face's Split(behavior="Isolated").
namespace {
// The entry of a table sorted by `entry >> shift` whose key is `key`, or 0 (no entry is 0).
template <typename T>
T FindPacked(const T* table, size_t count, uint64_t key, int shift) {
  size_t lo = 0, hi = count;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    const uint64_t k = static_cast<uint64_t>(table[mid]) >> shift;
    if (k == key) return table[mid];
    if (k < key) lo = mid + 1; else hi = mid;
  }
  return 0;
}
}  // namespace

uint8_t Tokenizer::CombiningClass(uint32_t cp) const {
  return cp < 0x300 ? 0 : static_cast<uint8_t>(FindPacked(nfc_.classes, nfc_.num_classes, cp, 8) & 0xFF);
}

// Unicode NFC (UAX #15): full canonical decomposition (Hangul algorithmically),
// canonical ordering of combining marks, then canonical composition of primary
// composites (a mark is blocked from its starter by a mark of the same or a higher
// class, or a starter, between them).
bool Tokenizer::Nfc(const char* text, size_t length, EncodeScratch* scratch) const {
  constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
  constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;
  Vec<uint32_t>& cps = scratch->codepoints;
  cps.clear();
  // Decompose, with an explicit stack (mappings nest a few levels at most).
  uint32_t stack[32];
  for (size_t i = 0; i < length;) {
    const auto* s = reinterpret_cast<const uint8_t*>(text);
    uint32_t cp;
    i += utf8::Decode(s + i, &cp);
    int top = 0;
    stack[top++] = cp;
    while (top > 0) {
      uint32_t c = stack[--top];
      if (c >= kSBase && c < kSBase + kSCount) {
        const uint32_t si = c - kSBase;
        if (!cps.push_back(kLBase + si / kNCount) || !cps.push_back(kVBase + (si % kNCount) / kTCount)) return false;
        if (si % kTCount != 0 && !cps.push_back(kTBase + si % kTCount)) return false;
        continue;
      }
      const uint64_t d = c < 0xC0 ? 0 : FindPacked(nfc_.decompositions, nfc_.num_decompositions, c, 42);
      if (d == 0 || top + 2 > 32) {
        if (!cps.push_back(c)) return false;
        continue;
      }
      const uint32_t first = static_cast<uint32_t>((d >> 21) & 0x1FFFFF), second = static_cast<uint32_t>(d & 0x1FFFFF);
      if (second != 0) stack[top++] = second;  // popped after the first's expansion
      stack[top++] = first;
    }
  }
  // Canonical ordering: marks sorted by class within each run, stably.
  const size_t n = cps.size();
  for (size_t i = 1; i < n; ++i) {
    const uint8_t c = CombiningClass(cps[i]);
    if (c == 0) continue;
    for (size_t j = i; j > 0; --j) {
      const uint8_t p = CombiningClass(cps[j - 1]);
      if (p <= c) break;
      std::swap(cps[j - 1], cps[j]);
    }
  }
  // Canonical composition.
  auto compose = [&](uint32_t a, uint32_t b) -> uint32_t {
    if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
      return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
      return a + (b - kTBase);
    const uint64_t key = (static_cast<uint64_t>(a) << 21) | b;
    return static_cast<uint32_t>(FindPacked(nfc_.compositions, nfc_.num_compositions, key, 21) & 0x1FFFFF);
  };
  size_t kept = n;
  if (n > 0) {
    size_t starter = 0;
    int last_class = CombiningClass(cps[0]) != 0 ? 256 : 0;
    kept = 1;
    bool have_starter = last_class == 0;
    for (size_t i = 1; i < n; ++i) {
      const uint32_t c = cps[i];
      const int cls = CombiningClass(c);
      const uint32_t composite = have_starter && (last_class < cls || last_class == 0) ? compose(cps[starter], c) : 0;
      if (composite != 0) {
        cps[starter] = composite;
        continue;
      }
      if (cls == 0) {
        starter = kept;
        have_starter = true;
      }
      last_class = cls;
      cps[kept++] = c;
    }
  }
  Vec<char>& out = scratch->normalized;
  if (!out.resize(4 * kept)) return false;
  size_t m = 0;
  for (size_t i = 0; i < kept; ++i) m += utf8::Encode(cps[i], out.data() + m);
  (void)out.resize(m);  // shrinking never fails
  return true;
}

kiln_status_t Tokenizer::EncodeSegment(const char* text, size_t length, bool at_start, EncodeScratch* scratch,
                                       Vec<int32_t>* out, kiln_error_t* error) const {
  if (length == 0) return KILN_OK;
  if (nfc_.enabled) {
    bool ascii = true;
    for (size_t i = 0; i < length && ascii; ++i) ascii = static_cast<uint8_t>(text[i]) < 0x80;
    if (!ascii) {
      if (!Nfc(text, length, scratch)) return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory (NFC)");
      text = scratch->normalized.data();
      length = scratch->normalized.size();
      if (length == 0) return KILN_OK;
    }
  }
  if (metaspace_) return EncodeMetaspace(text, length, at_start, scratch, out, error);
  size_t offset = 0;  // where the next match is looked for
  size_t gap = 0;     // end of the last pre-token
  bool retry = false;  // after an empty match: a non-empty one at the same place
  while (offset < length) {
    size_t start = 0, end = 0;
    const Regex::Result r = regex_.Find(text, length, offset, retry, &start, &end);
    if (r == Regex::Result::kNoMatch) {
      if (!retry) break;
      retry = false;  // nothing non-empty starts here: step over one character
      ++offset;
      while (offset < length && (static_cast<uint8_t>(text[offset]) & 0xC0) == 0x80) ++offset;
      continue;
    }
    if (r == Regex::Result::kLimit)
      return Fail(error, KILN_ERROR_INTERNAL,
                  "encode: the pre-tokenizer regex backtracked beyond its limit at byte %zu of a %zu-byte text",
                  offset, length);
    if (end == start) {
      offset = start;
      retry = true;
      continue;
    }
    retry = false;
    kiln_status_t status = KILN_OK;
    if (start > gap) status = EncodePiece(text + gap, start - gap, scratch, out, error);
    if (status == KILN_OK) status = EncodePiece(text + start, end - start, scratch, out, error);
    if (status != KILN_OK) return status;
    gap = offset = end;
  }
  if (gap < length) return EncodePiece(text + gap, length - gap, scratch, out, error);
  return KILN_OK;
}

// Byte-level BPE of one pre-token, with tokenizer.py's merge order: take the lowest
// rank among adjacent pairs, merge every occurrence of that pair left to right (not
// overlapping), repeat. A heap of (rank, position) finds the pairs; entries made stale
// by earlier merges are recognised and dropped when they come up. O(n log n).
kiln_status_t Tokenizer::EncodePiece(const char* piece, size_t length, EncodeScratch* scratch,
                                     Vec<int32_t>* out, kiln_error_t* error) const {
  const auto* s = reinterpret_cast<const uint8_t*>(piece);
  if (length == 1) {
    if (!out->push_back(byte_ids_[s[0]]))
      return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");
    return KILN_OK;
  }
  if (ignore_merges_) {
    Vec<char>& chars = scratch->chars;
    if (length > SIZE_MAX / 2 || !chars.resize(2 * length))
      return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");
    size_t n = 0;
    for (size_t i = 0; i < length; ++i) n += utf8::Encode(byte_to_cp_[s[i]], chars.data() + n);
    int32_t id = FindVocab(chars.data(), n);
    if (id >= 0) {
      if (!out->push_back(id)) return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");
      return KILN_OK;
    }
  }

  Vec<Symbol>& sym = scratch->symbols;
  if (!sym.resize(length)) return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");
  for (size_t i = 0; i < length; ++i) sym[i].id = byte_ids_[s[i]];
  return MergeSymbols(length, scratch, out, error);
}

// SentencePiece-style BPE of one segment between added tokens (see TokenizerSpec).
kiln_status_t Tokenizer::EncodeMetaspace(const char* text, size_t length, bool at_start, EncodeScratch* scratch,
                                         Vec<int32_t>* out, kiln_error_t* error) const {
  // Normalise: the prefix, then every space as U+2581 (3 bytes).
  Vec<char>& norm = scratch->chars;
  const bool prefix = !sp_.prepend.empty() && (sp_.prepend_scheme == TokenizerSpec::PrependScheme::kAlways ||
                                                (sp_.prepend_scheme == TokenizerSpec::PrependScheme::kFirst && at_start));
  if (length > SIZE_MAX / 4 || !norm.resize(sp_.prepend.size() + 3 * length))
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");
  size_t m = 0;
  if (prefix) {
    std::memcpy(norm.data(), sp_.prepend.data(), sp_.prepend.size());
    m = sp_.prepend.size();
  }
  for (size_t i = 0; i < length; ++i) {
    if (text[i] == ' ') {
      norm[m++] = '\xE2';
      norm[m++] = '\x96';
      norm[m++] = '\x81';
    } else {
      norm[m++] = text[i];
    }
  }
  // Initial symbols: one per character in the vocabulary, else its bytes' tokens (byte
  // fallback) or the unknown id.
  Vec<Symbol>& sym = scratch->symbols;
  if (m > static_cast<size_t>(INT32_MAX) || !sym.resize(m))
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");
  size_t n = 0;
  bool last_unk = false;
  for (size_t i = 0; i < m;) {
    const auto lead = static_cast<uint8_t>(norm[i]);
    const size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;  // well-formed
    const int32_t id = FindVocab(norm.data() + i, len);
    if (id >= 0) {
      sym[n++].id = id;
      last_unk = false;
    } else if (sp_.byte_fallback) {
      for (size_t k = 0; k < len; ++k) sym[n++].id = byte_ids_[static_cast<uint8_t>(norm[i + k])];
      last_unk = false;
    } else if (!(sp_.fuse_unk && last_unk)) {
      sym[n++].id = sp_.unk_id;
      last_unk = true;
    }
    i += len;
  }
  return MergeSymbols(n, scratch, out, error);
}

kiln_status_t Tokenizer::MergeSymbols(size_t length, EncodeScratch* scratch, Vec<int32_t>* out,
                                      kiln_error_t* error) const {
  if (length == 0) return KILN_OK;
  Vec<Symbol>& sym = scratch->symbols;
  Vec<PairEntry>& heap = scratch->heap;
  Vec<PairEntry>& batch = scratch->batch;
  const auto n = static_cast<int32_t>(length);  // length <= INT32_MAX
  if (!heap.reserve(length)) return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");
  heap.clear();
  for (int32_t i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }

  // Adds the pair starting at symbol p (which has a right neighbour) if it is a merge.
  auto add_pair = [&](int32_t p) -> bool {
    int32_t q = sym[p].next;
    uint32_t rank;
    int32_t merged;
    if (!FindMerge(sym[p].id, sym[q].id, &rank, &merged)) return true;
    return heap.push_back(PairEntry{rank, static_cast<uint32_t>(p), sym[p].id, sym[q].id, merged});
  };
  auto push_pair = [&](int32_t p) -> bool {
    size_t before = heap.size();
    if (!add_pair(p)) return false;
    if (heap.size() != before) std::push_heap(heap.begin(), heap.end(), MergesLater);
    return true;
  };
  for (int32_t i = 0; i + 1 < n; ++i) (void)add_pair(i);  // reserved: at most n - 1
  std::make_heap(heap.begin(), heap.end(), MergesLater);

  while (!heap.empty()) {
    // All current occurrences of the lowest-ranked pair, in text order. Pairs formed
    // by these merges wait for the next round, even if their rank is lower.
    const uint32_t rank = heap[0].rank;
    batch.clear();
    while (!heap.empty() && heap[0].rank == rank) {
      std::pop_heap(heap.begin(), heap.end(), MergesLater);
      if (!batch.push_back(heap[heap.size() - 1]))
        return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");
      heap.pop_back();
    }
    for (const PairEntry& e : batch) {
      const auto p = static_cast<int32_t>(e.pos);
      if (sym[p].id != e.left) continue;  // merged away, or grown since
      int32_t q = sym[p].next;
      if (q < 0 || sym[q].id != e.right) continue;
      sym[p].id = e.merged;
      sym[p].next = sym[q].next;
      if (sym[p].next >= 0) sym[sym[p].next].prev = p;
      sym[q].id = -1;
      if (sym[p].prev >= 0 && !push_pair(sym[p].prev))
        return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");
      if (sym[p].next >= 0 && !push_pair(p))
        return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");
    }
  }

  size_t count = 0;
  for (int32_t i = 0; i >= 0; i = sym[i].next) ++count;
  if (!GrowBy(out, count))
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "encode: out of memory");
  for (int32_t i = 0; i >= 0; i = sym[i].next) (void)out->push_back(sym[i].id);  // reserved
  return KILN_OK;
}

kiln_status_t Tokenizer::AppendBytes(int32_t id, bool skip_special, Vec<char>* out,
                                     kiln_error_t* error) const {
  if (id < 0 || id >= vocab_size_)
    return Fail(error, KILN_ERROR_INPUT_TOKENS, "token id %d is outside [0, %d)", id, vocab_size_);
  if (const AddedToken* added = FindAddedById(id)) {
    if (added->special && skip_special) return KILN_OK;
    if (!out->append(added->content.data(), added->content.size()))
      return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "decode: out of memory");
    return KILN_OK;
  }
  std::string_view token = vocab_[id];
  if (token.empty())
    return Fail(error, KILN_ERROR_INPUT_TOKENS, "token id %d is not used by the vocabulary", id);
  if (metaspace_) {
    // <0xXX> byte tokens stand for their byte; any other token for its text with
    // U+2581 as a space.
    if (sp_.byte_fallback && token.size() == 6 && token[0] == '<' && token[1] == '0' && token[2] == 'x' &&
        token[5] == '>' && std::isxdigit(static_cast<unsigned char>(token[3])) &&
        std::isxdigit(static_cast<unsigned char>(token[4]))) {
      const char hex[3] = {token[3], token[4], 0};
      if (!out->push_back(static_cast<char>(std::strtol(hex, nullptr, 16))))
        return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "decode: out of memory");
      return KILN_OK;
    }
    if (!GrowBy(out, token.size())) return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "decode: out of memory");
    for (size_t i = 0; i < token.size();) {
      if (i + 3 <= token.size() && token.compare(i, 3, "\xE2\x96\x81") == 0) {
        (void)out->push_back(' ');  // reserved
        i += 3;
      } else {
        (void)out->push_back(token[i++]);
      }
    }
    return KILN_OK;
  }
  // Each byte-level character (1 or 2 UTF-8 bytes) stands for one byte.
  const size_t start = out->size();
  if (!GrowBy(out, token.size()) || !out->resize(start + token.size()))
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "decode: out of memory");
  char* dst = out->data() + start;
  const auto* s = reinterpret_cast<const uint8_t*>(token.data());
  const size_t n = token.size();
  size_t written = 0;
  bool byte_level = true;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    if (s[i] < 0x80) {
      cp = s[i];
      i += 1;
    } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < n) {
      cp = (static_cast<uint32_t>(s[i] & 0x1F) << 6) | (s[i + 1] & 0x3F);
      i += 2;
    } else {
      byte_level = false;
      break;
    }
    if (cp >= 0x144 || cp_to_byte_[cp] < 0) {
      byte_level = false;
      break;
    }
    dst[written++] = static_cast<char>(cp_to_byte_[cp]);
  }
  if (!byte_level) {
    // A character outside the byte-level alphabet: the token stands for its own UTF-8
    // (Hugging Face's ByteLevel decoder does the same).
    std::memcpy(dst, token.data(), n);
    written = n;
  }
  (void)out->resize(start + written);  // shrinking never fails
  return KILN_OK;
}

kiln_status_t Tokenizer::AppendTokenBytes(int32_t id, bool skip_special, Vec<char>* out,
                                          kiln_error_t* error) const {
  if (out == nullptr) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "decode: out is NULL");
  return AppendBytes(id, skip_special, out, error);
}

kiln_status_t Tokenizer::Decode(const int32_t* ids, size_t count, bool skip_special,
                                Vec<char>* out_utf8, kiln_error_t* error) const {
  if (out_utf8 == nullptr)
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "decode: out_utf8 is NULL");
  if (ids == nullptr && count > 0) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "decode: ids is NULL");
  for (size_t i = 0; i < count; ++i) {
    int32_t id = ids[i];
    if (id < 0 || id >= vocab_size_)
      return Fail(error, KILN_ERROR_INPUT_TOKENS, "decode: ids[%zu] = %d is outside [0, %d)", i, id,
                  vocab_size_);
    if (vocab_[id].empty() && FindAddedById(id) == nullptr)
      return Fail(error, KILN_ERROR_INPUT_TOKENS, "decode: ids[%zu] = %d is not a token", i, id);
  }
  Vec<char> raw(allocator_);
  for (size_t i = 0; i < count; ++i) {
    kiln_status_t status = AppendBytes(ids[i], skip_special, &raw, error);
    if (status != KILN_OK) return status;
  }
  // The decoder's Strip: leading spaces of the text.
  size_t skip = 0;
  while (skip < raw.size() && skip < static_cast<size_t>(sp_.decode_strip) && raw[skip] == ' ') ++skip;
  if (!AppendUtf8Replacing(raw.data() + skip, raw.size() - skip, out_utf8))
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "decode: out of memory");
  return KILN_OK;
}

int32_t Tokenizer::TokenToId(std::string_view token) const {
  if (token.empty()) return -1;
  auto first = static_cast<uint8_t>(token[0]);
  for (uint32_t i = added_first_[first]; i < added_first_[first + 1]; ++i) {
    if (added_[i].content == token) return added_[i].id;
  }
  return FindVocab(token.data(), token.size());
}

bool Tokenizer::IsSpecial(int32_t id) const {
  const AddedToken* added = FindAddedById(id);
  return added != nullptr && added->special;
}

}  // namespace kiln::rt
