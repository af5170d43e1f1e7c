// CompactionRun: one compaction of one session, started by KvPool::Sync at
// the worker's step boundary. Its phases say where the pool's lock is held;
// KvPool takes or releases the lock between them and checks that the session
// was not closed meanwhile (docs/compaction.md). Two of its own, then the
// staged run's (staged_run.h), which KvPool::RunStaged sequences:
//
//   Prepare     locked    inputs from the session: formats, layer holes,
//                         the pages of keys a merging policy reads
//   Decide      unlocked  the policy's plan over the session's slot records
//   NewShapes   locked    shapes of the output blocks written anew
//   Address     locked    page addresses of the source and staged blocks
//   Copy        unlocked  the kernels' gather, merge and requantization
//   Publish     locked    the new tables and slot records
//
// From Prepare to Publish the session is busy (session_table.h), so what the
// unlocked phases read — slot records and pages — cannot change under them.
//
// Thread-safety: none; one run belongs to one Sync.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/compaction/compactor.h"
#include "daemon/compaction/executor.h"
#include "daemon/pool/block_pool.h"
#include "daemon/pool/session_table.h"
#include "daemon/pool/staged_run.h"
#include "daemon/pool/types.h"
#include "policies/policy.h"

namespace polykv::daemon {

class CompactionRun final : public StagedRun {
 public:
  // `policy` (of `policy_text`, the agent's) down to `target` tokens, with
  // the ladder's requantization step `cold` when set.
  CompactionRun(const policies::Policy& policy, std::string policy_text, uint64_t target,
                std::optional<policies::ColdStep> cold, uint64_t superblock_bytes)
      : policy_(policy),
        policy_text_(std::move(policy_text)),
        target_(target),
        cold_(cold),
        superblock_bytes_(superblock_bytes) {}

  const std::string& policy_text() const { return policy_text_; }

  // Locked. The plan's inputs, s's layer holes (LayerHoles) among them;
  // UNIMPLEMENTED for keys in device arenas.
  absl::Status Prepare(const Session& s, const QosRecord& qos, const BlockPool& blocks,
                       std::vector<LayerHole> layer_holes);
  // Unlocked (s busy). Reads the keys Prepare located and plans; false when
  // the plan changes nothing (then the run is over).
  absl::StatusOr<bool> Decide(const Session& s);
  // The output blocks that are not shared with old ones.
  absl::StatusOr<std::vector<BlockShape>> NewShapes(const Session& s) const override;
  absl::Status Address(const Session& s, const BlockPool& blocks) override;
  // The kernels' gather, merge and requantization.
  absl::Status Copy(const Session& s) const override;
  // The shared old blocks and the staged ones; s's new slot records.
  std::vector<Block> Publish(Session& s) override;

  // What Publish changed, for the pool's counters.
  struct Published {
    uint64_t shared_blocks = 0;
    uint64_t copied_blocks = 0;
    uint64_t evicted_tokens = 0;
    uint64_t merged_tokens = 0;
  };
  const Published& published() const { return published_; }

 private:
  // Whether output block j holds layer l's pages (right-aligned layers; a
  // plan over one record list has one offset, for every layer).
  bool Holds(const Session& s, size_t j, uint32_t l) const;

  const policies::Policy& policy_;
  const std::string policy_text_;
  const uint64_t target_;
  const std::optional<policies::ColdStep> cold_;
  const uint64_t superblock_bytes_;

  CompactionInputs in_;
  // Prepare: pages of the keys a merging policy clusters by, per summary layer.
  std::vector<std::vector<kernels::BlockEntry>> key_tables_;
  std::optional<CompactionPlan> plan_;
  // Address: [layer] the copy's source and destination pages.
  std::vector<LayerTables> tables_;
  bool copies_ = false;
  // The GPU the session's pages are on (a cuda tier; -1: host memory): the
  // copy runs the CUDA kernels there, and key summaries are read through
  // host copies.
  int device_ = -1;
  Published published_;
};

}  // namespace polykv::daemon
