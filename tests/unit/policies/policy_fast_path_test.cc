// The fast decision path (packed rank keys, radix selection, flat clusters,
// per-thread buffers, layer-by-layer validation) against the reference path
// (MakeReferencePolicy: the original sorts over Ranked structs): the same
// plans, bit for bit, on seeded random views, budgets and online chains.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "policies/plan.h"
#include "policies/policy.h"
#include "policies/ranking.h"
#include "policies/synthetic.h"

namespace polykv::policies {
namespace {

using enum ScoreStream;

struct Case {
  std::string spec;
  std::string params;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const std::string& p : PresetNames()) cases.push_back({p, ""});
  cases.push_back({"sinks+structural+intent", ""});
  cases.push_back({"sinks+structural+intent", "mode=merge"});
  cases.push_back({"sinks+window+anchors+h2o+snapkv", "mode=hybrid,window.size=64,pool=32"});
  cases.push_back({"structural", "mode=selective,layers=pyramid"});
  cases.push_back({"hybrid", "fill=0,cold.format=int4,cold.fraction=0.5,cold.kind=kv"});
  cases.push_back({"h2o", "layers=entropy,cold.format=int8,cold.fraction=0.3"});
  cases.push_back({"merge", "merge.threshold=0.2,merge.probe=3"});
  cases.push_back({"hybrid", "mode=merge,merge.share=0.5,merge.span=1"});
  cases.push_back({"sinks+anchors", ""});  // no scoring: anchors ranked by recency
  return cases;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Exact equality, weights compared bit for bit.
void ExpectSamePlan(const Plan& a, const Plan& b) {
  ASSERT_EQ(a.policy, b.policy);
  ASSERT_EQ(a.log_count_bias, b.log_count_bias);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const LayerPlan &x = a.layers[l], &y = b.layers[l];
    EXPECT_EQ(x.keep, y.keep);
    EXPECT_EQ(x.evict, y.evict);
    EXPECT_EQ(x.budget_tokens, y.budget_tokens);
    EXPECT_EQ(x.budget_bytes, y.budget_bytes);
    ASSERT_EQ(x.merges.size(), y.merges.size());
    for (size_t g = 0; g < x.merges.size(); ++g) {
      EXPECT_EQ(x.merges[g].members, y.merges[g].members);
      EXPECT_EQ(x.merges[g].representative, y.merges[g].representative);
      EXPECT_EQ(x.merges[g].count, y.merges[g].count);
      ASSERT_EQ(x.merges[g].weights.size(), y.merges[g].weights.size());
      for (size_t m = 0; m < x.merges[g].weights.size(); ++m) {
        EXPECT_EQ(Bits(x.merges[g].weights[m]), Bits(y.merges[g].weights[m]));
      }
    }
    ASSERT_EQ(x.requant.size(), y.requant.size());
    for (size_t r = 0; r < x.requant.size(); ++r) {
      EXPECT_EQ(x.requant[r].slot, y.requant[r].slot);
      EXPECT_EQ(x.requant[r].kind, y.requant[r].kind);
      EXPECT_EQ(x.requant[r].format, y.requant[r].format);
    }
  }
}

void ExpectSameDecision(const Policy& fast, const Policy& ref, const SessionView& view,
                        const Budget& budget) {
  auto a = fast.Decide(view, budget);
  auto b = ref.Decide(view, budget);
  ASSERT_EQ(a.status(), b.status());
  if (a.ok()) ExpectSamePlan(*a, *b);
}

Budget RandomBudget(SplitMix& rng, const SessionView& view, int layers) {
  const int64_t n = static_cast<int64_t>(view.layers[0].slots.size());
  const double fraction = std::vector<double>{1 / 1.1, 0.75, 0.5, 0.25, 0.05}[rng.Int(0, 4)];
  const int64_t tokens = std::max<int64_t>(8, static_cast<int64_t>(fraction * n));
  switch (rng.Int(0, 2)) {
    case 0:
      return Budget::TokensPerLayer(layers, tokens);
    case 1:
      return Budget::TotalTokens(tokens * layers);
    default:
      return Budget::BytesPerLayer(
          layers, static_cast<int64_t>(BytesPerToken(view.shape, kernels::PageFormat::kBF16,
                                                     kernels::PageFormat::kBF16) *
                                       tokens));
  }
}

TEST(PolicyFastPathTest, SamePlansAsTheReferenceOnRandomViews) {
  const uint64_t base_seed = 20261201;
  std::printf("base seed %llu\n", static_cast<unsigned long long>(base_seed));
  for (const Case& c : Cases()) {
    auto params = ParseParams(c.params);
    ASSERT_TRUE(params.ok());
    auto fast = MakePolicy(c.spec, *params);
    auto ref = MakeReferencePolicy(c.spec, *params);
    ASSERT_TRUE(fast.ok() && ref.ok()) << c.spec;
    for (int trial = 0; trial < 25; ++trial) {
      const uint64_t seed = base_seed + 7919 * trial;
      SplitMix rng(seed);
      SyntheticOptions o;
      o.seed = seed;
      o.num_layers = rng.Int(1, 3);
      o.num_tokens = rng.Int(16, 2500);
      o.key_dim = rng.Uniform() < 0.8 ? rng.Int(4, 16) : 0;
      o.pre_evicted = rng.Uniform() < 0.5 ? 0.3 * rng.Uniform() : 0.0;
      o.pinned_fraction = rng.Uniform() < 0.3 ? 0.01 : 0.0;
      o.entropy = rng.Uniform() < 0.7;
      SessionView view = MakeSyntheticView(o);
      // Ties and signed zeros, which the packed keys must order as Better does.
      if (rng.Uniform() < 0.3) {
        for (LayerView& layer : view.layers) {
          for (Slot& s : layer.slots) {
            s.score[kAttention] = std::round(s.score[kAttention] * 4.f) / 4.f;
            if (rng.Uniform() < 0.1) s.score[kAttention] = -0.f;
          }
        }
      }
      SCOPED_TRACE(c.spec + "{" + c.params + "} seed " + std::to_string(seed));
      const Budget budget = RandomBudget(rng, view, o.num_layers);
      ExpectSameDecision(**fast, **ref, view, budget);
      // The next decision of an online chain: merged slots, fewer tokens.
      auto plan = (*ref)->Decide(view, budget);
      if (plan.ok()) {
        const SessionView next = ApplyPlan(view, *plan);
        ExpectSameDecision(**fast, **ref, next, RandomBudget(rng, next, o.num_layers));
      }
    }
  }
}

TEST(RankKeyTest, OrdersLikeBetter) {
  SplitMix rng(5);
  std::printf("seed 5\n");
  const float scores[] = {-1.f, -0.f, 0.f, 1e-30f, 0.25f, 0.5f, 1.f, 3e38f};
  for (int t = 0; t < 20000; ++t) {
    // Slots of one layer: a higher index is a later position.
    Ranked a{static_cast<uint8_t>(rng.Int(0, 3)), scores[rng.Int(0, 7)], 0,
             static_cast<uint32_t>(rng.Int(0, 50))};
    Ranked b{static_cast<uint8_t>(rng.Int(0, 3)), scores[rng.Int(0, 7)], 0,
             static_cast<uint32_t>(rng.Int(0, 50))};
    a.position = a.index;
    b.position = b.index;
    EXPECT_EQ(Better(a, b), RankKey(a.tier, a.score, a.index) > RankKey(b.tier, b.score, b.index));
  }
}

TEST(RadixTest, SortAndSelectMatchStd) {
  SplitMix rng(11);
  std::printf("seed 11\n");
  std::vector<uint64_t> scratch;
  for (int t = 0; t < 200; ++t) {
    const size_t n = static_cast<size_t>(rng.Int(0, 3000));
    std::vector<uint64_t> keys(n);
    const int bits = rng.Int(1, 64);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t r = rng.Next();
      keys[i] = ((bits == 64 ? r : r & ((uint64_t{1} << bits) - 1)) & ~uint64_t{0xFFFF}) | i;
    }
    std::vector<uint64_t> sorted = keys;
    RadixSortAscending(absl::MakeSpan(sorted), &scratch);
    std::vector<uint64_t> expect = keys;
    std::sort(expect.begin(), expect.end());
    EXPECT_EQ(sorted, expect);
    const size_t k = n == 0 ? 0 : static_cast<size_t>(rng.Int(0, static_cast<int>(n)));
    std::vector<uint64_t> sel = keys;
    SelectLargest(absl::MakeSpan(sel), k, &scratch);
    std::sort(sel.begin(), sel.begin() + k);
    std::sort(sel.begin() + k, sel.end());
    EXPECT_TRUE(std::equal(sel.begin(), sel.begin() + k, expect.end() - k));
    std::vector<uint64_t> rest(sel.begin() + k, sel.end());
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), expect.begin()));
  }
}

}  // namespace
}  // namespace polykv::policies
