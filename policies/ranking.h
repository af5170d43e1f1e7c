// Ranking of slots and the bounded min-heap that keeps the best G of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

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
