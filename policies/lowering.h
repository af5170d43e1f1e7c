// Lowering: a Plan as the physical operations that carry it out, per layer,
// in output order (OutputOrder in plan.h). This is the ONE place plans become
// operations: daemon compaction (daemon/compaction/executor.cc) and the
// evaluation harness (bench/eval/compress.cc) both execute what it returns,
// so what is measured is what the daemon does (issue 12, item 1).
//
// Per output slot: the source slots it gathers (one, weight 1: kept; two or
// more: a merge group, weights normalised to sum 1), the source slot whose
// metadata it carries (itself, or the group's representative), the tokens it
// stands for, and any requantization of its keys or values. An executor that
// cannot carry out an operation must fail the compaction; nothing is dropped.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/page_format.h"
#include "policies/plan.h"

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

// src_counts: tokens each source slot of the layer stands for (0 reads as 1).
// INVALID_ARGUMENT when the plan names a slot outside the layer, a merge
// group's count is not the sum of its members', or a requantization targets
// a slot the plan does not keep.
absl::StatusOr<LoweredLayer> LowerLayer(const LayerPlan& plan,
                                        absl::Span<const uint32_t> src_counts);
// src_counts[l]: as above, for layer l.
absl::StatusOr<LoweredPlan> Lower(const Plan& plan,
                                  const std::vector<std::vector<uint32_t>>& src_counts);

}  // namespace polykv::policies
