// BlockPool's shared prefix blocks (block_pool.h, prefix_index.h): sharing a
// session's full blocks, attaching them to another session, their charge
// (once, to the tenant's index), and dropping cached ones for room.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/pool/block_pool.h"

namespace polykv::daemon {

void BlockPool::CountPrefix(Tenant& t, const BlockShape& shape, int64_t sign) {
  const uint64_t b = shape.bytes();
  used_bytes_ = sign > 0 ? used_bytes_ + b : used_bytes_ - b;
  t.prefix_bytes = sign > 0 ? t.prefix_bytes + b : t.prefix_bytes - b;
  pages_by_format_[{shape.key_format, false}] += uint64_t(sign * int64_t(shape.layers));
  pages_by_format_[{shape.value_format, true}] += uint64_t(sign * int64_t(shape.layers));
}

void BlockPool::CountShared(BlockAccount& account, uint64_t bytes, int64_t sign) {
  uint64_t& agent = agent_shared_[account.agent_id];
  if (sign > 0) {
    account.shared_bytes += bytes;
    agent += bytes;
  } else {
    account.shared_bytes -= bytes;
    agent -= bytes;
  }
}

void BlockPool::FreePrefixBlock(Tenant& t, Block& block) {
  const BlockShape shape = block.shape;
  if (FreePages(t, block)) CountPrefix(t, shape, -1);
}

uint64_t BlockPool::cached_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tenants_) n += t->prefix.cached_bytes();
  return n;
}

uint64_t BlockPool::free_bytes() const {
  const uint64_t used = used_bytes_ - cached_bytes();
  return options_.pool_bytes - std::min(options_.pool_bytes, used);
}

uint64_t BlockPool::DropCached(Tenant& t, uint64_t need) {
  uint64_t dropped = 0;
  while (dropped < need) {
    // The tenant's own first (their room is its own at once), then the
    // tenant caching most: its emptied arenas go back to the pool.
    Tenant* from = t.prefix.Coldest() ? &t : nullptr;
    for (auto& [name, other] : tenants_) {
      if (from == &t) break;
      const uint64_t cached = other->prefix.cached_bytes();
      if (cached > 0 && (from == nullptr || cached > from->prefix.cached_bytes())) {
        from = other.get();
      }
    }
    if (from == nullptr) break;
    for (Block& b : from->prefix.Drop(*from->prefix.Coldest())) {
      dropped += b.bytes();
      ++prefix_dropped_blocks_;
      FreePrefixBlock(*from, b);
    }
    if (from != &t && from->num_sessions == 0) RetireEmptyArenas(*from);
  }
  return dropped;
}

absl::StatusOr<uint64_t> BlockPool::SharePrefix(BlockAccount& account, const std::string& space,
                                                std::span<const int32_t> tokens,
                                                uint32_t block_tokens, std::vector<Block>& table,
                                                const std::vector<std::vector<policies::SlotRecord>>&
                                                    records) {
  Tenant& t = *tenants_.at(account.tenant);
  const uint64_t n = std::min<uint64_t>(tokens.size() / block_tokens, table.size());
  auto block_tokens_of = [&](uint64_t i) { return tokens.subspan(i * block_tokens, block_tokens); };
  // Checked whole before anything changes.
  PrefixId parent = t.prefix.Root(space);
  for (uint64_t i = 0; i < n; ++i) {
    if (table[i].prefix == 0) break;
    const PrefixIndex::Entry& e = t.prefix.Get(table[i].prefix);
    const auto own = block_tokens_of(i);
    if (e.parent != parent || !std::ranges::equal(e.tokens, own)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block ", i, " is a shared prefix block of other tokens than the ids given for "
          "tokens [", i * block_tokens, ", ", (i + 1) * block_tokens, ")"));
    }
    parent = table[i].prefix;
  }
  parent = t.prefix.Root(space);
  uint64_t shared = 0;
  for (uint64_t i = 0; i < n; ++i) {
    Block& b = table[i];
    const auto own = block_tokens_of(i);
    if (b.prefix != 0) {
      parent = b.prefix;
    } else if (auto found = t.prefix.Find(parent, own)) {
      parent = *found;  // shared by another table already: ours stays its own
      continue;
    } else {
      Count(account, b.shape, -1);
      CountPrefix(t, b.shape, +1);
      CountShared(account, b.bytes(), +1);
      std::vector<std::vector<policies::SlotRecord>> slots;
      for (const auto& list : records) {
        slots.emplace_back(list.begin() + i * block_tokens, list.begin() + (i + 1) * block_tokens);
      }
      parent = t.prefix.Insert(parent, own, b, std::move(slots));
    }
    if (shared == i) ++shared;
  }
  return shared;
}

AttachedPrefix BlockPool::AttachPrefix(BlockAccount& account, const std::string& space,
                                       std::span<const int32_t> tokens, uint32_t block_tokens,
                                       uint64_t max_blocks, size_t lists) {
  Tenant& t = *tenants_.at(account.tenant);
  AttachedPrefix out;
  PrefixId parent = t.prefix.Root(space);
  const uint64_t n = std::min<uint64_t>(tokens.size() / block_tokens, max_blocks);
  for (uint64_t i = 0; i < n; ++i) {
    auto found = t.prefix.Find(parent, tokens.subspan(i * block_tokens, block_tokens));
    if (!found) break;
    parent = *found;
    out.blocks.push_back(t.prefix.Get(parent).block);
  }
  // Referenced leaf first, so an ancestor is used more recently than its
  // descendants and never dropped before them.
  for (auto b = out.blocks.rbegin(); b != out.blocks.rend(); ++b) {
    t.prefix.Ref(b->prefix);
    CountShared(account, b->bytes(), +1);
  }
  out.records.resize(lists);
  for (const Block& b : out.blocks) {
    const auto& shared = t.prefix.Get(b.prefix).records;
    for (size_t j = 0; j < lists; ++j) {
      const auto& r = shared[std::min(j, shared.size() - 1)];
      out.records[j].insert(out.records[j].end(), r.begin(), r.end());
    }
  }
  return out;
}

std::vector<Block> BlockPool::FindPrefix(const std::string& tenant, const std::string& space,
                                         std::span<const int32_t> tokens, uint32_t block_tokens,
                                         uint64_t max_blocks) {
  std::vector<Block> out;
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return out;
  PrefixIndex& index = it->second->prefix;
  // A connector's lookup in a space nothing was stored in adds nothing.
  const std::optional<PrefixId> root = index.FindRoot(space);
  if (!root) return out;
  PrefixId parent = *root;
  const uint64_t n = std::min<uint64_t>(tokens.size() / block_tokens, max_blocks);
  for (uint64_t i = 0; i < n; ++i) {
    auto found = index.Find(parent, tokens.subspan(i * block_tokens, block_tokens));
    if (!found) break;
    parent = *found;
    out.push_back(index.Get(parent).block);
  }
  // Leaf first: an ancestor stays used more recently than its descendants.
  for (auto b = out.rbegin(); b != out.rend(); ++b) index.Touch(b->prefix);
  return out;
}

absl::StatusOr<uint64_t> BlockPool::StorePrefix(
    const std::string& tenant, const std::string& space, std::span<const int32_t> tokens,
    uint32_t block_tokens, const BlockShape& shape, uint64_t first, uint64_t count,
    const std::function<void(uint64_t, std::span<std::byte* const>)>& fill) {
  if (first > 0) {  // refused before anything (a tenant, a root) is added
    auto it = tenants_.find(tenant);
    if (it == tenants_.end() || !it->second->prefix.FindRoot(space)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "block 0 of this prefix is not stored (first_block ", first,
          "): store its blocks in order, from block 0"));
    }
  }
  auto& tp = tenants_[tenant];
  if (!tp) tp = std::make_unique<Tenant>(tenant, PageAllocatorOptions{options_.superblock_bytes});
  Tenant& t = *tp;
  BlockAccount account{tenant, "", 0};  // the index's, for the allocation only
  agent_bytes_.try_emplace(account.agent_id, 0);
  auto own = [&](uint64_t i) { return tokens.subspan(i * block_tokens, block_tokens); };
  // Every block of the chain is held while the store runs, so that making
  // room for the next (dropping cached blocks) cannot drop its parent.
  std::vector<PrefixId> held;
  absl::Status status;
  PrefixId parent = t.prefix.Root(space);
  for (uint64_t i = 0; i < first + count; ++i) {
    if (auto found = t.prefix.Find(parent, own(i))) {
      parent = *found;
      t.prefix.Ref(parent);
      held.push_back(parent);
      continue;
    }
    if (i < first) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "block ", i, " of this prefix is not stored (first_block ", first,
          "): store its blocks in order, from block 0"));
      break;
    }
    auto got = Allocate(account, shape, 1, /*zero=*/true);
    if (!got.ok()) {
      status = got.status();
      break;
    }
    Block& b = got->front();
    std::vector<std::byte*> addrs;
    for (PageId p : b.pages) addrs.push_back(reinterpret_cast<std::byte*>(HostAddress(tenant, p)));
    fill(i, addrs);
    Count(account, shape, -1);
    CountPrefix(t, shape, +1);
    // One record list: the block's tokens as written, one per slot.
    std::vector<policies::SlotRecord> records(block_tokens);
    for (uint32_t k = 0; k < block_tokens; ++k) {
      records[k].meta.position = static_cast<int64_t>(i * block_tokens + k);
    }
    parent = t.prefix.Insert(parent, own(i), b, {std::move(records)});
    held.push_back(parent);
  }
  const uint64_t chain = held.size();
  for (PrefixId id : held) {
    if (auto gone = t.prefix.Unref(id)) FreePrefixBlock(t, *gone);  // linked: never
  }
  for (auto id = held.rbegin(); id != held.rend(); ++id) t.prefix.Touch(*id);
  if (!status.ok()) return status;
  return chain;
}

}  // namespace polykv::daemon
