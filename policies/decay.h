// Online H2O accumulation: A_i <- lambda * A_i + (1 - lambda) * w_i at every
// decode step, where w_i is the step's attention weight on slot i (averaged
// over heads). The worker or daemon keeps one per layer and reports scores()
// as Slot::attn.
//
// Decay is kept as one global scale (A_i = stored_i * scale), so a step that
// only reports the top-k attended slots costs O(k), not O(num_slots) — the
// incremental update the compaction study asks for. Stored values are
// renormalised when the scale underflows.
//
// Thread-compatible (one owner per layer).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "policies/plan.h"

namespace polykv::policies {

class DecayAccumulator {
 public:
  // REQUIRES: 0 < lambda <= 1. Seed default 0.99.
  explicit DecayAccumulator(float lambda = 0.99f) : lambda_(lambda) {}

  // Appends `n` new slots with score 0 (tokens just written).
  void Append(size_t n) { stored_.resize(stored_.size() + n, 0.f); }

  // One decode step with dense attention weights. REQUIRES: w.size() == size().
  void Step(absl::Span<const float> w);
  // One decode step reporting only some slots (the others decay).
  // REQUIRES: idx.size() == w.size(), every idx < size().
  void StepSparse(absl::Span<const uint32_t> idx, absl::Span<const float> w);

  // Rewrites the state after a plan ran on this layer (merged slots sum).
  void ApplyPlan(const LayerPlan& plan);

  size_t size() const { return stored_.size(); }
  float score(size_t i) const { return static_cast<float>(stored_[i] * scale_); }
  std::vector<float> scores() const;

 private:
  void Decay();

  float lambda_;
  double scale_ = 1.0;
  std::vector<float> stored_;  // [size()] A_i / scale_
};

}  // namespace polykv::policies
