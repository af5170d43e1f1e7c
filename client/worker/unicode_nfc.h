// Unicode Normalization Form C (canonical decomposition, canonical ordering,
// canonical composition; UAX #15), the normalizer Qwen2's tokenizer.json names.
// Tables come from Python's unicodedata (unicode_nfc_tables.inc, Unicode
// 14.0). Hugging Face's NFC has Unicode 9.0 data, so marks added since (about
// 100 code points, e.g. Wancho tones) and U+11938 may normalize differently;
// the fixture generator finds and avoids them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace polykv::worker {

// Returns NFC(text). Bytes that are not valid UTF-8 are copied through
// unchanged and nothing composes across them. Pure ASCII returns at once.
// Thread-safe.
std::string NormalizeNfc(std::string_view text);

// Canonical combining class of `cp` (0 for starters); exposed for tests.
uint8_t CanonicalCombiningClass(uint32_t cp);

}  // namespace polykv::worker
