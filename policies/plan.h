// The output of every policy: what to do with each slot of each layer.
//
// A plan is valid when, per layer, every source slot appears in exactly one of
// keep / evict / one merge group; merge groups have >= 2 members of ONE block
// (same StructTag::block_id) in that layer; requantize targets name output
// slots (a kept slot, or a merge group's representative for the merged slot);
// and the resulting slots fit the budget. ValidatePlan() checks all of it;
// every Policy runs it on its own output before returning.
//
// Formats are per block: the layer's pages hold view.shape.block_tokens output
// slots each, in ONE format, so a block is stored in the finest format any of
// its slots has after the plan (policies/lowering.h, which also refuses a plan
// that requantizes part of a block or the trailing partial one). OutputBytes
// and ApplyPlan count and report formats that way.
//
// The executor (daemon compaction) builds the new layer in source order: for
// each source slot index i ascending, emit i if kept, or the merged slot if i
// is the representative of a merge group. OutputOrder() returns that order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/page_format.h"
#include "policies/session_view.h"

namespace polykv::policies {

struct MergeGroup {
  // [n >= 2] source slot indices, ascending, all in one block of this layer.
  std::vector<uint32_t> members;
  // [n] merge weights (score x multiplicity, normalised to sum 1). The merged
  // key and value are sum_i weights[i] * K_i (V_i).
  std::vector<float> weights;
  // The member whose position/metadata the merged slot carries: the one with
  // the largest weight (ties: lowest index).
  uint32_t representative = 0;
  // Sum of the members' multiplicities: the merged slot's count. With
  // Plan::log_count_bias the attention kernel adds log(count) to its logit, so
  // a slot standing for n identical tokens gets the softmax mass of n tokens.
  uint32_t count = 0;
};

struct RequantTarget {
  // A kept source slot, or a merge group's representative (the merged slot).
  uint32_t slot = 0;
  kernels::KvKind kind = kernels::KvKind::kValue;
  kernels::PageFormat format = kernels::PageFormat::kInt4;
};

struct LayerPlan {
  std::vector<uint32_t> keep;          // ascending source slot indices
  std::vector<uint32_t> evict;         // ascending source slot indices
  std::vector<MergeGroup> merges;      // ordered by representative ascending
  std::vector<RequantTarget> requant;  // ordered by (slot, kind)
  int64_t budget_tokens = 0;           // the token limit this layer was planned for
  int64_t budget_bytes = 0;            // the byte limit (0 when the budget is in tokens)

  // Slots the layer holds after the plan runs.
  size_t output_slots() const { return keep.size() + merges.size(); }
};

struct Plan {
  std::string policy;             // canonical spec of the policy that made it
  std::vector<LayerPlan> layers;  // [num_layers]
  bool log_count_bias = true;     // see MergeGroup::count
  bool changes() const;           // false when the plan keeps every slot as is
};

// Optional extra checks: per layer, source slot indices that must be kept
// (hard-protected: sinks, pinned tokens). Empty = none.
struct PlanChecks {
  std::vector<std::vector<uint32_t>> must_keep;  // [num_layers][...]
  // When set, the per-layer limits recorded in the plan must not exceed it
  // (per_layer) or must sum to at most it (total).
  const Budget* budget = nullptr;
};

// REQUIRES: ValidateView(view).ok().
// Returns InvalidArgument naming the first violation found.
absl::Status ValidatePlan(const SessionView& view, const Plan& plan, const PlanChecks& checks = {});

// Source slot index of each output slot, in output order (see file comment).
std::vector<uint32_t> OutputOrder(const LayerPlan& layer);
// The same into *out (resized; reuse it to avoid allocating).
void OutputOrder(const LayerPlan& layer, std::vector<uint32_t>* out);

// Bytes the layer holds after the plan, as a block-granular store holds them:
// each output slot at its block's format (the finest format of the block's
// slots after the plan: a kept slot's or a representative's format, its
// requant target applied). The trailing partial block counts its slots only.
// REQUIRES: ValidatePlan's structural checks hold (slots in range).
double OutputBytes(const SessionView& view, int layer, const LayerPlan& plan);

// The view after the plan ran (what the next decision sees): kept slots as
// they were, each merge group as one slot at its representative with count =
// group count, attn and obs summed (attention mass adds up), intent and key
// summary weight-averaged; every slot in the format its block is stored in
// (requant targets applied, then the block's finest format: see file
// comment). Pure; used by offline replay and usable by the daemon to keep its
// metadata in step.
// REQUIRES: ValidatePlan(view, plan).ok().
SessionView ApplyPlan(const SessionView& view, const Plan& plan);

// Applies a layer plan to a per-slot score vector (e.g. a DecayAccumulator's
// state): kept slots carry their score, a merged slot the sum of its members'.
// REQUIRES: scores.size() == number of source slots in the layer.
std::vector<float> RemapScores(const LayerPlan& plan, absl::Span<const float> scores);

}  // namespace polykv::policies
