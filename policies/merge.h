// Semantic merge: cluster slots of one block by key cosine similarity.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "policies/plan.h"
#include "policies/ranking.h"
#include "policies/session_view.h"

namespace polykv::policies {

struct MergeOptions {
  float threshold = 0.7f;  // min cosine(key, group leader key) to join (CodeComp seed)
  int probe = 16;          // groups of the same block compared against (bounds cost)
};

// Leader clustering of `candidates` (best first, as ranked) of one layer: each
// candidate joins the open group of its block whose leader key is most similar
// (>= threshold; ties: the earlier group), else starts a group it leads.
// Block id 0 never merges. Without keys every candidate is its own group.
// Returns groups, each a list of candidate positions into `candidates`, in
// order of their leaders (so the first group has the best leader).
std::vector<std::vector<uint32_t>> ClusterByKey(const SessionView& view, int layer,
                                                absl::Span<const Ranked> candidates,
                                                const MergeOptions& options);

// ClusterByKey for the fast decision path (and its implementation): the same
// groups, from candidates given as source slot indices in rank order (best
// first), written flat into reusable buffers instead of one vector per group.
struct KeyClusters {
  std::vector<uint32_t> offsets;  // [num_groups + 1] group g is members[offsets[g], offsets[g+1])
  std::vector<uint32_t> members;  // [num_candidates] candidate positions into `slots`
  // Scratch, kept between calls so a decision allocates nothing once warm.
  std::vector<uint64_t> order, sort_scratch;
  std::vector<uint32_t> leader_of, group_index, leader_ids;
  std::vector<float> leaders, unit;
  size_t num_groups() const { return offsets.empty() ? 0 : offsets.size() - 1; }
};
// REQUIRES: slots.size() < 2^30 (the ranking's index width).
void ClusterByKeyInto(const SessionView& view, int layer, absl::Span<const uint32_t> slots,
                      const MergeOptions& options, KeyClusters* out);

// Builds the plan entry for merging `members` (source slot indices, any order,
// >= 2) with weights (score + 1e-3) x multiplicity, normalised.
MergeGroup MakeMergeGroup(const SessionView& view, int layer, std::vector<uint32_t> members,
                          absl::Span<const float> scores);

// Attention output of one query over (possibly merged) keys/values, with or
// without the log-count bias: softmax_i(q.k_i / sqrt(d) + [bias] log(count_i)).
// keys, values: [n * d]; counts: [n]; out: [d]. Reference for tests and the
// with/without-bias measurement.
void AttendRef(absl::Span<const float> q, absl::Span<const float> keys,
               absl::Span<const float> values, absl::Span<const uint32_t> counts, int d,
               bool log_count_bias, absl::Span<float> out);

}  // namespace polykv::policies
