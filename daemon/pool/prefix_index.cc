#include "daemon/pool/prefix_index.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace polykv::daemon {

PrefixId PrefixIndex::Root(const std::string& space) {
  auto [it, added] = roots_.try_emplace(space, 0);
  if (added) it->second = next_id_++;
  return it->second;
}

std::optional<PrefixId> PrefixIndex::FindRoot(const std::string& space) const {
  auto it = roots_.find(space);
  if (it == roots_.end()) return std::nullopt;
  return it->second;
}

std::optional<PrefixId> PrefixIndex::Find(PrefixId parent, std::span<const int32_t> tokens) const {
  auto it = by_key_.find(Key{parent, {tokens.begin(), tokens.end()}});
  if (it == by_key_.end()) return std::nullopt;
  return it->second;
}

PrefixId PrefixIndex::Insert(PrefixId parent, std::span<const int32_t> tokens, Block& block,
                             std::vector<std::vector<policies::SlotRecord>> records) {
  const PrefixId id = next_id_++;
  block.prefix = id;
  Entry e;
  e.parent = parent;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.block = block;
  e.records = std::move(records);
  e.refs = 1;
  e.stamp = ++clock_;
  by_key_.emplace(Key{parent, e.tokens}, id);
  if (auto p = entries_.find(parent); p != entries_.end()) p->second.children.push_back(id);
  entries_.emplace(id, std::move(e));
  shared_bytes_ += block.bytes();
  return id;
}

void PrefixIndex::Ref(PrefixId id) {
  Entry& e = entries_.at(id);
  if (e.refs++ == 0) {
    cold_.erase({e.stamp, id});
    cached_bytes_ -= e.block.bytes();
    shared_bytes_ += e.block.bytes();
  }
  e.stamp = ++clock_;
}

std::optional<Block> PrefixIndex::Unref(PrefixId id) {
  Entry& e = entries_.at(id);
  if (--e.refs > 0) return std::nullopt;
  shared_bytes_ -= e.block.bytes();
  if (!e.linked) {
    Block block = std::move(e.block);
    Erase(id);
    return block;
  }
  cached_bytes_ += e.block.bytes();
  cold_.insert({e.stamp, id});
  return std::nullopt;
}

void PrefixIndex::Touch(PrefixId id) {
  Entry& e = entries_.at(id);
  if (e.refs == 0) cold_.erase({e.stamp, id});
  e.stamp = ++clock_;
  if (e.refs == 0) cold_.insert({e.stamp, id});
}

std::optional<PrefixId> PrefixIndex::Coldest() const {
  if (cold_.empty()) return std::nullopt;
  return cold_.begin()->second;
}

std::vector<Block> PrefixIndex::Drop(PrefixId id) {
  std::vector<Block> freed;
  Unlink(id, freed);
  return freed;
}

void PrefixIndex::Unlink(PrefixId id, std::vector<Block>& freed) {
  Entry& e = entries_.at(id);
  if (!e.linked) return;
  e.linked = false;
  by_key_.erase(Key{e.parent, e.tokens});
  // Children first: erasing `e` below invalidates the reference.
  for (PrefixId child : std::vector<PrefixId>(e.children)) Unlink(child, freed);
  Entry& self = entries_.at(id);
  if (self.refs > 0) return;  // freed at its last Unref
  cold_.erase({self.stamp, id});
  cached_bytes_ -= self.block.bytes();
  freed.push_back(std::move(self.block));
  Erase(id);
}

void PrefixIndex::Erase(PrefixId id) {
  const PrefixId parent = entries_.at(id).parent;
  if (auto p = entries_.find(parent); p != entries_.end()) std::erase(p->second.children, id);
  entries_.erase(id);
}

uint64_t PrefixIndex::num_pages() const {
  uint64_t n = 0;
  for (const auto& [id, e] : entries_) n += std::ranges::count_if(e.block.pages, [](PageId p) {
    return p != kNoPage;
  });
  return n;
}

absl::Status PrefixIndex::CheckInvariants(const std::map<PrefixId, uint32_t>& refs) const {
  uint64_t shared = 0, cached = 0, cold = 0;
  for (const auto& [id, e] : entries_) {
    auto it = refs.find(id);
    const uint32_t held = it == refs.end() ? 0 : it->second;
    if (held != e.refs) {
      return absl::InternalError(absl::StrCat("prefix block ", id, ": ", e.refs,
                                              " refs recorded, ", held, " tables hold it"));
    }
    if (e.refs == 0 && !e.linked) {
      return absl::InternalError(absl::StrCat("prefix block ", id, " unreachable and unused"));
    }
    if (e.linked != by_key_.contains(Key{e.parent, e.tokens})) {
      return absl::InternalError(absl::StrCat("prefix block ", id, " linked state drifted"));
    }
    (e.refs > 0 ? shared : cached) += e.block.bytes();
    cold += e.refs == 0;
  }
  for (const auto& [id, n] : refs) {
    if (!entries_.contains(id)) {
      return absl::InternalError(absl::StrCat("a table holds prefix block ", id,
                                              ", which the index does not"));
    }
  }
  if (shared != shared_bytes_ || cached != cached_bytes_ || cold != cold_.size() ||
      by_key_.size() > entries_.size()) {
    return absl::InternalError("prefix index byte counts drifted");
  }
  return absl::OkStatus();
}

}  // namespace polykv::daemon
