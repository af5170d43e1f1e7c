// Property tests: every policy over seeded random session views.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "policies/plan.h"
#include "policies/policy.h"
#include "policies/synthetic.h"

namespace polykv::policies {
namespace {

using enum ScoreStream;

struct Case {
  std::string spec;
  std::string params;
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const std::string& p : PresetNames()) {
    if (p != "full") cases.push_back({p, ""});
  }
  cases.push_back({"sinks+structural+intent", ""});
  cases.push_back({"sinks+structural+intent", "mode=merge"});
  cases.push_back({"sinks+window+anchors+h2o+snapkv", "mode=hybrid,window.size=64,pool=32"});
  cases.push_back({"structural", "mode=selective,layers=pyramid"});
  cases.push_back({"hybrid", "fill=0,cold.format=int4,cold.fraction=0.5,cold.kind=kv"});
  cases.push_back({"h2o", "layers=entropy,cold.format=int8,cold.fraction=0.3"});
  cases.push_back({"merge", "merge.threshold=0.2"});
  return cases;
}

std::string Name(const Case& c) { return c.spec + (c.params.empty() ? "" : "{" + c.params + "}"); }

std::unique_ptr<Policy> Make(const Case& c) {
  auto params = ParseParams(c.params);
  EXPECT_TRUE(params.ok()) << params.status();
  auto p = MakePolicy(c.spec, *params);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

bool SamePlan(const Plan& a, const Plan& b) {
  if (a.policy != b.policy || a.layers.size() != b.layers.size()) return false;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerPlan &x = a.layers[l], &y = b.layers[l];
    if (x.keep != y.keep || x.evict != y.evict || x.merges.size() != y.merges.size() ||
        x.requant.size() != y.requant.size()) {
      return false;
    }
    for (size_t g = 0; g < x.merges.size(); ++g) {
      if (x.merges[g].members != y.merges[g].members ||
          x.merges[g].weights != y.merges[g].weights ||
          x.merges[g].representative != y.merges[g].representative) {
        return false;
      }
    }
    for (size_t r = 0; r < x.requant.size(); ++r) {
      if (x.requant[r].slot != y.requant[r].slot || x.requant[r].kind != y.requant[r].kind) {
        return false;
      }
    }
  }
  return true;
}

// Budget respected, plan valid, hard-protected (sinks, pinned) kept, window
// and anchors kept when the policy protects them and they fit, deterministic.
TEST(PolicyPropertyTest, EveryPolicyOverRandomViews) {
  const uint64_t base_seed = 20261130;
  std::printf("base seed %llu\n", static_cast<unsigned long long>(base_seed));
  int checked = 0, changed = 0;
  for (const Case& c : AllCases()) {
    const std::unique_ptr<Policy> policy = Make(c);
    ASSERT_NE(policy, nullptr);
    for (int trial = 0; trial < 30; ++trial) {
      const uint64_t seed = base_seed + 1000 * trial + std::hash<std::string>{}(Name(c)) % 997;
      SplitMix rng(seed);
      SyntheticOptions o;
      o.seed = seed;
      o.num_layers = rng.Int(1, 4);
      o.num_tokens = rng.Int(16, 1500);
      o.key_dim = rng.Uniform() < 0.8 ? rng.Int(4, 16) : 0;
      o.pre_evicted = rng.Uniform() < 0.5 ? 0.3 * rng.Uniform() : 0.0;
      o.pinned_fraction = rng.Uniform() < 0.3 ? 0.01 : 0.0;
      o.entropy = rng.Uniform() < 0.7;
      const SessionView view = MakeSyntheticView(o);
      Budget budget;
      const int64_t n = static_cast<int64_t>(view.layers[0].slots.size());
      const int kind = rng.Int(0, 2);
      if (kind == 0) {
        budget = Budget::TokensPerLayer(o.num_layers, rng.Int(8, static_cast<int>(n + 8)));
      } else if (kind == 1) {
        budget = Budget::TotalTokens(rng.Int(8 * o.num_layers, static_cast<int>(n) * o.num_layers));
      } else {
        const double bpt =
            BytesPerToken(view.shape, kernels::PageFormat::kBF16, kernels::PageFormat::kBF16);
        budget = Budget::BytesPerLayer(o.num_layers,
                                       static_cast<int64_t>(bpt * rng.Int(8, static_cast<int>(n))));
      }
      SCOPED_TRACE(Name(c) + " seed " + std::to_string(seed) + " tokens " +
                   std::to_string(o.num_tokens) + " budget kind " + std::to_string(kind));
      auto budgets = policy->LayerBudgets(view, budget);
      ASSERT_TRUE(budgets.ok()) << budgets.status();
      auto plan = policy->Decide(view, budget);
      const auto classes = policy->ProtectClasses(view, *budgets);
      int64_t hard_max = 0;
      bool hard_over = false;
      for (int l = 0; l < view.num_layers(); ++l) {
        int64_t hard = 0;
        for (uint8_t cl : classes[l]) hard += (cl & (kProtectSink | kProtectPinned)) != 0;
        hard_max = std::max(hard_max, hard);
        hard_over |= hard > (*budgets)[l];
      }
      if (hard_over) {
        EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
        continue;
      }
      ASSERT_TRUE(plan.ok()) << plan.status();
      PlanChecks checks;
      checks.budget =
          budget.unit == Budget::Unit::kBytes && budget.per_layer.empty() ? nullptr : &budget;
      checks.must_keep.resize(view.num_layers());
      for (int l = 0; l < view.num_layers(); ++l) {
        for (size_t i = 0; i < classes[l].size(); ++i) {
          if (classes[l][i] & (kProtectSink | kProtectPinned)) {
            checks.must_keep[l].push_back(static_cast<uint32_t>(i));
          }
        }
      }
      EXPECT_TRUE(ValidatePlan(view, *plan, checks).ok()) << ValidatePlan(view, *plan, checks);
      for (int l = 0; l < view.num_layers(); ++l) {
        const LayerPlan& lp = plan->layers[l];
        EXPECT_LE(static_cast<int64_t>(lp.output_slots()), (*budgets)[l]);
        if (budget.unit == Budget::Unit::kTokens && !budget.per_layer.empty()) {
          EXPECT_LE(static_cast<int64_t>(lp.output_slots()), budget.per_layer[l]);
        }
        if (budget.unit == Budget::Unit::kBytes) {
          EXPECT_LE(OutputBytes(view, l, lp), static_cast<double>(budget.per_layer[l]));
        }
        // The window is always kept whole (it is sized to fit the budget).
        const std::set<uint32_t> kept(lp.keep.begin(), lp.keep.end());
        for (size_t i = 0; i < classes[l].size(); ++i) {
          if (classes[l][i] & kProtectWindow) {
            EXPECT_TRUE(kept.count(static_cast<uint32_t>(i)))
                << "window slot " << i << " layer " << l;
          }
        }
        // Anchors survive whenever hard + window + anchors fit the budget.
        int64_t prot = 0;
        for (uint8_t cl : classes[l]) prot += cl != 0;
        if (prot <= (*budgets)[l]) {
          for (size_t i = 0; i < classes[l].size(); ++i) {
            if (classes[l][i] != 0) {
              EXPECT_TRUE(kept.count(static_cast<uint32_t>(i))) << "protected slot " << i;
            }
          }
        }
      }
      // Deterministic: same input (and a copy of it) gives the same plan.
      const SessionView copy = view;
      auto again = policy->Decide(copy, budget);
      ASSERT_TRUE(again.ok());
      EXPECT_TRUE(SamePlan(*plan, *again));
      ++checked;
      changed += plan->changes();
    }
  }
  // The cases must actually exercise compaction, not keep everything.
  EXPECT_GT(checked, 300);
  EXPECT_GT(changed, checked / 2);
}

// Online: tokens arrive, the policy compacts whenever NeedsCompaction fires
// and the next decision sees ApplyPlan's view (merged slots included). Sinks
// and pinned tokens survive every compaction; layers never exceed the trigger.
TEST(PolicyPropertyTest, OnlineCompactionChains) {
  const uint64_t seed = 31337;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SyntheticOptions o;
  o.seed = seed;
  o.num_layers = 2;
  o.num_tokens = 1200;
  o.key_dim = 8;
  o.pinned_fraction = 0.01;
  const SessionView full = MakeSyntheticView(o);
  for (const Case& c : AllCases()) {
    SCOPED_TRACE(Name(c));
    const std::unique_ptr<Policy> policy = Make(c);
    const Budget budget = Budget::TokensPerLayer(2, 200);
    SessionView cur;
    cur.key_dim = full.key_dim;
    cur.shape = full.shape;
    cur.layers.resize(2);
    int compactions = 0;
    for (size_t t = 0; t < full.tokens.size(); ++t) {
      cur.tokens.push_back(full.tokens[t]);
      cur.current_turn = full.tokens[t].turn;
      for (int l = 0; l < 2; ++l) {
        cur.layers[l].slots.push_back(full.layers[l].slots[t]);
        cur.layers[l].keys.insert(cur.layers[l].keys.end(), full.key(l, t), full.key(l, t) + 8);
      }
      if (!policy->NeedsCompaction(cur, budget)) continue;
      auto plan = policy->Decide(cur, budget);
      ASSERT_TRUE(plan.ok()) << plan.status() << " at token " << t;
      cur = ApplyPlan(cur, *plan);
      ++compactions;
      ASSERT_TRUE(ValidateView(cur).ok());
    }
    EXPECT_GT(compactions, 5);
    for (int l = 0; l < 2; ++l) {
      EXPECT_LE(cur.layers[l].slots.size(), 220u);
      std::set<uint32_t> present;
      for (const Slot& s : cur.layers[l].slots) present.insert(s.token);
      for (size_t t = 0; t < full.tokens.size(); ++t) {
        const bool sink = c.spec.find("sinks") != std::string::npos || c.spec == "streaming" ||
                          c.spec == "hybrid" || c.spec == "merge" || c.spec == "structural" ||
                          c.spec == "intent";
        if ((sink && full.tokens[t].position < 4) || full.tokens[t].pinned) {
          EXPECT_TRUE(present.count(static_cast<uint32_t>(t))) << "token " << t << " layer " << l;
        }
      }
    }
  }
}

TEST(PolicyPropertyTest, FullKeepsEverythingOrRefuses) {
  SyntheticOptions o;
  o.num_tokens = 300;
  const SessionView view = MakeSyntheticView(o);
  auto full = MakePolicy("full");
  ASSERT_TRUE(full.ok());
  auto plan = (*full)->Decide(view, Budget::TokensPerLayer(o.num_layers, 300));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->changes());
  for (const LayerPlan& lp : plan->layers) EXPECT_EQ(lp.keep.size(), 300u);
  EXPECT_EQ((*full)->Decide(view, Budget::TokensPerLayer(o.num_layers, 299)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE((*full)->NeedsCompaction(view, Budget::TokensPerLayer(o.num_layers, 10)));
}

TEST(PolicyPropertyTest, HardProtectedOverBudgetIsResourceExhausted) {
  SyntheticOptions o;
  o.num_tokens = 200;
  const SessionView view = MakeSyntheticView(o);
  auto p = MakePolicy("streaming", {{"sinks.count", "16"}});
  ASSERT_TRUE(p.ok());
  auto plan = (*p)->Decide(view, Budget::TokensPerLayer(o.num_layers, 15));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_TRUE((*p)->Decide(view, Budget::TokensPerLayer(o.num_layers, 16)).ok());
}

TEST(PolicyPropertyTest, NonFiniteScoresAndEdgeBudgets) {
  const uint64_t seed = 4242;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SyntheticOptions o;
  o.seed = seed;
  o.num_tokens = 400;
  o.num_layers = 2;
  o.key_dim = 8;
  SessionView view = MakeSyntheticView(o);
  SplitMix rng(seed);
  const float bad[] = {NAN, INFINITY, -INFINITY, 1e38f, -1e38f, 1e-45f};
  for (LayerView& l : view.layers) {
    for (size_t i = 0; i < l.slots.size(); i += 7) {
      l.slots[i].score[kAttention] = bad[rng.Int(0, 5)];
      l.slots[i].score[kObservation] = bad[rng.Int(0, 5)];
      l.slots[i].score[kIntent] = bad[rng.Int(0, 5)];
    }
    for (size_t i = 0; i < l.keys.size(); i += 13) l.keys[i] = bad[rng.Int(0, 5)];
  }
  for (const Case& c : AllCases()) {
    SCOPED_TRACE(Name(c));
    const std::unique_ptr<Policy> policy = Make(c);
    for (int64_t b : {4, 5, 50, 399, 400}) {
      auto plan = policy->Decide(view, Budget::TokensPerLayer(2, b));
      ASSERT_TRUE(plan.ok()) << plan.status() << " budget " << b;
      for (const LayerPlan& lp : plan->layers)
        EXPECT_LE(static_cast<int64_t>(lp.output_slots()), b);
    }
    // Zero budget: only policies without sinks can meet it (by evicting all).
    auto zero = policy->Decide(view, Budget::TokensPerLayer(2, 0));
    if (zero.ok()) {
      for (const LayerPlan& lp : zero->layers) EXPECT_EQ(lp.output_slots(), 0u);
    } else {
      EXPECT_EQ(zero.status().code(), absl::StatusCode::kResourceExhausted);
    }
  }
  // Empty views and empty layers are fine.
  SessionView empty;
  empty.layers.resize(3);
  auto p = MakePolicy("hybrid");
  auto plan = (*p)->Decide(empty, Budget::TotalTokens(10));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->layers.size(), 3u);
  EXPECT_FALSE(plan->changes());
  // Budget of the wrong shape is bad input.
  EXPECT_EQ((*p)->Decide(view, Budget::TokensPerLayer(5, 10)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*p)->Decide(view, Budget::TokensPerLayer(2, -1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace polykv::policies
