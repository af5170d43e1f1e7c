#include "client/worker/unicode_nfc.h"

#include <algorithm>
#include <vector>

#include "client/worker/utf8.h"

namespace polykv::worker {
namespace {

struct CombiningClassRange {
  uint32_t first;
  uint32_t last;
  uint8_t ccc;
};
struct CanonicalDecomposition {
  uint32_t cp;
  uint32_t first;
  uint32_t second;  // 0: a singleton decomposition.
  bool composes;    // cp is the primary composite of (first, second).
};
#include "client/worker/unicode_nfc_tables.inc"

// Hangul syllables decompose and compose arithmetically (Unicode 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// Below U+00C0 nothing decomposes; below U+0300 every class is 0. The
// fast paths matter: most text is Latin.
constexpr uint32_t kFirstDecomposable = 0xC0;
constexpr uint32_t kFirstNonStarter = 0x300;

const CanonicalDecomposition* FindDecomposition(uint32_t cp) {
  if (cp < kFirstDecomposable) return nullptr;
  const auto* end = std::end(kCanonicalDecompositions);
  const auto* it = std::lower_bound(
      std::begin(kCanonicalDecompositions), end, cp,
      [](const CanonicalDecomposition& d, uint32_t v) { return d.cp < v; });
  return it != end && it->cp == cp ? it : nullptr;
}

void Decompose(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp - kSBase < kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const CanonicalDecomposition* d = FindDecomposition(cp);
  if (d == nullptr) {
    out->push_back(cp);
    return;
  }
  Decompose(d->first, out);  // One level per table row; recurse for the rest.
  if (d->second != 0) Decompose(d->second, out);
}

// (first << 32 | second) -> primary composite, sorted by key.
const std::vector<std::pair<uint64_t, uint32_t>>& Compositions() {
  static const auto* table = [] {
    auto* t = new std::vector<std::pair<uint64_t, uint32_t>>();
    for (const CanonicalDecomposition& d : kCanonicalDecompositions) {
      if (d.composes) t->emplace_back((static_cast<uint64_t>(d.first) << 32) | d.second, d.cp);
    }
    std::sort(t->begin(), t->end());
    return t;
  }();
  return *table;
}

// The primary composite of (a, b), or 0 if there is none.
uint32_t Compose(uint32_t a, uint32_t b) {
  if (a - kLBase < kLCount && b - kVBase < kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a - kSBase < kSCount && (a - kSBase) % kTCount == 0 && b - (kTBase + 1) < kTCount - 1) {
    return a + (b - kTBase);
  }
  if (b < kFirstNonStarter) return 0;  // Every table pair's second is >= U+0300.
  const auto& t = Compositions();
  const uint64_t key = (static_cast<uint64_t>(a) << 32) | b;
  auto it = std::lower_bound(t.begin(), t.end(), std::make_pair(key, uint32_t{0}));
  return it != t.end() && it->first == key ? it->second : 0;
}

// Decomposed code points -> NFC, in place.
void ReorderAndCompose(std::vector<uint32_t>* cps) {
  std::vector<uint32_t>& c = *cps;
  // Canonical ordering: a stable sort by class of each run of non-starters.
  for (size_t i = 1; i < c.size(); ++i) {
    const uint8_t cc = CanonicalCombiningClass(c[i]);
    if (cc == 0) continue;
    for (size_t j = i; j > 0; --j) {
      const uint8_t prev = CanonicalCombiningClass(c[j - 1]);
      if (prev == 0 || prev <= cc) break;
      std::swap(c[j - 1], c[j]);
    }
  }
  // Composition: c joins the last starter unless something between them is
  // a starter or has a class >= c's ("blocked").
  constexpr size_t kNone = static_cast<size_t>(-1);
  size_t starter = kNone;
  int last_class = -1;  // Class of the last kept code point after the starter; -1: none.
  size_t w = 0;
  for (size_t r = 0; r < c.size(); ++r) {
    const uint32_t cp = c[r];
    const int cc = CanonicalCombiningClass(cp);
    if (starter != kNone && last_class < cc) {
      if (const uint32_t composite = Compose(c[starter], cp); composite != 0) {
        c[starter] = composite;
        continue;
      }
    }
    if (cc == 0) {
      starter = w;
      last_class = -1;
    } else {
      last_class = cc;
    }
    c[w++] = cp;
  }
  c.resize(w);
}

}  // namespace

uint8_t CanonicalCombiningClass(uint32_t cp) {
  if (cp < kFirstNonStarter) return 0;
  const auto* end = std::end(kCombiningClassRanges);
  const auto* it = std::upper_bound(
      std::begin(kCombiningClassRanges), end, cp,
      [](uint32_t v, const CombiningClassRange& r) { return v < r.first; });
  return it != std::begin(kCombiningClassRanges) && cp <= (it - 1)->last ? (it - 1)->ccc : 0;
}

std::string NormalizeNfc(std::string_view text) {
  const auto is_ascii = [](char ch) { return static_cast<uint8_t>(ch) < 0x80; };
  if (std::all_of(text.begin(), text.end(), is_ascii)) {
    return std::string(text);
  }
  std::string out;
  out.reserve(text.size());
  std::vector<uint32_t> cps;
  size_t i = 0;
  while (i < text.size()) {
    // One run of valid UTF-8, normalized as a whole.
    cps.clear();
    uint32_t cp;
    int len;
    while (i < text.size() && (len = DecodeUtf8At(text, i, &cp)) > 0) {
      Decompose(cp, &cps);
      i += len;
    }
    ReorderAndCompose(&cps);
    for (uint32_t c : cps) AppendUtf8(c, &out);
    if (i < text.size()) out.push_back(text[i++]);  // An invalid byte, as is.
  }
  return out;
}

}  // namespace polykv::worker
