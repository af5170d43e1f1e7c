// Unicode Normalization Form C (canonical decomposition, canonical ordering,
// canonical composition; UAX #15), the normalizer Qwen2's tokenizer.json names.
// Tables come from Python's unicodedata (unicode_nfc_tables.inc).
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
