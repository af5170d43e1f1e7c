#include "policies/decay.h"

namespace polykv::policies {

void DecayAccumulator::Decay() {
  scale_ *= lambda_;
  if (scale_ < 1e-30) {
    for (float& s : stored_) s = static_cast<float>(s * scale_);
    scale_ = 1.0;
  }
}

void DecayAccumulator::Step(absl::Span<const float> w) {
  Decay();
  const double add = (1.0 - lambda_) / scale_;
  for (size_t i = 0; i < stored_.size() && i < w.size(); ++i) {
    stored_[i] += static_cast<float>(add * w[i]);
  }
}

void DecayAccumulator::StepSparse(absl::Span<const uint32_t> idx, absl::Span<const float> w) {
  Decay();
  const double add = (1.0 - lambda_) / scale_;
  for (size_t j = 0; j < idx.size() && j < w.size(); ++j) {
    if (idx[j] < stored_.size()) stored_[idx[j]] += static_cast<float>(add * w[j]);
  }
}

void DecayAccumulator::ApplyPlan(const LayerPlan& plan) { stored_ = RemapScores(plan, stored_); }

std::vector<float> DecayAccumulator::scores() const {
  std::vector<float> out(stored_.size());
  for (size_t i = 0; i < stored_.size(); ++i) out[i] = static_cast<float>(stored_[i] * scale_);
  return out;
}

}  // namespace polykv::policies
