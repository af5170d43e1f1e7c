#include "policies/ranking.h"

#include <algorithm>
#include <array>

namespace polykv::policies {

bool GlobalPool::Offer(const Ranked& r, Ranked* displaced, bool* did_displace) {
  if (did_displace != nullptr) *did_displace = false;
  if (capacity_ == 0) return false;
  if (heap_.size() < capacity_) {
    heap_.push_back(r);
    std::push_heap(heap_.begin(), heap_.end(), BetterOrder{});
    return true;
  }
  if (!Better(r, heap_.front())) return false;
  std::pop_heap(heap_.begin(), heap_.end(), BetterOrder{});
  if (displaced != nullptr) *displaced = heap_.back();
  if (did_displace != nullptr) *did_displace = true;
  heap_.back() = r;
  std::push_heap(heap_.begin(), heap_.end(), BetterOrder{});
  return true;
}

std::vector<uint32_t> GlobalPool::SortedIndices() const {
  std::vector<uint32_t> out;
  out.reserve(heap_.size());
  for (const Ranked& r : heap_) out.push_back(r.index);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

constexpr int kDigitBits = 11;
constexpr int kNumDigits = (64 + kDigitBits - 1) / kDigitBits;  // 6; the top one has 9 bits
constexpr uint32_t kBuckets = 1u << kDigitBits;

}  // namespace

void RadixSortAscending(absl::Span<uint64_t> keys, std::vector<uint64_t>* scratch) {
  const size_t n = keys.size();
  if (n < 2) return;
  // One pass counts every digit; a digit on which all keys agree moves nothing.
  std::vector<std::array<uint32_t, kBuckets>> hist(kNumDigits);
  for (auto& h : hist) h.fill(0);
  for (uint64_t k : keys) {
    for (int d = 0; d < kNumDigits; ++d) ++hist[d][(k >> (d * kDigitBits)) & (kBuckets - 1)];
  }
  scratch->resize(n);
  uint64_t* src = keys.data();
  uint64_t* dst = scratch->data();
  for (int d = 0; d < kNumDigits; ++d) {
    std::array<uint32_t, kBuckets>& h = hist[d];
    const int shift = d * kDigitBits;
    if (h[(src[0] >> shift) & (kBuckets - 1)] == n) continue;
    uint32_t sum = 0;
    for (uint32_t& c : h) {
      const uint32_t t = c;
      c = sum;
      sum += t;
    }
    for (size_t i = 0; i < n; ++i) dst[h[(src[i] >> shift) & (kBuckets - 1)]++] = src[i];
    std::swap(src, dst);
  }
  if (src != keys.data()) std::copy(src, src + n, keys.data());
}

void SelectLargest(absl::Span<uint64_t> keys, size_t k, std::vector<uint64_t>* scratch) {
  const size_t n = keys.size();
  if (k == 0 || k >= n) return;
  // Find the k-th largest key digit by digit from the top, keeping in
  // `scratch` only the keys that share the digits found so far.
  scratch->assign(keys.begin(), keys.end());
  uint64_t* cur = scratch->data();
  size_t size = n, need = k;  // the need-th largest of cur[0, size)
  std::array<uint32_t, kBuckets> h;
  for (int d = kNumDigits - 1; d >= 0 && size > 1; --d) {
    const int shift = d * kDigitBits;
    h.fill(0);
    for (size_t i = 0; i < size; ++i) ++h[(cur[i] >> shift) & (kBuckets - 1)];
    uint32_t b = kBuckets - 1;
    for (size_t above = 0;; --b) {
      if (above + h[b] >= need) {
        need -= above;
        break;
      }
      above += h[b];
    }
    if (h[b] == size) continue;
    size_t j = 0;
    for (size_t i = 0; i < size; ++i) {
      const uint64_t x = cur[i];
      cur[j] = x;
      j += ((x >> shift) & (kBuckets - 1)) == b;
    }
    size = j;
  }
  // Keys are distinct, so exactly k of them are >= the k-th largest.
  const uint64_t kth = cur[need - 1];
  std::partition(keys.begin(), keys.end(), [kth](uint64_t x) { return x >= kth; });
}

std::vector<Ranked> GlobalPool::BestFirst() const {
  std::vector<Ranked> out = heap_;
  std::sort(out.begin(), out.end(), BetterOrder{});
  return out;
}

}  // namespace polykv::policies
