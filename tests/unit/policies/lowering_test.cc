// The one lowering (policies/lowering.h): per operation (keep, merge, evict,
// requantize), per layer, and the errors for plans it cannot lower.
#include "policies/lowering.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/policy.h"
#include "policies/synthetic.h"

namespace polykv::policies {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using kernels::KvKind;
using kernels::PageFormat;

// A layer of slots with these counts, every slot at f16.
LayerView Layer(std::vector<uint32_t> counts) {
  LayerView l;
  for (uint32_t c : counts) {
    Slot s;
    s.count = c;
    s.k_format = s.v_format = PageFormat::kF16;
    l.slots.push_back(s);
  }
  return l;
}

SessionView ViewOf(std::vector<std::vector<uint32_t>> counts, int block_tokens = 16) {
  SessionView v;
  v.shape.block_tokens = block_tokens;
  for (auto& c : counts) v.layers.push_back(Layer(std::move(c)));
  return v;
}

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
  auto low = LowerLayer(lp, Layer({1, 5, 0, 2}), 16);
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
  auto low = LowerLayer(lp, Layer({1, 2, 1, 1, 1}), 16);
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
  low = LowerLayer(lp, Layer({1, 2, 1, 1, 1}), 16);
  ASSERT_TRUE(low.ok());
  EXPECT_THAT(low->weights, ElementsAre(1.f, 1.f / 3, 1.f / 3, 1.f / 3, 1.f));
}

TEST(LoweringTest, RequantizationNamesOutputSlots) {
  LayerPlan lp;
  lp.keep = {0, 3, 4};
  lp.merges = {Group({1, 2}, {1.f, 1.f}, 1, 2)};
  lp.requant = {{3, kernels::KvKind::kKey, kernels::PageFormat::kInt4},
                {3, kernels::KvKind::kValue, kernels::PageFormat::kInt4},
                {4, kernels::KvKind::kValue, kernels::PageFormat::kInt4}};
  // Four output slots in blocks of two: 0 and the group at 1; 3 and 4.
  auto low = LowerLayer(lp, Layer({1, 1, 1, 1, 1}), 2);
  ASSERT_FALSE(low.ok());  // the block of output slots 2, 3 is at int4 keys, but slot 3 at f16
  EXPECT_THAT(low.status().message(), HasSubstr("per block of 2"));
  lp.requant.push_back({4, KvKind::kKey, PageFormat::kInt4});
  low = LowerLayer(lp, Layer({1, 1, 1, 1, 1}), 2);
  ASSERT_TRUE(low.ok()) << low.status();
  // Output slots: 0, the group at 1, 3, 4 -> source 3 is output 2.
  ASSERT_EQ(low->requant.size(), 4u);
  EXPECT_EQ(low->requant[0].out_slot, 2u);
  EXPECT_EQ(low->requant[0].kind, kernels::KvKind::kKey);
  EXPECT_EQ(low->requant[1].out_slot, 2u);
  EXPECT_EQ(low->requant[1].kind, kernels::KvKind::kValue);
  EXPECT_EQ(low->requant[2].out_slot, 3u);
  EXPECT_THAT(low->block_k_formats, ElementsAre(PageFormat::kF16, PageFormat::kInt4));
  EXPECT_THAT(low->block_v_formats, ElementsAre(PageFormat::kF16, PageFormat::kInt4));
  // Two formats in one block: it would be stored at int4, not the int2 asked.
  lp.requant[1].format = PageFormat::kInt2;
  EXPECT_THAT(LowerLayer(lp, Layer({1, 1, 1, 1, 1}), 2).status().message(),
              HasSubstr("to int2 but its block holds slots at int4"));
}

TEST(LoweringTest, ABlockIsStoredInItsFinestSlotsFormat) {
  // Source slots already at mixed formats (an earlier requantization), no
  // requant now: each output block takes the finest format among its slots,
  // so nothing is stored coarser than it was.
  LayerView src = Layer({1, 1, 1, 1, 1});
  src.slots[0].v_format = PageFormat::kInt4;
  src.slots[1].v_format = PageFormat::kInt4;
  src.slots[2].v_format = PageFormat::kInt4;
  src.slots[3].k_format = PageFormat::kInt8;
  LayerPlan lp;
  lp.keep = {0, 1, 2, 3, 4};
  auto low = LowerLayer(lp, src, 2);
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_THAT(low->block_v_formats,
              ElementsAre(PageFormat::kInt4, PageFormat::kF16, PageFormat::kF16));
  EXPECT_THAT(low->block_k_formats,
              ElementsAre(PageFormat::kF16, PageFormat::kF16, PageFormat::kF16));
  EXPECT_EQ(low->block_tokens, 2);
  // A merged slot is stored in its representative's formats.
  lp.keep = {0, 1, 4};
  lp.merges = {Group({2, 3}, {1.f, 1.f}, 2, 2)};
  low = LowerLayer(lp, src, 2);
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_THAT(low->block_v_formats, ElementsAre(PageFormat::kInt4, PageFormat::kF16));
  EXPECT_THAT(low->block_k_formats, ElementsAre(PageFormat::kF16, PageFormat::kF16));
  EXPECT_EQ(FinerFormat(PageFormat::kF16, PageFormat::kBF16), PageFormat::kF16);
  EXPECT_EQ(FinerFormat(PageFormat::kInt8, PageFormat::kFP8E4M3), PageFormat::kFP8E4M3);
  EXPECT_EQ(FinerFormat(PageFormat::kInt2, PageFormat::kInt4), PageFormat::kInt4);
}

TEST(LoweringTest, AMergeRepresentativeCanBeRequantizedWithItsBlock) {
  LayerPlan lp;
  lp.keep = {2, 3};
  lp.merges = {Group({0, 1}, {1.f, 1.f}, 0, 2)};
  lp.requant = {{0, KvKind::kValue, PageFormat::kInt4}, {2, KvKind::kValue, PageFormat::kInt4}};
  auto low = LowerLayer(lp, Layer({1, 1, 1, 1}), 2);
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_THAT(low->block_v_formats, ElementsAre(PageFormat::kInt4, PageFormat::kF16));
  EXPECT_EQ(low->requant[0].out_slot, 0u);
}

TEST(LoweringTest, TheTrailingPartialBlockIsNotRequantized) {
  LayerPlan lp;
  lp.keep = {0, 1, 2};
  lp.requant = {{2, KvKind::kValue, PageFormat::kInt4}};
  auto low = LowerLayer(lp, Layer({1, 1, 1}), 2);
  EXPECT_THAT(low.status().message(), HasSubstr("still being filled"));
  EXPECT_THAT(LowerLayer(lp, Layer({1, 1, 1}), 0).status().message(), HasSubstr("block_tokens"));
}

TEST(LoweringTest, PlansItCannotLowerAreErrors) {
  const LayerView four = Layer({1, 1, 1, 1});
  LayerPlan past;
  past.keep = {0, 4};
  EXPECT_THAT(LowerLayer(past, four, 16).status().message(), HasSubstr("slot 4"));
  LayerPlan bad_count;
  bad_count.keep = {0};
  bad_count.merges = {Group({1, 2, 3}, {1.f, 1.f, 1.f}, 2, 7)};
  EXPECT_THAT(LowerLayer(bad_count, four, 16).status().message(), HasSubstr("claims 7 tokens"));
  LayerPlan evicted_requant;
  evicted_requant.keep = {0, 1};
  evicted_requant.evict = {2, 3};
  evicted_requant.requant = {{2, kernels::KvKind::kValue, kernels::PageFormat::kInt4}};
  EXPECT_THAT(LowerLayer(evicted_requant, four, 16).status().message(), HasSubstr("does not keep"));
  LayerPlan evict_past;
  evict_past.keep = {0};
  evict_past.evict = {9};
  EXPECT_FALSE(LowerLayer(evict_past, four, 16).ok());
}

TEST(LoweringTest, EachLayerIsLoweredWithItsOwnPlanAndCounts) {
  Plan p;
  p.log_count_bias = false;
  LayerPlan a, b;
  a.keep = {0, 1, 2};
  b.keep = {2};
  b.merges = {Group({0, 1}, {1.f, 3.f}, 1, 3)};
  p.layers = {a, b};
  auto low = Lower(p, ViewOf({{1, 1, 1}, {2, 1, 1}}));
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_FALSE(low->log_count_bias);
  ASSERT_EQ(low->layers.size(), 2u);
  EXPECT_EQ(low->layers[0].num_out(), 3u);
  EXPECT_THAT(low->layers[1].counts, ElementsAre(3, 1));
  EXPECT_THAT(low->layers[1].weights, ElementsAre(0.25f, 0.75f, 1.f));
  EXPECT_EQ(low->requant_ops(), 0u);
  EXPECT_THAT(Lower(p, ViewOf({{1, 1, 1}})).status().message(), HasSubstr("the view has 1"));
  // An error names its layer.
  p.layers[1].keep = {5};
  EXPECT_THAT(Lower(p, ViewOf({{1, 1, 1}, {2, 1, 1}})).status().message(), HasSubstr("layer 1"));
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
    auto low = Lower(*plan, view);
    ASSERT_TRUE(low.ok()) << spec << ": " << low.status();
    for (int l = 0; l < view.num_layers(); ++l) {
      const LoweredLayer& ll = low->layers[l];
      EXPECT_EQ(ll.num_out(), plan->layers[l].output_slots()) << spec;
      uint64_t total = 0, kept = 0;
      for (const Slot& s : view.layers[l].slots) total += std::max<uint32_t>(s.count, 1);
      for (uint32_t c : ll.counts) kept += c;
      EXPECT_EQ(kept + ll.evicted_tokens, total) << spec << " layer " << l;
    }
  }
  EXPECT_GE(lowered, 5);
  // Cold steps requantize whole full output blocks, so their plans lower too,
  // merge representatives included. (At 100 slots a layer the synthetic
  // session's anchors or merge's 256-slot window fill every block: nothing is
  // cold. 200 leaves room.)
  const struct {
    const char* spec;
    PolicyParams params;
  } cold[] = {
      {"hybrid", {{"cold.format", "int4"}, {"cold.fraction", "0.5"}, {"cold.kind", "v"}}},
      {"h2o", {{"cold.format", "int8"}, {"cold.fraction", "0.4"}, {"cold.kind", "kv"}}},
      {"merge",
       {{"cold.format", "int2"}, {"cold.fraction", "0.5"}, {"cold.kind", "k"}, {"window.size", "64"}}},
      {"structural", {{"cold.format", "fp8"}, {"cold.fraction", "1"}, {"cold.kind", "kv"}}},
  };
  size_t merged_requant = 0;
  for (const auto& c : cold) {
    auto policy = MakePolicy(c.spec, c.params);
    ASSERT_TRUE(policy.ok()) << c.spec << ": " << policy.status();
    auto plan = (*policy)->Decide(view, Budget::TotalTokens(4 * 200));
    ASSERT_TRUE(plan.ok()) << c.spec << ": " << plan.status();
    auto low = Lower(*plan, view);
    ASSERT_TRUE(low.ok()) << c.spec << ": " << low.status();
    EXPECT_GT(low->requant_ops(), 0u) << c.spec;
    for (int l = 0; l < view.num_layers(); ++l) {
      const LoweredLayer& ll = low->layers[l];
      const size_t bt = static_cast<size_t>(ll.block_tokens);
      EXPECT_LE(ll.requant.size() / (c.params.at("cold.kind") == "kv" ? 2 : 1),
                static_cast<size_t>(std::stod(c.params.at("cold.fraction")) * ll.num_out()))
          << c.spec;
      for (const RequantOp& op : ll.requant) {
        EXPECT_LT(op.out_slot, ll.num_out() / bt * bt) << c.spec << ": the partial block";
        merged_requant += ll.merged(op.out_slot);
      }
    }
  }
  EXPECT_GT(merged_requant, 0u);  // some merged slot was requantized
}

}  // namespace
}  // namespace polykv::policies
