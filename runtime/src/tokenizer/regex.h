// The pre-tokenizer's regular expressions: a small backtracking engine for the
// patterns of tokenizer.json Split pre-tokenizers (GPT-2, Llama-3, Qwen2/3, GPT-4o,
// Mistral-Nemo, DeepSeek-V3 ...), so that the runtime needs no regex library.
//
// Semantics are Perl's, as Oniguruma (Hugging Face `tokenizers`), Python's `regex` and
// PCRE2 share them: leftmost match, alternatives tried in order, greedy quantifiers
// backtrack. The syntax is the part on which those engines agree:
//   - literals (UTF-8), `\Q...\E`, escapes `\t \n \r \f \a \e \xHH \x{H...} \uHHHH`,
//     and `\` before any ASCII punctuation;
//   - `.` (any character but `\n`), `\s \S` (Unicode White_Space), `\d \D` (Nd),
//     `\p{X} \P{X} \p{^X}` for the general categories (L Lu Ll Lt Lm Lo M Mn Mc Me N Nd
//     Nl No P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk So Z Zs Zl Zp C Cc Cf Cs Co Cn), classes
//     `[...]` / `[^...]` of these with ranges;
//   - groups `(...)` (nothing is captured), `(?:...)`, `(?i:...)`, `(?-i:...)`, `(?i)`,
//     atomic `(?>...)`, look-aheads `(?=...)` and `(?!...)`, anchors `\A` and `\z`;
//   - quantifiers `? * + {n} {n,} {n,m}`, lazy (`??`, `*?` ...) and possessive (`?+`,
//     `*+` ...) on a single character; a group's repetition must be bounded and not
//     possessive.
//   - Case-insensitive matching folds ASCII letters (with U+017F for s and U+212A for k,
//     as Unicode case folding does); other cased characters under `(?i)` are refused.
// Refused, with the construct and its offset in the message: what the engines
// disagree on or real tokenizers do not use (`\w \b \v \h \R`, `^ $`, POSIX classes,
// class set operations, look-behind, back-references, named groups, other flags,
// script names).
//
// Unicode categories come from unicode_categories.inc (Unicode 14.0.0, the version of
// the NFC tables and of PCRE2 10.42).
#ifndef KILN_RUNTIME_TOKENIZER_REGEX_H_
#define KILN_RUNTIME_TOKENIZER_REGEX_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/kiln.h"
#include "support/allocator.h"
#include "support/vec.h"

namespace kiln::rt {

class Regex {
 public:
  explicit Regex(Allocator* allocator)
      : allocator_(allocator), ranges_(allocator), sets_(allocator), nodes_(allocator), alts_(allocator) {}
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Compiles `pattern` (UTF-8). Errors: KILN_ERROR_ARTIFACT_TOKENIZER (ill-formed or
  // unsupported; the message quotes the pattern and names the construct and its
  // offset), KILN_ERROR_OUT_OF_MEMORY.
  kiln_status_t Compile(std::string_view pattern, kiln_error_t* error);

  enum class Result { kNoMatch, kMatch, kLimit };
  // The leftmost match in text[0, length) (well-formed UTF-8) that starts at or after
  // `from` (a character boundary): [*start, *end). Look-aheads see the whole text. With
  // `anchored_non_empty`, only matches starting at `from` count and they must not be
  // empty (PCRE2's ANCHORED | NOTEMPTY_ATSTART). kLimit when the backtracking took
  // more than about a million steps plus a thousand per byte searched (patterns that
  // backtrack exponentially); real tokenizers' patterns stay linear.
  Result Find(const char* text, size_t length, size_t from, bool anchored_non_empty, size_t* start,
              size_t* end) const;

  // General categories, in the order of scripts/gen_unicode_categories.py.
  enum Category : uint8_t {
    kCc, kCf, kCn, kCo, kCs, kLl, kLm, kLo, kLt, kLu, kMc, kMe, kMn, kNd, kNl,
    kNo, kPc, kPd, kPe, kPf, kPi, kPo, kPs, kSc, kSk, kSm, kSo, kZl, kZp, kZs,
  };
  static Category CategoryOf(uint32_t cp);
  static const char* UnicodeVersion();

 private:
  friend class RegexParser;
  friend class RegexMatcher;
  struct Range {
    uint32_t lo, hi;  // inclusive
  };
  struct Set {
    uint64_t ascii[2];  // membership of U+0000..U+007F
    uint32_t first, count;  // ranges_[first, first + count), sorted, disjoint, above U+007F
  };
  enum class Kind : uint8_t { kSet, kGroup, kLookAhead, kNegativeLookAhead, kAtomic, kStart, kEnd };
  enum class Mode : uint8_t { kGreedy, kLazy, kPossessive };
  static constexpr uint32_t kUnbounded = 0xFFFFFFFFu;
  struct Node {
    Kind kind;
    Mode mode;
    uint32_t min, max;  // repetitions (kSet, kGroup); 1, 1 otherwise
    uint32_t index;     // kSet: sets_ index; else the first alternative in alts_
    uint32_t count;     // the number of alternatives
  };
  struct Alt {
    uint32_t begin, end;  // nodes_[begin, end) in sequence
  };

  Allocator* allocator_;
  Vec<Range> ranges_;
  Vec<Set> sets_;
  Vec<Node> nodes_;
  Vec<Alt> alts_;
  uint32_t root_ = 0;  // the node of the whole pattern (a group matched once)
};

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_TOKENIZER_REGEX_H_
