// How far a compressed cache moves the model's next-token distribution from
// the full cache's, on the full cache's own answer (teacher forcing): per
// position, KL(full || compressed) and whether the compressed cache's top
// token is still the full cache's. Task success needs many tasks to tell two
// caches apart; these move with every token. The reference keeps only its
// top-k log-probabilities per position, so that a worker process can hand
// them to another (polykv-worker --logprobs-out / --teacher-force).
// The reference's distributions should come from a forced pass too: the
// forward pass of a chunk and that of one decode step round differently
// (fast activation products in decode), and the measure is meant to see the
// cache alone.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace polykv::worker {

// The k most likely next tokens at one position, most likely first, with
// their natural-log probabilities under the full softmax.
struct TopLogprobs {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
};
TopLogprobs TopK(std::span<const float> logits, int k);

// One position of a forced turn, scored against the reference's TopLogprobs.
struct ForcedStep {
  // KL over the reference's top-k and one bin for all other tokens: a lower
  // bound on the full-vocabulary KL (grouping outcomes never raises it),
  // exact when the top-k hold all of the reference's mass. Nats.
  double kl = 0;
  bool top1 = false;          // this cache's argmax == the reference's
  double target_logprob = 0;  // log q(forced token)
};
ForcedStep ScoreStep(const TopLogprobs& reference, int32_t target, std::span<const float> logits);

struct ForcedSummary {
  int positions = 0;
  double kl_sum = 0, kl_max = 0, target_logprob_sum = 0;
  int top1 = 0;
  void Add(const ForcedStep& s);
  double kl_mean() const { return positions > 0 ? kl_sum / positions : 0; }
  double top1_agreement() const {
    return positions > 0 ? static_cast<double>(top1) / positions : 0;
  }
  double target_logprob_mean() const { return positions > 0 ? target_logprob_sum / positions : 0; }
};

// A reference turn: the tokens it produced, its end-of-turn token included
// when it stopped on one (so a forced run predicts the stop too), and its
// distribution before each of them. One JSON object per line:
// {"id": ..., "targets": [...], "top_ids": [[...], ...], "top_logprobs": [[...], ...]}.
struct ReferenceTurn {
  std::string id;
  std::vector<int32_t> targets;
  std::vector<TopLogprobs> top;  // one per target
};
std::string ReferenceTurnJson(const ReferenceTurn& turn);
// InvalidArgument naming what is wrong (lengths, types, an empty turn).
absl::StatusOr<ReferenceTurn> ParseReferenceTurn(const std::string& line);

}  // namespace polykv::worker
