// From a prefilled context to a compressed cache: the session view the
// policies decide on (built once per task from the shared prefill), and the
// plan lowered to per-layer slot selections for EvalKvStore::Compact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/eval/eval_kv_store.h"
#include "policies/plan.h"
#include "policies/policy.h"
#include "policies/session_view.h"

namespace polykv::eval {

// The view of `store`'s context: token metadata (positions, turns, roles),
// structural tags from the token texts, and per layer the captured scores
// (attn, obs, intent, entropy) and key summaries, in pages of `block_tokens`
// (the pages of the store the selection will be compacted into).
//   texts: [tokens] decoded text of each token (for the structure tagger)
// REQUIRES: store captured scores (EvalKvStoreOptions::capture_scores).
absl::StatusOr<policies::SessionView> BuildContextView(const EvalKvStore& store,
                                                       const std::vector<std::string>& texts,
                                                       int32_t current_turn, int block_tokens);

// Every slot of every layer kept as is (the full cache).
std::vector<LayerSelection> KeepAll(const EvalKvStore& store);

struct Selection {
  std::vector<LayerSelection> layers;
  double kept_slots_mean = 0;  // output slots averaged over layers
  int64_t merged_groups = 0;
  int64_t requant_blocks = 0;  // (layer, block) pairs the plan requantized (K, V or both)
};

// Runs `policy` on `view` with a total budget of budget_fraction x context
// tokens per layer (summed over layers, so layer allocators may move it) and
// lowers the plan, requantized blocks included (LayerSelection::requant_k/v,
// per block of view.shape.block_tokens). ResourceExhausted when the policy
// cannot fit the budget.
absl::StatusOr<Selection> Select(const policies::Policy& policy, const policies::SessionView& view,
                                 double budget_fraction);

}  // namespace polykv::eval
