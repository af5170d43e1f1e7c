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
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/compaction/executor.h"
#include "daemon/compaction/layer_hole.h"
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
  // Tokens per layer to compact down to (on average over layers, for a
  // policy whose layers keep budgets of their own).
  uint64_t target_tokens = 0;
  // [layer] the slots each layer does not hold (LayerHoles); empty: every
  // layer holds every slot.
  std::vector<LayerHole> layer_holes;
  // Key summaries (ReadKeySummaries) for policies that ReadsKeys(): [slots *
  // key_dim]; key_dim 0 = none.
  int key_dim = 0;
  std::vector<float> keys;
  // [layer] the per-layer streams' values (PolicyInputs::layer_scores);
  // empty: none reported. Read by per-layer decisions (an entropy layer
  // allocator).
  std::vector<policies::LayerScores> layer_scores;
  // Set: a requantization step of the pressure ladder (LadderColdStep),
  // planned in place of the policy's own cold step.
  std::optional<policies::ColdStep> cold;
};

struct CompactionPlan {
  bool changes = false;      // false: the policy keeps everything; nothing to do
  uint64_t num_out = 0;      // output slots: the committed count after
  // [record lists] the output slots each list's layers do not hold (the
  // layer that keeps the most holds them all); a plan over one record list
  // has one entry, empty, for every layer. Output block j has pages of layer
  // l iff its hole holds j x block_tokens.
  std::vector<LayerHole> layer_holes;
  // [output block] the formats of its pages (one shape per block).
  std::vector<kernels::PageFormat> block_k_formats, block_v_formats;
  // [record lists] the output slot records, [num_out] each
  // (placeholders with position -1 in the layer's hole): the session's
  // records after.
  std::vector<std::vector<SlotRecord>> records;
  // [record lists] each list's output groups, in its own slot indices
  // (the source and output slots it holds, LayerHole::LocalSlot); one
  // list: every layer runs groups[0].
  std::vector<CompactionGroups> groups;
  // [output block]: the source block it reuses unchanged, or -1 (new pages).
  std::vector<int64_t> shared;
  // [record lists] the groups of the output blocks that are not shared
  // (block formats: of those blocks, in order).
  std::vector<CompactionGroups> copy;
  size_t out_blocks() const { return shared.size(); }
  size_t shared_blocks() const;
};

// records: the session's slot record lists (PolicyInputs::records), each
// [committed tokens]: one for every layer, or one per layer. Over one per
// layer, a policy that SelectsPerLayer decides over one view layer per
// layer, of the slots layer l holds: the policy's LayerBudgets of layers x
// target tokens (uniform: the target each), aligned by AlignLayerBudgets.
// Any other decides once, over records[0], and every list follows that plan
// with its own records (FAILED_PRECONDITION when a layer has a hole). The
// leading whole blocks that every layer keeps in place (copies of the same
// source slots: a pinned shared prefix) stay where they are; each layer's
// hole follows them, its other slots aligned to the end of the table. The
// output blocks' formats are one per block for the layers it holds (a
// block's pages share a shape): the median of theirs by bits, ties to the
// finer. An output block is shared only where every layer it holds has its
// rows from one source block that exactly those layers hold.
absl::StatusOr<CompactionPlan> PlanCompaction(
    const policies::Policy& policy, std::span<const std::vector<SlotRecord>> records,
    const CompactionInputs& in);
// One record list for every layer.
absl::StatusOr<CompactionPlan> PlanCompaction(const policies::Policy& policy,
                                              const std::vector<SlotRecord>& slots,
                                              const CompactionInputs& in);

// Per-layer slot counts a right-aligned table can hold: the largest budget
// (`top`) as it is, every other the nearest count that differs from top by
// whole blocks, at least min(`pinned` + a block, the layer's size, top), at
// most its size. sizes: [layer] the slots each holds now; pinned: its
// leading slots pinned in every layer (a shared prefix, kept in place: a
// layer keeping no more would hold its last block in a copy).
// FAILED_PRECONDITION when a layer has no such count.
absl::StatusOr<std::vector<int64_t>> AlignLayerBudgets(const std::vector<int64_t>& budgets,
                                                       const std::vector<int64_t>& sizes,
                                                       int block_tokens, int64_t pinned = 0);

// FAILED_PRECONDITION unless `policy` can compact a session whose layers
// hold `holes` (layers with holes need a policy that SelectsPerLayer).
absl::Status CheckLayerHoles(const policies::Policy& policy, const std::vector<LayerHole>& holes);

}  // namespace polykv::daemon
