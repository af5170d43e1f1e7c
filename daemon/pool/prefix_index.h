// PrefixIndex: one tenant's shared prefix blocks, found by content (issue 42).
//
// A block of a session holding exactly the tokens [i*B, (i+1)*B) of its
// context, in its fill shape, can be shared: other sessions of the tenant
// whose context starts with the same tokens attach it instead of computing
// it. Entries form a trie: an entry is keyed by its parent (the entry of the
// block before it, or the root of its "space" — model, page formats, block
// size — for a first block) and its own token ids, compared exactly, so two
// different contexts never meet in one entry (no hash to collide) and the
// content of a block is always that of the whole prefix up to it.
//
// An entry is referenced by every session table holding its block (refs);
// with none it stays cached, revivable, and is dropped coldest first when
// memory is needed. Dropping an entry unlinks its descendants too (nothing
// could reach them any more); those still referenced are freed at their last
// unref. The index is per tenant (BlockPool::Tenant): a lookup never sees
// another tenant's blocks, so there is nothing to time across tenants.
//
// The index knows blocks, not memory: the caller frees the blocks it hands
// back. Thread-safety: none; the owner (BlockPool, under KvPool's mutex).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "daemon/pool/block.h"
#include "policies/slot_record.h"

namespace polykv::daemon {

class PrefixIndex {
 public:
  struct Entry {
    PrefixId parent = 0;
    std::vector<int32_t> tokens;  // the block's own token ids
    Block block;                  // its pages, owned by the index (block.prefix: its id)
    // What the sharing session's policy knew of these slots, for the
    // sessions that attach them: [record list][slot], one list or one per
    // layer as the sharer held them (session_table.h PolicyInputs).
    std::vector<std::vector<policies::SlotRecord>> records;
    uint32_t refs = 0;
    uint64_t stamp = 0;  // last use, for dropping the coldest first
    bool linked = true;  // reachable by Find (false once an ancestor was dropped)
    std::vector<PrefixId> children;
  };

  // The root of a space (model, formats, block size): the parent of its
  // first blocks. Never an entry of its own.
  PrefixId Root(const std::string& space);
  // The root of a space that has one (a lookup adds none).
  std::optional<PrefixId> FindRoot(const std::string& space) const;
  // The linked entry under `parent` holding exactly `tokens`.
  std::optional<PrefixId> Find(PrefixId parent, std::span<const int32_t> tokens) const;
  // A new entry, referenced once (by the table it came from).
  // REQUIRES: no linked entry under `parent` holds `tokens`.
  // `block.prefix` is set to the new id.
  PrefixId Insert(PrefixId parent, std::span<const int32_t> tokens, Block& block,
                  std::vector<std::vector<policies::SlotRecord>> records);
  const Entry& Get(PrefixId id) const { return entries_.at(id); }
  bool Contains(PrefixId id) const { return entries_.contains(id); }

  // One more table holds the entry's block (`stamp` orders uses).
  void Ref(PrefixId id);
  // One table less. Returns the entry's block when nothing can use it any
  // more (no ref left and unlinked): the caller frees it.
  std::optional<Block> Unref(PrefixId id);

  // Used now (a lookup that holds nothing): last to be dropped.
  void Touch(PrefixId id);
  // The cached (unreferenced) entry used longest ago.
  std::optional<PrefixId> Coldest() const;
  // Drops a cached entry (REQUIRES refs == 0) and unlinks its descendants;
  // returns the blocks of every entry that went (it and its unreferenced
  // descendants) for the caller to free.
  std::vector<Block> Drop(PrefixId id);

  uint64_t shared_bytes() const { return shared_bytes_; }  // entries with refs
  uint64_t cached_bytes() const { return cached_bytes_; }  // entries without
  size_t size() const { return entries_.size(); }
  uint64_t num_pages() const;  // of every entry (a walk: for invariants)

  // `refs` (every table's count per id) against the entries' own, and the
  // byte totals. INTERNAL naming the first difference.
  absl::Status CheckInvariants(const std::map<PrefixId, uint32_t>& refs) const;

 private:
  struct Key {
    PrefixId parent;
    std::vector<int32_t> tokens;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.parent, k.tokens);
    }
  };
  void Unlink(PrefixId id, std::vector<Block>& freed);
  void Erase(PrefixId id);

  absl::flat_hash_map<PrefixId, Entry> entries_;
  absl::flat_hash_map<Key, PrefixId> by_key_;  // linked entries only
  std::map<std::string, PrefixId> roots_;
  std::set<std::pair<uint64_t, PrefixId>> cold_;  // (stamp, id) of cached entries
  PrefixId next_id_ = 1;
  uint64_t clock_ = 0;
  uint64_t shared_bytes_ = 0;
  uint64_t cached_bytes_ = 0;
};

}  // namespace polykv::daemon
