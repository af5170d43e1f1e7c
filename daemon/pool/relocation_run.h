// RelocationRun: a session's blocks leave arenas being vacated (issue 40: a
// tenant's few remaining pages spread over many arenas kept them all, and the
// pool refused other tenants while mostly free). A staged run
// (staged_run.h) that keeps every slot: the moving blocks' shapes, their
// bytes copied as they are, published at the worker's step boundary like a
// compaction, the old pages freed on Ack.
//
// Thread-safety: none; a run belongs to one Sync.
#pragma once

#include <cstddef>
#include <vector>

#include "daemon/pool/staged_run.h"

namespace polykv::daemon {

class RelocationRun final : public StagedRun {
 public:
  // Locked. s's blocks with pages in arenas `blocks` is vacating.
  RelocationRun(const Session& s, const BlockPool& blocks);
  // Indices into s.tables.blocks of the blocks that move; none: nothing to do.
  const std::vector<size_t>& moving() const { return moving_; }

  // The moving blocks' shapes, as they are.
  absl::StatusOr<std::vector<BlockShape>> NewShapes(const Session& s) const override;
  absl::Status Address(const Session& s, const BlockPool& blocks) override;
  // A copy of every page (a device-to-device copy on a cuda tier).
  absl::Status Copy(const Session& s) const override;
  // Each moving block replaced by its staged copy, in place.
  std::vector<Block> Publish(Session& s) override;
  bool KeepsSlots() const override { return true; }

 private:
  struct PageCopy {
    const void* from;
    void* to;
    size_t bytes;
  };
  std::vector<size_t> moving_;
  std::vector<PageCopy> copies_;
  int device_ = -1;  // the GPU the pages are on; -1: host memory
};

}  // namespace polykv::daemon
