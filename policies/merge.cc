#include "policies/merge.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "policies/ranking.h"

namespace polykv::policies {

void ClusterByKeyInto(const SessionView& view, int layer, absl::Span<const uint32_t> slots,
                      const MergeOptions& options, KeyClusters* out) {
  const size_t R = slots.size();
  const int d = view.key_dim;
  const bool have_keys = d > 0 && !view.layers[layer].keys.empty();
  const std::vector<Slot>& layer_slots = view.layers[layer].slots;
  // Blocks never interact, so cluster block by block (keys of one block sit
  // together in memory; rank order is kept within each block). Same result
  // as one pass in rank order, without the cache misses of random key reads.
  // (block, rank) packed: an ascending sort is a stable sort by block.
  const int rank_bits = std::bit_width(R);
  std::vector<uint64_t>& order = out->order;
  order.resize(R);
  for (size_t c = 0; c < R; ++c) {
    const uint64_t block = view.tokens[layer_slots[slots[c]].token].tag.block_id;
    order[c] = (block << rank_bits) | c;
  }
  RadixSortAscending(absl::MakeSpan(order), &out->sort_scratch);
  const uint64_t rank_mask = (uint64_t{1} << rank_bits) - 1;
  std::vector<uint32_t>& leader_of = out->leader_of;
  std::vector<float>& leaders = out->leaders;
  std::vector<uint32_t>& leader_ids = out->leader_ids;
  std::vector<float>& unit = out->unit;
  leader_of.resize(R);
  unit.resize(std::max(d, 0));
  for (size_t b = 0; b < R;) {
    const uint64_t block = order[b] >> rank_bits;
    size_t e = b;
    while (e < R && (order[e] >> rank_bits) == block) ++e;
    leaders.clear();
    leader_ids.clear();
    for (size_t k = b; k < e; ++k) {
      const uint32_t c = static_cast<uint32_t>(order[k] & rank_mask);
      leader_of[c] = c;
      if (!have_keys || block == 0) continue;
      const float* key = view.key(layer, slots[c]);
      float norm = 0.f;
      for (int j = 0; j < d; ++j) norm += key[j] * key[j];
      if (!(norm > 0.f)) continue;
      const float inv = 1.f / std::sqrt(norm);
      for (int j = 0; j < d; ++j) unit[j] = key[j] * inv;
      const size_t groups = leader_ids.size();
      const size_t start = groups > static_cast<size_t>(options.probe) ? groups - options.probe : 0;
      int best = -1;
      float best_cos = options.threshold;
      for (size_t g = start; g < groups; ++g) {
        const float* lk = leaders.data() + g * d;
        // Four partial sums: lets the compiler vectorise without -ffast-math.
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        int j = 0;
        for (; j + 4 <= d; j += 4) {
          for (int u = 0; u < 4; ++u) acc[u] += unit[j + u] * lk[j + u];
        }
        for (; j < d; ++j) acc[0] += unit[j] * lk[j];
        const float dot = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        if (dot >= best_cos && (best < 0 || dot > best_cos)) {
          best = static_cast<int>(g);
          best_cos = dot;
        }
      }
      if (best >= 0) {
        leader_of[c] = leader_ids[best];
      } else {
        leader_ids.push_back(c);
        leaders.insert(leaders.end(), unit.begin(), unit.end());
      }
    }
    b = e;
  }
  // Groups in order of their leaders (rank order), members in rank order:
  // count, prefix-sum, fill.
  std::vector<uint32_t>& group_index = out->group_index;
  group_index.resize(R);
  out->offsets.assign(1, 0);
  for (uint32_t c = 0; c < R; ++c) {
    if (leader_of[c] == c) {
      group_index[c] = static_cast<uint32_t>(out->offsets.size() - 1);
      out->offsets.push_back(0);
    }
    ++out->offsets[group_index[leader_of[c]] + 1];
  }
  for (size_t g = 1; g < out->offsets.size(); ++g) out->offsets[g] += out->offsets[g - 1];
  out->members.resize(R);
  std::vector<uint32_t>& cursor = leader_ids;  // free now: the fill position of each group
  cursor.assign(out->offsets.begin(), out->offsets.end() - 1);
  for (uint32_t c = 0; c < R; ++c) out->members[cursor[group_index[leader_of[c]]]++] = c;
}

std::vector<std::vector<uint32_t>> ClusterByKey(const SessionView& view, int layer,
                                                absl::Span<const Ranked> candidates,
                                                const MergeOptions& options) {
  std::vector<uint32_t> slots(candidates.size());
  for (size_t c = 0; c < candidates.size(); ++c) slots[c] = candidates[c].index;
  KeyClusters k;
  ClusterByKeyInto(view, layer, slots, options, &k);
  std::vector<std::vector<uint32_t>> groups(k.num_groups());
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].assign(k.members.begin() + k.offsets[g], k.members.begin() + k.offsets[g + 1]);
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
