#include "policies/lowering.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace polykv::policies {

size_t LoweredPlan::requant_ops() const {
  size_t n = 0;
  for (const LoweredLayer& l : layers) n += l.requant.size();
  return n;
}

absl::StatusOr<LoweredLayer> LowerLayer(const LayerPlan& plan,
                                        absl::Span<const uint32_t> src_counts) {
  const size_t n = src_counts.size();
  auto count_of = [&](uint32_t s) { return std::max<uint32_t>(src_counts[s], 1); };
  std::vector<int32_t> group_at(n, -1);  // representative -> index into plan.merges
  for (size_t i = 0; i < plan.merges.size(); ++i) {
    const uint32_t rep = plan.merges[i].representative;
    if (rep >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge group represented by slot ", rep, " of a layer of ", n, " slots"));
    }
    group_at[rep] = static_cast<int32_t>(i);
  }
  LoweredLayer out;
  std::vector<int32_t> out_of(n, -1);  // kept source slot -> output slot
  for (uint32_t src : OutputOrder(plan)) {
    if (src >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan names slot ", src, " of a layer of ", n, " slots"));
    }
    if (group_at[src] < 0) {
      out_of[src] = static_cast<int32_t>(out.num_out());
      out.members.push_back(static_cast<int32_t>(src));
      out.weights.push_back(1.f);
      out.counts.push_back(count_of(src));
    } else {
      const MergeGroup& g = plan.merges[size_t(group_at[src])];
      double sum = 0;
      uint32_t tokens = 0;
      for (size_t i = 0; i < g.members.size(); ++i) {
        if (g.members[i] >= n) {
          return absl::InvalidArgumentError(
              absl::StrCat("merge group names slot ", g.members[i], " of ", n));
        }
        sum += std::max(i < g.weights.size() ? g.weights[i] : 0.f, 0.f);
        tokens += count_of(g.members[i]);
        if (g.members[i] != g.representative) out.merged_tokens += count_of(g.members[i]);
      }
      if (g.count != 0 && g.count != tokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            "merge group at slot ", src, " claims ", g.count, " tokens; its members hold ", tokens));
      }
      for (size_t i = 0; i < g.members.size(); ++i) {
        const float w = std::max(i < g.weights.size() ? g.weights[i] : 0.f, 0.f);
        out.members.push_back(static_cast<int32_t>(g.members[i]));
        out.weights.push_back(sum > 0 ? static_cast<float>(w / sum)
                                      : 1.f / static_cast<float>(g.members.size()));
      }
      out.counts.push_back(tokens);
    }
    out.sources.push_back(src);
    out.group_offsets.push_back(static_cast<int32_t>(out.members.size()));
  }
  for (uint32_t e : plan.evict) {
    if (e >= n) return absl::InvalidArgumentError(absl::StrCat("plan evicts slot ", e, " of ", n));
    out.evicted_tokens += count_of(e);
  }
  for (const RequantTarget& t : plan.requant) {
    if (t.slot >= n || out_of[t.slot] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan requantizes slot ", t.slot, ", which it does not keep"));
    }
    out.requant.push_back({static_cast<uint32_t>(out_of[t.slot]), t.kind, t.format});
  }
  std::sort(out.requant.begin(), out.requant.end(), [](const RequantOp& a, const RequantOp& b) {
    return a.out_slot != b.out_slot ? a.out_slot < b.out_slot : a.kind < b.kind;
  });
  return out;
}

absl::StatusOr<LoweredPlan> Lower(const Plan& plan,
                                  const std::vector<std::vector<uint32_t>>& src_counts) {
  if (src_counts.size() != plan.layers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan has ", plan.layers.size(),
                                                   " layers; counts were given for ",
                                                   src_counts.size()));
  }
  LoweredPlan out;
  out.log_count_bias = plan.log_count_bias;
  out.layers.reserve(plan.layers.size());
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    auto layer = LowerLayer(plan.layers[l], src_counts[l]);
    if (!layer.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, ": ", std::string(layer.status().message())));
    }
    out.layers.push_back(*std::move(layer));
  }
  return out;
}

}  // namespace polykv::policies
