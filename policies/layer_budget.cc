#include "policies/layer_budget.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>
#include <numeric>

namespace polykv::policies {

std::optional<LayerAllocator> ParseLayerAllocator(std::string_view name) {
  if (name == "uniform") return LayerAllocator::kUniform;
  if (name == "pyramid") return LayerAllocator::kPyramid;
  if (name == "entropy") return LayerAllocator::kEntropy;
  if (name == "importance") return LayerAllocator::kImportance;
  return std::nullopt;
}

std::string_view LayerAllocatorName(LayerAllocator a) {
  switch (a) {
    case LayerAllocator::kUniform:
      return "uniform";
    case LayerAllocator::kPyramid:
      return "pyramid";
    case LayerAllocator::kEntropy:
      return "entropy";
    case LayerAllocator::kImportance:
      return "importance";
  }
  return "unknown";
}

std::vector<double> LayerWeights(LayerAllocator allocator, absl::Span<const float> entropy,
                                 double skew) {
  const size_t L = entropy.size();
  std::vector<double> w(L, 1.0);
  if (L <= 1) return w;
  switch (allocator) {
    case LayerAllocator::kUniform:
    case LayerAllocator::kImportance:  // without scores
      break;
    case LayerAllocator::kPyramid:
      for (size_t l = 0; l < L; ++l) {
        w[l] = 1.0 + skew * (1.0 - 2.0 * static_cast<double>(l) / static_cast<double>(L - 1));
        w[l] = std::max(w[l], 0.0);
      }
      break;
    case LayerAllocator::kEntropy: {
      // rank[l]: 0 = most focused. Unknown entropy: rank by depth, top = focused.
      const bool known =
          std::all_of(entropy.begin(), entropy.end(), [](float e) { return e >= 0.f; });
      std::vector<size_t> order(L);
      std::iota(order.begin(), order.end(), 0);
      if (known) {
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return entropy[a] < entropy[b]; });
      } else {
        std::reverse(order.begin(), order.end());
      }
      for (size_t r = 0; r < L; ++r) {
        const double third = static_cast<double>(r) * 3.0 / static_cast<double>(L);
        w[order[r]] = third < 1.0 ? 1.2 : (third < 2.0 ? 0.8 : 0.6);
      }
      break;
    }
  }
  return w;
}

std::vector<int64_t> AllocateLayerBudgets(LayerAllocator allocator, int64_t total,
                                          absl::Span<const int64_t> layer_sizes,
                                          absl::Span<const float> entropy, double skew) {
  const size_t L = layer_sizes.size();
  std::vector<int64_t> out(L, 0);
  if (L == 0 || total <= 0) return out;
  std::vector<float> ent(entropy.begin(), entropy.end());
  ent.resize(L, -1.f);
  const std::vector<double> w = LayerWeights(allocator, ent, skew);
  // Water-filling: cap layers at their size, hand the surplus to the rest.
  std::vector<double> share(L, 0.0);
  std::vector<bool> capped(L, false);
  double left = static_cast<double>(total);
  for (size_t iter = 0; iter <= L; ++iter) {
    double wsum = 0;
    for (size_t l = 0; l < L; ++l) {
      if (!capped[l]) wsum += w[l];
    }
    if (wsum <= 0) break;
    bool changed = false;
    for (size_t l = 0; l < L; ++l) {
      if (capped[l]) continue;
      share[l] = left * w[l] / wsum;
      if (share[l] >= static_cast<double>(layer_sizes[l])) {
        share[l] = static_cast<double>(layer_sizes[l]);
        capped[l] = true;
        left -= share[l];
        changed = true;
      }
    }
    if (!changed) break;
  }
  // Largest-remainder rounding, never above a layer's size.
  int64_t used = 0;
  std::vector<std::pair<double, size_t>> rem;
  for (size_t l = 0; l < L; ++l) {
    out[l] = static_cast<int64_t>(std::floor(share[l]));
    used += out[l];
    rem.push_back({share[l] - static_cast<double>(out[l]), l});
  }
  std::stable_sort(rem.begin(), rem.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [r, l] : rem) {
    if (used >= total) break;
    if (r > 1e-9 && out[l] < layer_sizes[l]) {
      ++out[l];
      ++used;
    }
  }
  return out;
}

std::vector<int64_t> ImportanceLayerBudgets(int64_t total,
                                            absl::Span<const std::vector<float>> scores) {
  const size_t L = scores.size();
  std::vector<int64_t> out(L, 0);
  auto key = [](float s) { return std::isnan(s) ? -std::numeric_limits<float>::infinity() : s; };
  std::vector<float> all;
  for (const auto& layer : scores) {
    for (float s : layer) all.push_back(key(s));
  }
  const size_t take = static_cast<size_t>(std::clamp<int64_t>(total, 0, int64_t(all.size())));
  if (take == 0) return out;
  std::nth_element(all.begin(), all.begin() + take - 1, all.end(), std::greater<float>());
  const float threshold = all[take - 1];
  // Above the threshold: kept. At it: the rest of `take`, shared in
  // proportion to each layer's tied slots (largest remainder), so scores
  // that do not tell layers apart (none reported) split evenly.
  std::vector<int64_t> tied(L, 0);
  int64_t left = static_cast<int64_t>(take), num_tied = 0;
  for (size_t l = 0; l < L; ++l) {
    for (float s : scores[l]) {
      const float k = key(s);
      out[l] += k > threshold;
      tied[l] += k == threshold;
    }
    left -= out[l];
    num_tied += tied[l];
  }
  std::vector<std::pair<double, size_t>> rem;
  int64_t given = 0;
  for (size_t l = 0; l < L && num_tied > 0; ++l) {
    const double share = static_cast<double>(left) * tied[l] / num_tied;
    const auto whole = static_cast<int64_t>(std::floor(share));
    out[l] += whole;
    given += whole;
    rem.push_back({share - static_cast<double>(whole), l});
  }
  std::stable_sort(rem.begin(), rem.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < rem.size() && given < left; ++i, ++given) ++out[rem[i].second];
  return out;
}

}  // namespace polykv::policies
