#include "client/worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace polykv::worker {

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

Sampler::Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (options_.temperature <= 0.0f) return Argmax(logits);
  const float mx = logits[Argmax(logits)];
  std::vector<std::pair<float, int32_t>> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float e = std::exp((logits[i] - mx) / options_.temperature);
    p[i] = {e, static_cast<int32_t>(i)};
    sum += e;
  }
  // Sort by probability (descending, then id) and cut at top_p.
  std::sort(p.begin(), p.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  const double top_p = std::clamp(static_cast<double>(options_.top_p), 0.0, 1.0);
  double kept = 0;
  size_t n = 0;
  while (n < p.size()) {
    kept += p[n].first / sum;
    ++n;
    if (kept >= top_p) break;
  }
  double kept_mass = 0;
  for (size_t i = 0; i < n; ++i) kept_mass += p[i].first;
  std::uniform_real_distribution<double> u(0.0, kept_mass);
  double r = u(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= p[i].first;
    if (r <= 0) return p[i].second;
  }
  return p[n - 1].second;
}

}  // namespace polykv::worker
