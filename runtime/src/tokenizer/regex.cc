#include "tokenizer/regex.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "support/error.h"
#include "support/sort.h"
#include "tokenizer/utf8.h"

namespace kiln::rt {
namespace {

#include "tokenizer/unicode_categories.inc"

// Walks kUnicodeCategoryRuns (see unicode_categories.inc for its encoding) from the
// start of the index entry `entry`.
class CategoryRuns {
 public:
  explicit CategoryRuns(size_t entry = 0)
      : at_(kUnicodeCategoryIndex[entry][1]), next_(kUnicodeCategoryIndex[entry][0]) {}
  // The next run [*first, *last] of category *category; false after U+10FFFF.
  bool Next(uint32_t* first, uint32_t* last, uint8_t* category) {
    if (at_ >= sizeof(kUnicodeCategoryRuns)) return false;
    const uint8_t head = kUnicodeCategoryRuns[at_++];
    uint32_t length = (head & 7) + 1;
    if ((head & 7) == 6) {
      length = 7 + kUnicodeCategoryRuns[at_++];
    } else if ((head & 7) == 7) {
      length = kUnicodeCategoryRuns[at_] | kUnicodeCategoryRuns[at_ + 1] << 8 | kUnicodeCategoryRuns[at_ + 2] << 16;
      at_ += 3;
    }
    *first = next_;
    *last = next_ + length - 1;
    *category = head >> 3;
    next_ += length;
    return true;
  }

 private:
  size_t at_;
  uint32_t next_;
};
constexpr uint32_t kMaxRepeat = 65535;  // as PCRE2
// Recursion of the matcher: about one frame per node on the path of a match (a
// repeated group counts once per repetition). Real patterns need about ten.
constexpr uint64_t kMaxDepth = 500;
constexpr int kQuoted = 160;  // bytes of the pattern quoted in a message

// Unicode White_Space (PropList.txt): `\s` in Oniguruma, Python's `regex` and Rust.
constexpr uint32_t kWhiteSpace[][2] = {{0x09, 0x0D},     {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},
                                       {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                                       {0x205F, 0x205F}, {0x3000, 0x3000}};

constexpr uint32_t Bit(Regex::Category c) { return 1u << c; }
constexpr uint32_t kLetters = Bit(Regex::kLu) | Bit(Regex::kLl) | Bit(Regex::kLt) | Bit(Regex::kLm) | Bit(Regex::kLo);
constexpr uint32_t kCased = Bit(Regex::kLu) | Bit(Regex::kLl) | Bit(Regex::kLt);

struct CategoryName {
  const char* name;
  uint32_t mask;
};
constexpr CategoryName kCategoryNames[] = {
    {"L", kLetters},
    {"Lu", Bit(Regex::kLu)}, {"Ll", Bit(Regex::kLl)}, {"Lt", Bit(Regex::kLt)}, {"Lm", Bit(Regex::kLm)},
    {"Lo", Bit(Regex::kLo)},
    {"M", Bit(Regex::kMn) | Bit(Regex::kMc) | Bit(Regex::kMe)},
    {"Mn", Bit(Regex::kMn)}, {"Mc", Bit(Regex::kMc)}, {"Me", Bit(Regex::kMe)},
    {"N", Bit(Regex::kNd) | Bit(Regex::kNl) | Bit(Regex::kNo)},
    {"Nd", Bit(Regex::kNd)}, {"Nl", Bit(Regex::kNl)}, {"No", Bit(Regex::kNo)},
    {"P", Bit(Regex::kPc) | Bit(Regex::kPd) | Bit(Regex::kPs) | Bit(Regex::kPe) | Bit(Regex::kPi) |
              Bit(Regex::kPf) | Bit(Regex::kPo)},
    {"Pc", Bit(Regex::kPc)}, {"Pd", Bit(Regex::kPd)}, {"Ps", Bit(Regex::kPs)}, {"Pe", Bit(Regex::kPe)},
    {"Pi", Bit(Regex::kPi)}, {"Pf", Bit(Regex::kPf)}, {"Po", Bit(Regex::kPo)},
    {"S", Bit(Regex::kSm) | Bit(Regex::kSc) | Bit(Regex::kSk) | Bit(Regex::kSo)},
    {"Sm", Bit(Regex::kSm)}, {"Sc", Bit(Regex::kSc)}, {"Sk", Bit(Regex::kSk)}, {"So", Bit(Regex::kSo)},
    {"Z", Bit(Regex::kZs) | Bit(Regex::kZl) | Bit(Regex::kZp)},
    {"Zs", Bit(Regex::kZs)}, {"Zl", Bit(Regex::kZl)}, {"Zp", Bit(Regex::kZp)},
    {"C", Bit(Regex::kCc) | Bit(Regex::kCf) | Bit(Regex::kCs) | Bit(Regex::kCo) | Bit(Regex::kCn)},
    {"Cc", Bit(Regex::kCc)}, {"Cf", Bit(Regex::kCf)}, {"Cs", Bit(Regex::kCs)}, {"Co", Bit(Regex::kCo)},
    {"Cn", Bit(Regex::kCn)},
};

using utf8::DecodeChecked;
using utf8::kMaxCodePoint;

inline bool IsAsciiLetter(uint32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }
inline bool IsDigit(char c) { return c >= '0' && c <= '9'; }
inline int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Regex::Category Regex::CategoryOf(uint32_t cp) {
  // The last index entry at or below cp, then its runs up to the one holding cp.
  size_t entry = 0;
  while (entry + 1 < sizeof(kUnicodeCategoryIndex) / sizeof(kUnicodeCategoryIndex[0]) &&
         kUnicodeCategoryIndex[entry + 1][0] <= cp)
    ++entry;
  CategoryRuns runs(entry);
  uint32_t first, last;
  uint8_t category;
  while (runs.Next(&first, &last, &category))
    if (cp <= last) return static_cast<Category>(category);
  return kCn;  // above U+10FFFF
}

const char* Regex::UnicodeVersion() { return kUnicodeCategoriesVersion; }

// ---------------------------------------------------------------------------- parser

class RegexParser {
 public:
  RegexParser(Regex* re, std::string_view pattern, Allocator* allocator, kiln_error_t* error)
      : re_(re), p_(pattern.data()), n_(pattern.size()), allocator_(allocator), error_(error) {}

  kiln_status_t Run() {
    uint32_t first = 0, count = 0;
    if (!ParseAlternation(&first, &count)) return status_;
    if (pos_ < n_) return Refuse(pos_, "an unmatched ')'");
    Regex::Node root{Regex::Kind::kGroup, Regex::Mode::kGreedy, 1, 1, first, count};
    re_->root_ = static_cast<uint32_t>(re_->nodes_.size());
    if (!re_->nodes_.push_back(root)) return Oom();
    if (Depth(re_->root_) > kMaxDepth)
      return Refuse(0, "repetitions of groups nested too deeply (the matcher's recursion would exceed %llu)",
                    static_cast<unsigned long long>(kMaxDepth));
    return KILN_OK;
  }

 private:
  using Range = Regex::Range;

  kiln_status_t Oom() {
    status_ = Fail(error_, KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory (pre-tokenizer regex)");
    return status_;
  }

  // Records the reason the pattern is refused (printf-style) and returns the status.
  __attribute__((format(printf, 3, 4))) kiln_status_t Refuse(size_t at, const char* what, ...) {
    char reason[192];
    va_list args;
    va_start(args, what);
    std::vsnprintf(reason, sizeof(reason), what, args);
    va_end(args);
    status_ = Fail(error_, KILN_ERROR_ARTIFACT_TOKENIZER, "tokenizer: pre-tokenizer regex '%.*s'%s: %s at offset %zu",
                   static_cast<int>(std::min<size_t>(n_, kQuoted)), p_, n_ > kQuoted ? "..." : "", reason, at);
    return status_;
  }

  // Depth of the matcher's recursion through node i (see kMaxDepth), saturating.
  uint64_t Depth(uint32_t i) const {
    const Regex::Node& node = re_->nodes_[i];
    if (node.kind == Regex::Kind::kSet) return node.min == 1 && node.max == 1 ? 0 : 1;
    if (node.kind == Regex::Kind::kStart || node.kind == Regex::Kind::kEnd) return 0;
    uint64_t deepest = 0;
    for (uint32_t a = node.index; a < node.index + node.count; ++a) {
      uint64_t d = 0;
      for (uint32_t j = re_->alts_[a].begin; j < re_->alts_[a].end; ++j) d = std::min<uint64_t>(d + Depth(j), kMaxDepth + 1);
      deepest = std::max(deepest, d);
    }
    const uint64_t reps = node.kind == Regex::Kind::kGroup ? std::max<uint32_t>(node.max, 1) : 1;
    return std::min<uint64_t>(2 + reps * (deepest + 1), kMaxDepth + 1);
  }

  bool ParseAlternation(uint32_t* first, uint32_t* count) {
    Vec<Regex::Alt> alts(allocator_);
    for (;;) {
      Vec<Regex::Node> seq(allocator_);
      if (!ParseSequence(&seq)) return false;
      const auto begin = static_cast<uint32_t>(re_->nodes_.size());
      if (!re_->nodes_.append(seq.data(), seq.size())) return Oom(), false;
      if (!alts.push_back(Regex::Alt{begin, static_cast<uint32_t>(re_->nodes_.size())})) return Oom(), false;
      if (pos_ < n_ && p_[pos_] == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    *first = static_cast<uint32_t>(re_->alts_.size());
    *count = static_cast<uint32_t>(alts.size());
    if (!re_->alts_.append(alts.data(), alts.size())) return Oom(), false;
    return true;
  }

  bool ParseSequence(Vec<Regex::Node>* seq) {
    while (pos_ < n_ && p_[pos_] != '|' && p_[pos_] != ')') {
      const size_t atom_at = pos_;
      const size_t before = seq->size();
      bool flags_only = false;
      if (!ParseAtom(seq, &flags_only)) return false;
      if (!ParseQuantifier(seq, before, flags_only, atom_at)) return false;
    }
    return true;
  }

  // A quantifier after the atom that appended seq[before..] (nothing for `(?i)`).
  bool ParseQuantifier(Vec<Regex::Node>* seq, size_t before, bool flags_only, size_t atom_at) {
    if (pos_ >= n_) return true;
    const size_t at = pos_;
    uint32_t min, max;
    if (!Quantifier(&min, &max)) return status_ == KILN_OK;
    Regex::Mode mode = Regex::Mode::kGreedy;
    if (pos_ < n_ && p_[pos_] == '?') {
      mode = Regex::Mode::kLazy;
      ++pos_;
    } else if (pos_ < n_ && p_[pos_] == '+') {
      mode = Regex::Mode::kPossessive;
      ++pos_;
    }
    uint32_t m2, x2;
    const size_t again = pos_;
    if (Quantifier(&m2, &x2)) return Refuse(again, "a quantifier after a quantifier"), false;
    if (status_ != KILN_OK) return false;
    if (flags_only || seq->size() == before) return Refuse(at, "a quantifier with nothing to repeat"), false;
    Regex::Node& node = seq->back();
    switch (node.kind) {
      case Regex::Kind::kSet:
        break;
      case Regex::Kind::kGroup: {
        // A group of one single character is that character.
        const Regex::Alt* alt = &re_->alts_[node.index];
        if (node.count == 1 && alt->end - alt->begin == 1) {
          const Regex::Node inner = re_->nodes_[alt->begin];
          if (inner.kind == Regex::Kind::kSet && inner.min == 1 && inner.max == 1) {
            node = inner;
            break;
          }
        }
        if (mode == Regex::Mode::kPossessive)
          return Refuse(at, "a possessive quantifier on a group is not supported (use an atomic group)"), false;
        if (max == Regex::kUnbounded)
          return Refuse(at, "an unbounded repetition of a group is not supported (only single characters and classes repeat without bound)"), false;
        break;
      }
      default:
        return Refuse(at, "a quantifier on a look-ahead, atomic group or anchor (at offset %zu) is not supported", atom_at), false;
    }
    node.min = min;
    node.max = max;
    node.mode = mode;
    return true;
  }

  // Reads `? * + {n} {n,} {n,m}` at pos_; false (pos_ unchanged) when there is none.
  bool Quantifier(uint32_t* min, uint32_t* max) {
    if (pos_ >= n_) return false;
    const char c = p_[pos_];
    if (c == '?' || c == '*' || c == '+') {
      *min = c == '+' ? 1 : 0;
      *max = c == '?' ? 1 : Regex::kUnbounded;
      ++pos_;
      return true;
    }
    if (c != '{') return false;
    size_t i = pos_ + 1;
    auto number = [&](uint32_t* v) {
      const size_t start = i;
      uint64_t x = 0;
      while (i < n_ && IsDigit(p_[i])) {
        x = std::min<uint64_t>(x * 10 + static_cast<uint64_t>(p_[i] - '0'), 1u << 30);
        ++i;
      }
      *v = static_cast<uint32_t>(x);
      return i > start;
    };
    uint32_t lo, hi;
    if (!number(&lo)) {
      if (i < n_ && p_[i] == ',') {
        Refuse(pos_, "'{,n}' is not supported (engines disagree: Oniguruma reads {0,n}, PCRE2 a literal; write {0,n})");
      }
      return false;  // a literal '{'
    }
    if (i < n_ && p_[i] == '}') {
      hi = lo;
    } else if (i < n_ && p_[i] == ',') {
      ++i;
      if (i < n_ && p_[i] == '}') {
        hi = Regex::kUnbounded;
      } else if (!number(&hi) || i >= n_ || p_[i] != '}') {
        return false;  // a literal '{'
      }
    } else {
      return false;
    }
    if (lo > kMaxRepeat || (hi != Regex::kUnbounded && hi > kMaxRepeat)) {
      Refuse(pos_, "a repetition count above %u", kMaxRepeat);
      return false;
    }
    if (hi < lo) {
      Refuse(pos_, "a repetition {%u,%u} whose maximum is below its minimum", lo, hi);
      return false;
    }
    *min = lo;
    *max = hi;
    pos_ = i + 1;
    return true;
  }

  bool ParseAtom(Vec<Regex::Node>* seq, bool* flags_only) {
    const size_t at = pos_;
    const char c = p_[pos_];
    Vec<Range> ranges(allocator_);
    switch (c) {
      case '(':
        return ParseGroup(seq, flags_only);
      case '[':
        if (!ParseClass(&ranges)) return false;
        return AddSet(seq, &ranges);
      case '.':
        ++pos_;
        if (!ranges.push_back(Range{0, '\n' - 1}) || !ranges.push_back(Range{'\n' + 1, kMaxCodePoint}))
          return Oom(), false;
        return AddSet(seq, &ranges);
      case '^':
      case '$':
        return Refuse(at, "the anchor '%c' is not supported (its meaning differs between engines; \\A and \\z are)", c),
               false;
      case '*':
      case '+':
      case '?':
        return Refuse(at, "a quantifier with nothing to repeat"), false;
      case '{': {
        uint32_t lo, hi;
        const size_t save = pos_;
        if (Quantifier(&lo, &hi)) return Refuse(save, "a quantifier with nothing to repeat"), false;
        if (status_ != KILN_OK) return false;
        break;  // a literal '{'
      }
      case '\\': {
        if (pos_ + 1 < n_ && p_[pos_ + 1] == 'Q') {  // \Q...\E: literal text
          size_t i = pos_ + 2;
          while (i < n_ && !(p_[i] == '\\' && i + 1 < n_ && p_[i + 1] == 'E')) {
            uint32_t cp;
            const size_t len = DecodeChecked(reinterpret_cast<const uint8_t*>(p_ + i), n_ - i, &cp);
            if (len == 0) return Refuse(i, "ill-formed UTF-8"), false;
            if (!AddChar(seq, cp, i)) return false;
            i += len;
          }
          pos_ = i < n_ ? i + 2 : n_;
          if (seq->size() == 0) *flags_only = true;  // nothing to repeat
          return true;
        }
        if (pos_ + 1 < n_ && (p_[pos_ + 1] == 'A' || p_[pos_ + 1] == 'z')) {
          const bool start = p_[pos_ + 1] == 'A';
          pos_ += 2;
          if (!seq->push_back(Regex::Node{start ? Regex::Kind::kStart : Regex::Kind::kEnd, Regex::Mode::kGreedy, 1, 1,
                                          0, 0}))
            return Oom(), false;
          return true;
        }
        uint32_t cp;
        bool is_set;
        if (!ParseEscape(false, &cp, &is_set, &ranges)) return false;
        if (is_set) return AddSet(seq, &ranges);
        return AddChar(seq, cp, at);
      }
      default:
        break;
    }
    uint32_t cp;
    const size_t len = DecodeChecked(reinterpret_cast<const uint8_t*>(p_ + pos_), n_ - pos_, &cp);
    if (len == 0) return Refuse(pos_, "ill-formed UTF-8"), false;
    pos_ += len;
    return AddChar(seq, cp, at);
  }

  bool ParseGroup(Vec<Regex::Node>* seq, bool* flags_only) {
    const size_t at = pos_;
    ++pos_;  // '('
    Regex::Kind kind = Regex::Kind::kGroup;
    const bool saved_ci = ci_;
    if (pos_ < n_ && p_[pos_] == '?') {
      ++pos_;
      const char d = pos_ < n_ ? p_[pos_] : '\0';
      if (d == ':') {
        ++pos_;
      } else if (d == '=') {
        kind = Regex::Kind::kLookAhead;
        ++pos_;
      } else if (d == '!') {
        kind = Regex::Kind::kNegativeLookAhead;
        ++pos_;
      } else if (d == '>') {
        kind = Regex::Kind::kAtomic;
        ++pos_;
      } else if (d == '<' && pos_ + 1 < n_ && (p_[pos_ + 1] == '=' || p_[pos_ + 1] == '!')) {
        return Refuse(at, "a look-behind is not supported"), false;
      } else if (d == '<' || d == 'P' || d == '\'') {
        return Refuse(at, "a named group is not supported"), false;
      } else if (d == '#') {
        return Refuse(at, "a comment group is not supported"), false;
      } else {
        // Flags: (?i) (?-i) (?i:...) (?-i:...).
        bool on = true, any = false, ci = ci_;
        while (pos_ < n_ && p_[pos_] != ')' && p_[pos_] != ':') {
          const char f = p_[pos_];
          if (f == '-' && on) {
            on = false;
          } else if (f == 'i') {
            ci = on;
            any = true;
          } else {
            return Refuse(pos_, "the flag '%c' is not supported (only i is)", f), false;
          }
          ++pos_;
        }
        if (pos_ >= n_ || !any) return Refuse(at, "an incomplete group"), false;
        if (p_[pos_] == ')') {  // (?i): to the end of the enclosing group
          ++pos_;
          ci_ = ci;
          *flags_only = true;
          return true;
        }
        ++pos_;  // ':'
        ci_ = ci;
      }
    }
    uint32_t first = 0, count = 0;
    if (!ParseAlternation(&first, &count)) return false;
    if (pos_ >= n_ || p_[pos_] != ')') return Refuse(at, "a '(' without its ')'"), false;
    ++pos_;
    ci_ = saved_ci;
    if (!seq->push_back(Regex::Node{kind, Regex::Mode::kGreedy, 1, 1, first, count})) return Oom(), false;
    return true;
  }

  // An escape at pos_ ('\\'): a character (*cp) or a set (*is_set, its ranges appended).
  bool ParseEscape(bool in_class, uint32_t* cp, bool* is_set, Vec<Range>* ranges) {
    const size_t at = pos_;
    *is_set = false;
    if (pos_ + 1 >= n_) return Refuse(at, "a '\\' at the end"), false;
    const char c = p_[pos_ + 1];
    pos_ += 2;
    switch (c) {
      case 't': *cp = '\t'; return true;
      case 'n': *cp = '\n'; return true;
      case 'r': *cp = '\r'; return true;
      case 'f': *cp = '\f'; return true;
      case 'a': *cp = 0x07; return true;
      case 'e': *cp = 0x1B; return true;
      case 'x':
      case 'u': {
        uint32_t v = 0;
        int digits = 0;
        if (c == 'x' && pos_ < n_ && p_[pos_] == '{') {
          size_t i = pos_ + 1;
          while (i < n_ && HexValue(p_[i]) >= 0 && digits < 8) {
            v = v * 16 + static_cast<uint32_t>(HexValue(p_[i++]));
            ++digits;
          }
          if (digits == 0 || i >= n_ || p_[i] != '}') return Refuse(at, "a malformed \\x{...}"), false;
          pos_ = i + 1;
        } else {
          const int want = c == 'x' ? 2 : 4;
          while (digits < want && pos_ < n_ && HexValue(p_[pos_]) >= 0) {
            v = v * 16 + static_cast<uint32_t>(HexValue(p_[pos_++]));
            ++digits;
          }
          if (c == 'u' ? digits != 4 : digits == 0) return Refuse(at, "a malformed \\%c escape", c), false;
        }
        if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) return Refuse(at, "an escape of no character"), false;
        *cp = v;
        return true;
      }
      case 's':
      case 'S':
        *is_set = true;
        return AddWhiteSpace(ranges, c == 'S');
      case 'd':
      case 'D':
        *is_set = true;
        return AddCategories(ranges, Bit(Regex::kNd), c == 'D');
      case 'p':
      case 'P': {
        *is_set = true;
        bool negate = c == 'P';
        if (pos_ >= n_ || p_[pos_] != '{')
          return Refuse(at, "\\%c without braces (write \\%c{...})", c, c), false;
        size_t i = pos_ + 1;
        if (i < n_ && p_[i] == '^') {
          negate = !negate;
          ++i;
        }
        const size_t name_at = i;
        while (i < n_ && p_[i] != '}') ++i;
        if (i >= n_) return Refuse(at, "a \\%c{ without its '}'", c), false;
        const std::string_view name(p_ + name_at, i - name_at);
        pos_ = i + 1;
        for (const CategoryName& k : kCategoryNames) {
          if (name == k.name) {
            // Under (?i) engines differ on a category with some cased letters only.
            if (ci_ && (k.mask & kCased) != 0 && (k.mask & kCased) != kCased)
              return Refuse(at, "\\%c{%.*s} under (?i) is not supported (engines disagree)", c, static_cast<int>(name.size()),
                            name.data()),
                     false;
            return AddCategories(ranges, k.mask, negate);
          }
        }
        return Refuse(at, "the property '%.*s' is not supported (only general categories such as L, Lu, N, P are)",
                      static_cast<int>(std::min<size_t>(name.size(), 40)), name.data()),
               false;
      }
      default:
        break;
    }
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      if (c == 'A' || c == 'z') return Refuse(at, "the anchor \\%c inside a class is not supported", c), false;
      if (c == 'Q' && in_class) return Refuse(at, "\\Q inside a class is not supported"), false;
      return Refuse(at, "the escape \\%c is not supported", c), false;
    }
    // Any other character stands for itself.
    pos_ = at + 1;
    const size_t len = DecodeChecked(reinterpret_cast<const uint8_t*>(p_ + pos_), n_ - pos_, cp);
    if (len == 0) return Refuse(pos_, "ill-formed UTF-8"), false;
    pos_ += len;
    return true;
  }

  // [...] at pos_: its ranges (the class itself, negation applied) into *out.
  bool ParseClass(Vec<Range>* out) {
    const size_t at = pos_;
    ++pos_;
    bool negate = false;
    if (pos_ < n_ && p_[pos_] == '^') {
      negate = true;
      ++pos_;
    }
    if (pos_ < n_ && p_[pos_] == ']') return Refuse(pos_, "a ']' first in a class (write \\])"), false;
    Vec<Range> items(allocator_);
    for (;;) {
      if (pos_ >= n_) return Refuse(at, "a '[' without its ']'"), false;
      const char c = p_[pos_];
      if (c == ']') {
        ++pos_;
        break;
      }
      const size_t item_at = pos_;
      if (c == '[') return Refuse(pos_, "a '[' inside a class is not supported (POSIX or nested classes; write \\[)"), false;
      if (c == '&' && pos_ + 1 < n_ && p_[pos_ + 1] == '&')
        return Refuse(pos_, "'&&' inside a class is not supported (set operations; write \\&\\&)"), false;
      uint32_t lo;
      bool is_set = false;
      if (!ClassChar(&lo, &is_set, &items)) return false;
      if (is_set) continue;
      // A range lo-hi, unless the '-' is last.
      if (pos_ + 1 < n_ && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi;
        bool hi_set = false;
        const size_t hi_at = pos_;
        if (p_[pos_] == '[') return Refuse(pos_, "a '[' inside a class (write \\[)"), false;
        if (!ClassChar(&hi, &hi_set, &items)) return false;
        if (hi_set) return Refuse(hi_at, "a range ending in a class escape"), false;
        if (hi < lo) return Refuse(item_at, "a range out of order"), false;
        if (!AddRange(&items, lo, hi, item_at)) return false;
        continue;
      }
      if (!AddRange(&items, lo, lo, item_at)) return false;
    }
    if (!Normalize(&items)) return false;
    if (negate) return Complement(items, out);
    if (!out->append(items.data(), items.size())) return Oom(), false;
    return true;
  }

  // One item of a class: a character or a class escape (whose ranges go to *items).
  bool ClassChar(uint32_t* cp, bool* is_set, Vec<Range>* items) {
    if (p_[pos_] == '\\') {
      Vec<Range> set(allocator_);
      if (!ParseEscape(true, cp, is_set, &set)) return false;
      if (*is_set && !items->append(set.data(), set.size())) return Oom(), false;
      return true;
    }
    const size_t len = DecodeChecked(reinterpret_cast<const uint8_t*>(p_ + pos_), n_ - pos_, cp);
    if (len == 0) return Refuse(pos_, "ill-formed UTF-8"), false;
    pos_ += len;
    return true;
  }

  // Adds [lo, hi] to a class, with the ASCII letters' case partners under (?i).
  bool AddRange(Vec<Range>* items, uint32_t lo, uint32_t hi, size_t at) {
    if (!items->push_back(Range{lo, hi})) return Oom(), false;
    if (!ci_) return true;
    for (uint32_t c = lo; c <= hi && c < 0x80; ++c) {
      if (IsAsciiLetter(c) && !AddFolds(items, c)) return false;
    }
    if (hi >= 0x80) {
      for (uint32_t c = std::max<uint32_t>(lo, 0x80); c <= hi; ++c) {
        if ((Bit(Regex::CategoryOf(c)) & kCased) != 0)
          return Refuse(at, "a cased non-ASCII character U+%04X under (?i) is not supported", c), false;
      }
    }
    return true;
  }

  bool AddFolds(Vec<Range>* items, uint32_t c) {
    const uint32_t lower = c | 0x20, upper = c & ~0x20u;
    if (!items->push_back(Range{lower, lower}) || !items->push_back(Range{upper, upper})) return Oom(), false;
    if (lower == 's' && !items->push_back(Range{0x17F, 0x17F})) return Oom(), false;  // LATIN SMALL LETTER LONG S
    if (lower == 'k' && !items->push_back(Range{0x212A, 0x212A})) return Oom(), false;  // KELVIN SIGN
    return true;
  }

  bool AddChar(Vec<Regex::Node>* seq, uint32_t cp, size_t at) {
    Vec<Range> ranges(allocator_);
    if (!AddRange(&ranges, cp, cp, at)) return false;
    return AddSet(seq, &ranges);
  }

  bool AddWhiteSpace(Vec<Range>* ranges, bool negate) {
    Vec<Range> ws(allocator_);
    for (const auto& r : kWhiteSpace)
      if (!ws.push_back(Range{r[0], r[1]})) return Oom(), false;
    if (negate) return Complement(ws, ranges);
    if (!ranges->append(ws.data(), ws.size())) return Oom(), false;
    return true;
  }

  bool AddCategories(Vec<Range>* ranges, uint32_t mask, bool negate) {
    Vec<Range> set(allocator_);
    CategoryRuns runs;
    uint32_t lo, hi;
    uint8_t category;
    while (runs.Next(&lo, &hi, &category)) {
      if ((mask >> category & 1) == 0) continue;
      if (!set.empty() && set.back().hi + 1 == lo) {
        set.back().hi = hi;
      } else if (!set.push_back(Range{lo, hi})) {
        return Oom(), false;
      }
    }
    if (negate) return Complement(set, ranges);
    if (!ranges->append(set.data(), set.size())) return Oom(), false;
    return true;
  }

  // Sorts and merges ranges in place.
  bool Normalize(Vec<Range>* ranges) {
    Sort(ranges->begin(), ranges->end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
    size_t m = 0;
    for (size_t i = 0; i < ranges->size(); ++i) {
      const Range r = (*ranges)[i];
      if (m > 0 && r.lo <= (*ranges)[m - 1].hi + 1) {
        (*ranges)[m - 1].hi = std::max((*ranges)[m - 1].hi, r.hi);
      } else {
        (*ranges)[m++] = r;
      }
    }
    (void)ranges->resize(m);  // shrinking never fails
    return true;
  }

  // Appends the complement of sorted, merged `set` over [0, U+10FFFF].
  bool Complement(const Vec<Range>& set, Vec<Range>* out) {
    uint32_t next = 0;
    for (const Range& r : set) {
      if (r.lo > next && !out->push_back(Range{next, r.lo - 1})) return Oom(), false;
      next = r.hi + 1;
    }
    if (next <= kMaxCodePoint && !out->push_back(Range{next, kMaxCodePoint})) return Oom(), false;
    return true;
  }

  // A set node matching once, made from (unsorted) ranges.
  bool AddSet(Vec<Regex::Node>* seq, Vec<Range>* ranges) {
    Normalize(ranges);
    Regex::Set set{{0, 0}, static_cast<uint32_t>(re_->ranges_.size()), 0};
    for (const Range& r : *ranges) {
      for (uint32_t c = r.lo; c <= r.hi && c < 0x80; ++c) set.ascii[c >> 6] |= uint64_t{1} << (c & 63);
      if (r.hi < 0x80) continue;
      if (!re_->ranges_.push_back(Range{std::max<uint32_t>(r.lo, 0x80), r.hi})) return Oom(), false;
      ++set.count;
    }
    const auto index = static_cast<uint32_t>(re_->sets_.size());
    if (!re_->sets_.push_back(set)) return Oom(), false;
    if (!seq->push_back(Regex::Node{Regex::Kind::kSet, Regex::Mode::kGreedy, 1, 1, index, 0})) return Oom(), false;
    return true;
  }

  Regex* re_;
  const char* p_;
  size_t n_;
  size_t pos_ = 0;
  bool ci_ = false;  // case-insensitive here
  Allocator* allocator_;
  kiln_error_t* error_;
  kiln_status_t status_ = KILN_OK;
};

kiln_status_t Regex::Compile(std::string_view pattern, kiln_error_t* error) {
  ranges_.clear();
  sets_.clear();
  nodes_.clear();
  alts_.clear();
  RegexParser parser(this, pattern, allocator_, error);
  return parser.Run();
}

// ---------------------------------------------------------------------------- matcher

class RegexMatcher {
 public:
  using Result = Regex::Result;
  RegexMatcher(const Regex& re, const uint8_t* text, size_t length, uint64_t limit)
      : re_(re), s_(text), n_(length), limit_(limit) {}

  Result At(size_t pos, bool non_empty, size_t* end) {
    start_ = pos;
    non_empty_ = non_empty;
    const Result r = Match(re_.root_, re_.root_ + 1, pos, nullptr);
    if (r == Result::kMatch) *end = end_;
    return r;
  }

 private:
  // What follows when a sequence of nodes has matched: more nodes (kSeq), the end of
  // one repetition of a group (kRepeat), or the end of a look-ahead's or atomic group's
  // own match (kAccept). nullptr: the end of the pattern.
  struct Cont {
    enum Kind : uint8_t { kSeq, kRepeat, kAccept } kind;
    uint32_t i, end;    // kSeq: nodes_[i, end); kRepeat: the group node (i), repetitions done (end)
    size_t* accepted;  // kAccept: receives the end
    const Cont* next;
  };

  bool In(const Regex::Set& set, size_t pos, size_t* next) const {
    if (pos >= n_) return false;
    const uint8_t c = s_[pos];
    if (c < 0x80) {
      *next = pos + 1;
      return (set.ascii[c >> 6] >> (c & 63)) & 1;
    }
    uint32_t cp;
    *next = pos + utf8::Decode(s_ + pos, &cp);
    const Regex::Range* r = re_.ranges_.data() + set.first;
    size_t lo = 0, hi = set.count;
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (r[mid].hi < cp) lo = mid + 1;
      else if (r[mid].lo > cp) hi = mid;
      else return true;
    }
    return false;
  }

  size_t Back(size_t pos) const {
    do --pos;
    while ((s_[pos] & 0xC0) == 0x80);
    return pos;
  }

  Result Match(uint32_t i, uint32_t end, size_t pos, const Cont* k) {
    if (++steps_ > limit_) return Result::kLimit;
    // Single characters in a row need no recursion.
    while (i < end) {
      const Regex::Node& node = re_.nodes_[i];
      if (node.kind != Regex::Kind::kSet || node.min != 1 || node.max != 1) break;
      if (!In(re_.sets_[node.index], pos, &pos)) return Result::kNoMatch;
      ++i;
    }
    if (i == end) return Continue(pos, k);
    const Regex::Node& node = re_.nodes_[i];
    switch (node.kind) {
      case Regex::Kind::kSet:
        return Repeat(node, i, end, pos, k);
      case Regex::Kind::kGroup: {
        const Cont after{Cont::kSeq, i + 1, end, nullptr, k};
        return Iterate(i, 0, pos, &after);
      }
      case Regex::Kind::kLookAhead:
      case Regex::Kind::kNegativeLookAhead:
      case Regex::Kind::kAtomic: {
        size_t accepted = pos;
        const Cont accept{Cont::kAccept, 0, 0, &accepted, nullptr};
        Result r = Result::kNoMatch;
        for (uint32_t a = node.index; a < node.index + node.count && r == Result::kNoMatch; ++a)
          r = Match(re_.alts_[a].begin, re_.alts_[a].end, pos, &accept);
        if (r == Result::kLimit) return r;
        if (node.kind == Regex::Kind::kAtomic)
          return r == Result::kMatch ? Match(i + 1, end, accepted, k) : Result::kNoMatch;
        if ((r == Result::kMatch) != (node.kind == Regex::Kind::kLookAhead)) return Result::kNoMatch;
        return Match(i + 1, end, pos, k);
      }
      case Regex::Kind::kStart:
        return pos == 0 ? Match(i + 1, end, pos, k) : Result::kNoMatch;
      case Regex::Kind::kEnd:
        return pos == n_ ? Match(i + 1, end, pos, k) : Result::kNoMatch;
    }
    return Result::kNoMatch;
  }

  // A repeated single character (node i), then nodes (i, end) and k.
  Result Repeat(const Regex::Node& node, uint32_t i, uint32_t end, size_t pos, const Cont* k) {
    const Regex::Set& set = re_.sets_[node.index];
    uint32_t count = 0;
    size_t next;
    if (node.mode == Regex::Mode::kLazy) {
      for (;;) {
        if (count >= node.min) {
          const Result r = Match(i + 1, end, pos, k);
          if (r != Result::kNoMatch) return r;
        }
        if (count == node.max || !In(set, pos, &next)) return Result::kNoMatch;
        pos = next;
        ++count;
      }
    }
    while (count < node.max && In(set, pos, &next)) {
      pos = next;
      ++count;
    }
    if (count < node.min) return Result::kNoMatch;
    if (node.mode == Regex::Mode::kPossessive) return Match(i + 1, end, pos, k);
    for (;;) {
      const Result r = Match(i + 1, end, pos, k);
      if (r != Result::kNoMatch || count == node.min) return r;
      pos = Back(pos);
      --count;
    }
  }

  // The group node `g` after `count` repetitions.
  Result Iterate(uint32_t g, uint32_t count, size_t pos, const Cont* after) {
    const Regex::Node& node = re_.nodes_[g];
    // Repetitions are bounded, so one that matched nothing may still be followed by
    // more: as PCRE2 does, the group behaves as `max` nested optional copies of itself.
    const bool may_stop = count >= node.min;
    const bool may_go_on = count < node.max;
    if (node.mode == Regex::Mode::kLazy && may_stop) {
      const Result r = Continue(pos, after);
      if (r != Result::kNoMatch) return r;
    }
    if (may_go_on) {
      const Cont repeat{Cont::kRepeat, g, count + 1, nullptr, after};
      for (uint32_t a = node.index; a < node.index + node.count; ++a) {
        const Result r = Match(re_.alts_[a].begin, re_.alts_[a].end, pos, &repeat);
        if (r != Result::kNoMatch) return r;
      }
    }
    if (node.mode != Regex::Mode::kLazy && may_stop) return Continue(pos, after);
    return Result::kNoMatch;
  }

  Result Continue(size_t pos, const Cont* k) {
    if (k == nullptr) {
      if (non_empty_ && pos == start_) return Result::kNoMatch;
      end_ = pos;
      return Result::kMatch;
    }
    switch (k->kind) {
      case Cont::kSeq:
        return Match(k->i, k->end, pos, k->next);
      case Cont::kRepeat:
        return Iterate(k->i, k->end, pos, k->next);
      case Cont::kAccept:
        *k->accepted = pos;
        return Result::kMatch;
    }
    return Result::kNoMatch;
  }

  const Regex& re_;
  const uint8_t* s_;
  size_t n_;
  uint64_t limit_;
  uint64_t steps_ = 0;
  size_t start_ = 0;
  size_t end_ = 0;
  bool non_empty_ = false;
};

Regex::Result Regex::Find(const char* text, size_t length, size_t from, bool anchored_non_empty, size_t* start,
                          size_t* end) const {
  if (nodes_.empty() || from > length) return Result::kNoMatch;
  const auto* s = reinterpret_cast<const uint8_t*>(text);
  RegexMatcher matcher(*this, s, length, (uint64_t{1} << 20) + 1024 * static_cast<uint64_t>(length - from));
  for (size_t pos = from;;) {
    const Result r = matcher.At(pos, anchored_non_empty, end);
    if (r != Result::kNoMatch) {
      *start = pos;
      return r;
    }
    if (anchored_non_empty || pos >= length) return Result::kNoMatch;
    ++pos;
    while (pos < length && (s[pos] & 0xC0) == 0x80) ++pos;
  }
}

}  // namespace kiln::rt
