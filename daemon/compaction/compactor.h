// Compactor: the decision half of a compaction, over plain data. From a
// snapshot of a session's slot records it runs the policy, lowers the plan
// (executor.h) and works out which output blocks can keep their old pages
// (a plain copy of one whole source block in its formats IS that block) and
// which need new pages and a copy. On top of the lowering's block formats it
// applies the daemon's two storage rules: no block coarser than the agent's
// QoS floors (as at Open), and the trailing partial block, which the worker
// goes on filling, at least in the fill formats. The pool calls it WITHOUT its lock (the snapshot is the
// session's state at a frozen epoch), then allocates, copies and publishes
// (docs/compaction.md).
//
// Thread-safety: stateless; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/compaction/executor.h"
#include "kernels/page_format.h"
#include "kernels/page_layout.h"
#include "policies/policy.h"

namespace polykv::daemon {

// A session's token budget now: max(budget_tokens, ceil(fraction x
// context_tokens)), context_tokens being every token it has committed so far
// (dropped ones too); 0 = none. With a fraction the budget grows with the
// session, and budget_tokens is its floor (QosRecord).
uint64_t SessionBudget(uint64_t budget_tokens, double fraction, uint64_t context_tokens);

// What the compaction trigger looks at.
struct TargetInputs {
  bool compacting_policy = false;  // the agent's policy is not "full"
  uint64_t committed_tokens = 0;
  uint32_t block_tokens = 16;
  uint64_t budget_tokens = 0;  // SessionBudget; 0 = none
  uint64_t want_tokens = 0;    // the pressure ladder's ask; 0 = none
  double trigger = 1.10;       // the policy's Trigger()
};

// Tokens to compact down to now; 0 = no compaction. A session is compacted
// past budget + max(floor(budget x (trigger - 1)), 1) — by default past
// budget + budget/10, so in batches, not every token — or when the ladder
// asks for fewer tokens; the target is rounded so that whole blocks are
// dropped, which lets window-like policies share every kept block.
uint64_t CompactionTarget(const TargetInputs& in);

// A session's state at one epoch, as the policy sees it (with its slot
// records, passed apart: the pool lends its own, frozen while the session is
// busy, instead of copying them).
struct CompactionInputs {
  kernels::PageShape shape;  // of one page (block_tokens rows)
  TableFormats formats;      // of the session's blocks
  // The agent's QoS floors: no output block is stored coarser.
  std::optional<kernels::PageFormat> key_floor, value_floor;
  int32_t current_turn = 0;
  uint64_t target_tokens = 0;
  // Key summaries (ReadKeySummaries) for policies that ReadsKeys(): [slots *
  // key_dim]; key_dim 0 = none.
  int key_dim = 0;
  std::vector<float> keys;
};

struct CompactionPlan {
  bool changes = false;      // false: the policy keeps everything; nothing to do
  CompactionGroups groups;   // every output slot
  // [output block]: the source block it reuses unchanged, or -1 (new pages).
  std::vector<int64_t> shared;
  // The groups of the output blocks that are not shared (block formats: of
  // those blocks, in order).
  CompactionGroups copy;
  // A session whose layers hold their own slots (PlanCompaction's `upper`):
  // layer l's groups and copy groups at [l - 1], for l >= 1; `groups` and
  // `copy` are layer 0's. Every layer has the same output slots count and
  // block formats. Empty: every layer runs `groups`.
  std::vector<CompactionGroups> upper_groups, upper_copy;
  size_t out_blocks() const { return shared.size(); }
  size_t shared_blocks() const;
};

// slots: [committed tokens], the session's records (layer 0's when `upper`
// is given). upper: the records of layers 1.. of a session whose layers keep
// their own slots (each [committed tokens]). A policy that SelectsPerLayer
// then decides over one view layer per layer, every layer to the target; any
// other decides once, over layer 0's records, for all. The output blocks'
// formats are one per block for all layers (a block's pages share a shape):
// per block the median of the layers' formats by bits, ties to the finer.
// An output block is shared only where every layer's rows are one source
// block's.
absl::StatusOr<CompactionPlan> PlanCompaction(const policies::Policy& policy,
                                              const std::vector<SlotRecord>& slots,
                                              const CompactionInputs& in);
absl::StatusOr<CompactionPlan> PlanCompaction(const policies::Policy& policy,
                                              const std::vector<SlotRecord>& slots,
                                              const std::vector<std::vector<SlotRecord>>& upper,
                                              const CompactionInputs& in);

}  // namespace polykv::daemon
