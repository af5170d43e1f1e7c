// StagedRun: a change of one session's pages that writes NEW blocks and
// publishes them as the session's next epoch at the worker's step boundary:
// a compaction (compaction_run.h) or a move out of arenas being vacated
// (relocation_run.h). KvPool::RunStaged sequences every run with the pool
// lock the same way (docs/compaction.md):
//
//   NewShapes  locked    shapes of the blocks written anew; KvPool stages
//                        their pages, a few blocks per hold of the lock
//   Address    locked    the page addresses the copy reads and writes
//   Copy       unlocked  the new pages written from the old ones
//   Publish    locked    the new table; KvPool makes the old blocks it no
//                        longer holds pending (freed when the worker acks)
//                        and publishes epoch + 1
//
// The session is busy from before NewShapes to after Publish
// (session_table.h): its other mutating calls are refused and its
// destruction deferred, so what Copy reads cannot change under it.
//
// Thread-safety: none; a run belongs to one Sync.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/pool/block_pool.h"
#include "daemon/pool/session_table.h"

namespace polykv::daemon {

class StagedRun {
 public:
  virtual ~StagedRun() = default;

  // Locked. The shapes of the blocks written anew, in the order Publish
  // takes them from s.tables.staged.
  virtual absl::StatusOr<std::vector<BlockShape>> NewShapes(const Session& s) const = 0;
  // Locked, once those blocks are staged. UNIMPLEMENTED for pages the
  // daemon cannot address (device arenas).
  virtual absl::Status Address(const Session& s, const BlockPool& blocks) = 0;
  // Unlocked (s busy).
  virtual absl::Status Copy(const Session& s) const = 0;
  // Locked, after a successful Copy. Makes s.tables.blocks the new table
  // (from the old one and every staged block, leaving s.tables.staged
  // empty) and updates what else of s the run changes; returns the old
  // blocks the new table does not hold.
  virtual std::vector<Block> Publish(Session& s) = 0;
  // The new tables hold the same slots with the same bytes (only the pages
  // differ): the worker keeps what it holds of them (SyncResult::same_slots).
  virtual bool KeepsSlots() const { return false; }
};

}  // namespace polykv::daemon
