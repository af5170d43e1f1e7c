// The compactor's decisions over plain data: when a session is compacted and
// to how many tokens (CompactionTarget), and what a plan keeps, shares and
// copies (PlanCompaction) with real policies. No pool, no memory.
#include "daemon/compaction/compactor.h"
#include "daemon/compaction/policy_registry.h"
#include "daemon/compaction/pressure_ladder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <string>

namespace polykv::daemon {
namespace {

using policies::ScoreStream;

constexpr int kBt = 16;

TargetInputs Inputs(uint64_t committed, uint64_t budget, uint64_t want = 0) {
  return TargetInputs{true, committed, kBt, budget, want};
}

TEST(CompactionTargetTest, FullPolicyAndEmptySessionsAreNeverCompacted) {
  EXPECT_EQ(CompactionTarget({false, 1000, kBt, 32, 16}), 0u);
  EXPECT_EQ(CompactionTarget(Inputs(0, 32, 16)), 0u);
  EXPECT_EQ(CompactionTarget(Inputs(1000, 0, 0)), 0u);  // no budget, no ask
}

// The policy's `trigger` moves the threshold: 1.0 compacts past budget + 1,
// 1.5 past budget + budget/2.
TEST(CompactionTargetTest, ThePolicysTriggerSetsTheMargin) {
  TargetInputs at = Inputs(322, 320);
  at.trigger = 1.0;
  EXPECT_EQ(CompactionTarget(at), 306u);  // 2 over -> one block
  at.committed_tokens = 321;
  EXPECT_EQ(CompactionTarget(at), 0u);
  at.trigger = 1.5;
  at.committed_tokens = 480;
  EXPECT_EQ(CompactionTarget(at), 0u);
  at.committed_tokens = 481;
  EXPECT_EQ(CompactionTarget(at), 305u);  // 161 over -> eleven blocks
}

// A fractional budget grows with the session's context; budget_tokens is
// its floor, and without a fraction the budget is budget_tokens alone.
TEST(SessionBudgetTest, FractionOfTheContextWithTheTokensAsFloor) {
  EXPECT_EQ(SessionBudget(0, 0, 5000), 0u);  // no budget
  EXPECT_EQ(SessionBudget(300, 0, 5000), 300u);
  EXPECT_EQ(SessionBudget(0, 0.75, 1000), 750u);
  EXPECT_EQ(SessionBudget(0, 0.75, 1001), 751u);  // 750.75 rounds up
  EXPECT_EQ(SessionBudget(0, 0.75, 1), 1u);
  EXPECT_EQ(SessionBudget(0, 0.75, 0), 0u);
  EXPECT_EQ(SessionBudget(1024, 0.75, 1000), 1024u);  // below the floor
  EXPECT_EQ(SessionBudget(1024, 0.75, 4000), 3000u);
  EXPECT_EQ(SessionBudget(0, 1.0, 4000), 4000u);
}

TEST(CompactionTargetTest, AFractionalBudgetCompactsAsTheContextGrows) {
  // 3/4 of 400 tokens seen, all still held: past 300 + 1 at trigger 1.
  TargetInputs at = Inputs(400, SessionBudget(0, 0.75, 400));
  at.trigger = 1.0;
  EXPECT_EQ(CompactionTarget(at), 288u);  // 100 over -> seven blocks
  // After it, 288 held of 400 seen; 48 more tokens: 336 held, budget 336.
  at.committed_tokens = 336;
  at.budget_tokens = SessionBudget(0, 0.75, 448);
  EXPECT_EQ(CompactionTarget(at), 0u);
  // 64 more: 400 held, budget 384 -> 16 over, one block.
  at.committed_tokens = 400;
  at.budget_tokens = SessionBudget(0, 0.75, 512);
  EXPECT_EQ(CompactionTarget(at), 384u);
}

TEST(CompactionTargetTest, BudgetTriggersPastTenPercentAndDropsWholeBlocks) {
  // budget 32: trigger past 32 + 3.
  EXPECT_EQ(CompactionTarget(Inputs(32, 32)), 0u);
  EXPECT_EQ(CompactionTarget(Inputs(35, 32)), 0u);
  EXPECT_EQ(CompactionTarget(Inputs(36, 32)), 20u);  // 4 over -> one block dropped
  EXPECT_EQ(CompactionTarget(Inputs(48, 32)), 32u);  // 16 over -> exactly one block
  EXPECT_EQ(CompactionTarget(Inputs(49, 32)), 17u);  // 17 over -> two blocks
  EXPECT_EQ(CompactionTarget(Inputs(52, 32)), 20u);
  EXPECT_EQ(CompactionTarget(Inputs(64, 32)), 32u);
  // budget 320: trigger past 352.
  EXPECT_EQ(CompactionTarget(Inputs(352, 320)), 0u);
  EXPECT_EQ(CompactionTarget(Inputs(353, 320)), 305u);  // 33 over -> three blocks
  // Small budgets: the trigger margin is at least one token.
  EXPECT_EQ(CompactionTarget(Inputs(6, 5)), 0u);
  // 7 > 6, but dropping a whole block would drop everything: the target stays.
  EXPECT_EQ(CompactionTarget(Inputs(7, 5)), 5u);
  EXPECT_EQ(CompactionTarget(Inputs(21, 5)), 5u);  // drop 16 of 21
  // Other block sizes.
  EXPECT_EQ(CompactionTarget({true, 100, 32, 40, 0}), 36u);  // 60 over -> 64 dropped
}

TEST(CompactionTargetTest, LadderAskTriggersBelowTheBudgetAndTheSmallerTargetWins) {
  EXPECT_EQ(CompactionTarget(Inputs(64, 0, 40)), 32u);  // 24 over -> two blocks
  EXPECT_EQ(CompactionTarget(Inputs(64, 0, 64)), 0u);   // asks for no fewer
  EXPECT_EQ(CompactionTarget(Inputs(64, 0, 100)), 0u);
  // Within the budget's margin, the ladder's ask still compacts.
  EXPECT_EQ(CompactionTarget(Inputs(105, 100, 64)), 57u);  // 41 over -> 48 dropped
  // Both: the smaller.
  EXPECT_EQ(CompactionTarget(Inputs(200, 100, 50)), 40u);  // 150 over -> 160 dropped
  EXPECT_EQ(CompactionTarget(Inputs(200, 50, 100)), 40u);
}

// n slots at logical positions first, first + 1, ...
std::vector<SlotRecord> Slots(int n, int64_t first = 100) {
  std::vector<SlotRecord> s(n);
  for (int i = 0; i < n; ++i) s[i].meta.position = first + i;
  return s;
}

CompactionInputs In(uint64_t target) {
  CompactionInputs in;
  in.shape = {kBt, 2, 32};
  in.formats.fill_k = kernels::PageFormat::kF16;
  in.formats.fill_v = kernels::PageFormat::kF16;
  in.target_tokens = target;
  return in;
}

std::unique_ptr<policies::Policy> Policy(const std::string& spec,
                                         const policies::PolicyParams& params = {}) {
  auto p = policies::MakePolicy(spec, params);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

std::vector<int32_t> Range(int32_t first, int32_t last) {  // [first, last)
  std::vector<int32_t> v(last - first);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// The plan's bookkeeping, recomputed: every output block is shared exactly
// when it is rows [0, n) of one source block, single-member groups in order;
// `copy` is the groups of the other blocks, in order.
void ExpectConsistent(const CompactionPlan& p) {
  const CompactionGroups& g = p.groups[0];
  ASSERT_EQ(p.shared.size(), (g.num_out() + size_t(kBt) - 1) / size_t(kBt));
  ASSERT_EQ(g.group_offsets.size(), g.num_out() + 1);
  std::vector<int32_t> members, offsets{0};
  std::vector<float> weights;
  for (size_t j = 0; j < p.shared.size(); ++j) {
    const int first = int(j) * kBt, last = std::min(int(g.num_out()), first + kBt);
    bool plain = true;
    for (int o = first; o < last; ++o) {
      plain &= g.group_offsets[o + 1] - g.group_offsets[o] == 1;
    }
    const int32_t m0 = g.members[g.group_offsets[first]];
    bool same = plain && m0 % kBt == 0;
    for (int o = first; o < last && same; ++o) same = g.members[g.group_offsets[o]] == m0 + o - first;
    EXPECT_EQ(p.shared[j], same ? m0 / kBt : -1) << "output block " << j;
    if (same) continue;
    for (int o = first; o < last; ++o) {
      for (int k = g.group_offsets[o]; k < g.group_offsets[o + 1]; ++k) {
        members.push_back(g.members[k]);
        weights.push_back(g.weights[k]);
      }
      offsets.push_back(int32_t(members.size()));
    }
  }
  EXPECT_EQ(p.copy[0].members, members);
  EXPECT_EQ(p.copy[0].weights, weights);
  EXPECT_EQ(p.copy[0].group_offsets, offsets);
  EXPECT_EQ(p.copy[0].slots.size(), p.copy[0].num_out());
}

std::vector<int64_t> Positions(const CompactionGroups& g) {
  std::vector<int64_t> out;
  for (const SlotRecord& r : g.slots) out.push_back(r.meta.position);
  return out;
}

TEST(PlanCompactionTest, WindowDroppingWholeBlocksSharesEveryKeptBlock) {
  auto window = Policy("window");
  auto plan = PlanCompaction(*window, Slots(48), In(32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->changes);
  EXPECT_EQ(plan->groups[0].num_out(), 32u);
  EXPECT_EQ(plan->groups[0].members, Range(16, 48));
  EXPECT_EQ(plan->groups[0].evicted_tokens, 16u);
  EXPECT_EQ(plan->groups[0].merged_tokens, 0u);
  EXPECT_EQ(Positions(plan->groups[0]).front(), 116);
  EXPECT_EQ(plan->shared, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(plan->shared_blocks(), 2u);
  EXPECT_EQ(plan->out_blocks(), 2u);
  EXPECT_EQ(plan->copy[0].num_out(), 0u);
  EXPECT_EQ(plan->copy[0].group_offsets, std::vector<int32_t>{0});
  ExpectConsistent(*plan);
}

TEST(PlanCompactionTest, APartialLastBlockIsSharedWhenItStartsABlock) {
  // 40 slots down to 24: keeps 16..39, i.e. all of block 1 and the first 8
  // rows of block 2 (block 2's committed rows).
  auto plan = PlanCompaction(*Policy("window"), Slots(40), In(24));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->groups[0].members, Range(16, 40));
  EXPECT_EQ(plan->shared, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(plan->copy[0].num_out(), 0u);
  ExpectConsistent(*plan);
}

TEST(PlanCompactionTest, MisalignedRowsAreCopiedIntoNewBlocks) {
  // 41 slots down to 24: keeps 17..40, which starts inside block 1.
  auto plan = PlanCompaction(*Policy("window"), Slots(41), In(24));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->groups[0].members, Range(17, 41));
  EXPECT_EQ(plan->shared, (std::vector<int64_t>{-1, -1}));
  EXPECT_EQ(plan->shared_blocks(), 0u);
  EXPECT_EQ(plan->copy[0].num_out(), 24u);
  EXPECT_EQ(plan->copy[0].members, Range(17, 41));
  EXPECT_EQ(plan->copy[0].weights, std::vector<float>(24, 1.f));
  EXPECT_EQ(Positions(plan->copy[0]).front(), 117);
  ExpectConsistent(*plan);
}

TEST(PlanCompactionTest, NothingToDropIsNoChange) {
  auto plan = PlanCompaction(*Policy("window"), Slots(20), In(32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->changes);
  EXPECT_TRUE(plan->shared.empty());
  EXPECT_TRUE(plan->groups.empty() && plan->copy.empty());
  // "full" under its budget: no change; over it, the policy's refusal.
  auto full = Policy("full");
  plan = PlanCompaction(*full, Slots(20), In(32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->changes);
  EXPECT_EQ(PlanCompaction(*full, Slots(48), In(32)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(PlanCompactionTest, H2oKeepsHeavyHittersAndTheRecentWindow) {
  auto h2o = Policy("h2o");  // half window, half heavy hitters
  // Heavy hitters are exactly block 0: both kept blocks are shared.
  std::vector<SlotRecord> slots = Slots(64);
  for (int i = 0; i < 16; ++i) slots[i].score[ScoreStream::kAttention] = 10.f + i;
  auto plan = PlanCompaction(*h2o, slots, In(32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<int32_t> kept = Range(0, 16);
  for (int32_t i : Range(48, 64)) kept.push_back(i);
  EXPECT_EQ(plan->groups[0].members, kept);
  EXPECT_EQ(plan->shared, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(plan->copy[0].num_out(), 0u);
  ExpectConsistent(*plan);

  // Heavy hitters scattered over blocks 0 and 1: that output block is copied.
  slots = Slots(64);
  for (int i = 0; i < 16; ++i) slots[2 * i + 1].score[ScoreStream::kAttention] = 10.f + i;
  plan = PlanCompaction(*h2o, slots, In(32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  kept.clear();
  for (int i = 0; i < 16; ++i) kept.push_back(2 * i + 1);
  for (int32_t i : Range(48, 64)) kept.push_back(i);
  EXPECT_EQ(plan->groups[0].members, kept);
  EXPECT_EQ(plan->shared, (std::vector<int64_t>{-1, 3}));
  EXPECT_EQ(plan->copy[0].num_out(), 16u);
  EXPECT_EQ(plan->copy[0].members, std::vector<int32_t>(kept.begin(), kept.begin() + 16));
  EXPECT_EQ(plan->groups[0].evicted_tokens, 32u);
  ExpectConsistent(*plan);

  // The window size is a parameter: window.size=8 keeps 24 heavy hitters.
  auto narrow = Policy("h2o", {{"window.size", "8"}});
  plan = PlanCompaction(*narrow, slots, In(32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->groups[0].num_out(), 32u);
  EXPECT_EQ(std::vector<int32_t>(plan->groups[0].members.end() - 8, plan->groups[0].members.end()),
            Range(56, 64));
  ExpectConsistent(*plan);
}

TEST(PlanCompactionTest, OnlyPlainRowsOfOneBlockAreShared) {
  // The daemon's view carries no keys, so a merge policy has nothing to
  // cluster by; whatever it keeps, shared blocks hold single-member groups.
  std::vector<SlotRecord> slots = Slots(96);
  for (int i = 0; i < 96; ++i) slots[i].score[ScoreStream::kAttention] = float((i * 37) % 11);
  auto plan = PlanCompaction(*Policy("merge", {{"window.size", "16"}}), slots, In(48));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->changes);
  EXPECT_EQ(plan->groups[0].num_out(), 48u);
  // Every source slot is kept, merged or evicted, once.
  EXPECT_EQ(plan->groups[0].members.size() + plan->groups[0].evicted_tokens, 96u);
  ExpectConsistent(*plan);
  for (size_t j = 0; j < plan->shared.size(); ++j) {
    if (plan->shared[j] < 0) continue;
    for (size_t o = j * kBt; o < std::min<size_t>((j + 1) * kBt, 48); ++o) {
      EXPECT_EQ(plan->groups[0].group_offsets[o + 1] - plan->groups[0].group_offsets[o], 1);
    }
  }
}

TEST(PlanCompactionTest, PolicyErrorsPassThrough) {
  // Positions 0..3 are sinks, hard-protected: a budget of 2 cannot hold them.
  auto plan = PlanCompaction(*Policy("streaming"), Slots(64, 0), In(2));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  // Pinned slots too.
  std::vector<SlotRecord> slots = Slots(64);
  for (int i = 0; i < 40; ++i) slots[i].meta.pinned = true;
  plan = PlanCompaction(*Policy("window"), slots, In(32));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
}

// Requantization: the output blocks the plan requantizes get new pages in the
// coarser format (never shared with their old pages), the others keep theirs.
// Slots 0..15 are the least attended (evicted at a 48-token target), 16..31
// the coldest kept, so a third of the kept slots is exactly output block 0.
std::vector<SlotRecord> ColdSecondBlock() {
  std::vector<SlotRecord> slots = Slots(64);
  for (int i = 0; i < 64; ++i) {
    slots[i].score[ScoreStream::kAttention] = i < 16 ? 0.f : i < 32 ? 1.f : 10.f;
  }
  return slots;
}

std::unique_ptr<policies::Policy> ColdH2o() {
  return Policy("h2o", {{"cold.format", "int4"}, {"cold.fraction", "0.34"}});
}

TEST(PlanCompactionTest, RequantizedBlocksGetNewPagesInTheirFormat) {
  auto plan = PlanCompaction(*ColdH2o(), ColdSecondBlock(), In(48));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->groups[0].members, Range(16, 64));
  using F = kernels::PageFormat;
  EXPECT_EQ(plan->groups[0].block_v_formats, (std::vector<F>{F::kInt4, F::kF16, F::kF16}));
  EXPECT_EQ(plan->groups[0].block_k_formats, (std::vector<F>{F::kF16, F::kF16, F::kF16}));
  // Output block 0 is source block 1's rows, but in another format: copied.
  EXPECT_EQ(plan->shared, (std::vector<int64_t>{-1, 2, 3}));
  EXPECT_EQ(plan->copy[0].members, Range(16, 32));
  EXPECT_EQ(plan->copy[0].block_v_formats, std::vector<F>{F::kInt4});
  EXPECT_EQ(plan->copy[0].block_k_formats, std::vector<F>{F::kF16});

  // The next compaction sees those slots at int4 (BuildView reads each
  // block's formats) and keeps the block as it is.
  CompactionInputs again = In(48);
  again.formats.v = {F::kInt4, F::kF16, F::kF16};
  std::vector<SlotRecord> next(plan->groups[0].slots.begin(), plan->groups[0].slots.end());
  const auto view = BuildView(next, again.shape, again.formats, 0);
  EXPECT_EQ(view.layers[0].slots[0].v_format, F::kInt4);
  EXPECT_EQ(view.layers[0].slots[16].v_format, F::kF16);
}

// One implementation of what a plan leaves: the offline replay's ApplyPlan
// (policies/plan.h, what replay_main and the policies' property tests step
// with) and the daemon's compaction (PlanCompaction's output records) give
// the same slots, counts, pins and scores for the same decision, merges
// included: both go through policies::GroupScores.
TEST(PlanCompactionTest, TheReplayAndTheDaemonLeaveTheSameSlotsForOnePlan) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<SlotRecord> records = Slots(96);
  for (size_t i = 0; i < records.size(); ++i) {
    SlotRecord& r = records[i];
    r.count = 1 + uint32_t(i % 3 == 0);
    r.meta.turn = int32_t(i / 32);
    r.meta.pinned = i == 40;
    r.meta.tag.block_id = uint32_t(i / 8);  // merges stay inside a block
    for (ScoreStream st : {ScoreStream::kAttention, ScoreStream::kIntent,
                           ScoreStream::kImportance, ScoreStream::kObservation}) {
      r.score[st] = u(rng);
    }
  }
  const CompactionInputs base = In(48);
  const int key_dim = 8;
  // Keys near their block's centre: a merging policy finds groups to merge.
  std::vector<float> centres(12 * key_dim), keys(records.size() * key_dim);
  for (float& c : centres) c = u(rng) - 0.5f;
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = centres[(i / key_dim / 8) * key_dim + i % key_dim] + 0.02f * (u(rng) - 0.5f);
  }
  const std::vector<std::pair<std::string, policies::PolicyParams>> specs = {
      {"h2o", {}}, {"kvzip", {}}, {"snapkv", {}}, {"hybrid", {}},
      {"merge", {{"window.size", "16"}}}};
  for (const auto& [spec, params] : specs) {
    SCOPED_TRACE(spec);
    auto policy = Policy(spec, params);
    CompactionInputs in = base;
    in.current_turn = 2;
    if (policy->ReadsKeys()) {
      in.keys = keys;
      in.key_dim = key_dim;
    }
    auto daemon = PlanCompaction(*policy, records, in);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    ASSERT_TRUE(daemon->changes);

    policies::SessionView view = BuildView(records, in.shape, in.formats, in.current_turn);
    if (in.key_dim > 0) {
      view.key_dim = in.key_dim;
      view.layers[0].keys = in.keys;
    }
    auto plan = policy->Decide(view, policies::Budget::TokensPerLayer(1, 48));
    ASSERT_TRUE(plan.ok()) << plan.status();
    const policies::SessionView replay = policies::ApplyPlan(view, *plan);

    const std::vector<SlotRecord>& after = daemon->records[0];
    const std::vector<policies::Slot>& slots = replay.layers[0].slots;
    ASSERT_EQ(after.size(), slots.size());
    bool merged = false;
    for (size_t j = 0; j < slots.size(); ++j) {
      const policies::TokenMeta& t = replay.tokens[slots[j].token];
      EXPECT_EQ(after[j].meta.position, t.position) << j;
      EXPECT_EQ(after[j].count, slots[j].count) << j;
      EXPECT_EQ(after[j].meta.pinned, t.pinned) << j;
      for (ScoreStream st : {ScoreStream::kAttention, ScoreStream::kIntent,
                             ScoreStream::kImportance, ScoreStream::kObservation}) {
        EXPECT_FLOAT_EQ(after[j].score[st], slots[j].score[st]) << j;
      }
      merged |= after[j].count > records[size_t(after[j].meta.position - 100)].count;
    }
    if (spec == "merge") EXPECT_TRUE(merged) << "the merge policy merged nothing";
  }
}

// The ladder's requantization step is typed data (CompactionInputs::cold),
// not a policy text of its own: it plans what the agent's policy with those
// cold.* and window.size parameters plans, and 10^4 steps of different
// fractions leave the registry with the one policy sessions named.
TEST(PlanCompactionTest, ALadderStepPlansAsThePolicyWithItsColdParametersAndAddsNoPolicy) {
  using F = kernels::PageFormat;
  for (int64_t window : {-1, 16}) {
    CompactionInputs step = In(64);  // a budget of every slot: nothing evicted
    step.cold = policies::ColdStep{F::kInt4, false, true, 0.34, window};
    policies::PolicyParams params{{"cold.format", "int4"}, {"cold.fraction", "0.34"}};
    if (window >= 0) params["window.size"] = std::to_string(window);
    auto typed = PlanCompaction(*Policy("h2o"), ColdSecondBlock(), step);
    auto text = PlanCompaction(*Policy("h2o", params), ColdSecondBlock(), In(64));
    ASSERT_TRUE(typed.ok()) << typed.status();
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_TRUE(typed->changes) << window;
    EXPECT_EQ(typed->groups[0].block_v_formats, text->groups[0].block_v_formats) << window;
    EXPECT_EQ(typed->groups[0].block_k_formats, text->groups[0].block_k_formats) << window;
    EXPECT_EQ(typed->groups[0].members, text->groups[0].members) << window;
    EXPECT_EQ(typed->shared, text->shared) << window;
  }
  PolicyRegistry registry;
  for (uint64_t i = 0; i < 10000; ++i) {
    CompactionInputs step = In(64);
    step.cold = LadderColdStep(F::kInt4, 2, 64 + i, kBt);  // a new fraction each time
    auto policy = registry.Get("h2o");
    ASSERT_TRUE(policy.ok()) << policy.status();
    ASSERT_TRUE(PlanCompaction(**policy, ColdSecondBlock(), step).ok()) << i;
  }
  EXPECT_EQ(registry.size(), 1u);
}

TEST(PlanCompactionTest, NoBlockIsStoredBelowTheQosFloorOrTheFillFormatWhileFilling) {
  using F = kernels::PageFormat;
  CompactionInputs in = In(48);
  in.value_floor = F::kInt8;
  auto plan = PlanCompaction(*ColdH2o(), ColdSecondBlock(), in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->groups[0].block_v_formats, (std::vector<F>{F::kInt8, F::kF16, F::kF16}));
  // A session whose 48 slots are all at int4 already, compacted to 40: its
  // trailing partial block (output slots 32..39, which the worker goes on
  // filling) goes back to the fill format.
  std::vector<SlotRecord> slots = Slots(48);
  in = In(40);
  in.formats.v = {F::kInt4, F::kInt4, F::kInt4};
  auto window = PlanCompaction(*Policy("window"), slots, in);
  ASSERT_TRUE(window.ok()) << window.status();
  ASSERT_EQ(window->groups[0].num_out(), 40u);
  EXPECT_EQ(window->groups[0].block_v_formats, (std::vector<F>{F::kInt4, F::kInt4, F::kF16}));
  ExpectConsistent(*window);
}

// A session's record lists when its layers keep their own: `first`'s, then
// `rest`'s.
std::vector<std::vector<SlotRecord>> Layers(const std::vector<SlotRecord>& first,
                                            const std::vector<std::vector<SlotRecord>>& rest) {
  std::vector<std::vector<SlotRecord>> all{first};
  all.insert(all.end(), rest.begin(), rest.end());
  return all;
}

// Importance per layer: `high` slots at 3, `mid` at 2, the rest at 0.1.
std::vector<SlotRecord> Scored(int n, int64_t first, std::pair<int, int> high,
                               std::pair<int, int> mid = {0, 0}) {
  std::vector<SlotRecord> s = Slots(n, first);
  for (int i = 0; i < n; ++i) {
    s[i].score[ScoreStream::kImportance] = i >= high.first && i < high.second ? 3.f
                      : i >= mid.first && i < mid.second ? 2.f
                                                         : 0.1f;
  }
  return s;
}

// select=layer over a session whose layers keep their own records: each
// layer keeps its own most important slots, as many per layer; an output
// block is shared only where every layer's rows are one source block's.
TEST(PlanCompactionTest, PerLayerSelectionKeepsEachLayersOwnSlots) {
  auto kvzip = Policy("kvzip", {{"select", "layer"}, {"window.size", "16"}, {"sinks.count", "0"}});
  // Layers 0 and 1 value slots 0..15, layer 2 slots 16..31; the window is 48..63.
  const std::vector<SlotRecord> layer0 = Scored(64, 100, {0, 16});
  const std::vector<std::vector<SlotRecord>> upper = {Scored(64, 100, {0, 16}),
                                                      Scored(64, 100, {16, 32})};
  auto plan = PlanCompaction(*kvzip, Layers(layer0, upper), In(32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->groups.size(), 3u);
  ASSERT_EQ(plan->copy.size(), 3u);
  std::vector<int32_t> low = Range(0, 16), high = Range(16, 32), window = Range(48, 64);
  low.insert(low.end(), window.begin(), window.end());
  high.insert(high.end(), window.begin(), window.end());
  EXPECT_EQ(plan->groups[0].members, low);
  EXPECT_EQ(plan->groups[1].members, low);
  EXPECT_EQ(plan->groups[2].members, high);
  EXPECT_EQ(Positions(plan->groups[2]).front(), 116);
  // Output block 0 is source block 0 in layers 0-1 but block 1 in layer 2:
  // copied in every layer. Block 1 is the window everywhere: shared.
  EXPECT_EQ(plan->shared, (std::vector<int64_t>{-1, 3}));
  EXPECT_EQ(plan->copy[0].members, Range(0, 16));
  EXPECT_EQ(plan->copy[1].members, Range(0, 16));
  EXPECT_EQ(plan->copy[2].members, Range(16, 32));
  EXPECT_EQ(plan->copy[2].slots.size(), 16u);

  // Without select=layer the same policy decides by layer 0's records for
  // all; each layer's output records are its own (here: their positions).
  auto uniform = Policy("kvzip", {{"window.size", "16"}, {"sinks.count", "0"}});
  const std::vector<std::vector<SlotRecord>> moved = {Scored(64, 1000, {16, 32}),
                                                      Scored(64, 2000, {16, 32})};
  plan = PlanCompaction(*uniform, Layers(layer0, moved), In(32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->groups.size(), 3u);
  EXPECT_EQ(plan->groups[2].members, low);
  EXPECT_EQ(Positions(plan->groups[2]).front(), 2000);
  EXPECT_EQ(Positions(plan->groups[1]).back(), 1063);
  EXPECT_EQ(plan->shared, (std::vector<int64_t>{0, 3}));  // all layers agree now
  ExpectConsistent(*plan);

  // Records of another length than layer 0's are a bug, not a plan.
  EXPECT_EQ(PlanCompaction(*kvzip, Layers(layer0, {Slots(63), Slots(64)}), In(32)).status().code(),
            absl::StatusCode::kInternal);
}

// One shape per output block for all layers: the median of the layers'
// formats, ties to the finer. Here every layer keeps slots 0..15 and 32..47
// and requantizes its colder block: layers 0 and 1 the second, layer 2 the
// first, so the second goes to int4 and the first stays f16 (and is shared).
TEST(PlanCompactionTest, PerLayerFormatsAreTheMedianOverLayers) {
  using F = kernels::PageFormat;
  auto kvzip = Policy("kvzip", {{"select", "layer"}, {"window.size", "0"}, {"sinks.count", "0"},
                                {"cold.format", "int4"}, {"cold.fraction", "0.5"}});
  const auto l0 = Scored(64, 0, {0, 16}, {32, 48});
  const std::vector<std::vector<SlotRecord>> upper = {Scored(64, 0, {0, 16}, {32, 48}),
                                                      Scored(64, 0, {32, 48}, {0, 16})};
  auto plan = PlanCompaction(*kvzip, Layers(l0, upper), In(32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<int32_t> kept = Range(0, 16), second = Range(32, 48);
  kept.insert(kept.end(), second.begin(), second.end());
  EXPECT_EQ(plan->groups[0].members, kept);
  EXPECT_EQ(plan->groups[2].members, kept);
  EXPECT_EQ(plan->groups[0].block_v_formats, (std::vector<F>{F::kF16, F::kInt4}));
  for (const CompactionGroups& g : plan->groups) {
    EXPECT_EQ(g.block_v_formats, plan->groups[0].block_v_formats);
  }
  EXPECT_EQ(plan->shared, (std::vector<int64_t>{0, -1}));
  EXPECT_EQ(plan->copy[2].block_v_formats, std::vector<F>{F::kInt4});
  EXPECT_EQ(plan->copy[2].members, Range(32, 48));
}

// Right-aligned per-layer counts: the largest budget stays, every other is
// rounded to the nearest count that differs from it by whole blocks (at
// least a block, at most what the layer holds).
TEST(AlignLayerBudgetsTest, CountsDifferByWholeBlocks) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(AlignLayerBudgets({56, 16}, {68, 68}, kBt).value(), (V{56, 24}));  // 8 -> a block
  EXPECT_EQ(AlignLayerBudgets({40, 40}, {68, 68}, kBt).value(), (V{40, 40}));
  EXPECT_EQ(AlignLayerBudgets({64, 50}, {100, 100}, kBt).value(), (V{64, 48}));
  EXPECT_EQ(AlignLayerBudgets({64, 57}, {100, 100}, kBt).value(), (V{64, 64}));
  EXPECT_EQ(AlignLayerBudgets({10, 3}, {68, 68}, kBt).value(), (V{10, 10}));  // under a block
  EXPECT_EQ(AlignLayerBudgets({80, 20}, {68, 68}, kBt).value(), (V{68, 20}));  // capped first
  // 32 slots pinned in every layer: a block past them at least.
  EXPECT_EQ(AlignLayerBudgets({80, 20}, {100, 100}, kBt, 32).value(), (V{80, 48}));
  EXPECT_EQ(AlignLayerBudgets({40, 20}, {100, 100}, kBt, 32).value(), (V{40, 40}));  // top
  // A layer of 8 slots cannot hold 100 - 16k of them.
  EXPECT_EQ(AlignLayerBudgets({100, 8}, {100, 8}, kBt).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// layers=importance: one threshold over all layers' importance sets each
// layer's count; the table is right-aligned (a layer that keeps fewer starts
// whole blocks later, its records there placeholders), and a block is shared
// only where the layers that hold it are the ones its source block held.
TEST(PlanCompactionTest, ImportanceBudgetsRightAlignTheLayers) {
  auto kvzip = Policy("kvzip", {{"select", "layer"}, {"layers", "importance"},
                                {"window.size", "16"}, {"sinks.count", "0"}});
  // 16 important slots in layer 0 (and 16 next, its newest), 48 in layer 1,
  // 16 in layer 2: the 96 to keep.
  const auto l0 = Scored(64, 0, {0, 16}, {48, 64});
  const std::vector<std::vector<SlotRecord>> upper = {Scored(64, 0, {0, 48}),
                                                      Scored(64, 0, {16, 32})};
  auto plan = PlanCompaction(*kvzip, Layers(l0, upper), In(32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 80 slots score 3 and layer 0's newest 16 score 2: 32, 48, 16.
  EXPECT_EQ(plan->num_out, 48u);
  EXPECT_EQ(plan->layer_holes, (std::vector<LayerHole>{{0, 16}, {}, {0, 32}}));
  ASSERT_EQ(plan->records.size(), 3u);
  for (const auto& r : plan->records) ASSERT_EQ(r.size(), 48u);
  std::vector<int64_t> want0(16, -1);
  for (int64_t p = 0; p < 16; ++p) want0.push_back(p);
  for (int64_t p = 48; p < 64; ++p) want0.push_back(p);
  std::vector<int64_t> got0;
  for (const SlotRecord& r : plan->records[0]) got0.push_back(r.meta.position);
  EXPECT_EQ(got0, want0);
  EXPECT_EQ(plan->records[2][31].meta.position, -1);
  EXPECT_EQ(plan->records[2][32].meta.position, 48);  // the window fills layer 2's 16
  // Block 2 is source block 3 (the window) in all three layers: shared.
  // Block 1 holds no layer 2 while source block 0 did: copied, as block 0.
  EXPECT_EQ(plan->shared, (std::vector<int64_t>{-1, -1, 3}));
  EXPECT_EQ(plan->copy[0].members, Range(0, 16));
  EXPECT_EQ(plan->copy[1].num_out(), 32u);
  EXPECT_EQ(plan->copy[2].num_out(), 0u);
  EXPECT_EQ(plan->block_k_formats.size(), 3u);

  // The next compaction reads each layer from its offset on (members are
  // the layer's own slot indices), after 16 new slots in every layer.
  std::vector<std::vector<SlotRecord>> next = plan->records;
  for (auto& r : next) {
    for (const SlotRecord& s : Slots(16, 64)) r.push_back(s);
    for (SlotRecord& s : r) s.score[ScoreStream::kImportance] = s.meta.position < 0 ? NAN : 0.1f;
  }
  CompactionInputs in = In(32);
  in.layer_holes = plan->layer_holes;
  auto again = PlanCompaction(*kvzip, next, in);
  ASSERT_TRUE(again.ok()) << again.status();
  const std::vector<const CompactionGroups*> groups = {
      &again->groups[0], &again->groups[1], &again->groups[2]};
  for (size_t l = 0; l < 3; ++l) {
    const int held = 64 - int(in.layer_holes[l].length);
    for (int32_t m : groups[l]->members) EXPECT_LT(m, held) << "layer " << l;
    const LayerHole& hole = again->layer_holes[l];
    EXPECT_EQ(again->num_out - hole.length, groups[l]->num_out());
    EXPECT_EQ(hole.start % kBt, 0u);
    EXPECT_EQ(hole.length % kBt, 0u);
    for (size_t i = 0; i < again->num_out; ++i) {
      EXPECT_EQ(again->records[l][i].meta.position < 0, !hole.holds(i)) << l << " " << i;
    }
  }
  // A layer-uniform policy cannot compact layers that start apart.
  auto uniform = Policy("kvzip", {{"window.size", "16"}, {"sinks.count", "0"}});
  EXPECT_EQ(PlanCompaction(*uniform, next, in).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Every layer of `plan` holds slots 0..15 (positions 0..15) in place, then
// its hole (placeholders), then the rest up to position `newest` - 1.
void ExpectPrefixInPlace(const CompactionPlan& plan, int64_t newest) {
  ASSERT_EQ(plan.records.size(), plan.layer_holes.size());
  for (size_t l = 0; l < plan.records.size(); ++l) {
    const LayerHole& hole = plan.layer_holes[l];
    const auto& r = plan.records[l];
    ASSERT_EQ(r.size(), plan.num_out);
    EXPECT_TRUE(hole.empty() || (hole.start == 16u && hole.length % kBt == 0)) << l;
    EXPECT_LT(hole.end(), plan.num_out) << l;
    for (size_t i = 0; i < r.size(); ++i) {
      if (i < 16) EXPECT_EQ(r[i].meta.position, int64_t(i)) << l;
      EXPECT_EQ(r[i].meta.position < 0, !hole.holds(i)) << l << " slot " << i;
    }
    EXPECT_EQ(r.back().meta.position, newest - 1) << l;
  }
}

// A shared prefix (its slots pinned in every layer) stays in its blocks:
// each layer's hole follows it, so the prefix block is reused in place, not
// copied, and the next compaction, over those holes, keeps it there.
TEST(PlanCompactionTest, APinnedPrefixStaysInPlaceBeforeTheLayersHoles) {
  auto kvzip = Policy("kvzip", {{"select", "layer"}, {"layers", "importance"},
                                {"window.size", "16"}, {"sinks.count", "0"}});
  auto pin = [](std::vector<SlotRecord> s) {
    for (int i = 0; i < kBt; ++i) s[i].meta.pinned = true;
    return s;
  };
  // Besides the prefix and the window (64..79), layer 0 values 16..31 and
  // layer 1 16..47: layers 0 and 2 keep fewer slots than layer 1.
  const auto l0 = pin(Scored(80, 0, {16, 32}));
  const std::vector<std::vector<SlotRecord>> upper = {pin(Scored(80, 0, {16, 48})),
                                                      pin(Scored(80, 0, {0, 0}))};
  auto plan = PlanCompaction(*kvzip, Layers(l0, upper), In(48));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectPrefixInPlace(*plan, 80);
  EXPECT_TRUE(plan->layer_holes[1].empty());
  EXPECT_FALSE(plan->layer_holes[0].empty());
  EXPECT_FALSE(plan->layer_holes[2].empty());
  // Block 0 is the prefix in every layer: reused, not copied.
  EXPECT_EQ(plan->shared[0], 0);
  for (const CompactionGroups& c : plan->copy) {
    for (int32_t m : c.members) EXPECT_GE(m, 16);
  }

  // 16 new slots; the next compaction reads each layer's held slots around
  // its hole and keeps the prefix in place again.
  std::vector<std::vector<SlotRecord>> next = plan->records;
  for (auto& r : next) {
    for (const SlotRecord& s : Slots(16, 80)) r.push_back(s);
    for (SlotRecord& s : r) s.score[ScoreStream::kImportance] = s.meta.position < 0 ? NAN : 0.1f;
  }
  CompactionInputs in = In(32);
  in.layer_holes = plan->layer_holes;
  auto again = PlanCompaction(*kvzip, next, in);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectPrefixInPlace(*again, 96);
  EXPECT_EQ(again->shared[0], 0);
  for (size_t l = 0; l < 3; ++l) {
    for (int32_t m : again->groups[l].members) {
      EXPECT_LT(m, 96 - int(in.layer_holes[l].length)) << "layer " << l;
    }
  }
}

}  // namespace
}  // namespace polykv::daemon
