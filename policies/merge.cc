#include "policies/merge.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"

namespace polykv::policies {

std::vector<std::vector<uint32_t>> ClusterByKey(const SessionView& view, int layer,
                                                absl::Span<const Ranked> candidates,
                                                const MergeOptions& options) {
  std::vector<std::vector<uint32_t>> groups;
  const int d = view.key_dim;
  const bool have_keys = d > 0 && !view.layers[layer].keys.empty();
  if (!have_keys) {
    groups.reserve(candidates.size());
    for (uint32_t c = 0; c < candidates.size(); ++c) groups.push_back({c});
    return groups;
  }
  // Unit-normalised leader keys, one row per group.
  std::vector<float> leaders;
  absl::flat_hash_map<uint32_t, std::vector<uint32_t>> by_block;  // block -> group ids
  std::vector<float> unit(d);
  for (uint32_t c = 0; c < candidates.size(); ++c) {
    const uint32_t slot = candidates[c].index;
    const float* k = view.key(layer, slot);
    double norm = 0;
    for (int j = 0; j < d; ++j) norm += double(k[j]) * k[j];
    const float inv = norm > 0 ? static_cast<float>(1.0 / std::sqrt(norm)) : 0.f;
    for (int j = 0; j < d; ++j) unit[j] = k[j] * inv;
    const uint32_t block = view.meta(layer, slot).tag.block_id;
    int best = -1;
    float best_cos = options.threshold;
    if (block != 0 && inv > 0) {
      std::vector<uint32_t>& open = by_block[block];
      const size_t start =
          open.size() > static_cast<size_t>(options.probe) ? open.size() - options.probe : 0;
      for (size_t g = start; g < open.size(); ++g) {
        const float* lk = leaders.data() + size_t(open[g]) * d;
        // Four partial sums: lets the compiler vectorise without -ffast-math.
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        int j = 0;
        for (; j + 4 <= d; j += 4) {
          for (int u = 0; u < 4; ++u) acc[u] += unit[j + u] * lk[j + u];
        }
        for (; j < d; ++j) acc[0] += unit[j] * lk[j];
        const float dot = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        if (dot >= best_cos && (best < 0 || dot > best_cos)) {
          best = static_cast<int>(open[g]);
          best_cos = dot;
        }
      }
    }
    if (best >= 0) {
      groups[best].push_back(c);
    } else {
      const uint32_t id = static_cast<uint32_t>(groups.size());
      groups.push_back({c});
      leaders.insert(leaders.end(), unit.begin(), unit.end());
      if (block != 0 && inv > 0) by_block[block].push_back(id);
    }
  }
  return groups;
}

MergeGroup MakeMergeGroup(const SessionView& view, int layer, std::vector<uint32_t> members,
                          absl::Span<const float> scores) {
  std::sort(members.begin(), members.end());
  MergeGroup g;
  g.members = std::move(members);
  const std::vector<Slot>& slots = view.layers[layer].slots;
  double sum = 0;
  g.weights.resize(g.members.size());
  g.count = 0;
  for (size_t m = 0; m < g.members.size(); ++m) {
    const uint32_t i = g.members[m];
    const double w = (std::max(0.f, scores[i]) + 1e-3) * slots[i].count;
    g.weights[m] = static_cast<float>(w);
    sum += w;
    g.count += slots[i].count;
  }
  size_t rep = 0;
  for (size_t m = 0; m < g.members.size(); ++m) {
    g.weights[m] = static_cast<float>(g.weights[m] / sum);
    if (g.weights[m] > g.weights[rep]) rep = m;
  }
  g.representative = g.members[rep];
  return g;
}

void AttendRef(absl::Span<const float> q, absl::Span<const float> keys,
               absl::Span<const float> values, absl::Span<const uint32_t> counts, int d,
               bool log_count_bias, absl::Span<float> out) {
  const size_t n = counts.size();
  std::vector<double> logit(n);
  double mx = -1e300;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (size_t i = 0; i < n; ++i) {
    double dot = 0;
    for (int j = 0; j < d; ++j) dot += double(q[j]) * keys[i * d + j];
    logit[i] = dot * scale + (log_count_bias ? std::log(double(counts[i])) : 0.0);
    mx = std::max(mx, logit[i]);
  }
  double z = 0;
  std::vector<double> acc(d, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const double p = std::exp(logit[i] - mx);
    z += p;
    for (int j = 0; j < d; ++j) acc[j] += p * values[i * d + j];
  }
  for (int j = 0; j < d; ++j) out[j] = static_cast<float>(acc[j] / z);
}

}  // namespace polykv::policies
