// The one lowering (policies/lowering.h): per operation (keep, merge, evict,
// requantize), per layer, and the errors for plans it cannot lower.
#include "policies/lowering.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/policy.h"
#include "policies/synthetic.h"

namespace polykv::policies {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

MergeGroup Group(std::vector<uint32_t> m, std::vector<float> w, uint32_t rep, uint32_t count) {
  MergeGroup g;
  g.members = std::move(m);
  g.weights = std::move(w);
  g.representative = rep;
  g.count = count;
  return g;
}

TEST(LoweringTest, KeptSlotsGatherThemselvesWithTheirCounts) {
  LayerPlan lp;
  lp.keep = {0, 2, 3};
  lp.evict = {1};
  auto low = LowerLayer(lp, std::vector<uint32_t>{1, 5, 0, 2});
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_THAT(low->group_offsets, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(low->members, ElementsAre(0, 2, 3));
  EXPECT_THAT(low->weights, ElementsAre(1.f, 1.f, 1.f));
  EXPECT_THAT(low->sources, ElementsAre(0, 2, 3));
  EXPECT_THAT(low->counts, ElementsAre(1, 1, 2));  // a count of 0 reads as 1
  EXPECT_EQ(low->evicted_tokens, 5u);
  EXPECT_EQ(low->merged_tokens, 0u);
  EXPECT_FALSE(low->merged(0));
}

TEST(LoweringTest, AMergeGroupIsOneOutputSlotAtItsRepresentativeWithNormalisedWeights) {
  LayerPlan lp;
  lp.keep = {0, 4};
  lp.merges = {Group({1, 2, 3}, {2.f, 1.f, 1.f}, 1, 4)};
  auto low = LowerLayer(lp, std::vector<uint32_t>{1, 2, 1, 1, 1});
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_EQ(low->num_out(), 3u);
  EXPECT_THAT(low->group_offsets, ElementsAre(0, 1, 4, 5));
  EXPECT_THAT(low->members, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(low->weights, ElementsAre(1.f, 0.5f, 0.25f, 0.25f, 1.f));
  EXPECT_THAT(low->sources, ElementsAre(0, 1, 4));
  EXPECT_THAT(low->counts, ElementsAre(1, 4, 1));
  EXPECT_TRUE(low->merged(1));
  EXPECT_EQ(low->merged_tokens, 2u);  // the members besides the representative
  // Negative weights count as 0; all-zero weights average.
  lp.merges = {Group({1, 2, 3}, {0.f, -1.f, 0.f}, 1, 4)};
  low = LowerLayer(lp, std::vector<uint32_t>{1, 2, 1, 1, 1});
  ASSERT_TRUE(low.ok());
  EXPECT_THAT(low->weights, ElementsAre(1.f, 1.f / 3, 1.f / 3, 1.f / 3, 1.f));
}

TEST(LoweringTest, RequantizationNamesOutputSlots) {
  LayerPlan lp;
  lp.keep = {0, 3, 4};
  lp.merges = {Group({1, 2}, {1.f, 1.f}, 1, 2)};
  lp.requant = {{3, kernels::KvKind::kKey, kernels::PageFormat::kInt4},
                {3, kernels::KvKind::kValue, kernels::PageFormat::kInt2},
                {4, kernels::KvKind::kValue, kernels::PageFormat::kInt4}};
  auto low = LowerLayer(lp, std::vector<uint32_t>(5, 1));
  ASSERT_TRUE(low.ok()) << low.status();
  // Output slots: 0, the group at 1, 3, 4 -> source 3 is output 2.
  ASSERT_EQ(low->requant.size(), 3u);
  EXPECT_EQ(low->requant[0].out_slot, 2u);
  EXPECT_EQ(low->requant[0].kind, kernels::KvKind::kKey);
  EXPECT_EQ(low->requant[1].out_slot, 2u);
  EXPECT_EQ(low->requant[1].format, kernels::PageFormat::kInt2);
  EXPECT_EQ(low->requant[2].out_slot, 3u);
}

TEST(LoweringTest, PlansItCannotLowerAreErrors) {
  const std::vector<uint32_t> four(4, 1);
  LayerPlan past;
  past.keep = {0, 4};
  EXPECT_THAT(LowerLayer(past, four).status().message(), HasSubstr("slot 4"));
  LayerPlan bad_count;
  bad_count.keep = {0};
  bad_count.merges = {Group({1, 2, 3}, {1.f, 1.f, 1.f}, 2, 7)};
  EXPECT_THAT(LowerLayer(bad_count, four).status().message(), HasSubstr("claims 7 tokens"));
  LayerPlan evicted_requant;
  evicted_requant.keep = {0, 1};
  evicted_requant.evict = {2, 3};
  evicted_requant.requant = {{2, kernels::KvKind::kValue, kernels::PageFormat::kInt4}};
  EXPECT_THAT(LowerLayer(evicted_requant, four).status().message(), HasSubstr("does not keep"));
  LayerPlan evict_past;
  evict_past.keep = {0};
  evict_past.evict = {9};
  EXPECT_FALSE(LowerLayer(evict_past, four).ok());
}

TEST(LoweringTest, EachLayerIsLoweredWithItsOwnPlanAndCounts) {
  Plan p;
  p.log_count_bias = false;
  LayerPlan a, b;
  a.keep = {0, 1, 2};
  b.keep = {2};
  b.merges = {Group({0, 1}, {1.f, 3.f}, 1, 3)};
  p.layers = {a, b};
  auto low = Lower(p, {{1, 1, 1}, {2, 1, 1}});
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_FALSE(low->log_count_bias);
  ASSERT_EQ(low->layers.size(), 2u);
  EXPECT_EQ(low->layers[0].num_out(), 3u);
  EXPECT_THAT(low->layers[1].counts, ElementsAre(3, 1));
  EXPECT_THAT(low->layers[1].weights, ElementsAre(0.25f, 0.75f, 1.f));
  EXPECT_EQ(low->requant_ops(), 0u);
  EXPECT_THAT(Lower(p, {{1, 1, 1}}).status().message(), HasSubstr("counts were given for 1"));
  // An error names its layer.
  p.layers[1].keep = {5};
  EXPECT_THAT(Lower(p, {{1, 1, 1}, {2, 1, 1}}).status().message(), HasSubstr("layer 1"));
}

// Every plan a real policy makes lowers, with one output slot per planned
// output slot, and the tokens it keeps + evicts + folds = the layer's tokens.
TEST(LoweringTest, RealPoliciesPlansLowerAndConserveTokens) {
  SyntheticOptions so;
  so.num_tokens = 300;
  so.num_layers = 4;
  so.pre_evicted = 0.2;  // some slots already merged (count > 1)
  const SessionView view = MakeSyntheticView(so);
  int lowered = 0;
  for (const std::string& spec : PresetNames()) {
    auto policy = MakePolicy(spec);
    ASSERT_TRUE(policy.ok()) << spec << ": " << policy.status();
    auto plan = (*policy)->Decide(view, Budget::TotalTokens(4 * 100));
    if (spec == "full") {  // keeps everything, so it cannot fit a budget
      EXPECT_TRUE(absl::IsResourceExhausted(plan.status())) << plan.status();
      continue;
    }
    ASSERT_TRUE(plan.ok()) << spec << ": " << plan.status();
    ++lowered;
    std::vector<std::vector<uint32_t>> counts(view.num_layers());
    for (int l = 0; l < view.num_layers(); ++l) {
      for (const Slot& s : view.layers[l].slots) counts[l].push_back(s.count);
    }
    auto low = Lower(*plan, counts);
    ASSERT_TRUE(low.ok()) << spec << ": " << low.status();
    for (int l = 0; l < view.num_layers(); ++l) {
      const LoweredLayer& ll = low->layers[l];
      EXPECT_EQ(ll.num_out(), plan->layers[l].output_slots()) << spec;
      uint64_t total = 0, kept = 0;
      for (uint32_t c : counts[l]) total += std::max<uint32_t>(c, 1);
      for (uint32_t c : ll.counts) kept += c;
      EXPECT_EQ(kept + ll.evicted_tokens, total) << spec << " layer " << l;
    }
  }
  EXPECT_GE(lowered, 5);
}

}  // namespace
}  // namespace polykv::policies
