#include "policies/plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "policies/lowering.h"
#include "policies/slot_record.h"

namespace polykv::policies {

bool Plan::changes() const {
  for (const LayerPlan& l : layers) {
    if (!l.evict.empty() || !l.merges.empty() || !l.requant.empty()) return true;
  }
  return false;
}

namespace {

absl::Status Bad(int layer, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("plan layer ", layer, ": ", what));
}

bool Ascending(const std::vector<uint32_t>& v) {
  for (size_t i = 1; i < v.size(); ++i) {
    if (v[i - 1] >= v[i]) return false;
  }
  return true;
}

// Calls f(source, group) for every output slot of `lp` in output order (keep
// and the merge representatives, both ascending, merged): group is the merge
// group the slot stands for, nullptr for a kept slot.
template <typename F>
void ForEachOutputSlot(const LayerPlan& lp, F&& f) {
  size_t k = 0, g = 0;
  while (k < lp.keep.size() || g < lp.merges.size()) {
    if (g == lp.merges.size() ||
        (k < lp.keep.size() && lp.keep[k] < lp.merges[g].representative)) {
      f(lp.keep[k++], static_cast<const MergeGroup*>(nullptr));
    } else {
      const MergeGroup& mg = lp.merges[g++];
      f(mg.representative, &mg);
    }
  }
}

// True when `slot` represents one of lp's merge groups (ordered by
// representative, as ValidatePlan requires).
bool IsRepresentative(const LayerPlan& lp, uint32_t slot) {
  auto it = std::lower_bound(
      lp.merges.begin(), lp.merges.end(), slot,
      [](const MergeGroup& g, uint32_t s) { return g.representative < s; });
  return it != lp.merges.end() && it->representative == slot;
}

// Calls f(first, size, k, v) for each output block of the layer: output slots
// [first, first + size) stored in formats k and v, the finest each of its
// slots has after the plan (as policies/lowering.h lays blocks out).
template <typename F>
void ForEachOutputBlock(const SessionView& view, int layer, const LayerPlan& lp, F&& f) {
  const std::vector<Slot>& slots = view.layers[layer].slots;
  const size_t bt = static_cast<size_t>(std::max(1, view.shape.block_tokens));
  size_t r = 0;  // requant is ordered by (slot, kind); output slots ascend
  size_t j = 0, first = 0;
  kernels::PageFormat bk = kernels::PageFormat::kF32, bv = kernels::PageFormat::kF32;
  ForEachOutputSlot(lp, [&](uint32_t src, const MergeGroup*) {
    kernels::PageFormat k = slots[src].k_format, v = slots[src].v_format;
    while (r < lp.requant.size() && lp.requant[r].slot < src) ++r;
    for (size_t q = r; q < lp.requant.size() && lp.requant[q].slot == src; ++q) {
      (lp.requant[q].kind == kernels::KvKind::kKey ? k : v) = lp.requant[q].format;
    }
    bk = j == first ? k : FinerFormat(bk, k);
    bv = j == first ? v : FinerFormat(bv, v);
    if (++j - first == bt) {
      f(first, bt, bk, bv);
      first = j;
    }
  });
  if (j > first) f(first, j - first, bk, bv);
}

}  // namespace

double OutputBytes(const SessionView& view, int layer, const LayerPlan& plan) {
  double bytes = 0;
  ForEachOutputBlock(view, layer, plan,
                     [&](size_t, size_t size, kernels::PageFormat k, kernels::PageFormat v) {
                       bytes += static_cast<double>(size) * BytesPerToken(view.shape, k, v);
                     });
  return bytes;
}

namespace {

constexpr int kWithinBudget = -1;
constexpr int kOverTotal = -2;

// The plan's layer budgets against checks.budget (when given): kWithinBudget,
// kOverTotal, or the first layer over its per-layer budget.
int BudgetViolation(const SessionView& view, const Plan& plan, const PlanChecks& checks,
                    int64_t total_tokens, int64_t total_bytes) {
  if (checks.budget == nullptr) return kWithinBudget;
  const Budget& b = *checks.budget;
  const bool bytes = b.unit == Budget::Unit::kBytes;
  if (b.per_layer.empty()) {
    return (bytes ? total_bytes : total_tokens) > b.total ? kOverTotal : kWithinBudget;
  }
  for (int l = 0; l < view.num_layers(); ++l) {
    const int64_t planned = bytes ? plan.layers[l].budget_bytes : plan.layers[l].budget_tokens;
    if (l >= static_cast<int>(b.per_layer.size()) || planned > b.per_layer[l]) return l;
  }
  return kWithinBudget;
}

// Every check of ValidatePlan as one yes/no, in as few passes as it can: a
// layer without merge groups is one merge-walk of keep and evict (both
// ascending) over [0, n), no state array. Accepting here implies
// ValidatePlanDetailed accepts; on a rejection that one finds the message.
bool PlanLooksValid(const SessionView& view, const Plan& plan, const PlanChecks& checks,
                    std::vector<uint8_t>* state) {
  if (static_cast<int>(plan.layers.size()) != view.num_layers()) return false;
  int64_t total_tokens = 0, total_bytes = 0;
  for (int l = 0; l < view.num_layers(); ++l) {
    const LayerPlan& lp = plan.layers[l];
    const std::vector<Slot>& slots = view.layers[l].slots;
    const size_t n = slots.size();
    if (!Ascending(lp.keep) || !Ascending(lp.evict)) return false;
    const uint32_t* keep = lp.keep.data();
    const size_t num_keep = lp.keep.size();
    const std::vector<uint32_t>* must_keep =
        l < static_cast<int>(checks.must_keep.size()) ? &checks.must_keep[l] : nullptr;
    if (lp.merges.empty()) {
      if (num_keep + lp.evict.size() != n) return false;
      const uint32_t* evict = lp.evict.data();
      size_t a = 0, b = 0;
      for (uint32_t i = 0; i < n; ++i) {
        if (a < num_keep && keep[a] == i) {
          ++a;
        } else if (b < lp.evict.size() && evict[b] == i) {
          ++b;
        } else {
          return false;
        }
      }
      for (const RequantTarget& t : lp.requant) {
        if (!std::binary_search(lp.keep.begin(), lp.keep.end(), t.slot)) return false;
      }
      if (must_keep != nullptr) {
        for (uint32_t i : *must_keep) {
          if (!std::binary_search(lp.keep.begin(), lp.keep.end(), i)) return false;
        }
      }
    } else {
      state->assign(n, 0);
      uint8_t* st = state->data();
      size_t marked = 0;
      auto mark = [&](const std::vector<uint32_t>& v, uint8_t s) {
        for (uint32_t i : v) {
          if (i >= n || st[i] != 0) return false;
          st[i] = s;
        }
        marked += v.size();
        return true;
      };
      if (!mark(lp.keep, 1) || !mark(lp.evict, 2)) return false;
      uint32_t prev_rep = 0;
      for (size_t gi = 0; gi < lp.merges.size(); ++gi) {
        const MergeGroup& g = lp.merges[gi];
        if (g.members.size() < 2 || !Ascending(g.members) ||
            g.weights.size() != g.members.size() || (gi > 0 && g.representative <= prev_rep) ||
            !std::binary_search(g.members.begin(), g.members.end(), g.representative)) {
          return false;
        }
        prev_rep = g.representative;
        if (!mark(g.members, 3)) return false;
        double wsum = 0;
        uint64_t count = 0;
        const uint32_t block = view.meta(l, g.members[0]).tag.block_id;
        for (size_t m = 0; m < g.members.size(); ++m) {
          if (!(g.weights[m] >= 0.f) || !std::isfinite(g.weights[m])) return false;
          wsum += g.weights[m];
          count += slots[g.members[m]].count;
          if (view.meta(l, g.members[m]).tag.block_id != block) return false;
        }
        if (std::abs(wsum - 1.0) > 1e-3 || count != g.count) return false;
      }
      if (marked != n) return false;  // every slot in some set (none twice: checked above)
      for (const RequantTarget& t : lp.requant) {
        if (t.slot >= n || (st[t.slot] != 1 && !IsRepresentative(lp, t.slot))) return false;
      }
      if (must_keep != nullptr) {
        for (uint32_t i : *must_keep) {
          if (i >= n || st[i] != 1) return false;
        }
      }
    }
    for (size_t r = 0; r < lp.requant.size(); ++r) {
      const RequantTarget& t = lp.requant[r];
      if (!kernels::IsValidFormat(static_cast<int>(t.format))) return false;
      if (r > 0) {
        const RequantTarget& p = lp.requant[r - 1];
        if (std::make_pair(p.slot, p.kind) >= std::make_pair(t.slot, t.kind)) return false;
      }
    }
    if (static_cast<int64_t>(lp.output_slots()) > lp.budget_tokens) return false;
    if (lp.budget_bytes > 0 &&
        OutputBytes(view, l, lp) > static_cast<double>(lp.budget_bytes) + 1e-6) {
      return false;
    }
    total_tokens += lp.budget_tokens;
    total_bytes += lp.budget_bytes;
  }
  return BudgetViolation(view, plan, checks, total_tokens, total_bytes) == kWithinBudget;
}

// ValidatePlan's checks one by one, naming the first violation.
absl::Status ValidatePlanDetailed(const SessionView& view, const Plan& plan,
                                  const PlanChecks& checks) {
  if (static_cast<int>(plan.layers.size()) != view.num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan has ", plan.layers.size(), " layers, view ", view.num_layers()));
  }
  int64_t total_tokens = 0, total_bytes = 0;
  std::vector<uint8_t> state;  // 0 unseen, 1 keep, 2 evict, 3 merged
  for (int l = 0; l < view.num_layers(); ++l) {
    const LayerPlan& lp = plan.layers[l];
    const std::vector<Slot>& slots = view.layers[l].slots;
    const size_t n = slots.size();
    state.assign(n, 0);
    if (!Ascending(lp.keep)) return Bad(l, "keep not strictly ascending");
    if (!Ascending(lp.evict)) return Bad(l, "evict not strictly ascending");
    auto mark = [&](uint32_t i, uint8_t s) -> absl::Status {
      if (i >= n) return Bad(l, absl::StrCat("slot ", i, " out of range (", n, " slots)"));
      if (state[i] != 0) return Bad(l, absl::StrCat("slot ", i, " appears twice"));
      state[i] = s;
      return absl::OkStatus();
    };
    for (uint32_t i : lp.keep) {
      if (auto st = mark(i, 1); !st.ok()) return st;
    }
    for (uint32_t i : lp.evict) {
      if (auto st = mark(i, 2); !st.ok()) return st;
    }
    uint32_t prev_rep = 0;
    for (size_t gi = 0; gi < lp.merges.size(); ++gi) {
      const MergeGroup& g = lp.merges[gi];
      if (g.members.size() < 2) return Bad(l, absl::StrCat("merge group ", gi, " has < 2 members"));
      if (!Ascending(g.members)) return Bad(l, absl::StrCat("merge group ", gi, " not ascending"));
      if (g.weights.size() != g.members.size()) {
        return Bad(l, absl::StrCat("merge group ", gi, " weights size"));
      }
      if (gi > 0 && g.representative <= prev_rep) {
        return Bad(l, "merge groups not ordered by representative");
      }
      prev_rep = g.representative;
      if (!std::binary_search(g.members.begin(), g.members.end(), g.representative)) {
        return Bad(l, absl::StrCat("merge group ", gi, " representative not a member"));
      }
      double wsum = 0;
      uint64_t count = 0;
      for (size_t m = 0; m < g.members.size(); ++m) {
        if (auto st = mark(g.members[m], 3); !st.ok()) return st;
        if (!(g.weights[m] >= 0.f) || !std::isfinite(g.weights[m])) {
          return Bad(l, absl::StrCat("merge group ", gi, " bad weight"));
        }
        wsum += g.weights[m];
        count += slots[g.members[m]].count;
      }
      if (std::abs(wsum - 1.0) > 1e-3) {
        return Bad(l, absl::StrCat("merge group ", gi, " weights sum to ", wsum));
      }
      if (count != g.count) return Bad(l, absl::StrCat("merge group ", gi, " count mismatch"));
      const uint32_t block = view.meta(l, g.members[0]).tag.block_id;
      for (uint32_t m : g.members) {
        if (view.meta(l, m).tag.block_id != block) {
          return Bad(l, absl::StrCat("merge group ", gi, " crosses blocks"));
        }
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (state[i] == 0) return Bad(l, absl::StrCat("slot ", i, " in no set"));
    }
    for (size_t r = 0; r < lp.requant.size(); ++r) {
      const RequantTarget& t = lp.requant[r];
      if (t.slot >= n || (state[t.slot] != 1 && !IsRepresentative(lp, t.slot))) {
        return Bad(l, absl::StrCat("requant target ", t.slot,
                                   " is neither a kept slot nor a merge representative"));
      }
      if (!kernels::IsValidFormat(static_cast<int>(t.format))) return Bad(l, "requant format");
      if (r > 0) {
        const RequantTarget& p = lp.requant[r - 1];
        if (std::make_pair(p.slot, p.kind) >= std::make_pair(t.slot, t.kind)) {
          return Bad(l, "requant targets not ordered by (slot, kind)");
        }
      }
    }
    if (static_cast<int64_t>(lp.output_slots()) > lp.budget_tokens) {
      return Bad(l, absl::StrCat(lp.output_slots(), " slots exceed budget ", lp.budget_tokens));
    }
    if (lp.budget_bytes > 0) {
      const double bytes = OutputBytes(view, l, lp);
      if (bytes > static_cast<double>(lp.budget_bytes) + 1e-6) {
        return Bad(l, absl::StrCat(bytes, " bytes exceed budget ", lp.budget_bytes));
      }
    }
    if (l < static_cast<int>(checks.must_keep.size())) {
      for (uint32_t i : checks.must_keep[l]) {
        if (i >= n || state[i] != 1) {
          return Bad(l, absl::StrCat("protected slot ", i, " not kept"));
        }
      }
    }
    total_tokens += lp.budget_tokens;
    total_bytes += lp.budget_bytes;
  }
  if (const int l = BudgetViolation(view, plan, checks, total_tokens, total_bytes);
      l == kOverTotal) {
    return absl::InvalidArgumentError("plan: layer budgets exceed the given total");
  } else if (l != kWithinBudget) {
    return Bad(l, "planned budget exceeds the given per-layer budget");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlan(const SessionView& view, const Plan& plan, const PlanChecks& checks) {
  thread_local std::vector<uint8_t> state;  // reused: policies validate every plan they make
  if (PlanLooksValid(view, plan, checks, &state)) return absl::OkStatus();
  return ValidatePlanDetailed(view, plan, checks);
}

std::vector<uint32_t> OutputOrder(const LayerPlan& layer) {
  std::vector<uint32_t> out;
  OutputOrder(layer, &out);
  return out;
}

void OutputOrder(const LayerPlan& layer, std::vector<uint32_t>* out) {
  out->resize(layer.output_slots());
  uint32_t* o = out->data();
  ForEachOutputSlot(layer, [&](uint32_t src, const MergeGroup*) { *o++ = src; });
}

std::vector<float> RemapScores(const LayerPlan& plan, absl::Span<const float> scores) {
  std::vector<float> out;
  out.reserve(plan.output_slots());
  ForEachOutputSlot(plan, [&](uint32_t src, const MergeGroup* g) {
    float sum = 0;
    if (g == nullptr) {
      sum = scores[src];
    } else {
      for (uint32_t m : g->members) sum += scores[m];
    }
    out.push_back(sum);
  });
  return out;
}

SessionView ApplyPlan(const SessionView& view, const Plan& plan) {
  SessionView out;
  out.tokens = view.tokens;
  out.key_dim = view.key_dim;
  out.shape = view.shape;
  out.current_turn = view.current_turn;
  out.layers.resize(view.layers.size());
  const size_t d = static_cast<size_t>(view.key_dim);
  for (size_t l = 0; l < view.layers.size(); ++l) {
    const LayerView& in = view.layers[l];
    const LayerPlan& lp = plan.layers[l];
    LayerView& o = out.layers[l];
    o.score = in.score;
    const bool keys = d > 0 && !in.keys.empty();
    ForEachOutputSlot(lp, [&](uint32_t i, const MergeGroup* mg) {
      if (mg == nullptr) {
        o.slots.push_back(in.slots[i]);
        if (keys) {
          o.keys.insert(o.keys.end(), in.keys.begin() + i * d, in.keys.begin() + (i + 1) * d);
        }
        return;
      }
      Slot s = in.slots[i];
      s.count = mg->count;
      GroupScores group;  // the daemon's rule (slot_record.h)
      std::vector<float> key(keys ? d : 0, 0.f);
      for (size_t m = 0; m < mg->members.size(); ++m) {
        const Slot& src = in.slots[mg->members[m]];
        group.Add(src.score, view.tokens[src.token].pinned);
        for (size_t j = 0; j < key.size(); ++j) {
          key[j] += mg->weights[m] * in.keys[mg->members[m] * d + j];
        }
      }
      s.score = group.score;
      out.tokens[s.token].pinned |= group.pinned;
      o.slots.push_back(s);
      o.keys.insert(o.keys.end(), key.begin(), key.end());
    });
    // Every slot in its block's format (requant targets applied).
    ForEachOutputBlock(view, static_cast<int>(l), lp,
                       [&](size_t first, size_t size, kernels::PageFormat k,
                           kernels::PageFormat v) {
                         for (size_t j = first; j < first + size; ++j) {
                           o.slots[j].k_format = k;
                           o.slots[j].v_format = v;
                         }
                       });
  }
  return out;
}

}  // namespace polykv::policies
