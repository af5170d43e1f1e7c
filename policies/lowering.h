// Lowering: a Plan as the physical operations that carry it out, per layer,
// in output order (OutputOrder in plan.h). This is the ONE place plans become
// operations: the daemon's compaction (daemon/compaction/executor.cc)
// executes what it returns, and the offline replay (ApplyPlan) reads the same
// plans, so what is measured is what the daemon does.
//
// Per output slot: the source slots it gathers (one, weight 1: kept; two or
// more: a merge group, weights normalised to sum 1), the source slot whose
// metadata it carries (itself, or the group's representative), the tokens it
// stands for, and any requantization of its keys or values. An executor that
// cannot carry out an operation must fail the compaction; nothing is dropped.
//
// Formats are per block (a page holds block_tokens slots in one format), so
// requantization is too: each output block is stored in the most precise
// format any of its slots has after the plan (its requant target, else its
// source format, a merged slot its representative's). No slot is stored
// coarser than the plan says; a plan that requantizes part of a block, or the
// trailing partial block (the one still being filled), is refused.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/page_format.h"
#include "policies/plan.h"
#include "policies/session_view.h"

namespace polykv::policies {

struct RequantOp {
  uint32_t out_slot = 0;  // output slot index
  kernels::KvKind kind = kernels::KvKind::kValue;
  kernels::PageFormat format = kernels::PageFormat::kInt4;
};

struct LoweredLayer {
  std::vector<int32_t> group_offsets{0};  // [num_out + 1] CSR over members
  std::vector<int32_t> members;           // source slots of each output slot
  std::vector<float> weights;             // per member; each group sums to 1
  std::vector<uint32_t> sources;          // [num_out] whose metadata it carries
  std::vector<uint32_t> counts;           // [num_out] tokens it stands for
  std::vector<RequantOp> requant;         // ordered by (out_slot, kind)
  int block_tokens = 0;                   // slots per output block
  // [ceil(num_out / block_tokens)] K and V format of each output block.
  std::vector<kernels::PageFormat> block_k_formats, block_v_formats;
  uint64_t evicted_tokens = 0;            // counts of the evicted slots
  uint64_t merged_tokens = 0;             // counts folded into a representative
  size_t num_out() const { return counts.size(); }
  bool merged(size_t j) const { return group_offsets[j + 1] - group_offsets[j] > 1; }
};

struct LoweredPlan {
  std::vector<LoweredLayer> layers;
  bool log_count_bias = true;  // Plan::log_count_bias
  size_t requant_ops() const;
};

// src: the layer the plan was made for (each slot's count, 0 read as 1, and
// formats); block_tokens: slots per page. INVALID_ARGUMENT when the plan
// names a slot outside the layer, a merge group's count is not the sum of
// its members', a requantization targets a slot the plan does not keep (a
// merge group's representative counts as kept) or part of a block (see the
// file comment), or block_tokens < 1.
absl::StatusOr<LoweredLayer> LowerLayer(const LayerPlan& plan, const LayerView& src,
                                        int block_tokens);
// Every layer of `view`, with view.shape.block_tokens.
absl::StatusOr<LoweredPlan> Lower(const Plan& plan, const SessionView& view);

// The more precise of two formats: more bits, ties to the lower wire value
// (f16 over bf16, fp8 over int8). What a block mixing them is stored in.
kernels::PageFormat FinerFormat(kernels::PageFormat a, kernels::PageFormat b);

}  // namespace polykv::policies
