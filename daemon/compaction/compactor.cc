#include "daemon/compaction/compactor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

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

// See the file comment of compactor.h; formats are per output block.
void ApplyStorageRules(const CompactionInputs& in, size_t num_out,
                       std::vector<kernels::PageFormat>& k, std::vector<kernels::PageFormat>& v) {
  for (size_t b = 0; b < k.size(); ++b) {
    if (in.key_floor) k[b] = policies::FinerFormat(k[b], *in.key_floor);
    if (in.value_floor) v[b] = policies::FinerFormat(v[b], *in.value_floor);
  }
  const size_t bt = static_cast<size_t>(in.shape.block_tokens);
  if (!k.empty() && num_out % bt != 0) {
    k.back() = policies::FinerFormat(k.back(), in.formats.fill_k);
    v.back() = policies::FinerFormat(v.back(), in.formats.fill_v);
  }
}

// The median of `f` by precision (FinerFormat's order), ties to the finer.
kernels::PageFormat MedianFormat(std::vector<kernels::PageFormat>& f) {
  std::sort(f.begin(), f.end(), [](kernels::PageFormat a, kernels::PageFormat b) {
    return a != b && policies::FinerFormat(a, b) == b;
  });
  return f[f.size() / 2];
}

// A placeholder record for the slots below a layer's offset (it holds none).
SlotRecord Absent() {
  SlotRecord r;
  r.meta.position = -1;
  return r;
}

// A policy that selects per layer, over one view layer per model layer (each
// layer's records from its offset on): its groups per layer, in layer-local
// slot indices, or none when the plan changes nothing.
absl::StatusOr<std::vector<CompactionGroups>> DecidePerLayer(
    const policies::Policy& policy, const std::vector<std::span<const SlotRecord>>& records,
    const CompactionInputs& in) {
  policies::SessionView view = BuildLayerView(records, in.shape, in.formats, in.current_turn);
  const int L = view.num_layers();
  for (size_t l = 0; l < std::min(in.layer_scores.size(), view.layers.size()); ++l) {
    view.layers[l].score = in.layer_scores[l];
  }
  auto budgets = policy.LayerBudgets(
      view, policies::Budget::TotalTokens(static_cast<int64_t>(in.target_tokens) * L));
  if (!budgets.ok()) return budgets.status();
  std::vector<int64_t> sizes;
  int64_t pinned = std::numeric_limits<int64_t>::max();  // leading slots pinned in every layer
  for (const auto& r : records) {
    sizes.push_back(static_cast<int64_t>(r.size()));
    int64_t p = 0;
    while (p < int64_t(r.size()) && r[size_t(p)].meta.pinned) ++p;
    pinned = std::min(pinned, p);
  }
  auto aligned = AlignLayerBudgets(*budgets, sizes, in.shape.block_tokens,
                                   records.empty() ? 0 : pinned);
  if (!aligned.ok()) return aligned.status();
  auto plan =
      policy.Decide(view, policies::Budget{policies::Budget::Unit::kTokens, *aligned, 0, in.cold});
  if (!plan.ok()) return plan.status();
  std::vector<CompactionGroups> out;
  if (!plan->changes()) return out;
  out.reserve(records.size());
  for (int l = 0; l < L; ++l) {
    auto g = LowerPlanLayer(view, l, records[size_t(l)], *plan);
    if (!g.ok()) return g.status();
    out.push_back(*std::move(g));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> AlignLayerBudgets(const std::vector<int64_t>& budgets,
                                                       const std::vector<int64_t>& sizes,
                                                       int block_tokens, int64_t pinned) {
  const int64_t T = std::max(block_tokens, 1);
  std::vector<int64_t> b(budgets.size());
  for (size_t l = 0; l < b.size(); ++l) b[l] = std::clamp<int64_t>(budgets[l], 0, sizes[l]);
  const int64_t top = b.empty() ? 0 : *std::max_element(b.begin(), b.end());
  std::vector<int64_t> out(b.size());
  for (size_t l = 0; l < b.size(); ++l) {
    // The nearest count in top's class mod T, at least a block past the
    // pinned slots (or all the layer has, or top), at most what it holds.
    const int64_t low = std::max<int64_t>(1, std::min({sizes[l], pinned + T, top}));
    int64_t c = top - (top - b[l] + T / 2) / T * T;
    while (c > sizes[l]) c -= T;
    while (c < low) c += T;
    if (c > sizes[l] || c > top) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer ", l, " holds ", sizes[l], " slots: it cannot keep a count that differs from ",
          top, " by whole blocks of ", T));
    }
    out[l] = c;
  }
  return out;
}

size_t CompactionPlan::shared_blocks() const {
  return static_cast<size_t>(std::count_if(shared.begin(), shared.end(),
                                           [](int64_t i) { return i >= 0; }));
}

absl::StatusOr<CompactionPlan> PlanCompaction(const policies::Policy& policy,
                                              const std::vector<SlotRecord>& slots,
                                              const CompactionInputs& in) {
  return PlanCompaction(policy, std::span(&slots, 1), in);
}

absl::StatusOr<CompactionPlan> PlanCompaction(
    const policies::Policy& policy, std::span<const std::vector<SlotRecord>> records,
    const CompactionInputs& in) {
  if (records.empty()) return absl::InternalError("no slot record list to plan over");
  const std::vector<SlotRecord>& slots = records[0];
  for (const auto& list : records) {
    if (list.size() != slots.size()) {
      return absl::InternalError(absl::StrCat("a layer has ", list.size(),
                                              " slot records, another ", slots.size()));
    }
  }
  const size_t L = records.size();
  std::vector<LayerHole> src = in.layer_holes;
  src.resize(L);
  const bool per_layer = L > 1 && policy.SelectsPerLayer();
  if (auto st = CheckLayerHoles(policy, src); !st.ok()) return st;
  const int bt = in.shape.block_tokens;
  for (const LayerHole& h : src) {
    if (h.start % uint64_t(bt) != 0 || h.length % uint64_t(bt) != 0 ||
        (!h.empty() && h.end() >= std::max<size_t>(slots.size(), 1))) {
      return absl::InternalError(absl::StrCat("layer hole [", h.start, ", ", h.end(), ") in ",
                                              slots.size(), " slots of blocks of ", bt));
    }
  }
  CompactionPlan out;
  std::vector<CompactionGroups> layers;  // [L], layer-local slot indices
  if (per_layer) {
    std::vector<std::vector<SlotRecord>> gathered(L);  // layers with a hole inside
    std::vector<std::span<const SlotRecord>> held;
    for (size_t l = 0; l < L; ++l) {
      const std::span<const SlotRecord> all(records[l]);
      if (src[l].start == 0) {
        held.push_back(all.subspan(src[l].length));
        continue;
      }
      gathered[l].assign(all.begin(), all.begin() + std::ptrdiff_t(src[l].start));
      gathered[l].insert(gathered[l].end(), all.begin() + std::ptrdiff_t(src[l].end()), all.end());
      held.push_back(gathered[l]);
    }
    auto g = DecidePerLayer(policy, held, in);
    if (!g.ok()) return g.status();
    if (g->empty()) return out;
    layers = *std::move(g);
  } else {
    policies::SessionView view = BuildView(slots, in.shape, in.formats, in.current_turn);
    if (in.key_dim > 0) {
      view.key_dim = in.key_dim;
      view.layers[0].keys = in.keys;
    }
    policies::Budget budget =
        policies::Budget::TokensPerLayer(1, static_cast<int64_t>(in.target_tokens));
    budget.cold = in.cold;
    auto plan = policy.Decide(view, budget);
    if (!plan.ok()) return plan.status();
    if (!plan->changes()) return out;
    auto g = LowerPlan(view, slots, *plan);
    if (!g.ok()) return g.status();
    layers.reserve(L);  // emplace_back(layers[0]) below never reallocates
    layers.push_back(*std::move(g));
    for (size_t l = 1; l < L; ++l) {
      CompactionGroups& gl = layers.emplace_back(layers[0]);
      gl.slots = OutputRecords(layers[0], records[l]);
    }
  }
  out.changes = true;
  // The table slot of layer l's source slot `local` (its member index).
  auto source_slot = [&](size_t l, int64_t local) {
    return int64_t(src[l].TableSlot(uint64_t(local)));
  };

  // The leading whole output blocks every layer keeps in place: plain copies
  // of the same source slots (a shared prefix, pinned in every layer, stays
  // in its shared blocks). After them each layer's hole; its other slots are
  // aligned to the end, where new tokens follow in every layer alike
  // (AlignLayerBudgets made the counts differ by whole blocks).
  int num_out = 0, fewest = std::numeric_limits<int>::max(), in_place = fewest;
  for (size_t l = 0; l < L; ++l) {
    const CompactionGroups& g = layers[l];
    num_out = std::max(num_out, int(g.num_out()));
    fewest = std::min(fewest, int(g.num_out()));
    int o = 0;
    while (o < std::min(in_place, int(g.num_out())) &&
           g.group_offsets[o + 1] - g.group_offsets[o] == 1 &&
           source_slot(l, g.members[g.group_offsets[o]]) == o) {
      ++o;
    }
    in_place = std::min(in_place, o);
  }
  // Every layer holds the block being filled: a hole never reaches the end.
  in_place = L > 1 ? std::min(in_place, fewest - 1) / bt * bt : 0;
  out.num_out = static_cast<uint64_t>(num_out);
  for (size_t l = 0; l < L; ++l) {
    const int skip = num_out - int(layers[l].num_out());
    if (skip % bt != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer ", l, " keeps ", layers[l].num_out(), " slots and another ", num_out,
          ": a session's layers must differ by whole blocks of ", bt));
    }
    out.layer_holes.push_back(skip == 0 ? LayerHole{}
                                        : LayerHole{uint64_t(in_place), uint64_t(skip)});
  }
  const size_t out_blocks = (static_cast<size_t>(num_out) + bt - 1) / bt;
  auto holds = [&](size_t l, size_t j) { return out.layer_holes[l].holds(j * bt); };
  // Layer l's index of output block j (which it holds).
  auto local_block = [&](size_t l, size_t j) {
    return out.layer_holes[l].LocalSlot(j * bt) / uint64_t(bt);
  };
  // One shape per output block: the median format over the layers it holds.
  for (size_t j = 0; j < out_blocks; ++j) {
    std::vector<kernels::PageFormat> k, v;
    for (size_t l = 0; l < L; ++l) {
      if (!holds(l, j)) continue;
      k.push_back(layers[l].block_k_formats[local_block(l, j)]);
      v.push_back(layers[l].block_v_formats[local_block(l, j)]);
    }
    out.block_k_formats.push_back(MedianFormat(k));
    out.block_v_formats.push_back(MedianFormat(v));
  }
  ApplyStorageRules(in, out.num_out, out.block_k_formats, out.block_v_formats);
  for (size_t l = 0; l < L; ++l) {
    CompactionGroups& g = layers[l];
    const LayerHole& hole = out.layer_holes[l];
    g.block_k_formats.clear();
    g.block_v_formats.clear();
    for (size_t j = 0; j < out_blocks; ++j) {
      if (!holds(l, j)) continue;
      g.block_k_formats.push_back(out.block_k_formats[j]);
      g.block_v_formats.push_back(out.block_v_formats[j]);
    }
    // Room for the tokens committed until the next compaction (at +10%), so
    // that Commit, under the pool lock, appends without reallocating.
    auto& r = out.records.emplace_back();
    r.reserve(out.num_out + out.num_out / 8 + 64);
    const auto before = g.slots.begin() + std::ptrdiff_t(std::min<uint64_t>(hole.start,
                                                                            g.slots.size()));
    r.assign(g.slots.begin(), hole.empty() ? g.slots.end() : before);
    if (hole.empty()) continue;
    r.insert(r.end(), hole.length, Absent());
    r.insert(r.end(), before, g.slots.end());
  }

  // An output block whose every slot, in every layer it holds, is a plain
  // copy of the same row of one source block that those same layers hold
  // IS that block: the new table shares its pages instead of copying them
  // (the worker only appends to them after adopting the new table, and
  // nobody reads the old one after that).
  out.shared.assign(out_blocks, -1);
  std::vector<CompactionGroups> copies(L);
  for (size_t j = 0; j < out_blocks; ++j) {
    const int first = static_cast<int>(j) * bt;
    const int last = std::min(num_out, first + bt);
    size_t l0 = 0;  // a layer holding block j (the fullest holds them all)
    while (!holds(l0, j)) ++l0;
    const CompactionGroups& g0 = layers[l0];
    const int64_t m0 = source_slot(
        l0, g0.members[g0.group_offsets[out.layer_holes[l0].LocalSlot(uint64_t(first))]]);
    const size_t sb = static_cast<size_t>(m0 / bt);
    bool same = m0 % bt == 0 && out.block_k_formats[j] == in.formats.key(sb) &&
                out.block_v_formats[j] == in.formats.value(sb);
    for (size_t l = 0; l < L && same; ++l) {
      const bool held = holds(l, j);
      same = held == src[l].holds(sb * bt);
      const CompactionGroups& g = layers[l];
      for (int o = first; held && o < last && same; ++o) {
        const auto local = out.layer_holes[l].LocalSlot(uint64_t(o));
        same = g.group_offsets[local + 1] - g.group_offsets[local] == 1 &&
               source_slot(l, g.members[g.group_offsets[local]]) == m0 + (o - first);
      }
    }
    if (same) {
      out.shared[j] = static_cast<int64_t>(sb);
      continue;
    }
    for (size_t l = 0; l < L; ++l) {
      if (!holds(l, j)) continue;
      const CompactionGroups& g = layers[l];
      CompactionGroups& c = copies[l];
      const auto from = out.layer_holes[l].LocalSlot(uint64_t(first));
      for (auto o = from; o < from + uint64_t(last - first); ++o) {
        for (int k = g.group_offsets[o]; k < g.group_offsets[o + 1]; ++k) {
          c.members.push_back(g.members[k]);
          c.weights.push_back(g.weights[k]);
        }
        c.group_offsets.push_back(static_cast<int32_t>(c.members.size()));
        c.sources.push_back(g.sources[o]);
        c.counts.push_back(g.counts[o]);
        c.slots.push_back(g.slots[o]);
      }
      c.block_k_formats.push_back(out.block_k_formats[j]);
      c.block_v_formats.push_back(out.block_v_formats[j]);
    }
  }
  out.groups = std::move(layers);
  out.copy = std::move(copies);
  return out;
}

absl::Status CheckLayerHoles(const policies::Policy& policy, const std::vector<LayerHole>& holes) {
  const bool apart =
      std::any_of(holes.begin(), holes.end(), [](const LayerHole& h) { return !h.empty(); });
  if (apart && !policy.SelectsPerLayer()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "policy '", policy.spec(), "' decides once for all layers, but this session's layers "
        "keep budgets of their own (a select=layer policy compacted it): only a select=layer "
        "policy can compact it now"));
  }
  return absl::OkStatus();
}

}  // namespace polykv::daemon
