// PageAllocator: superblock/slab allocation of KV pages inside one tenant's arenas.
//
// Arenas are cut into superblocks (default 2 MiB). A superblock serves exactly
// one size class (a page byte size rounded up to 256) while it holds pages and
// returns to the shared free list the moment its last page is freed, so size
// classes do not strand memory after churn. Alloc and Free are O(1): a class
// keeps an intrusive list of its superblocks with free slots, and a superblock
// keeps a stack of its free slots.
//
// The allocator knows offsets only, never memory: it can be tested without an
// arena (vLLM's block-pool discipline). Running out is a normal result
// (RESOURCE_EXHAUSTED); asking for the impossible is INVALID_ARGUMENT.
//
// Thread-safety: none; the owner (KvPool) serializes calls.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace polykv::daemon {

// [arena_id:16][superblock:24][slot:24]. Arena ids start at 1, so 0 is never a page.
using PageId = uint64_t;
inline constexpr PageId kNoPage = 0;
inline constexpr uint64_t kSizeClassAlignment = 256;

struct PageLocation {
  uint32_t arena_id = 0;
  uint64_t offset = 0;      // Byte offset in the arena, 256-aligned.
  uint32_t size_bytes = 0;  // The page's size class.
};

struct PageAllocatorOptions {
  uint64_t superblock_bytes = 2ull << 20;  // Multiple of 256.
};

class PageAllocator {
 public:
  explicit PageAllocator(const PageAllocatorOptions& options);
  PageAllocator(const PageAllocator&) = delete;
  PageAllocator& operator=(const PageAllocator&) = delete;

  // Adds [0, size_bytes) of arena `arena_id` as free superblocks; a tail
  // shorter than a superblock is not used.
  // REQUIRES: 0 < arena_id < 65536, not already added.
  absl::Status AddArena(uint32_t arena_id, uint64_t size_bytes);
  // Removes an arena none of whose superblocks holds a page. FAILED_PRECONDITION
  // if pages are still allocated there, NOT_FOUND if unknown.
  absl::Status RemoveArena(uint32_t arena_id);
  // Arenas with no allocated page, in ascending id order.
  std::vector<uint32_t> EmptyArenas() const;

  // Stops handing out pages of an arena (its pages are being moved out so
  // that it can be removed): its free superblocks and free slots are no
  // longer offered, and a superblock emptied there is not reused. Its pages
  // stay valid until freed. NOT_FOUND if unknown; vacating twice is a no-op.
  absl::Status Vacate(uint32_t arena_id);
  // Offers a vacating arena's free space again (its pages could not move).
  void Unvacate(uint32_t arena_id);
  bool Vacating(uint32_t arena_id) const;
  uint32_t num_vacating() const { return num_vacating_; }
  // One arena's size and use, for choosing which to vacate.
  struct ArenaUse {
    uint32_t arena_id = 0;
    uint64_t size_bytes = 0;
    uint64_t used_superblocks = 0;  // superblocks holding at least one page
    bool vacating = false;
  };
  std::vector<ArenaUse> ArenaUses() const;
  // The arena a page id points into (arithmetic on the id: no check).
  static uint32_t ArenaOf(PageId page) { return static_cast<uint32_t>(page >> 48); }

  // Size class of a page of `page_bytes` bytes.
  static uint32_t SizeClass(uint64_t page_bytes);

  // One page of at least page_bytes bytes. INVALID_ARGUMENT when page_bytes is
  // 0 or exceeds a superblock; RESOURCE_EXHAUSTED when no slot is left.
  absl::StatusOr<PageId> Alloc(uint64_t page_bytes);
  // INVALID_ARGUMENT for a page that is not currently allocated (double free,
  // forged id); nothing changes then.
  absl::Status Free(PageId page);
  // Location of an allocated page; INVALID_ARGUMENT otherwise.
  absl::StatusOr<PageLocation> Locate(PageId page) const;
  // Location of a page this allocator handed out for `class_bytes`, from its
  // id alone (no lookup, no check): for describing pages known to be
  // allocated, e.g. outside the owner's lock.
  static PageLocation LocationOf(PageId page, uint32_t class_bytes, uint64_t superblock_bytes);
  // How many pages of `page_bytes` could be allocated now without new arenas.
  uint64_t FreePagesFor(uint64_t page_bytes) const;

  uint64_t superblock_bytes() const { return superblock_bytes_; }
  uint64_t arena_bytes() const { return arena_bytes_; }
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t num_pages() const { return num_pages_; }
  uint64_t num_superblocks() const { return num_superblocks_; }
  // Free superblocks that can be handed out (not those of vacating arenas).
  uint64_t num_free_superblocks() const { return free_superblocks_.size(); }

  // Recounts everything from scratch and compares with the running totals:
  // slots, lists and bytes. INTERNAL with the first broken invariant.
  absl::Status CheckInvariants() const;

 private:
  struct SbRef {
    uint32_t arena = 0;  // 0 = none
    uint32_t index = 0;
    bool operator==(const SbRef&) const = default;
  };
  struct Superblock {
    uint64_t offset = 0;
    uint32_t class_bytes = 0;  // 0 = free superblock
    uint32_t capacity = 0;
    uint32_t used = 0;
    std::vector<uint32_t> free_slots;  // stack
    std::vector<bool> allocated;       // [capacity]
    SbRef prev, next;                  // in its class's list of non-full superblocks
    bool in_class_list = false;
  };
  struct ArenaState {
    uint64_t size_bytes = 0;
    std::vector<Superblock> superblocks;
    uint64_t used_pages = 0;
    bool vacating = false;
  };
  struct ClassState {
    SbRef nonfull_head;
  };

  Superblock& Sb(SbRef r) { return arenas_.at(r.arena).superblocks[r.index]; }
  const Superblock& Sb(SbRef r) const { return arenas_.at(r.arena).superblocks[r.index]; }
  void LinkNonfull(uint32_t class_bytes, SbRef r);
  void UnlinkNonfull(uint32_t class_bytes, SbRef r);
  static PageId MakeId(SbRef r, uint32_t slot);
  // Decodes and checks that the page is allocated.
  absl::StatusOr<std::pair<SbRef, uint32_t>> Resolve(PageId page) const;

  const uint64_t superblock_bytes_;
  absl::flat_hash_map<uint32_t, ArenaState> arenas_;
  absl::flat_hash_map<uint32_t, ClassState> classes_;
  std::vector<SbRef> free_superblocks_;  // stack
  uint64_t arena_bytes_ = 0;
  uint64_t used_bytes_ = 0;
  uint64_t num_pages_ = 0;
  uint64_t num_superblocks_ = 0;
  uint32_t num_vacating_ = 0;
};

}  // namespace polykv::daemon
