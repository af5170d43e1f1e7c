// BlockPool: the pool's memory, in blocks. Each tenant has its own arenas and
// PageAllocator (arenas are never shared across tenants). A block is the K and
// V page of every layer for block_tokens tokens; blocks are allocated
// all-or-nothing and charged to a BlockAccount (a session) as they are handed
// out, so the pool, tenant, agent and per-format counts can never disagree.
//
// Memory (issue 14, findings 2 and 10). A tenant's arenas start small and
// double, so many small tenants fit. When the budget is short, empty arenas
// of ANY tenant are retired: their memfd is punched (its memory goes back to
// the system even while workers still map it) and kept, with the processes
// that were given its fd, until they are all gone; its id is not reused
// meanwhile, and whatever memory an old mapper makes it hold again is counted
// and punched anew. So live arenas plus what retired ones hold stay within
// pool_bytes whatever workers keep mapped, and a retired arena's memory is
// never another tenant's (new arenas are new memfds). Pages handed out for a
// reservation are zeroed first: a page never shows a previous owner's KV.
//
// Thread-safety: none; the owner (KvPool) serializes calls under its mutex.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/memory/arena.h"
#include "daemon/memory/process_ref.h"
#include "daemon/pool/page_allocator.h"
#include "daemon/pool/types.h"
#include "kernels/page_format.h"

namespace polykv::daemon {

using ArenaFactory = std::function<absl::StatusOr<std::unique_ptr<Arena>>(const ArenaOptions&)>;

// What one block is made of. A session's blocks start in its fill shape; a
// compaction may store cold blocks in coarser formats (requantization), and
// a policy with budgets that differ by layer leaves a layer's oldest blocks
// without its pages (docs/compaction.md, "Budgets that differ by layer").
struct BlockShape {
  uint32_t layers = 0;            // layers with pages in the block
  uint32_t key_page_bytes = 0;    // size class
  uint32_t value_page_bytes = 0;  // size class
  PageFormat key_format = PageFormat::kF16;
  PageFormat value_format = PageFormat::kF16;
  // [model layers] which layers have pages, when not all do (then `layers`
  // counts the true ones); empty: layers 0 .. layers - 1 all do.
  std::vector<bool> present;
  uint64_t bytes() const { return uint64_t(layers) * (key_page_bytes + value_page_bytes); }
  uint32_t page_bytes(size_t i) const { return i % 2 ? value_page_bytes : key_page_bytes; }
  // Entries of Block::pages (2 per model layer) and whether layer l has pages.
  size_t num_entries() const { return 2 * (present.empty() ? layers : present.size()); }
  bool has_layer(size_t l) const { return present.empty() ? l < layers : present[l]; }
  bool operator==(const BlockShape&) const = default;
};

// The shape of a block of `layers` layers in formats kf/vf for `page`-shaped
// pages (size classes from PageBytes). INVALID_ARGUMENT when a format cannot
// hold such pages (PageBytes is 0: e.g. quantized values need head_dim
// divisible by the value group) or a page would exceed `max_page_bytes`.
absl::StatusOr<BlockShape> MakeBlockShape(uint32_t layers, const kernels::PageShape& page,
                                          PageFormat kf, PageFormat vf, uint64_t max_page_bytes);

// One block's pages, in its shape's formats: pages[2 * layer] is K,
// pages[2 * layer + 1] is V; kNoPage for a layer the block has none of.
struct Block {
  BlockShape shape;
  std::vector<PageId> pages;
  bool empty() const { return pages.empty(); }
  uint64_t bytes() const { return shape.bytes(); }
};

// [layer]: the first slot of a session's table held by each layer (its first
// block with pages of the layer, times block_tokens): 0 unless the layers
// keep budgets of their own. `num_layers` entries.
std::vector<uint64_t> LayerOffsets(const std::vector<Block>& table, uint32_t num_layers,
                                   uint32_t block_tokens);

// Whose blocks: every page handed out is charged to exactly one account.
struct BlockAccount {
  std::string tenant;
  std::string agent_id;
  uint64_t bytes = 0;
};

// Where the block's pages are, for the worker. Pure arithmetic on page ids
// (PageAllocator::LocationOf), so it needs no lock: REQUIRES the pages are
// allocated with the block's size classes.
BlockDesc DescribeBlock(uint64_t superblock_bytes, const Block& block, uint32_t block_index);

struct BlockPoolOptions {
  uint64_t pool_bytes = 1ull << 30;
  uint64_t arena_bytes = 64ull << 20;  // the largest arena
  uint64_t superblock_bytes = 2ull << 20;
  ArenaFactory arena_factory;
  // A tenant's first arena; each next one is twice the last, up to
  // arena_bytes. 0 = arena_bytes / 16 (at least one superblock).
  uint64_t first_arena_bytes = 0;
  // Who was given an arena's fd (DupArenaFd's pid); empty: nobody is
  // watched, and a retired arena is dropped at once.
  ProcessWatcher watcher;
};

class BlockPool {
 public:
  explicit BlockPool(BlockPoolOptions options) : options_(std::move(options)) {}
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A session with this account opens / ends. A tenant's empty arenas are
  // retired when its last session ends.
  void AttachSession(const BlockAccount& account);
  void DetachSession(const BlockAccount& account);

  // `count` blocks for `account`, adding arenas within the budget as needed
  // (retiring empty arenas of other tenants first when it is short).
  // All or nothing: on error no page stays allocated and arenas added for
  // the call are removed again. RESOURCE_EXHAUSTED when the budget or the
  // arena ids run out. With `zero`, the pages are zeroed (a reservation: the
  // worker gets them to fill); a compaction's output is written whole by its
  // copy before anyone reads it. New arenas leave `keep_unmapped` bytes of
  // the budget unmapped (other agents' unused guarantees, which arenas of
  // this tenant would otherwise strand).
  absl::StatusOr<std::vector<Block>> Allocate(BlockAccount& account, const BlockShape& shape,
                                              uint64_t count, bool zero = true,
                                              uint64_t keep_unmapped = 0);
  // Frees the block's pages and uncharges them; `block` is left empty. An
  // arena being vacated is retired as soon as its last page goes.
  void Free(BlockAccount& account, Block& block);

  // Arenas being vacated. When the budget is short, Grow picks the arenas
  // whose pages fit in their tenant's other arenas (the sparsest first) and
  // stops allocating in them; their sessions move those blocks out at their
  // next Sync (KvPool::Relocate), and an emptied arena is retired: one uid's
  // few pages spread over many arenas cannot keep the pool from others.
  bool InVacatingArena(const std::string& tenant, const Block& block) const;
  // The block's pages could not move: its arenas take allocations again.
  void StopVacating(const std::string& tenant, const Block& block);

  // Address of an allocated page in this process: in host memory
  // (*device = -1), or in the memory of GPU *device for device arenas; 0 for
  // unknown pages (or arenas with no memory, as in the pool's unit tests).
  uint64_t PageAddress(const std::string& tenant, PageId page, int* device) const;
  // PageAddress of a page in host memory; 0 for device arenas.
  uint64_t HostAddress(const std::string& tenant, PageId page) const;
  absl::StatusOr<PageLocation> Locate(const std::string& tenant, PageId page) const;
  // Exports of the tenant's arenas whose ids are not in `known` (sorted),
  // which gains them; ids of arenas retired since leave `known`, so an id
  // used again later is announced again.
  std::vector<ArenaExport> NewArenas(const std::string& tenant, std::vector<uint32_t>& known) const;
  // A dup of the arena's fd for process `holder` (recorded: the arena is not
  // forgotten while it lives). NOT_FOUND for an arena of the tenant retired
  // since it was announced (it is empty: nothing of the session is in it);
  // PERMISSION_DENIED unless it is the tenant's; RESOURCE_EXHAUSTED when 64
  // other live processes hold it (each is watched with a pidfd).
  absl::StatusOr<ArenaFd> DupArenaFd(const std::string& tenant, uint32_t arena_id,
                                     pid_t holder);
  // Drops retired arenas whose holders are all gone, and punches again the
  // ones an old mapper wrote to. Called periodically and when short.
  void SweepRetired();

  uint64_t pool_bytes() const { return options_.pool_bytes; }
  uint64_t superblock_bytes() const { return options_.superblock_bytes; }
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t free_bytes() const { return options_.pool_bytes - std::min(options_.pool_bytes, used_bytes_); }
  // How many blocks of `shape` `tenant` could allocate now, in its free page
  // slots, free superblocks and the arenas the pool budget still allows.
  // Less than free_bytes() / shape.bytes() when the free bytes are slots of
  // other size classes (a requantized block's pages are of new classes).
  uint64_t FreeBlocksFor(const std::string& tenant, const BlockShape& shape) const;
  uint64_t agent_bytes(const std::string& agent_id) const;
  // Drops an agent's zero entry (its last session ended).
  void ForgetAgent(const std::string& agent_id);
  const std::map<std::string, uint64_t>& bytes_by_agent() const { return agent_bytes_; }

  // Tenants, arenas, pages and the per-format counts of Stats.
  void Summarize(PoolSummary& out) const;
  // Allocator invariants, and the pool's / tenants' / agents' counts against
  // the totals of `accounts` (every session) and `pages` (their page count).
  absl::Status CheckInvariants(const std::map<std::string, uint64_t>& agent_totals,
                               uint64_t account_total, uint64_t pages) const;

 private:
  struct Tenant {
    Tenant(std::string n, const PageAllocatorOptions& o) : name(std::move(n)), allocator(o) {}
    const std::string name;
    PageAllocator allocator;
    std::map<uint32_t, std::unique_ptr<Arena>> arenas;
    uint32_t num_sessions = 0;
  };

  const Tenant& TenantOf(const std::string& name) const { return *tenants_.at(name); }
  // A retired arena and the processes that may still map it.
  struct Retired {
    std::unique_ptr<Arena> arena;
    std::vector<std::shared_ptr<const ProcessRef>> holders;
    uint64_t serial = 0;  // retirement order
  };

  // Adds one arena to `tenant` if the budget allows (after retiring empty
  // arenas of other tenants). Returns the new arena id.
  absl::StatusOr<uint32_t> Grow(Tenant& tenant, uint64_t keep_unmapped);
  absl::StatusOr<uint32_t> NextArenaId();
  void RetireEmptyArenas(Tenant& tenant);
  void RetireArena(Tenant& tenant, uint32_t arena_id);
  // Marks arenas to vacate (see InVacatingArena); returns their bytes.
  uint64_t VacateSparseArenas();
  // Live arenas plus what retired ones hold: what pool_bytes caps.
  uint64_t ChargedBytes() const;
  void ZeroPages(const Tenant& t, const Block& block);
  void Count(BlockAccount& account, const BlockShape& shape, int64_t sign);

  const BlockPoolOptions options_;
  std::map<std::string, std::unique_ptr<Tenant>> tenants_;
  // Live arena id -> processes given its fd (alive ones; pruned as they go).
  std::map<uint32_t, std::vector<std::shared_ptr<const ProcessRef>>> holders_;
  std::map<uint32_t, Retired> retired_;
  uint64_t retirements_ = 0;
  // Id -> tenant of every arena retired since its id was last handed out,
  // watched or not: a fetch of an announced, since retired arena is
  // NOT_FOUND for its tenant (and PERMISSION_DENIED for everyone else).
  std::map<uint32_t, std::string> retired_owner_;
  std::map<std::string, uint64_t> agent_bytes_;
  std::map<std::pair<PageFormat, bool>, uint64_t> pages_by_format_;
  uint64_t used_bytes_ = 0;
  uint32_t next_arena_id_ = 1;
};

}  // namespace polykv::daemon
