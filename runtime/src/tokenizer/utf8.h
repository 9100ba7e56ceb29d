// UTF-8 for the tokenizer and its pre-tokenizer regex: one validator (well-formed
// sequences as Unicode's Table 3-7 defines them) and one decoder and encoder.
#ifndef KILN_RUNTIME_SRC_TOKENIZER_UTF8_H_
#define KILN_RUNTIME_SRC_TOKENIZER_UTF8_H_

#include <cstddef>
#include <cstdint>

namespace kiln::rt::utf8 {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// For a lead byte of a multi-byte sequence: the number of continuation bytes and the
// range allowed for the first of them (which excludes overlong forms, surrogates and
// code points above U+10FFFF). False for ASCII, continuation and never-valid bytes.
inline bool LeadInfo(uint8_t c, size_t* need, uint8_t* lo, uint8_t* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    *need = 1;
    return true;
  }
  if (c >= 0xE0 && c <= 0xEF) {
    *need = 2;
    if (c == 0xE0) *lo = 0xA0;
    if (c == 0xED) *hi = 0x9F;
    return true;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    *need = 3;
    if (c == 0xF0) *lo = 0x90;
    if (c == 0xF4) *hi = 0x8F;
    return true;
  }
  return false;
}

// Length of the well-formed sequence starting at s[i] (i < n), or 0 when ill-formed.
// When ill-formed, *subpart receives the length of its maximal subpart (>= 1): the
// bytes one U+FFFD replaces.
inline size_t SequenceLength(const uint8_t* s, size_t n, size_t i, size_t* subpart) {
  uint8_t c = s[i];
  if (c < 0x80) return 1;
  size_t need;
  uint8_t lo, hi;
  *subpart = 1;
  if (!LeadInfo(c, &need, &lo, &hi)) return 0;
  if (i + 1 >= n || s[i + 1] < lo || s[i + 1] > hi) return 0;
  size_t k = 2;
  while (k <= need && i + k < n && (s[i + k] & 0xC0) == 0x80) ++k;
  if (k == need + 1) return k;
  *subpart = k;
  return 0;
}

// Decodes the well-formed character at s (validated before): its length in bytes.
inline size_t Decode(const uint8_t* s, uint32_t* cp) {
  const uint8_t c = s[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if (c < 0xE0) {
    *cp = (static_cast<uint32_t>(c & 0x1F) << 6) | (s[1] & 0x3F);
    return 2;
  }
  if (c < 0xF0) {
    *cp = (static_cast<uint32_t>(c & 0x0F) << 12) | (static_cast<uint32_t>(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return 3;
  }
  *cp = (static_cast<uint32_t>(c & 0x07) << 18) | (static_cast<uint32_t>(s[1] & 0x3F) << 12) |
        (static_cast<uint32_t>(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
  return 4;
}

// Decodes the character at s[0 .. n) after checking it: its length, 0 when ill-formed.
inline size_t DecodeChecked(const uint8_t* s, size_t n, uint32_t* cp) {
  size_t subpart;
  return SequenceLength(s, n, 0, &subpart) == 0 ? 0 : Decode(s, cp);
}

// Writes the UTF-8 of the scalar value cp (<= U+10FFFF, not a surrogate) to out[0 .. 4):
// its length in bytes.
inline size_t Encode(uint32_t cp, char* out) {
  if (cp < 0x80) {
    out[0] = static_cast<char>(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = static_cast<char>(0xC0 | (cp >> 6));
    out[1] = static_cast<char>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = static_cast<char>(0xE0 | (cp >> 12));
    out[1] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<char>(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = static_cast<char>(0xF0 | (cp >> 18));
  out[1] = static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
  out[2] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
  out[3] = static_cast<char>(0x80 | (cp & 0x3F));
  return 4;
}

}  // namespace kiln::rt::utf8

#endif  // KILN_RUNTIME_SRC_TOKENIZER_UTF8_H_
