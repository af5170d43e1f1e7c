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
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/compaction/layer_hole.h"
#include "daemon/memory/arena.h"
#include "daemon/memory/process_ref.h"
#include "daemon/pool/block.h"
#include "daemon/pool/page_allocator.h"
#include "daemon/pool/prefix_index.h"
#include "daemon/pool/types.h"
#include "kernels/page_format.h"

namespace polykv::daemon {

using ArenaFactory = std::function<absl::StatusOr<std::unique_ptr<Arena>>(const ArenaOptions&)>;

// [layer]: the slots of a session's table each layer does not hold (its
// first run of blocks without pages of the layer): empty unless the layers
// keep budgets of their own. `num_layers` entries.
std::vector<LayerHole> LayerHoles(const std::vector<Block>& table, uint32_t num_layers,
                                  uint32_t block_tokens);

// Whose blocks: every page handed out is charged to exactly one account.
// Shared prefix blocks (prefix_index.h) are charged to their tenant's index
// once, not to the accounts whose tables hold them; each such account counts
// their bytes in `shared_bytes`, which its agent's max_bytes also bounds
// (Admission), so sharing lets no agent hold more than its cap.
struct BlockAccount {
  std::string tenant;
  std::string agent_id;
  uint64_t bytes = 0;         // its own pages
  uint64_t shared_bytes = 0;  // prefix blocks its tables hold
};

// The bytes a table's block charges to the account holding it: 0 for a
// shared prefix block.
inline uint64_t OwnBytes(const Block& b) { return b.prefix ? 0 : b.bytes(); }

// Prefix blocks attached to a session (BlockPool::AttachPrefix), with what
// the sharing session's policy knew of their slots: [record list][slot].
struct AttachedPrefix {
  std::vector<Block> blocks;
  std::vector<std::vector<policies::SlotRecord>> records;
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
  // arena being vacated is retired as soon as its last page goes. A shared
  // prefix block is let go instead: its pages stay while another table
  // holds it, and cached after that (PrefixIndex).
  void Free(BlockAccount& account, Block& block);

  // --- Shared prefixes (prefix_index.h; defined in block_pool_prefix.cc) ---
  // Makes the full blocks of `table` that hold `tokens` (block i: tokens
  // [i*B, (i+1)*B), B = block_tokens) shared prefix blocks of the tenant's
  // index in `space` (model, formats and block size: blocks of one space
  // have one shape), with `records` (their slots', per record list:
  // session_table.h PolicyInputs); their bytes move from
  // the account's own to its shared. A block whose tokens another table
  // shared already stays the table's own (the chain goes on through that
  // one). Returns how many leading blocks of `table` are now shared.
  // INVALID_ARGUMENT, nothing changed, when a block already shared holds
  // other tokens. REQUIRES: the caller checked the blocks hold these tokens
  // in order, in the fill shape.
  absl::StatusOr<uint64_t> SharePrefix(BlockAccount& account, const std::string& space,
                                       std::span<const int32_t> tokens, uint32_t block_tokens,
                                       std::vector<Block>& table,
                                       const std::vector<std::vector<policies::SlotRecord>>& records);
  // The longest chain of the tenant's shared blocks in `space` holding the
  // leading full blocks of `tokens`, at most `max_blocks`, each now held by
  // the account (cached ones revived), with their records in `lists` lists
  // (a sharer's list per layer where it held them so, else its one list).
  AttachedPrefix AttachPrefix(BlockAccount& account, const std::string& space,
                              std::span<const int32_t> tokens, uint32_t block_tokens,
                              uint64_t max_blocks, size_t lists);
  // The chain of the tenant's blocks in `space` holding the leading full
  // blocks of `tokens`, at most `max_blocks`, touched as used; held by no
  // table (an engine's connector reads them under the caller's lock).
  std::vector<Block> FindPrefix(const std::string& tenant, const std::string& space,
                                std::span<const int32_t> tokens, uint32_t block_tokens,
                                uint64_t max_blocks);
  // Stores blocks [first, first + count) of `tokens`' chain in `space` as
  // cached entries of `shape`, fill(i, pages) writing block i's new pages
  // (their host addresses, Block::pages' order: a host pool's);
  // blocks the index holds already are kept unfilled. Returns the chain's
  // leading blocks held now. FAILED_PRECONDITION when a block before
  // `first` is missing; RESOURCE_EXHAUSTED when no room is left (what was
  // stored stays). Charged to the tenant's index, like shared blocks.
  absl::StatusOr<uint64_t> StorePrefix(const std::string& tenant, const std::string& space,
                                       std::span<const int32_t> tokens, uint32_t block_tokens,
                                       const BlockShape& shape, uint64_t first, uint64_t count,
                                       const std::function<void(uint64_t, std::span<std::byte* const>)>& fill);
  // Bytes of shared prefix blocks no table holds: cached, and given up
  // whenever an allocation needs the room (free_bytes counts them free).
  uint64_t cached_bytes() const;

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
  // Free, counting cached prefix blocks as free: allocations drop them.
  uint64_t free_bytes() const;
  // How many blocks of `shape` `tenant` could allocate now, in its free page
  // slots, free superblocks and the arenas the pool budget still allows.
  // Less than free_bytes() / shape.bytes() when the free bytes are slots of
  // other size classes (a requantized block's pages are of new classes).
  uint64_t FreeBlocksFor(const std::string& tenant, const BlockShape& shape) const;
  // The agent's own bytes plus the shared prefix blocks its tables hold:
  // what its QoS limits.
  uint64_t agent_bytes(const std::string& agent_id) const;
  // Drops an agent's zero entry (its last session ended).
  void ForgetAgent(const std::string& agent_id);
  const std::map<std::string, uint64_t>& bytes_by_agent() const { return agent_bytes_; }

  // Tenants, arenas, pages and the per-format counts of Stats.
  void Summarize(PoolSummary& out) const;
  // What CheckInvariants compares the pool's counts with, from every table.
  struct Holdings {
    std::map<std::string, uint64_t> agent_bytes;   // own bytes by agent
    std::map<std::string, uint64_t> agent_shared;  // shared bytes held, by agent
    uint64_t bytes = 0;                            // own bytes of every account
    uint64_t pages = 0;                            // own pages of every account
    // tenant -> prefix entry -> tables holding it.
    std::map<std::string, std::map<PrefixId, uint32_t>> prefix_refs;
  };
  // Allocator and prefix index invariants, and the pool's / tenants' /
  // agents' counts against `held`.
  absl::Status CheckInvariants(const Holdings& held) const;

 private:
  struct Tenant {
    Tenant(std::string n, const PageAllocatorOptions& o) : name(std::move(n)), allocator(o) {}
    const std::string name;
    PageAllocator allocator;
    std::map<uint32_t, std::unique_ptr<Arena>> arenas;
    uint32_t num_sessions = 0;
    PrefixIndex prefix;
    uint64_t prefix_bytes = 0;  // its index's blocks, charged once
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
  absl::StatusOr<std::vector<Block>> AllocateOnce(Tenant& t, BlockAccount& account,
                                                  const BlockShape& shape, uint64_t count,
                                                  bool zero, uint64_t keep_unmapped);
  // Frees the block's pages in `t` (uncharged by the caller); false if one
  // was not allocated (a bug CheckInvariants reports as drifted counts).
  bool FreePages(Tenant& t, Block& block);
  void Count(BlockAccount& account, const BlockShape& shape, int64_t sign);
  // A block's charge to its tenant's prefix index (+1) or off it (-1).
  void CountPrefix(Tenant& t, const BlockShape& shape, int64_t sign);
  void CountShared(BlockAccount& account, uint64_t bytes, int64_t sign);
  void FreePrefixBlock(Tenant& t, Block& block);
  // Drops cached prefix blocks, `t`'s coldest first, then other tenants',
  // until `need` bytes went or none are left. Returns the bytes dropped.
  uint64_t DropCached(Tenant& t, uint64_t need);

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
  std::map<std::string, uint64_t> agent_shared_;
  uint64_t prefix_dropped_blocks_ = 0;
  std::map<std::pair<PageFormat, bool>, uint64_t> pages_by_format_;
  uint64_t used_bytes_ = 0;
  uint32_t next_arena_id_ = 1;
};

}  // namespace polykv::daemon
