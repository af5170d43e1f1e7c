#include "daemon/compaction/compactor.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "policies/lowering.h"

namespace polykv::daemon {

uint64_t SessionBudget(uint64_t budget_tokens, double fraction, uint64_t context_tokens) {
  if (!(fraction > 0)) return budget_tokens;
  const double share = std::ceil(std::min(fraction, 1.0) * static_cast<double>(context_tokens));
  return std::max(budget_tokens, static_cast<uint64_t>(share));
}

uint64_t CompactionTarget(const TargetInputs& in) {
  if (!in.compacting_policy || in.committed_tokens == 0) return 0;
  uint64_t target = 0;
  const double ratio = std::max(in.trigger, 1.0) - 1.0;
  const uint64_t slack = std::max<uint64_t>(
      static_cast<uint64_t>(static_cast<double>(in.budget_tokens) * ratio), 1);
  if (in.budget_tokens > 0 && in.committed_tokens > in.budget_tokens + slack) {
    target = in.budget_tokens;
  }
  if (in.want_tokens > 0 && in.committed_tokens > in.want_tokens) {
    target = target == 0 ? in.want_tokens : std::min(target, in.want_tokens);
  }
  if (target > 0) {
    const uint64_t drop = (in.committed_tokens - target + in.block_tokens - 1) / in.block_tokens *
                          in.block_tokens;
    if (drop < in.committed_tokens) target = in.committed_tokens - drop;
  }
  return target;
}

namespace {

// See the file comment of compactor.h.
void ApplyStorageRules(const CompactionInputs& in, CompactionGroups& g) {
  const size_t blocks = g.block_k_formats.size();
  for (size_t b = 0; b < blocks; ++b) {
    if (in.key_floor) {
      g.block_k_formats[b] = policies::FinerFormat(g.block_k_formats[b], *in.key_floor);
    }
    if (in.value_floor) {
      g.block_v_formats[b] = policies::FinerFormat(g.block_v_formats[b], *in.value_floor);
    }
  }
  const size_t bt = static_cast<size_t>(in.shape.block_tokens);
  if (blocks > 0 && static_cast<size_t>(g.num_out()) % bt != 0) {
    g.block_k_formats.back() = policies::FinerFormat(g.block_k_formats.back(), in.formats.fill_k);
    g.block_v_formats.back() = policies::FinerFormat(g.block_v_formats.back(), in.formats.fill_v);
  }
}

// The median of `f` by precision (FinerFormat's order), ties to the finer.
kernels::PageFormat MedianFormat(std::vector<kernels::PageFormat>& f) {
  std::sort(f.begin(), f.end(), [](kernels::PageFormat a, kernels::PageFormat b) {
    return a != b && policies::FinerFormat(a, b) == b;
  });
  return f[f.size() / 2];
}

}  // namespace

size_t CompactionPlan::shared_blocks() const {
  return static_cast<size_t>(std::count_if(shared.begin(), shared.end(),
                                           [](int64_t i) { return i >= 0; }));
}

absl::StatusOr<CompactionPlan> PlanCompaction(const policies::Policy& policy,
                                              const std::vector<SlotRecord>& slots,
                                              const CompactionInputs& in) {
  return PlanCompaction(policy, slots, {}, in);
}

absl::StatusOr<CompactionPlan> PlanCompaction(const policies::Policy& policy,
                                              const std::vector<SlotRecord>& slots,
                                              const std::vector<std::vector<SlotRecord>>& upper,
                                              const CompactionInputs& in) {
  for (const auto& u : upper) {
    if (u.size() != slots.size()) {
      return absl::InternalError(absl::StrCat("a layer has ", u.size(), " slot records, layer 0 ",
                                              slots.size()));
    }
  }
  const bool per_layer = !upper.empty() && policy.SelectsPerLayer();
  policies::SessionView view;
  if (per_layer) {
    std::vector<const std::vector<SlotRecord>*> records{&slots};
    for (const auto& u : upper) records.push_back(&u);
    view = BuildLayerView(records, in.shape, in.formats, in.current_turn);
  } else {
    view = BuildView(slots, in.shape, in.formats, in.current_turn);
    if (in.key_dim > 0) {
      view.key_dim = in.key_dim;
      view.layers[0].keys = in.keys;
    }
  }
  auto plan = policy.Decide(view, policies::Budget::TokensPerLayer(
                                      view.num_layers(), static_cast<int64_t>(in.target_tokens)));
  if (!plan.ok()) return plan.status();
  CompactionPlan out;
  if (!plan->changes()) return out;
  std::vector<CompactionGroups> layers;  // [1 + upper.size()]
  layers.reserve(1 + upper.size());      // emplace_back(layers[0]) below never reallocates
  if (per_layer) {
    for (int l = 0; l < view.num_layers(); ++l) {
      auto g = LowerPlanLayer(view, l, l == 0 ? slots : upper[size_t(l) - 1], *plan);
      if (!g.ok()) return g.status();
      if (l > 0 && g->num_out() != layers[0].num_out()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "select=layer: layer ", l, " keeps ", g->num_out(), " slots and layer 0 ",
            layers[0].num_out(), "; a session's layers must hold as many slots each"));
      }
      layers.push_back(*std::move(g));
    }
    // One shape per block: the median format over layers.
    for (size_t b = 0; b < layers[0].block_k_formats.size(); ++b) {
      std::vector<kernels::PageFormat> k, v;
      for (const CompactionGroups& g : layers) {
        k.push_back(g.block_k_formats[b]);
        v.push_back(g.block_v_formats[b]);
      }
      layers[0].block_k_formats[b] = MedianFormat(k);
      layers[0].block_v_formats[b] = MedianFormat(v);
    }
  } else {
    auto g = LowerPlan(view, slots, *plan);
    if (!g.ok()) return g.status();
    layers.push_back(*std::move(g));
    for (const auto& u : upper) {
      CompactionGroups& gl = layers.emplace_back(layers[0]);
      gl.slots = OutputRecords(layers[0], u);
    }
  }
  ApplyStorageRules(in, layers[0]);
  for (CompactionGroups& g : layers) {
    g.block_k_formats = layers[0].block_k_formats;
    g.block_v_formats = layers[0].block_v_formats;
    // Room for the tokens committed until the next compaction (at +10%), so
    // that Commit, under the pool lock, appends without reallocating.
    g.slots.reserve(g.slots.size() + g.slots.size() / 8 + 64);
  }
  out.changes = true;

  // An output block whose every slot, in every layer, is a plain copy of the
  // same row of one source block IS that block: the new table shares its
  // pages instead of copying them (the worker only appends to them after
  // adopting the new table, and nobody reads the old one after that).
  const CompactionGroups& g0 = layers[0];
  const int bt = in.shape.block_tokens;
  const int num_out = g0.num_out();
  const size_t out_blocks = (static_cast<size_t>(num_out) + bt - 1) / bt;
  out.shared.assign(out_blocks, -1);
  std::vector<CompactionGroups> copies(layers.size());
  for (CompactionGroups& c : copies) c.group_offsets.push_back(0);
  for (size_t j = 0; j < out_blocks; ++j) {
    const int first = static_cast<int>(j) * bt;
    const int last = std::min(num_out, first + bt);
    const int32_t m0 = g0.members[g0.group_offsets[first]];
    bool same = m0 % bt == 0 && g0.block_k_formats[j] == in.formats.key(size_t(m0 / bt)) &&
                g0.block_v_formats[j] == in.formats.value(size_t(m0 / bt));
    for (const CompactionGroups& g : layers) {
      for (int o = first; o < last && same; ++o) {
        same = g.group_offsets[o + 1] - g.group_offsets[o] == 1 &&
               g.members[g.group_offsets[o]] == m0 + (o - first);
      }
    }
    if (same) {
      out.shared[j] = m0 / bt;
      continue;
    }
    for (size_t l = 0; l < layers.size(); ++l) {
      const CompactionGroups& g = layers[l];
      CompactionGroups& c = copies[l];
      for (int o = first; o < last; ++o) {
        for (int k = g.group_offsets[o]; k < g.group_offsets[o + 1]; ++k) {
          c.members.push_back(g.members[k]);
          c.weights.push_back(g.weights[k]);
        }
        c.group_offsets.push_back(static_cast<int32_t>(c.members.size()));
        c.slots.push_back(g.slots[o]);
      }
      c.block_k_formats.push_back(g.block_k_formats[j]);
      c.block_v_formats.push_back(g.block_v_formats[j]);
    }
  }
  out.groups = std::move(layers[0]);
  out.copy = std::move(copies[0]);
  for (size_t l = 1; l < layers.size(); ++l) {
    out.upper_groups.push_back(std::move(layers[l]));
    out.upper_copy.push_back(std::move(copies[l]));
  }
  return out;
}

}  // namespace polykv::daemon
