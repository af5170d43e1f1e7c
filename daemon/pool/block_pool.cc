#include "daemon/pool/block_pool.h"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace polykv::daemon {
namespace {

constexpr uint32_t kMaxArenaId = (1u << 16) - 1;
// Retired arenas watched at most. A long-lived worker keeps every arena it
// ever mapped "held"; past this many the oldest untouched (punched, nothing
// resident) ones are let go, so ids and the daemon's fds stay bounded. Such a
// worker could then make one of those hold memory again unseen: at most
// arena_bytes each, and only by writing where it has no pages.
constexpr size_t kMaxRetiredArenas = 256;
// Live processes watched per arena (a pidfd each). Workers of a tenant are
// a few per arena; a uid forking fetchers cannot grow the daemon's fds.
constexpr size_t kMaxHoldersPerArena = 64;

}  // namespace

absl::StatusOr<BlockShape> MakeBlockShape(uint32_t layers, const kernels::PageShape& page,
                                          PageFormat kf, PageFormat vf, uint64_t max_page_bytes) {
  const uint64_t kb = kernels::PageBytes(kf, kernels::KvKind::kKey, page);
  const uint64_t vb = kernels::PageBytes(vf, kernels::KvKind::kValue, page);
  if (kb == 0 || vb == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "formats ", std::string(kernels::FormatShortName(kf)), "/",
        std::string(kernels::FormatShortName(vf)), " cannot store heads of ", page.head_dim,
        " channels (quantized values need head_dim divisible by the value group)"));
  }
  if (std::max(kb, vb) > max_page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a page would be ", std::max(kb, vb), " bytes, over the superblock size (",
        max_page_bytes, "); use smaller block_tokens"));
  }
  return BlockShape{layers, PageAllocator::SizeClass(kb), PageAllocator::SizeClass(vb), kf, vf};
}

BlockDesc DescribeBlock(uint64_t superblock_bytes, const Block& block, uint32_t block_index) {
  const BlockShape& shape = block.shape;
  BlockDesc b;
  b.block_index = block_index;
  b.pages.reserve(block.pages.size());
  for (size_t i = 0; i < block.pages.size(); ++i) {
    if (block.pages[i] == kNoPage) continue;  // the layer holds none of these slots
    const PageLocation loc =
        PageAllocator::LocationOf(block.pages[i], shape.page_bytes(i), superblock_bytes);
    PageDesc d;
    d.page_id = block.pages[i];
    d.arena_id = loc.arena_id;
    d.offset = loc.offset;
    d.size_bytes = loc.size_bytes;
    d.layer = static_cast<uint32_t>(i / 2);
    d.is_value = i % 2 == 1;
    d.format = d.is_value ? shape.value_format : shape.key_format;
    d.block_index = block_index;
    b.pages.push_back(d);
  }
  return b;
}

std::vector<LayerHole> LayerHoles(const std::vector<Block>& table, uint32_t num_layers,
                                  uint32_t block_tokens) {
  std::vector<LayerHole> out(num_layers);
  for (uint32_t l = 0; l < num_layers; ++l) {
    auto absent = [&](size_t b) {
      return 2 * l < table[b].pages.size() && table[b].pages[2 * l] == kNoPage;
    };
    size_t b = 0;
    while (b < table.size() && !absent(b)) ++b;
    size_t e = b;
    while (e < table.size() && absent(e)) ++e;
    if (e > b) out[l] = LayerHole{b * block_tokens, (e - b) * block_tokens};
  }
  return out;
}

void BlockPool::AttachSession(const BlockAccount& account) {
  auto& t = tenants_[account.tenant];
  if (!t) t = std::make_unique<Tenant>(account.tenant, PageAllocatorOptions{options_.superblock_bytes});
  ++t->num_sessions;
  agent_bytes_.try_emplace(account.agent_id, 0);
}

void BlockPool::DetachSession(const BlockAccount& account) {
  Tenant& t = *tenants_.at(account.tenant);
  if (--t.num_sessions == 0) RetireEmptyArenas(t);
}

uint64_t BlockPool::ChargedBytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tenants_) n += t->allocator.arena_bytes();
  for (const auto& [id, r] : retired_) n += r.arena->ResidentBytes();
  return n;
}

uint64_t BlockPool::FreeBlocksFor(const std::string& tenant, const BlockShape& shape) const {
  auto it = tenants_.find(tenant);
  if (it == tenants_.end() || shape.bytes() == 0) return 0;
  const PageAllocator& a = it->second->allocator;
  const uint64_t sb = options_.superblock_bytes;
  const uint64_t unarenaed = options_.pool_bytes - std::min(options_.pool_bytes, ChargedBytes());
  const uint64_t free_sbs = a.num_free_superblocks() + unarenaed / sb;
  // Per half: free slots in its class's partly used superblocks, and pages
  // per superblock; the free superblocks are shared by both halves.
  struct Half {
    uint64_t partial, per_sb;
  };
  auto half = [&](uint32_t page_bytes) {
    const uint64_t per_sb = sb / PageAllocator::SizeClass(page_bytes);
    return Half{a.FreePagesFor(page_bytes) - a.num_free_superblocks() * per_sb, per_sb};
  };
  const Half k = half(shape.key_page_bytes), v = half(shape.value_page_bytes);
  const bool same_class = PageAllocator::SizeClass(shape.key_page_bytes) ==
                          PageAllocator::SizeClass(shape.value_page_bytes);
  auto fits = [&](uint64_t n) {
    const uint64_t pages = n * shape.layers;
    auto sbs = [](uint64_t need, const Half& h) {
      return need <= h.partial ? 0 : (need - h.partial + h.per_sb - 1) / h.per_sb;
    };
    return same_class ? sbs(2 * pages, k) <= free_sbs : sbs(pages, k) + sbs(pages, v) <= free_sbs;
  };
  uint64_t lo = 0, hi = free_sbs * sb / shape.bytes() + (k.partial + v.partial) / shape.layers + 1;
  while (lo < hi) {  // the largest n that fits
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

absl::StatusOr<uint32_t> BlockPool::NextArenaId() {
  // Ids are 16 bits (they are part of page ids): round-robin from the last
  // one handed out, skipping ids in use, so a freed id is reused last. A
  // retired arena keeps its id: a worker that still maps it must never take
  // a new arena for it.
  for (uint32_t tries = 0; tries < kMaxArenaId; ++tries) {
    uint32_t id = next_arena_id_;
    next_arena_id_ = next_arena_id_ % kMaxArenaId + 1;
    bool used = retired_.contains(id);
    for (const auto& [name, t] : tenants_) used |= t->arenas.contains(id);
    if (!used) return id;
  }
  return absl::ResourceExhaustedError("all 65535 arena ids are in use");
}

void BlockPool::RetireEmptyArenas(Tenant& t) {
  for (uint32_t id : t.allocator.EmptyArenas()) RetireArena(t, id);
  SweepRetired();
}

void BlockPool::RetireArena(Tenant& t, uint32_t id) {
  if (!t.allocator.RemoveArena(id).ok()) return;
  auto node = t.arenas.extract(id);
  Retired r{std::move(node.mapped()), {}, ++retirements_};
  retired_owner_[id] = t.name;
  if (auto h = holders_.extract(id)) r.holders = std::move(h.mapped());
  // Its memory goes back now; the memfd is kept only for the processes
  // that may still map it. A failed punch leaves it resident: still counted.
  (void)r.arena->Discard();
  retired_.emplace(id, std::move(r));
}

uint64_t BlockPool::VacateSparseArenas() {
  const uint64_t sb = options_.superblock_bytes;
  uint64_t vacated = 0;
  for (auto& [name, t] : tenants_) {
    std::vector<PageAllocator::ArenaUse> uses = t->allocator.ArenaUses();
    // Where moved pages can go: free superblocks of the arenas that stay.
    // Whole superblocks per used one is the worst case (pages of a class
    // also fill the free slots of its partly used superblocks).
    uint64_t room = t->allocator.num_free_superblocks();
    std::erase_if(uses, [](const auto& u) { return u.vacating || u.used_superblocks == 0; });
    std::sort(uses.begin(), uses.end(), [](const auto& x, const auto& y) {
      return x.used_superblocks * y.size_bytes < y.used_superblocks * x.size_bytes;
    });
    for (const auto& u : uses) {
      const uint64_t free_here = u.size_bytes / sb - u.used_superblocks;
      // Its own free superblocks are no destination once it is vacated; it
      // must give back more than its pages take elsewhere.
      if (room < free_here + u.used_superblocks || u.used_superblocks * 2 > u.size_bytes / sb) {
        continue;
      }
      if (!t->allocator.Vacate(u.arena_id).ok()) continue;
      room -= free_here + u.used_superblocks;
      vacated += u.size_bytes;
    }
  }
  return vacated;
}

bool BlockPool::InVacatingArena(const std::string& tenant, const Block& block) const {
  const PageAllocator& a = TenantOf(tenant).allocator;
  return a.num_vacating() > 0 && std::any_of(block.pages.begin(), block.pages.end(), [&](PageId p) {
    return p != kNoPage && a.Vacating(PageAllocator::ArenaOf(p));
  });
}

void BlockPool::StopVacating(const std::string& tenant, const Block& block) {
  Tenant& t = *tenants_.at(tenant);
  for (PageId p : block.pages) {
    if (p != kNoPage) t.allocator.Unvacate(PageAllocator::ArenaOf(p));
  }
}

void BlockPool::SweepRetired() {
  std::vector<std::pair<uint64_t, uint32_t>> untouched;  // (serial, id)
  for (auto it = retired_.begin(); it != retired_.end();) {
    auto& holders = it->second.holders;
    std::erase_if(holders, [](const auto& p) { return !p->Alive(); });
    if (holders.empty()) {
      it = retired_.erase(it);  // closes the daemon's fd: the memfd is gone
      continue;
    }
    // An old mapper wrote to it: that memory is nobody's, hand it back.
    if (it->second.arena->ResidentBytes() > 0) {
      (void)it->second.arena->Discard();
    } else {
      untouched.push_back({it->second.serial, it->first});
    }
    ++it;
  }
  if (retired_.size() <= kMaxRetiredArenas) return;
  std::sort(untouched.begin(), untouched.end());
  for (size_t i = 0; i < untouched.size() && retired_.size() > kMaxRetiredArenas; ++i) {
    retired_.erase(untouched[i].second);
  }
}

absl::StatusOr<uint32_t> BlockPool::Grow(Tenant& tenant, uint64_t keep_unmapped) {
  const uint64_t sb = options_.superblock_bytes;
  auto room = [&] {
    const uint64_t taken = ChargedBytes() + keep_unmapped;
    return options_.pool_bytes - std::min(options_.pool_bytes, taken);
  };
  // Each arena of a tenant twice its last, from a small first one.
  uint64_t want = options_.first_arena_bytes ? options_.first_arena_bytes
                                             : options_.arena_bytes / 16;
  for (size_t i = 0; i < tenant.arenas.size() && want < options_.arena_bytes; ++i) want *= 2;
  want = std::max(sb, std::min(want, options_.arena_bytes));
  if (room() < want) {
    // Empty arenas are budget nobody uses, whichever tenant holds them and
    // whether or not it has sessions (finding 2). This tenant has none: its
    // allocation would have used them.
    SweepRetired();
    for (auto& [name, t] : tenants_) {
      if (t.get() != &tenant) RetireEmptyArenas(*t);
    }
  }
  const uint64_t size = std::min(want, room()) / sb * sb;
  if (size < sb) {
    // Arenas of other sessions that hold few pages come back once those
    // pages have moved (at their sessions' next Sync): worth a retry then.
    const uint64_t vacating = VacateSparseArenas();
    return absl::ResourceExhaustedError(
        vacating == 0 ? std::string("pool budget exhausted")
                      : absl::StrCat("pool budget exhausted; ", vacating >> 20,
                                     " MiB of sparsely used arenas are being emptied"));
  }
  auto id = NextArenaId();
  if (!id.ok()) return id.status();
  ArenaOptions ao;
  ao.id = *id;
  ao.size_bytes = size;
  auto arena = options_.arena_factory(ao);
  if (!arena.ok()) return arena.status();
  if (auto s = tenant.allocator.AddArena(*id, size); !s.ok()) return s;
  tenant.arenas.emplace(*id, *std::move(arena));
  retired_owner_.erase(*id);
  return *id;
}

void BlockPool::ZeroPages(const Tenant& t, const Block& block) {
  for (PageId p : block.pages) {
    if (p == kNoPage) continue;
    auto loc = t.allocator.Locate(p);
    if (loc.ok()) (void)t.arenas.at(loc->arena_id)->Zero(loc->offset, loc->size_bytes);
  }
}

void BlockPool::Count(BlockAccount& account, const BlockShape& shape, int64_t sign) {
  const uint64_t b = shape.bytes();
  if (sign > 0) {
    account.bytes += b;
    used_bytes_ += b;
    agent_bytes_[account.agent_id] += b;
  } else {
    account.bytes -= b;
    used_bytes_ -= b;
    agent_bytes_[account.agent_id] -= b;
  }
  pages_by_format_[{shape.key_format, false}] += uint64_t(sign * int64_t(shape.layers));
  pages_by_format_[{shape.value_format, true}] += uint64_t(sign * int64_t(shape.layers));
}

absl::StatusOr<std::vector<Block>> BlockPool::Allocate(BlockAccount& account,
                                                       const BlockShape& shape, uint64_t count,
                                                       bool zero, uint64_t keep_unmapped) {
  Tenant& t = *tenants_.at(account.tenant);
  auto got = AllocateOnce(t, account, shape, count, zero, keep_unmapped);
  // Cached prefix blocks go before anything live: when they are what fills
  // the pool, drop enough of them and try again.
  while (absl::IsResourceExhausted(got.status()) &&
         DropCached(t, count * shape.bytes()) > 0) {
    got = AllocateOnce(t, account, shape, count, zero, keep_unmapped);
  }
  return got;
}

absl::StatusOr<std::vector<Block>> BlockPool::AllocateOnce(Tenant& t, BlockAccount& account,
                                                           const BlockShape& shape,
                                                           uint64_t count, bool zero,
                                                           uint64_t keep_unmapped) {
  std::vector<Block> out;
  out.reserve(count);
  std::vector<uint32_t> grown;
  absl::Status failure;
  for (uint64_t b = 0; b < count && failure.ok(); ++b) {
    Block block{shape, {}};
    std::vector<PageId>& pages = block.pages;
    pages.reserve(shape.num_entries());
    for (uint32_t i = 0; i < shape.num_entries(); ++i) {
      if (!shape.has_layer(i / 2)) {
        pages.push_back(kNoPage);
        continue;
      }
      const uint32_t bytes = shape.page_bytes(i);
      auto page = t.allocator.Alloc(bytes);
      if (!page.ok() && absl::IsResourceExhausted(page.status())) {
        auto grew = Grow(t, keep_unmapped);
        if (!grew.ok()) {
          failure = grew.status();
          break;
        }
        grown.push_back(*grew);
        page = t.allocator.Alloc(bytes);
      }
      if (!page.ok()) {
        failure = page.status();
        break;
      }
      pages.push_back(*page);
    }
    out.push_back(std::move(block));
  }
  if (!failure.ok()) {
    for (const Block& block : out) {
      for (PageId p : block.pages) {
        if (p != kNoPage) (void)t.allocator.Free(p);
      }
    }
    for (uint32_t id : grown) {
      if (t.allocator.RemoveArena(id).ok()) t.arenas.erase(id);
    }
    return failure;
  }
  for (const Block& block : out) {
    if (zero) ZeroPages(t, block);
    Count(account, shape, +1);
  }
  return out;
}

void BlockPool::Free(BlockAccount& account, Block& block) {
  if (block.empty()) return;
  Tenant& t = *tenants_.at(account.tenant);
  if (block.prefix != 0) {
    CountShared(account, block.bytes(), -1);
    const PrefixId id = std::exchange(block.prefix, 0);
    block.pages.clear();
    if (auto gone = t.prefix.Unref(id)) {
      FreePrefixBlock(t, *gone);
    } else if (t.prefix.Get(id).refs == 0 && InVacatingArena(t.name, t.prefix.Get(id).block)) {
      // Cached where an arena is being emptied: it would keep it.
      for (Block& b : t.prefix.Drop(id)) {
        ++prefix_dropped_blocks_;
        FreePrefixBlock(t, b);
      }
    }
    return;
  }
  if (FreePages(t, block)) Count(account, block.shape, -1);
}

bool BlockPool::FreePages(Tenant& t, Block& block) {
  // A page of a block is allocated by construction; a failure here is a bug
  // that CheckInvariants reports as drifted counts.
  bool all = true, vacated = false;
  for (PageId p : block.pages) {
    if (p == kNoPage) continue;
    all &= t.allocator.Free(p).ok();
    vacated |= t.allocator.Vacating(PageAllocator::ArenaOf(p));
  }
  block.pages.clear();
  if (vacated) {
    for (uint32_t id : t.allocator.EmptyArenas()) {
      if (t.allocator.Vacating(id)) RetireArena(t, id);
    }
  }
  return all;
}

uint64_t BlockPool::PageAddress(const std::string& tenant, PageId page, int* device) const {
  *device = -1;
  const Tenant& t = TenantOf(tenant);
  auto loc = t.allocator.Locate(page);
  if (!loc.ok()) return 0;
  const Arena& arena = *t.arenas.at(loc->arena_id);
  auto* base = static_cast<uint8_t*>(arena.host_base());
  if (base == nullptr && arena.device_base() != nullptr) {
    base = static_cast<uint8_t*>(arena.device_base());
    *device = arena.device();
  }
  return base == nullptr ? 0 : reinterpret_cast<uintptr_t>(base + loc->offset);
}

uint64_t BlockPool::HostAddress(const std::string& tenant, PageId page) const {
  int device = -1;
  const uint64_t addr = PageAddress(tenant, page, &device);
  return device >= 0 ? 0 : addr;
}

absl::StatusOr<PageLocation> BlockPool::Locate(const std::string& tenant, PageId page) const {
  return TenantOf(tenant).allocator.Locate(page);
}

std::vector<ArenaExport> BlockPool::NewArenas(const std::string& tenant,
                                              std::vector<uint32_t>& known) const {
  const auto& arenas = TenantOf(tenant).arenas;
  std::erase_if(known, [&](uint32_t id) { return !arenas.contains(id); });
  std::vector<ArenaExport> out;
  for (const auto& [id, arena] : arenas) {
    if (!std::binary_search(known.begin(), known.end(), id)) {
      out.push_back(arena->Export());
      known.insert(std::upper_bound(known.begin(), known.end(), id), id);
    }
  }
  return out;
}

absl::StatusOr<ArenaFd> BlockPool::DupArenaFd(const std::string& tenant, uint32_t arena_id,
                                              pid_t holder) {
  const Tenant& t = TenantOf(tenant);
  auto it = t.arenas.find(arena_id);
  if (auto r = retired_owner_.find(arena_id);
      it == t.arenas.end() && r != retired_owner_.end() && r->second == tenant) {
    // Announced, then retired before this fetch (empty arenas go back under
    // pressure): none of the tenant's pages are in it, so skipping it is safe.
    return absl::NotFoundError(absl::StrCat(
        "arena ", arena_id, " was retired (it was empty and the pool needed the room); it holds "
        "no page of this tenant"));
  }
  if (it == t.arenas.end()) {
    // Same answer whether the arena is another tenant's or does not exist.
    return absl::PermissionDeniedError(
        absl::StrCat("arena ", arena_id, " is not an arena of this session's tenant"));
  }
  if (it->second->fd() < 0) {
    return absl::FailedPreconditionError(
        "arena has no descriptor to hand out (legacy CUDA IPC: map it with its handle)");
  }
  int fd = dup(it->second->fd());
  if (fd < 0) return absl::InternalError("dup of arena fd failed");
  if (options_.watcher) {
    auto& holders = holders_[arena_id];
    std::erase_if(holders, [](const auto& p) { return !p->Alive(); });
    const bool known = std::any_of(holders.begin(), holders.end(),
                                   [&](const auto& p) { return p->pid() == holder; });
    if (!known && holders.size() >= kMaxHoldersPerArena) {
      close(fd);
      return absl::ResourceExhaustedError(absl::StrCat(
          "arena ", arena_id, " is mapped by ", holders.size(),
          " live processes already (the most polykvd watches); fetch it in fewer processes"));
    }
    if (!known) {
      if (auto ref = options_.watcher(holder)) holders.push_back(std::move(ref));
    }
  }
  return ArenaFd{fd, it->second->size_bytes()};
}

uint64_t BlockPool::agent_bytes(const std::string& agent_id) const {
  auto own = agent_bytes_.find(agent_id);
  auto shared = agent_shared_.find(agent_id);
  return (own == agent_bytes_.end() ? 0 : own->second) +
         (shared == agent_shared_.end() ? 0 : shared->second);
}

void BlockPool::ForgetAgent(const std::string& agent_id) {
  auto it = agent_bytes_.find(agent_id);
  if (it != agent_bytes_.end() && it->second == 0) agent_bytes_.erase(it);
  auto shared = agent_shared_.find(agent_id);
  if (shared != agent_shared_.end() && shared->second == 0) agent_shared_.erase(shared);
}

void BlockPool::Summarize(PoolSummary& p) const {
  p.pool_bytes = options_.pool_bytes;
  p.used_bytes = used_bytes_;
  p.superblock_bytes = options_.superblock_bytes;
  for (const auto& [name, t] : tenants_) {
    p.arena_bytes += t->allocator.arena_bytes();
    p.num_arenas += t->arenas.size();
    p.num_pages += t->allocator.num_pages();
    for (const auto& u : t->allocator.ArenaUses()) {
      p.num_superblocks_used += u.used_superblocks;
      p.vacating_arenas += u.vacating;
    }
    p.tenants.push_back({name, t->allocator.used_bytes(), t->allocator.arena_bytes(), t->num_sessions});
    p.prefix_shared_bytes += t->prefix.shared_bytes();
    p.prefix_cached_bytes += t->prefix.cached_bytes();
  }
  p.prefix_dropped_blocks = prefix_dropped_blocks_;
  p.retired_arenas = retired_.size();
  for (const auto& [id, r] : retired_) p.retired_resident_bytes += r.arena->ResidentBytes();
  for (const auto& [k, n] : pages_by_format_) p.pages_by_format.push_back({k, n});
  for (const auto& [a, b] : agent_bytes_) p.bytes_by_agent.push_back({a, b});
  std::stable_sort(p.bytes_by_agent.begin(), p.bytes_by_agent.end(),
                   [](const auto& x, const auto& y) { return x.second > y.second; });
}

absl::Status BlockPool::CheckInvariants(const Holdings& held) const {
  uint64_t tenant_used = 0, prefix_bytes = 0, pages = held.pages;
  for (const auto& [name, t] : tenants_) {
    if (auto s = t->allocator.CheckInvariants(); !s.ok()) return s;
    tenant_used += t->allocator.used_bytes();
    auto refs = held.prefix_refs.find(name);
    if (auto s = t->prefix.CheckInvariants(refs == held.prefix_refs.end()
                                                ? std::map<PrefixId, uint32_t>{}
                                                : refs->second);
        !s.ok()) {
      return absl::InternalError(absl::StrCat("tenant ", name, ": ", s.message()));
    }
    if (t->prefix_bytes != t->prefix.shared_bytes() + t->prefix.cached_bytes()) {
      return absl::InternalError(absl::StrCat("tenant ", name, ": prefix bytes drifted"));
    }
    prefix_bytes += t->prefix_bytes;
    pages += t->prefix.num_pages();
  }
  if (held.bytes + prefix_bytes != used_bytes_ || tenant_used != used_bytes_) {
    return absl::InternalError(absl::StrCat("used bytes: pool ", used_bytes_, ", tenants ",
                                            tenant_used, ", sessions ", held.bytes,
                                            " + shared prefixes ", prefix_bytes));
  }
  for (const auto* counts : {&agent_bytes_, &agent_shared_}) {
    const auto& totals = counts == &agent_bytes_ ? held.agent_bytes : held.agent_shared;
    for (const auto& [agent, b] : *counts) {
      auto it = totals.find(agent);
      if ((it == totals.end() ? 0 : it->second) != b) {
        return absl::InternalError(absl::StrCat("agent ", agent, " bytes drifted"));
      }
    }
  }
  uint64_t format_pages = 0;
  for (const auto& [k, n] : pages_by_format_) format_pages += n;
  if (format_pages != pages) return absl::InternalError("pages-by-format count drifted");
  return absl::OkStatus();
}

}  // namespace polykv::daemon
