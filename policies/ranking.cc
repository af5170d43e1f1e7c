#include "policies/ranking.h"

#include <algorithm>

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

std::vector<Ranked> GlobalPool::BestFirst() const {
  std::vector<Ranked> out = heap_;
  std::sort(out.begin(), out.end(), BetterOrder{});
  return out;
}

}  // namespace polykv::policies
