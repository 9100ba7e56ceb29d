// Whitespace as Python's str.isspace() and str.strip() define it, in UTF-8: what a chat
// template's `| trim` removes from a message. Shared by the compiler's Jinja evaluator
// (compiler/importers/hf/Jinja.cpp) and the runtime, which applies the template's
// strip to each message (runtime/src/session.cc RenderChat). Header-only, no
// dependencies.
#ifndef KILN_FORMATS_WHITESPACE_H_
#define KILN_FORMATS_WHITESPACE_H_

#include <cstddef>

namespace kiln::format {

// The bytes of the whitespace code point at s[k] (ASCII whitespace, U+001C-U+001F,
// U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000); 0
// when s[k] starts none. `n` is the length of s.
inline size_t SpaceLength(const char* s, size_t n, size_t k) {
  auto b = [&](size_t i) { return i < n ? static_cast<unsigned char>(s[i]) : 0u; };
  const unsigned c = b(k);
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
  if (c == 0xC2 && (b(k + 1) == 0x85 || b(k + 1) == 0xA0)) return 2;
  if (c == 0xE1 && b(k + 1) == 0x9A && b(k + 2) == 0x80) return 3;  // U+1680
  if (c == 0xE2 && b(k + 1) == 0x80) {
    const unsigned t = b(k + 2);  // U+2000-U+200A, U+2028, U+2029, U+202F
    if ((t >= 0x80 && t <= 0x8A) || t == 0xA8 || t == 0xA9 || t == 0xAF) return 3;
  }
  if (c == 0xE2 && b(k + 1) == 0x81 && b(k + 2) == 0x9F) return 3;  // U+205F
  if (c == 0xE3 && b(k + 1) == 0x80 && b(k + 2) == 0x80) return 3;  // U+3000
  return 0;
}

// Narrows [*begin, *end) of s as str.strip() (left and right), lstrip() or rstrip().
inline void StripSpace(const char* s, size_t* begin, size_t* end, bool left, bool right) {
  size_t b = *begin, e = *end;
  if (left)
    while (b < e && SpaceLength(s, e, b) > 0) b += SpaceLength(s, e, b);
  if (right)
    while (e > b) {
      size_t k = e - 1;  // the last code point's first byte
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
      if (SpaceLength(s, e, k) != e - k) break;
      e = k;
    }
  *begin = b;
  *end = e;
}

}  // namespace kiln::format

#endif  // KILN_FORMATS_WHITESPACE_H_
