// What each policy keeps, on small hand-built views.
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/layer_budget.h"
#include "policies/lowering.h"
#include "policies/merge.h"
#include "policies/policy.h"
#include "policies/synthetic.h"

namespace polykv::policies {
namespace {

using enum ScoreStream;

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// One layer, n tokens, one turn each of `roles` cycling, no keys.
SessionView MakeView(int n, int layers = 1) {
  SessionView v;
  v.shape = kernels::PageShape{16, 8, 128};
  v.tokens.resize(n);
  for (int i = 0; i < n; ++i) {
    v.tokens[i].position = i;
    v.tokens[i].turn = 2;
    v.tokens[i].role = Role::kAssistant;
    v.tokens[i].tag = StructTag{BlockKind::kBody, static_cast<uint32_t>(1 + i / 8), 1, false};
  }
  v.layers.resize(layers);
  for (LayerView& l : v.layers) {
    for (int i = 0; i < n; ++i) l.slots.push_back(Slot{static_cast<uint32_t>(i)});
  }
  v.current_turn = 2;
  return v;
}

std::unique_ptr<Policy> Make(std::string_view spec, PolicyParams params = {}) {
  auto p = MakePolicy(spec, params);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

LayerPlan Decide1(const Policy& p, const SessionView& v, int64_t budget) {
  auto plan = p.Decide(v, Budget::TokensPerLayer(v.num_layers(), budget));
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? plan->layers[0] : LayerPlan{};
}

TEST(WindowPolicyTest, KeepsMostRecent) {
  auto p = Make("window");
  LayerPlan lp = Decide1(*p, MakeView(10), 4);
  EXPECT_THAT(lp.keep, ElementsAre(6, 7, 8, 9));
  EXPECT_THAT(lp.evict, ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(WindowPolicyTest, UnderBudgetKeepsAll) {
  auto p = Make("h2o");
  LayerPlan lp = Decide1(*p, MakeView(10), 10);
  EXPECT_EQ(lp.keep.size(), 10u);
  EXPECT_TRUE(lp.evict.empty());
}

TEST(StreamingPolicyTest, SinksPlusWindow) {
  auto p = Make("streaming", {{"sinks.count", "2"}});
  LayerPlan lp = Decide1(*p, MakeView(10), 5);
  EXPECT_THAT(lp.keep, ElementsAre(0, 1, 7, 8, 9));
  // An explicit smaller window leaves the rest of the budget unused.
  auto q = Make("streaming", {{"sinks.count", "2"}, {"window.size", "1"}});
  EXPECT_THAT(Decide1(*q, MakeView(10), 5).keep, ElementsAre(0, 1, 9));
}

TEST(H2OPolicyTest, KeepsHeavyHittersAndRecentHalf) {
  SessionView v = MakeView(10);
  const float attn[10] = {0.1f, 0.9f, 0.2f, 0.8f, 0.05f, 0.3f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (int i = 0; i < 10; ++i) v.layers[0].slots[i].score[kAttention] = attn[i];
  auto p = Make("h2o");  // window.ratio = 0.5
  EXPECT_THAT(Decide1(*p, v, 4).keep, ElementsAre(1, 3, 8, 9));
}

TEST(H2OPolicyTest, TiesBreakTowardRecentDeterministically) {
  SessionView v = MakeView(10);  // all scores equal
  auto p = Make("h2o", {{"window.ratio", "0"}});
  EXPECT_THAT(Decide1(*p, v, 3).keep, ElementsAre(7, 8, 9));
}

TEST(SnapKVPolicyTest, PoolsObservationScoresOverNeighbours) {
  SessionView v = MakeView(40);
  v.layers[0].slots[10].score[kObservation] = 1.f;  // one hot token: its neighbours survive with it
  auto p = Make("snapkv", {{"window.size", "2"}, {"snapkv.kernel", "3"}});
  EXPECT_THAT(Decide1(*p, v, 5).keep, ElementsAre(9, 10, 11, 38, 39));
}

TEST(SnapKVPolicyTest, FallsBackToAttentionWithoutObservation) {
  SessionView v = MakeView(40);
  v.layers[0].slots[20].score[kAttention] = 1.f;
  auto p = Make("snapkv", {{"window.size", "0"}, {"snapkv.kernel", "1"}});  // no window
  EXPECT_THAT(Decide1(*p, v, 1).keep, ElementsAre(20));
}

TEST(HybridPolicyTest, WindowPoolAndProtectedBaseScores) {
  SessionView v = MakeView(100);
  for (int i = 0; i < 5; ++i) v.tokens[i].role = Role::kSystem;
  for (int i = 5; i < 10; ++i) {
    v.tokens[i].role = Role::kUser;
    v.tokens[i].turn = 1;
  }
  for (int i = 0; i < 10; ++i) v.tokens[i].turn = i < 5 ? 0 : 1;
  v.layers[0].slots[50].score[kAttention] = 1.f;  // one heavy hitter
  v.layers[0].slots[60].score[kAttention] = 0.5f;
  // Budget 30: sinks 2 + window 10 + pool (fills 18: 8 anchors left + 50, 60, then recency).
  auto p = Make("hybrid", {{"sinks.count", "2"}, {"window.size", "10"}, {"pool", "4"}});
  LayerPlan lp = Decide1(*p, v, 30);
  EXPECT_EQ(lp.keep.size(), 30u);
  for (uint32_t i : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 50, 60, 90, 99}) {
    EXPECT_TRUE(std::binary_search(lp.keep.begin(), lp.keep.end(), i)) << i;
  }
  // fill=0: exactly sinks + window + G.
  auto q =
      Make("hybrid", {{"sinks.count", "2"}, {"window.size", "10"}, {"pool", "4"}, {"fill", "0"}});
  LayerPlan lq = Decide1(*q, v, 30);
  EXPECT_EQ(lq.keep.size(), 16u);
  // The pool holds the 4 best anchors (all tie on score; most recent win).
  EXPECT_THAT(lq.keep, ElementsAre(0, 1, 6, 7, 8, 9, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99));
}

TEST(HybridPolicyTest, WindowShrinksToLeavePoolReserve) {
  SessionView v = MakeView(100);
  v.layers[0].slots[3].score[kAttention] = 1.f;
  auto p = Make("hybrid", {{"sinks.count", "0"}, {"window.size", "1024"}, {"pool", "2"}});
  LayerPlan lp = Decide1(*p, v, 10);
  EXPECT_THAT(lp.keep, ElementsAre(3, 91, 92, 93, 94, 95, 96, 97, 98, 99));
}

// Keys: every 8-token block has one direction; all blocks orthogonal-ish.
SessionView ViewWithKeys(int n, int d = 8) {
  SessionView v = MakeView(n);
  v.key_dim = d;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < d; ++j) {
      v.layers[0].keys.push_back(j == (i / 8) % d ? 1.f : 0.01f * ((i + j) % 3));
    }
  }
  return v;
}

TEST(MergePolicyTest, MergesOnlyAsMuchAsTheBudgetNeeds) {
  SessionView v = ViewWithKeys(32);
  auto p = Make("merge", {{"sinks.count", "0"}, {"window.size", "0"}});
  LayerPlan lp = Decide1(*p, v, 31);  // one slot too many: one merge of two
  ASSERT_EQ(lp.merges.size(), 1u);
  EXPECT_EQ(lp.merges[0].members.size(), 2u);
  EXPECT_TRUE(lp.evict.empty());
  EXPECT_EQ(lp.keep.size(), 30u);
  // Budget 4 = one slot per block: every block merges into one slot.
  LayerPlan all = Decide1(*p, v, 4);
  ASSERT_EQ(all.merges.size(), 4u);
  for (const MergeGroup& g : all.merges) {
    EXPECT_EQ(g.members.size(), 8u);
    EXPECT_EQ(g.count, 8u);
    const uint32_t block = v.tokens[g.members[0]].tag.block_id;
    for (uint32_t m : g.members) EXPECT_EQ(v.tokens[m].tag.block_id, block);
  }
  // Budget 2: two blocks merged, two evicted (merging alone cannot reach it).
  LayerPlan two = Decide1(*p, v, 2);
  EXPECT_EQ(two.merges.size(), 2u);
  EXPECT_EQ(two.evict.size(), 16u);
}

TEST(MergePolicyTest, NeverMergesAcrossBlocksOrDissimilarKeys) {
  SessionView v = ViewWithKeys(32);
  // Same keys everywhere, but block ids differ per token: nothing may merge.
  for (int i = 0; i < 32; ++i) v.tokens[i].tag.block_id = 100 + i;
  auto p = Make("merge", {{"sinks.count", "0"}, {"window.size", "0"}});
  LayerPlan lp = Decide1(*p, v, 8);
  EXPECT_TRUE(lp.merges.empty());
  EXPECT_EQ(lp.evict.size(), 24u);
  // Threshold above any similarity: nothing merges either.
  SessionView w = ViewWithKeys(32);
  auto q = Make("merge", {{"sinks.count", "0"}, {"window.size", "0"}, {"merge.threshold", "1.5"}});
  EXPECT_TRUE(Decide1(*q, w, 8).merges.empty());
}

TEST(MergePolicyTest, WeightsFollowScoreTimesCount) {
  SessionView v = ViewWithKeys(8);
  v.layers[0].slots[0].score[kAttention] = 3.f;
  v.layers[0].slots[1].score[kAttention] = 1.f;
  v.layers[0].slots[1].count = 3;
  for (int i = 2; i < 8; ++i) v.layers[0].slots[i].score[kAttention] = 0.f;
  auto p = Make("merge", {{"sinks.count", "0"}, {"window.size", "0"}});
  LayerPlan lp = Decide1(*p, v, 1);
  ASSERT_EQ(lp.merges.size(), 1u);
  const MergeGroup& g = lp.merges[0];
  EXPECT_EQ(g.count, 10u);
  // normalised scores: 1.0 and 1/3; weights (s + 1e-3) * count.
  EXPECT_NEAR(g.weights[0] / g.weights[1], (1.0 + 1e-3) / ((1.0 / 3 + 1e-3) * 3), 1e-4);
  // 1.001 vs (0.3333 + 0.001) x 3 = 1.003: the merged 3-token slot weighs more.
  EXPECT_EQ(g.representative, 1u);
}

TEST(MergeBiasTest, LogCountBiasMakesMergingIdenticalKeysExact) {
  // 5 copies of key a (value va) and one key b (value vb), merged to 2 slots.
  const int d = 4;
  const std::vector<float> q = {1.f, 0.5f, -0.2f, 0.3f};
  const std::vector<float> a = {0.3f, 0.1f, 0.4f, -0.2f}, b = {-0.5f, 0.2f, 0.1f, 0.6f};
  const std::vector<float> va = {1, 2, 3, 4}, vb = {-1, 0, 1, 0};
  std::vector<float> keys, values;
  for (int i = 0; i < 5; ++i) {
    keys.insert(keys.end(), a.begin(), a.end());
    values.insert(values.end(), va.begin(), va.end());
  }
  keys.insert(keys.end(), b.begin(), b.end());
  values.insert(values.end(), vb.begin(), vb.end());
  std::vector<float> full(d), with(d), without(d);
  const std::vector<uint32_t> ones(6, 1), counts = {5, 1};
  AttendRef(q, keys, values, ones, d, true, absl::MakeSpan(full));
  std::vector<float> mk = a, mv = va;
  mk.insert(mk.end(), b.begin(), b.end());
  mv.insert(mv.end(), vb.begin(), vb.end());
  AttendRef(q, mk, mv, counts, d, true, absl::MakeSpan(with));
  AttendRef(q, mk, mv, counts, d, false, absl::MakeSpan(without));
  double err_with = 0, err_without = 0;
  for (int j = 0; j < d; ++j) {
    err_with = std::max(err_with, double(std::abs(with[j] - full[j])));
    err_without = std::max(err_without, double(std::abs(without[j] - full[j])));
  }
  EXPECT_LT(err_with, 1e-5);
  EXPECT_GT(err_without, 0.1);
}

TEST(StructuralPolicyTest, SignaturesOutliveCommentsAtEqualAttention) {
  SessionView v = MakeView(40);
  for (int i = 0; i < 40; ++i) {
    v.tokens[i].tag.kind = (i % 2 == 0) ? BlockKind::kSignature : BlockKind::kComment;
    v.tokens[i].tag.block_id = 1 + i;
  }
  auto p = Make("structural", {{"sinks.count", "0"}, {"mode", "selective"}});
  LayerPlan lp = Decide1(*p, v, 20);
  for (uint32_t i : lp.keep) EXPECT_EQ(i % 2, 0u) << i;
}

TEST(StructuralPolicyTest, ErrorsOutliveVerboseToolOutput) {
  SessionView v = MakeView(40);
  for (int i = 0; i < 40; ++i) {
    v.tokens[i].tag.kind = i < 20 ? BlockKind::kError : BlockKind::kToolOutput;
  }
  auto p = Make("structural", {{"sinks.count", "0"}, {"mode", "selective"}});
  LayerPlan lp = Decide1(*p, v, 20);
  // gamma * recency favours the tail, but alpha * structure dominates.
  EXPECT_THAT(lp.keep, ElementsAreArray(
                           {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
}

TEST(IntentPolicyTest, FollowsRelevanceOncePruningPays) {
  SessionView v = MakeView(40);
  for (int i = 0; i < 40; ++i) v.layers[0].slots[i].score[kIntent] = (i % 4 == 0) ? 0.9f : -0.3f;
  for (int i = 0; i < 40; ++i) v.layers[0].slots[i].score[kAttention] = static_cast<float>(i);
  v.current_turn = 6;  // > 5 turns: intent relevance decides
  auto p = Make("intent", {{"sinks.count", "0"}});
  LayerPlan lp = Decide1(*p, v, 10);
  for (uint32_t i : lp.keep) EXPECT_EQ(i % 4, 0u) << i;
  // Short session (3 turns, 40 tokens): falls back to attention.
  v.current_turn = 2;
  EXPECT_THAT(Decide1(*p, v, 3).keep, ElementsAre(37, 38, 39));
}

// kvzip keeps the sinks, its window and the slots the reconstruction probes
// found most important, whatever attention the decode paid them; only it
// asks the worker for that stream.
TEST(KvzipPolicyTest, KeepsTheMostImportantSlotsBesideSinksAndWindow) {
  SessionView v = MakeView(40);
  for (int i = 0; i < 40; ++i) v.layers[0].slots[i].score[kAttention] = static_cast<float>(i);
  for (int i : {9, 17, 25}) v.layers[0].slots[i].score[kImportance] = 1.f + 0.1f * i;
  auto p = Make("kvzip", {{"window.size", "2"}});
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->Reads().has(kImportance));
  EXPECT_THAT(Decide1(*p, v, 9).keep, ElementsAre(0, 1, 2, 3, 9, 17, 25, 38, 39));
  for (const char* other : {"h2o", "snapkv", "hybrid", "merge", "structural", "intent", "full"}) {
    EXPECT_FALSE(Make(other)->Reads().has(kImportance)) << other;
  }
  EXPECT_TRUE(Make("sinks+kvzip+h2o")->Reads().has(kImportance));
}

// Pinned slots (a shared prefix the daemon keeps whole) are kept in every
// layer whatever the per-layer budgets would give: importance budgets rank
// them first, so a layer whose pinned slots scored low is not starved below
// them, and the other layers share what is left.
TEST(KvzipPolicyTest, PerLayerImportanceBudgetsKeepEveryPinnedSlot) {
  SessionView v = MakeView(40, 2);
  for (int i = 0; i < 16; ++i) v.tokens[i].pinned = true;
  for (int i = 0; i < 40; ++i) {
    v.layers[0].slots[i].score[kImportance] = i < 16 ? 0.f : 1.f;  // pinned: least important
    v.layers[1].slots[i].score[kImportance] = i < 16 ? 0.f : 2.f;
  }
  auto p = Make("kvzip", {{"select", "layer"}, {"layers", "importance"}, {"window.size", "2"}});
  ASSERT_NE(p, nullptr);
  const Budget budget = Budget::TotalTokens(36);  // over both layers
  auto budgets = p->LayerBudgets(v, budget);
  ASSERT_TRUE(budgets.ok()) << budgets.status();
  EXPECT_GE((*budgets)[0], 16);
  EXPECT_GE((*budgets)[1], 16);
  EXPECT_LE((*budgets)[0] + (*budgets)[1], 36);
  auto plan = p->Decide(v, budget);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const LayerPlan& lp : plan->layers) {
    for (uint32_t i = 0; i < 16; ++i) {
      EXPECT_NE(std::find(lp.keep.begin(), lp.keep.end(), i), lp.keep.end()) << i;
    }
  }
}

// select=layer tells a caller with one slot list for all layers (the daemon)
// to give each layer its own; it ranks by per-layer importance alone, so
// components that read streams summed over layers, and merging, are refused.
TEST(KvzipPolicyTest, SelectPerLayerOnlyForSelectiveKvzip) {
  EXPECT_FALSE(Make("kvzip")->SelectsPerLayer());
  EXPECT_TRUE(Make("kvzip", {{"select", "layer"}})->SelectsPerLayer());
  EXPECT_FALSE(Make("kvzip", {{"select", "session"}})->SelectsPerLayer());
  EXPECT_TRUE(Make("sinks+kvzip", {{"select", "layer"}})->SelectsPerLayer());
  for (const auto& [spec, params] : std::vector<std::pair<const char*, PolicyParams>>{
           {"kvzip", {{"select", "heads"}}},
           {"h2o", {{"select", "layer"}}},
           {"sinks+kvzip+h2o", {{"select", "layer"}}},
           {"sinks+window", {{"select", "layer"}}},
           {"kvzip", {{"select", "layer"}, {"mode", "merge"}}}}) {
    EXPECT_EQ(MakePolicy(spec, params).status().code(), absl::StatusCode::kInvalidArgument)
        << spec;
  }
}

// Only policies with a snapkv component ask the worker for the observation
// window's stream.
TEST(SnapkvPolicyTest, OnlySnapkvReadsTheObservationWindow) {
  EXPECT_TRUE(Make("snapkv")->Reads().has(kObservation));
  EXPECT_TRUE(Make("sinks+snapkv+h2o")->Reads().has(kObservation));
  for (const char* other : {"h2o", "kvzip", "hybrid", "merge", "structural", "intent", "full"}) {
    EXPECT_FALSE(Make(other)->Reads().has(kObservation)) << other;
  }
}

// What each policy asks a worker to measure: attention for every scorer that
// ranks by (or falls back to) it, nothing for policies that only protect,
// entropy only for entropy-calibrated layer budgets.
TEST(CompositeTest, ReadsTheStreamsItsComponentsRankBy) {
  using S = ScoreStream;
  EXPECT_EQ(Make("window")->Reads(), StreamSet{});
  EXPECT_EQ(Make("streaming")->Reads(), StreamSet{});
  EXPECT_EQ(Make("full")->Reads(), StreamSet{});
  EXPECT_EQ(Make("h2o")->Reads(), StreamSet{S::kAttention});
  EXPECT_EQ(Make("kvzip")->Reads(), StreamSet{S::kImportance});
  EXPECT_EQ(Make("snapkv")->Reads(), (StreamSet{S::kAttention, S::kObservation}));
  EXPECT_EQ(Make("intent")->Reads(), (StreamSet{S::kAttention, S::kIntent, S::kEntropy}));
  EXPECT_EQ(Make("kvzip", {{"select", "layer"}, {"layers", "entropy"}})->Reads(),
            (StreamSet{S::kImportance, S::kEntropy}));
}

TEST(CompositeTest, WeightsCombineComponents) {
  SessionView v = MakeView(10);
  v.current_turn = 9;
  for (int i = 0; i < 10; ++i) {
    v.layers[0].slots[i].score[kAttention] = i == 2 ? 1.f : 0.f;
    v.layers[0].slots[i].score[kIntent] = i == 7 ? 1.f : 0.f;
  }
  auto attn_heavy = Make("h2o+intent", {{"h2o.weight", "2"}});
  EXPECT_THAT(Decide1(*attn_heavy, v, 1).keep, ElementsAre(2));
  auto intent_heavy = Make("h2o+intent", {{"intent.weight", "2"}});
  EXPECT_THAT(Decide1(*intent_heavy, v, 1).keep, ElementsAre(7));
}

TEST(CompositeTest, RejectsUnknownNamesAndParameters) {
  EXPECT_EQ(MakePolicy("h2o+bogus").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePolicy("h2o", {{"snapkv.kernel", "3"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePolicy("h2o", {{"mode", "fancy"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePolicy("h2o", {{"trigger", "-1"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Compacting before the budget is reached would never end.
  EXPECT_EQ(MakePolicy("h2o", {{"trigger", "0.9"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePolicy("h2o+h2o").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseParams("a=1,b").ok());
}

// The daemon reads the trigger ratio without a view (its compaction trigger).
TEST(CompositeTest, TriggerIsTheParameter) {
  EXPECT_DOUBLE_EQ(Make("h2o")->Trigger(), 1.10);
  EXPECT_DOUBLE_EQ(Make("kvzip", {{"trigger", "1.02"}})->Trigger(), 1.02);
}

// The daemon and the worker age attention by it (the decayed H2O score): h2o
// policies only, 1 (summed) unless set, in (0, 1].
TEST(CompositeTest, AttentionDecayIsTheH2oParameter) {
  EXPECT_DOUBLE_EQ(Make("h2o")->AttentionDecay(), 1.0);
  EXPECT_DOUBLE_EQ(Make("hybrid", {{"h2o.decay", "0.99"}})->AttentionDecay(), 0.99);
  EXPECT_DOUBLE_EQ(Make("kvzip")->AttentionDecay(), 1.0);
  EXPECT_EQ(MakePolicy("kvzip", {{"h2o.decay", "0.9"}}).status().code(),
            absl::StatusCode::kInvalidArgument);  // no h2o component
  for (const char* bad : {"0", "-0.5", "1.01", "nan", "x"}) {
    EXPECT_EQ(MakePolicy("h2o", {{"h2o.decay", bad}}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(CompositeTest, PolicyFromTextTakesBracedParameters) {
  auto p = MakePolicyFromText("h2o{cold.format=int4, cold.fraction=0.5}");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->spec(), Make("h2o", {{"cold.format", "int4"}, {"cold.fraction", "0.5"}})->spec());
  EXPECT_EQ((*MakePolicyFromText("h2o"))->spec(), Make("h2o")->spec());
  for (const char* bad : {"h2o{cold.format=int4", "h2o{nope=1}", "h2o{x}", "nope"}) {
    auto r = MakePolicyFromText(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << bad;
    EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr(bad));
  }
}

TEST(CompositeTest, SpecIsCanonical) {
  auto a = Make("hybrid");
  auto b = Make("sinks+window+anchors+h2o", {{"window.size", "1024"}, {"pool", "256"}});
  EXPECT_EQ(a->spec(), b->spec());
  EXPECT_THAT(a->spec(), ::testing::HasSubstr("window.size=1024"));
}

TEST(CompositeTest, NeedsCompactionAt110Percent) {
  auto p = Make("h2o");
  const Budget b = Budget::TokensPerLayer(1, 100);
  EXPECT_FALSE(p->NeedsCompaction(MakeView(110), b));
  EXPECT_TRUE(p->NeedsCompaction(MakeView(111), b));
}

// Pages hold block_tokens slots in one format, so the cold step requantizes
// whole output blocks: the coldest full blocks without a protected slot, as
// many as cold.fraction of the output slots fills (rounded down), never the
// trailing partial block; and the lowering accepts the plan.
TEST(CompositeTest, ColdRequantizationTakesWholeColdBlocks) {
  SessionView v = MakeView(400);
  std::mt19937 rng(17);  // seed 17
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (Slot& s : v.layers[0].slots) s.score[kAttention] = u(rng);
  // h2o: a window of 100 recent slots, 100 pool slots by attention; 200
  // output slots = 12 full blocks + 8. Blocks 0..5 hold pool slots only,
  // block 6 reaches into the window.
  const int bt = v.shape.block_tokens;
  for (const char* kind : {"k", "v", "kv"}) {
    auto p = Make("h2o", {{"cold.format", "int4"}, {"cold.fraction", "0.3"}, {"cold.kind", kind}});
    auto plan = p->Decide(v, Budget::TokensPerLayer(1, 200));
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(Lower(*plan, v).ok()) << kind << ": " << Lower(*plan, v).status();
    const LayerPlan& lp = plan->layers[0];
    const std::vector<uint32_t> order = OutputOrder(lp);
    ASSERT_EQ(order.size(), 200u);
    std::vector<int> out_of(400, -1);
    for (size_t j = 0; j < order.size(); ++j) out_of[order[j]] = static_cast<int>(j);
    const bool want_k = std::string_view(kind) != "v", want_v = std::string_view(kind) != "k";
    std::set<int> blocks;
    std::vector<int> per_block(13, 0);
    for (const RequantTarget& t : lp.requant) {
      ASSERT_GE(out_of[t.slot], 0) << "requantizes a slot it does not keep: " << t.slot;
      EXPECT_EQ(t.format, kernels::PageFormat::kInt4);
      EXPECT_TRUE(t.kind == kernels::KvKind::kKey ? want_k : want_v) << kind;
      const int b = out_of[t.slot] / bt;
      blocks.insert(b);
      ++per_block[b];
    }
    // floor(0.3 x 200 / 16) = 3 blocks, each whole, per kind.
    ASSERT_EQ(blocks.size(), 3u) << kind;
    for (int b : blocks) {
      EXPECT_LT(b, 6) << "block " << b << " holds window slots or is the partial one";
      EXPECT_EQ(per_block[b], bt * (want_k + want_v)) << "block " << b;
    }
    // The coldest of the candidate blocks 0..5 by mean attention.
    std::vector<std::pair<double, int>> mean;
    for (int b = 0; b < 6; ++b) {
      double sum = 0;
      for (int j = b * bt; j < (b + 1) * bt; ++j) {
        sum += v.layers[0].slots[order[j]].score[kAttention];
      }
      mean.push_back({sum / bt, b});
    }
    std::sort(mean.begin(), mean.end());
    EXPECT_EQ(blocks, (std::set<int>{mean[0].second, mean[1].second, mean[2].second})) << kind;
  }
  // A fraction below one block requantizes nothing.
  auto few = Make("h2o", {{"cold.format", "int4"}, {"cold.fraction", "0.07"}});
  auto plan = few->Decide(v, Budget::TokensPerLayer(1, 200));
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->layers[0].requant.empty());
  // Slots already at cold.format's bits are not requantized again; the block
  // is still stored in cold.format.
  for (Slot& s : v.layers[0].slots) s.v_format = kernels::PageFormat::kInt4;
  auto kv = Make("h2o", {{"cold.format", "int4"}, {"cold.fraction", "0.3"}, {"cold.kind", "kv"}});
  plan = kv->Decide(v, Budget::TokensPerLayer(1, 200));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->layers[0].requant.size(), 3u * bt);
  for (const RequantTarget& t : plan->layers[0].requant) EXPECT_EQ(t.kind, kernels::KvKind::kKey);
  EXPECT_TRUE(Lower(*plan, v).ok()) << Lower(*plan, v).status();
}

// Within budget nothing is evicted, but the cold step still runs (the
// daemon's pressure ladder relies on it: a budget of every slot); without a
// cold format such a plan changes nothing.
TEST(CompositeTest, WithinBudgetTheColdStepStillRequantizes) {
  SessionView v = MakeView(400);
  for (size_t i = 0; i < v.layers[0].slots.size(); ++i) {
    v.layers[0].slots[i].score[kAttention] = float(i % 7);
  }
  const int bt = v.shape.block_tokens;
  auto plain = Make("window", {{"window.size", "128"}});
  auto plan = plain->Decide(v, Budget::TokensPerLayer(1, 400));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->changes());
  auto cold = Make("window", {{"window.size", "128"}, {"cold.format", "int4"},
                              {"cold.fraction", "1"}});
  plan = cold->Decide(v, Budget::TokensPerLayer(1, 400));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const LayerPlan& lp = plan->layers[0];
  EXPECT_TRUE(lp.evict.empty());
  EXPECT_EQ(lp.keep.size(), 400u);
  // 400 slots = 25 blocks; the last 128 (8 blocks) are the window.
  std::set<uint32_t> blocks;
  for (const RequantTarget& t : lp.requant) {
    EXPECT_EQ(t.kind, kernels::KvKind::kValue);
    blocks.insert(t.slot / bt);
  }
  EXPECT_EQ(lp.requant.size(), 17u * bt);
  EXPECT_EQ(blocks.size(), 17u);
  EXPECT_LT(*blocks.rbegin(), 17u);
  EXPECT_TRUE(Lower(*plan, v).ok()) << Lower(*plan, v).status();
}

TEST(PolicyTextTest, WithParamsSetsParametersInKeyOrder) {
  EXPECT_EQ(WithParams("h2o", {{"cold.format", "int4"}}).value(), "h2o{cold.format=int4}");
  EXPECT_EQ(WithParams("h2o{window.size=64,cold.format=int8}", {{"cold.format", "int4"}}).value(),
            "h2o{cold.format=int4,window.size=64}");
  EXPECT_EQ(WithParams("sinks+window", {}).value(), "sinks+window");
  EXPECT_EQ(WithParams("h2o{window.size=64", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WithParams("h2o{oops}", {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CompositeTest, BytesBudgetCountsFormats) {
  SessionView v = MakeView(100);
  const double bf16 =
      BytesPerToken(v.shape, kernels::PageFormat::kBF16, kernels::PageFormat::kBF16);
  auto p = Make("window");
  auto plan = p->Decide(v, Budget::BytesPerLayer(1, static_cast<int64_t>(bf16 * 30.5)));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->layers[0].keep.size(), 30u);
  // Cheaper slots: int8 keys/values, but the most expensive slot sets the rate.
  for (Slot& s : v.layers[0].slots) s.k_format = s.v_format = kernels::PageFormat::kInt8;
  auto cheap = p->Decide(v, Budget::BytesPerLayer(1, static_cast<int64_t>(bf16 * 30.5)));
  ASSERT_TRUE(cheap.ok());
  const double int8 =
      BytesPerToken(v.shape, kernels::PageFormat::kInt8, kernels::PageFormat::kInt8);
  ASSERT_LT(int8, bf16);
  EXPECT_EQ(cheap->layers[0].keep.size(),
            static_cast<size_t>(static_cast<int64_t>(bf16 * 30.5) / int8));
}

TEST(LayerBudgetTest, AllocatorsRespectTotalAndCaps) {
  const std::vector<int64_t> sizes = {1000, 1000, 1000, 1000, 1000, 1000};
  const std::vector<float> ent = {3.0f, 2.5f, 2.0f, 1.5f, 1.0f, 0.5f};
  for (LayerAllocator a :
       {LayerAllocator::kUniform, LayerAllocator::kPyramid, LayerAllocator::kEntropy}) {
    const auto b = AllocateLayerBudgets(a, 2400, sizes, ent, 0.5);
    int64_t sum = 0;
    for (int64_t x : b) sum += x;
    EXPECT_EQ(sum, 2400) << LayerAllocatorName(a);
  }
  EXPECT_THAT(AllocateLayerBudgets(LayerAllocator::kUniform, 2400, sizes, ent),
              ElementsAre(400, 400, 400, 400, 400, 400));
  const auto pyr = AllocateLayerBudgets(LayerAllocator::kPyramid, 2400, sizes, ent, 0.5);
  EXPECT_TRUE(std::is_sorted(pyr.rbegin(), pyr.rend()));
  EXPECT_EQ(pyr.front(), 600);
  // Entropy: most diffuse third 0.6, middle 0.8, most focused 1.2 (x 2400 / 2.6*2).
  const auto e = AllocateLayerBudgets(LayerAllocator::kEntropy, 2600, sizes, ent);
  EXPECT_THAT(e, ElementsAre(300, 300, 400, 400, 600, 600));
  // Unknown entropy: depth order, top layers focused.
  const std::vector<float> unknown(6, -1.f);
  EXPECT_THAT(AllocateLayerBudgets(LayerAllocator::kEntropy, 2600, sizes, unknown),
              ElementsAre(300, 300, 400, 400, 600, 600));
  // Caps: a small layer gives its surplus to the others.
  const std::vector<int64_t> small = {10, 1000, 1000};
  const auto c = AllocateLayerBudgets(LayerAllocator::kUniform, 900, small, {});
  EXPECT_THAT(c, ElementsAre(10, 445, 445));
}

// layers=importance: the `total` best slots over all layers, counted per
// layer (NaN ranks lowest; ties shared by how many each layer has); kvzip
// only.
TEST(LayerBudgetTest, ImportanceCountsEachLayersShareOfTheBestSlots) {
  const std::vector<std::vector<float>> scores = {{5, 1, 1, 0}, {4, 4, 3, 2}, {NAN, 9, 1, 1}};
  EXPECT_THAT(ImportanceLayerBudgets(5, scores), ElementsAre(1, 3, 1));
  EXPECT_THAT(ImportanceLayerBudgets(7, scores), ElementsAre(2, 4, 1));  // one of four tied 1s
  EXPECT_THAT(ImportanceLayerBudgets(0, scores), ElementsAre(0, 0, 0));
  EXPECT_THAT(ImportanceLayerBudgets(99, scores), ElementsAre(4, 4, 4));
  // Nothing reported (all NaN), or all equal: an even split.
  const std::vector<std::vector<float>> none(3, std::vector<float>(10, NAN));
  EXPECT_THAT(ImportanceLayerBudgets(12, none), ElementsAre(4, 4, 4));
  EXPECT_THAT(ImportanceLayerBudgets(13, {std::vector<float>(5, 1.f), std::vector<float>(15, 1.f)}),
              ElementsAre(3, 10));  // 3.25 and 9.75: the larger remainder
  // Through the policy, on a view whose layers' importance differs.
  SessionView v = MakeView(8, 2);
  for (int i = 0; i < 8; ++i) {
    v.layers[0].slots[i].score[kImportance] = i < 2 ? 1.f : 0.f;
    v.layers[1].slots[i].score[kImportance] = i < 6 ? 1.f : 0.f;
  }
  auto p = Make("kvzip", {{"select", "layer"}, {"layers", "importance"}});
  EXPECT_THAT(p->LayerBudgets(v, Budget::TotalTokens(8)).value(), ElementsAre(2, 6));
  EXPECT_EQ(MakePolicy("h2o", {{"layers", "importance"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LayerBudgetTest, PolicyAppliesAllocatorToTotals) {
  SyntheticOptions o;
  o.num_layers = 6;
  o.num_tokens = 500;
  SessionView v = MakeSyntheticView(o);
  auto p = Make("intent");
  auto b = p->LayerBudgets(v, Budget::TotalTokens(1300));
  ASSERT_TRUE(b.ok());
  int64_t sum = 0;
  for (int64_t x : *b) sum += x;
  EXPECT_EQ(sum, 1300);
  EXPECT_GT(std::set<int64_t>(b->begin(), b->end()).size(), 1u);  // not uniform
  // Explicit per-layer budgets are caps, used as given.
  auto e = p->LayerBudgets(v, Budget::TokensPerLayer(6, 77));
  ASSERT_TRUE(e.ok());
  EXPECT_THAT(*e, ::testing::Each(77));
}

}  // namespace
}  // namespace polykv::policies
