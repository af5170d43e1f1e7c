// UTF-8 encoding and decoding of one code point, shared by the JSON reader,
// the tokenizer's byte-level alphabet, its pre-tokenizers and NFC.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace polykv::worker {

// Appends the UTF-8 bytes of `cp` (REQUIRES: cp <= 0x10FFFF) to `s`.
inline void AppendUtf8(uint32_t cp, std::string* s) {
  if (cp < 0x80) {
    s->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    s->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Decodes the code point starting at s[i] (REQUIRES: i < s.size()) into *cp
// and returns its length in bytes, or 0 when the bytes there are not valid
// UTF-8 (truncated, overlong, a surrogate, above U+10FFFF): callers then take
// the byte at i alone.
inline int DecodeUtf8At(std::string_view s, size_t i, uint32_t* cp) {
  const uint8_t c = static_cast<uint8_t>(s[i]);
  int len;
  uint32_t v;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    v = c & 0x1F;
    len = 2;
  } else if ((c & 0xF0) == 0xE0) {
    v = c & 0x0F;
    len = 3;
  } else if ((c & 0xF8) == 0xF0) {
    v = c & 0x07;
    len = 4;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (int k = 1; k < len; ++k) {
    const uint8_t cc = static_cast<uint8_t>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    v = (v << 6) | (cc & 0x3F);
  }
  if ((len == 2 && v < 0x80) || (len == 3 && v < 0x800) ||
      (len == 4 && (v < 0x10000 || v > 0x10FFFF)) || (v >= 0xD800 && v <= 0xDFFF)) {
    return 0;
  }
  *cp = v;
  return len;
}

}  // namespace polykv::worker
