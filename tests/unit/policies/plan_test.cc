// Plan validity checks, output order, online decay and the global pool.
#include "policies/plan.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/decay.h"
#include "policies/ranking.h"
#include "policies/synthetic.h"

namespace polykv::policies {
namespace {

using enum ScoreStream;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

SessionView View(int n) {
  SessionView v;
  v.shape = kernels::PageShape{16, 8, 128};
  for (int i = 0; i < n; ++i) {
    TokenMeta t;
    t.position = i;
    t.tag.block_id = 1 + i / 4;
    v.tokens.push_back(t);
  }
  v.layers.resize(1);
  for (int i = 0; i < n; ++i) v.layers[0].slots.push_back(Slot{static_cast<uint32_t>(i)});
  return v;
}

Plan OnePlan(LayerPlan lp) {
  Plan p;
  p.layers.push_back(std::move(lp));
  return p;
}

MergeGroup Group(std::vector<uint32_t> m, uint32_t rep) {
  MergeGroup g;
  g.members = m;
  g.weights.assign(m.size(), 1.f / m.size());
  g.representative = rep;
  g.count = static_cast<uint32_t>(m.size());
  return g;
}

TEST(PlanTest, ValidPlanPasses) {
  const SessionView v = View(8);
  LayerPlan lp;
  lp.keep = {0, 3, 7};
  lp.evict = {6};
  lp.merges = {Group({1, 2}, 1), Group({4, 5}, 5)};
  lp.requant = {{3, kernels::KvKind::kKey, kernels::PageFormat::kInt4},
                {3, kernels::KvKind::kValue, kernels::PageFormat::kInt4}};
  lp.budget_tokens = 5;
  EXPECT_TRUE(ValidatePlan(v, OnePlan(lp)).ok()) << ValidatePlan(v, OnePlan(lp));
  EXPECT_THAT(OutputOrder(lp), ElementsAre(0, 1, 3, 5, 7));
  const std::vector<float> s = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_THAT(RemapScores(lp, s), ElementsAre(1, 5, 4, 11, 8));
}

TEST(PlanTest, EachViolationIsReported) {
  const SessionView v = View(8);
  LayerPlan good;
  good.keep = {0, 1, 2, 3};
  good.evict = {4, 5, 6, 7};
  good.budget_tokens = 4;
  ASSERT_TRUE(ValidatePlan(v, OnePlan(good)).ok());
  auto expect_bad = [&](LayerPlan lp, const char* what) {
    const absl::Status st = ValidatePlan(v, OnePlan(lp));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(std::string(st.message()), HasSubstr(what));
  };
  LayerPlan lp = good;
  lp.evict = {4, 5, 6};
  expect_bad(lp, "in no set");
  lp = good;
  lp.evict = {3, 4, 5, 6, 7};
  expect_bad(lp, "appears twice");
  lp = good;
  lp.budget_tokens = 3;
  expect_bad(lp, "exceed budget");
  lp = good;
  lp.evict = {4, 5};
  lp.merges = {Group({3, 6}, 3)};  // 3 is also kept
  expect_bad(lp, "appears twice");
  lp = good;
  lp.evict = {4, 7};
  lp.merges = {Group({5, 6}, 5)};  // blocks 2 and 2: fine
  lp.budget_tokens = 5;
  EXPECT_TRUE(ValidatePlan(v, OnePlan(lp)).ok());
  lp.keep = {0, 1, 2};
  lp.evict = {4, 7};
  lp.merges = {Group({3, 5, 6}, 5)};  // block 1 and 2
  expect_bad(lp, "crosses blocks");
  lp = good;
  lp.evict = {4, 5, 7};
  lp.merges = {Group({6}, 6)};
  expect_bad(lp, "< 2 members");
  lp = good;
  lp.evict = {6, 7};
  lp.merges = {Group({4, 5}, 4)};
  lp.merges[0].weights = {0.2f, 0.2f};
  lp.budget_tokens = 5;
  expect_bad(lp, "weights sum");
  lp = good;
  lp.requant = {{5, kernels::KvKind::kValue, kernels::PageFormat::kInt4}};
  expect_bad(lp, "neither a kept slot nor a merge representative");
  // A merge group's representative stands for the merged slot: it may be
  // requantized; another member may not.
  lp = good;
  lp.evict = {6, 7};
  lp.merges = {Group({4, 5}, 5)};
  lp.budget_tokens = 5;
  lp.requant = {{5, kernels::KvKind::kValue, kernels::PageFormat::kInt4}};
  EXPECT_TRUE(ValidatePlan(v, OnePlan(lp)).ok()) << ValidatePlan(v, OnePlan(lp));
  lp.requant = {{4, kernels::KvKind::kValue, kernels::PageFormat::kInt4}};
  expect_bad(lp, "neither a kept slot nor a merge representative");
  lp = good;
  lp.keep = {1, 0, 2, 3};
  expect_bad(lp, "ascending");
  lp = good;
  lp.evict = {4, 5, 6, 8};
  expect_bad(lp, "out of range");
  PlanChecks checks;
  checks.must_keep = {{5}};
  EXPECT_THAT(std::string(ValidatePlan(v, OnePlan(good), checks).message()),
              HasSubstr("protected slot 5"));
  const Budget tight = Budget::TokensPerLayer(1, 3);
  checks = PlanChecks{};
  checks.budget = &tight;
  EXPECT_FALSE(ValidatePlan(v, OnePlan(good), checks).ok());
}

// Formats are per block (here 2 slots): a block is stored, and counted, in
// the finest format of its slots after the plan.
TEST(PlanTest, ByteBudgetCountsRequantizedBlocks) {
  SessionView v = View(4);
  v.shape.block_tokens = 2;
  const double bf16 =
      BytesPerToken(v.shape, kernels::PageFormat::kBF16, kernels::PageFormat::kBF16);
  const double mixed =
      BytesPerToken(v.shape, kernels::PageFormat::kBF16, kernels::PageFormat::kInt4);
  ASSERT_GT(bf16, mixed);
  LayerPlan lp;
  lp.keep = {0, 1, 2, 3};
  lp.budget_tokens = 4;
  lp.budget_bytes = static_cast<int64_t>(2 * bf16 + 2 * mixed);
  EXPECT_FALSE(ValidatePlan(v, OnePlan(lp)).ok());
  // Half a block requantized: the block stays bf16, and so do its bytes.
  lp.requant = {{2, kernels::KvKind::kValue, kernels::PageFormat::kInt4}};
  EXPECT_DOUBLE_EQ(OutputBytes(v, 0, lp), 4 * bf16);
  EXPECT_FALSE(ValidatePlan(v, OnePlan(lp)).ok());
  lp.requant.push_back({3, kernels::KvKind::kValue, kernels::PageFormat::kInt4});
  EXPECT_TRUE(ValidatePlan(v, OnePlan(lp)).ok()) << ValidatePlan(v, OnePlan(lp));
  EXPECT_DOUBLE_EQ(OutputBytes(v, 0, lp), 2 * bf16 + 2 * mixed);
}

TEST(PlanTest, ApplyPlanBuildsTheNextView) {
  SessionView v = View(6);
  v.shape.block_tokens = 2;  // output blocks {0, 2}, {3, 5}
  v.key_dim = 2;
  for (int i = 0; i < 6; ++i) {
    v.layers[0].slots[i].score[kAttention] = static_cast<float>(i);
    v.layers[0].slots[i].score[kIntent] = 1.f;
    v.layers[0].keys.push_back(static_cast<float>(i));
    v.layers[0].keys.push_back(1.f);
  }
  LayerPlan lp;
  lp.keep = {0, 3};
  lp.evict = {1};
  MergeGroup g = Group({4, 5}, 5);
  g.weights = {0.25f, 0.75f};
  lp.merges = {g};
  v.layers[0].slots[4].score[kIntent] = 3.f;
  v.tokens[4].pinned = true;
  // Block {3, 5}: a kept slot and a merged one (its representative).
  lp.requant = {{3, kernels::KvKind::kValue, kernels::PageFormat::kInt8},
                {5, kernels::KvKind::kValue, kernels::PageFormat::kInt8}};
  lp.budget_tokens = 4;
  lp.keep.push_back(2);
  std::sort(lp.keep.begin(), lp.keep.end());
  {
    // Half the block requantized: it is stored, and reported, at bf16.
    LayerPlan half = lp;
    half.requant.pop_back();
    const SessionView h = ApplyPlan(v, OnePlan(half));
    EXPECT_EQ(h.layers[0].slots[2].v_format, kernels::PageFormat::kBF16);
  }
  const Plan plan = OnePlan(lp);
  ASSERT_TRUE(ValidatePlan(v, plan).ok()) << ValidatePlan(v, plan);
  const SessionView next = ApplyPlan(v, plan);
  ASSERT_TRUE(ValidateView(next).ok());
  const LayerView& l = next.layers[0];
  ASSERT_EQ(l.slots.size(), 4u);
  EXPECT_EQ(l.slots[0].token, 0u);
  EXPECT_EQ(l.slots[1].token, 2u);
  EXPECT_EQ(l.slots[2].token, 3u);
  EXPECT_EQ(l.slots[2].v_format, kernels::PageFormat::kInt8);
  EXPECT_EQ(l.slots[2].k_format, kernels::PageFormat::kBF16);
  EXPECT_EQ(l.slots[3].token, 5u);  // the representative
  EXPECT_EQ(l.slots[3].count, 2u);
  EXPECT_EQ(l.slots[3].v_format, kernels::PageFormat::kInt8);
  EXPECT_EQ(l.slots[0].v_format, kernels::PageFormat::kBF16);
  // The daemon's merge rule (slot_record.h): attention mass adds up, the
  // most relevant member speaks for the group, a pinned member pins it.
  EXPECT_FLOAT_EQ(l.slots[3].score[kAttention], 9.f);
  EXPECT_FLOAT_EQ(l.slots[3].score[kIntent], 3.f);
  EXPECT_TRUE(next.tokens[5].pinned);
  ASSERT_EQ(l.keys.size(), 8u);
  EXPECT_FLOAT_EQ(l.keys[6], 0.25f * 4 + 0.75f * 5);
  EXPECT_FLOAT_EQ(l.keys[7], 1.f);
}

TEST(ViewTest, RejectsBadViews) {
  SessionView v = View(4);
  EXPECT_TRUE(ValidateView(v).ok());
  v.layers[0].slots[2].token = 1;  // positions not ascending
  EXPECT_FALSE(ValidateView(v).ok());
  v = View(4);
  v.layers[0].slots[0].token = 9;
  EXPECT_FALSE(ValidateView(v).ok());
  v = View(4);
  v.key_dim = 3;
  v.layers[0].keys.resize(5);
  EXPECT_FALSE(ValidateView(v).ok());
  v = View(4);
  v.layers[0].slots[1].count = 0;
  EXPECT_FALSE(ValidateView(v).ok());
}

TEST(DecayAccumulatorTest, MatchesClosedFormDenseAndSparse) {
  const float lambda = 0.9f;
  DecayAccumulator dense(lambda), sparse(lambda);
  dense.Append(3);
  sparse.Append(3);
  std::vector<double> ref(3, 0.0);
  for (int step = 0; step < 1000; ++step) {
    const std::vector<float> w = {step % 2 ? 1.f : 0.f, 0.f, 0.25f};
    dense.Step(w);
    sparse.StepSparse(std::vector<uint32_t>{0, 2}, std::vector<float>{w[0], w[2]});
    for (int i = 0; i < 3; ++i) ref[i] = lambda * ref[i] + (1 - lambda) * w[i];
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(dense.score(i), ref[i], 1e-4);
    EXPECT_NEAR(sparse.score(i), ref[i], 1e-4);
  }
  // 1000 steps at 0.9 take the scale below 1e-30: renormalised on the way.
  EXPECT_NEAR(dense.score(2), 0.25, 1e-4);
  LayerPlan lp;
  lp.keep = {2};
  lp.merges = {Group({0, 1}, 0)};
  dense.ApplyPlan(lp);
  ASSERT_EQ(dense.size(), 2u);
  EXPECT_NEAR(dense.score(0), ref[0] + ref[1], 1e-4);
}

TEST(GlobalPoolTest, KeepsTheBestAndMatchesASort) {
  const uint64_t seed = 77;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix rng(seed);
  std::vector<Ranked> all;
  for (uint32_t i = 0; i < 2000; ++i) {
    all.push_back(Ranked{static_cast<uint8_t>(rng.Int(0, 1)), static_cast<float>(rng.Int(0, 50)),
                         rng.Int(0, 100000), i});
  }
  GlobalPool pool(128);
  for (const Ranked& r : all) pool.Offer(r);
  std::vector<Ranked> sorted = all;
  std::sort(sorted.begin(), sorted.end(), Better);
  std::vector<uint32_t> want;
  for (size_t i = 0; i < 128; ++i) want.push_back(sorted[i].index);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(pool.SortedIndices(), want);
  EXPECT_EQ(pool.worst().index, sorted[127].index);
  GlobalPool empty(0);
  EXPECT_FALSE(empty.Offer(all[0]));
}

}  // namespace
}  // namespace polykv::policies
