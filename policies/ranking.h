// Ranking of slots and the bounded min-heap that keeps the best G of them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace polykv::policies {

// One slot as the selector sees it.
struct Ranked {
  uint8_t tier = 0;   // protection tier (3 hard, 2 window, 1 anchor, 0 none)
  float score = 0.f;  // combined score; never NaN
  int64_t position = 0;
  uint32_t index = 0;  // source slot index (unique within a layer)
};

// Strict total order: higher tier, then higher score, then more recent, then
// lower index. Every tie is broken, so decisions are deterministic.
inline bool Better(const Ranked& a, const Ranked& b) {
  if (a.tier != b.tier) return a.tier > b.tier;
  if (a.score != b.score) return a.score > b.score;
  if (a.position != b.position) return a.position > b.position;
  return a.index < b.index;
}

// Better as a function object, so std algorithms inline it.
struct BetterOrder {
  bool operator()(const Ranked& a, const Ranked& b) const { return Better(a, b); }
};

// The same order packed into one integer, for the fast selection paths: for
// two slots of ONE layer, RankKey(a) > RankKey(b) exactly when Better(a, b).
// Positions ascend strictly with the slot index in a valid view (ValidateView),
// so "more recent, then lower index" is "higher index", which fits the low
// kRankIndexBits bits; the score takes the 32 bits above them as an
// order-preserving image of the float (-0 and +0 compare equal, as in Better),
// the tier the 2 bits on top.
inline constexpr int kRankIndexBits = 30;
inline constexpr uint64_t kRankIndexMask = (uint64_t{1} << kRankIndexBits) - 1;

// REQUIRES: tier < 4, index <= kRankIndexMask, score not NaN.
inline uint64_t RankKey(uint8_t tier, float score, uint32_t index) {
  uint32_t u = std::bit_cast<uint32_t>(score + 0.f);  // + 0 turns -0 into +0
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (uint64_t{tier} << 62) | (uint64_t{u} << kRankIndexBits) | index;
}
inline uint32_t RankKeyIndex(uint64_t key) { return static_cast<uint32_t>(key & kRankIndexMask); }

// Sorts keys ascending: LSD radix sort over 11-bit digits, skipping the digits
// on which all keys agree (so a sort of keys that use b bits costs about
// b / 11 passes). `scratch` is resized to keys.size(); pass a reused buffer
// to avoid allocating. O(n) per pass, stable.
void RadixSortAscending(absl::Span<uint64_t> keys, std::vector<uint64_t>* scratch);

// Moves the k largest keys to keys[0, k) (in no particular order) with an
// MSD radix select over 11-bit digits: each pass keeps only the keys of the
// digit bucket that holds the k-th largest, so the cost is one or two passes
// over all keys. REQUIRES: k <= keys.size(); keys distinct.
void SelectLargest(absl::Span<uint64_t> keys, size_t k, std::vector<uint64_t>* scratch);

// The global important-token pool of the compaction study: the best
// `capacity` candidates offered so far, in a min-heap whose top is the worst
// member, so an offer costs O(log capacity). Used by the selector for every
// score-ranked pool and usable online (offer each slot as it slides out of
// the recent window).
// Thread-compatible.
class GlobalPool {
 public:
  explicit GlobalPool(size_t capacity) : capacity_(capacity) { heap_.reserve(capacity); }

  // Offers one candidate. Returns true if it entered the pool (possibly
  // displacing the worst member, which is then written to *displaced when
  // displaced != nullptr and the pool was full).
  bool Offer(const Ranked& r, Ranked* displaced = nullptr, bool* did_displace = nullptr);

  size_t size() const { return heap_.size(); }
  size_t capacity() const { return capacity_; }
  // REQUIRES: size() > 0. The worst member.
  const Ranked& worst() const { return heap_.front(); }
  // Members' slot indices, ascending.
  std::vector<uint32_t> SortedIndices() const;
  // Members, best first.
  std::vector<Ranked> BestFirst() const;

 private:
  size_t capacity_;
  std::vector<Ranked> heap_;  // std heap ordered by Better: front() is the worst
};

}  // namespace polykv::policies
