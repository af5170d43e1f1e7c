// The daemon half of the policy engine: compaction at Sync, epochs with
// pending old pages until Ack, ReportSlots validation, the pressure ladder,
// and the executor's plan lowering — on a KvPool with a fake clock and real
// memfd arenas mapped into the test (the test plays the worker).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "daemon/compaction/executor.h"
#include "daemon/compaction/pressure_ladder.h"
#include "daemon/pool/kv_pool.h"
#include "kernels/ops.h"
#include "tests/unit/daemon/paged_session_fixture.h"

namespace polykv::daemon {
namespace {

class CompactionTest : public PagedSessionTest {};

TEST_F(CompactionTest, BudgetCompactionPublishesNewEpochAndOldPagesWaitForAck) {
  SetQos("a", "window", 32);
  Sess s = Open("a");
  auto events = pool_->Watch(s.id, s.token, peer_);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_TRUE(Append(s, 30).ok());
  auto changed = Sync(s);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);  // under budget + 10%
  ASSERT_TRUE(Append(s, 18).ok());  // 48 > 32 + 3
  const uint64_t before = pool_->used_bytes();
  ASSERT_TRUE(Sync(s, /*ack=*/false).value());
  EXPECT_EQ(s.epoch, 1u);
  EXPECT_FALSE(s.same_slots);
  EXPECT_EQ(s.committed, 32u);
  // Watchers hear of the new epoch.
  auto e = (*events)->Next(absl::ZeroDuration());
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, SessionEventMsg::Type::kEpoch);
  EXPECT_EQ(e->epoch, 1u);
  // window keeps the most recent 32 positions, in order.
  for (uint64_t i = 0; i < s.committed; ++i) EXPECT_EQ(s.positions[i], int64_t(16 + i));
  // Window dropped block 0 exactly: the new table shares blocks 1 and 2 (no
  // copy, no new pages); block 0 stays allocated until the ack.
  const uint64_t block_bytes = 2ull * kLayers * kBlock * kHeads * kDim * 4;
  EXPECT_EQ(pool_->pending_bytes(), block_bytes);
  EXPECT_EQ(pool_->used_bytes(), before);
  EXPECT_EQ(pool_->Stats().compaction_shared_blocks, 2u);
  Check();
  ASSERT_TRUE(pool_->Ack(s.id, s.token, peer_, 1).ok());
  EXPECT_EQ(pool_->pending_bytes(), 0u);
  EXPECT_EQ(pool_->used_bytes(), 2 * block_bytes);
  Check();
  // The worker continues in the new tables; the next compaction is epoch 2:
  // 52 slots, 20 over budget -> two blocks' worth evicted.
  ASSERT_TRUE(Append(s, 20).ok());
  ASSERT_TRUE(Sync(s).value());
  EXPECT_EQ(s.epoch, 2u);
  EXPECT_EQ(s.committed, 20u);
  EXPECT_EQ(s.positions.back(), 67);
  PoolSummary st = pool_->Stats();
  ASSERT_EQ(st.compactions_by_policy.size(), 1u);
  EXPECT_EQ(st.compactions_by_policy[0], (std::pair<std::string, uint64_t>{"window", 2}));
  EXPECT_EQ(st.evicted_tokens_by_policy[0].second, 16u + 32u);
  ASSERT_TRUE(pool_->Close(s.id, s.token, peer_).ok());
  EXPECT_EQ(pool_->used_bytes(), 0u);
  Check();
}

// budget_fraction: the session keeps a share of what it has seen, so its
// budget grows as it does (budget_tokens its floor); a bad fraction is
// refused and leaves the QoS as it was.
TEST_F(CompactionTest, FractionalBudgetGrowsWithTheSessionAndBadFractionsAreRefused) {
  QosRecord q;
  q.agent_id = "a";
  q.policy = "window";
  q.budget_tokens = 32;  // the floor
  q.budget_fraction = 0.5;
  ASSERT_TRUE(pool_->SetQos(q).ok());
  for (double bad : {-0.1, 1.5, std::nan(""), HUGE_VAL}) {
    QosRecord b = q;
    b.budget_fraction = bad;
    auto r = pool_->SetQos(b);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("budget_fraction"), absl::string_view::npos);
  }
  EXPECT_EQ(pool_->GetQos("a").budget_fraction, 0.5);
  Sess s = Open("a");
  // 48 seen: the budget is the floor, 32; 48 > 32 + 3 -> one block goes.
  ASSERT_TRUE(Append(s, 48).ok());
  ASSERT_TRUE(Sync(s).value());
  EXPECT_EQ(s.committed, 32u);
  // 96 seen, 80 held: budget 48, 80 > 48 + 4 -> two blocks go.
  ASSERT_TRUE(Append(s, 48).ok());
  ASSERT_TRUE(Sync(s).value());
  EXPECT_EQ(s.committed, 48u);
  EXPECT_EQ(s.positions.front(), 48);
  // 104 seen, 56 held: budget 52, within its 10% margin.
  ASSERT_TRUE(Append(s, 8).ok());
  EXPECT_FALSE(Sync(s).value());
  // 200 seen, 152 held: budget 100 -> 52 over, four blocks.
  ASSERT_TRUE(Append(s, 96).ok());
  ASSERT_TRUE(Sync(s).value());
  EXPECT_EQ(s.committed, 88u);
  EXPECT_EQ(s.positions.back(), 199);
  Check();
}

TEST_F(CompactionTest, WorkerThatNeverAcksKeepsOldPagesUntilSessionEnds) {
  SetQos("a", "streaming", 32);
  Sess s = Open("a");
  ASSERT_TRUE(Append(s, 64).ok());
  ASSERT_TRUE(Sync(s, /*ack=*/false).value());
  const uint64_t pending = pool_->pending_bytes();
  EXPECT_GT(pending, 0u);
  // Over budget again, but epoch 1 is unacknowledged: no epoch 2, pages kept.
  ASSERT_TRUE(Append(s, 40).ok());
  EXPECT_FALSE(Sync(s, false).value());
  EXPECT_EQ(s.epoch, 1u);
  EXPECT_EQ(pool_->pending_bytes(), pending);
  Check();
  // Bad acks change nothing.
  EXPECT_EQ(pool_->Ack(s.id, s.token, peer_, 7).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_->pending_bytes(), pending);
  // The lease runs out: everything, pending pages included, is reclaimed.
  clock_.now += absl::Seconds(5);
  EXPECT_EQ(pool_->ReclaimExpired().size(), 1u);
  EXPECT_EQ(pool_->used_bytes(), 0u);
  EXPECT_EQ(pool_->pending_bytes(), 0u);
  Check();
}

TEST_F(CompactionTest, H2oKeepsReportedHeavyHittersAndPinnedSlots) {
  SetQos("a", "h2o", 32);
  Sess s = Open("a");
  ASSERT_TRUE(Append(s, 60).ok());
  std::vector<float> attn(60, 0.01f);
  attn[5] = 50.f;
  attn[9] = 40.f;
  ReportSlotsRequest r;
  r.epoch = 0;
  r.first_slot = 0;
  Values(r, ScoreStream::kAttention) = attn;
  r.slots.resize(3);
  r.slots[2].pinned = true;  // slot 2
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, r).ok());
  ASSERT_TRUE(Sync(s).value());
  EXPECT_EQ(s.committed, 28u);  // 60 - 32: whole blocks' worth evicted
  std::set<int64_t> kept(s.positions.begin(), s.positions.end());
  EXPECT_TRUE(kept.contains(5));
  EXPECT_TRUE(kept.contains(9));
  EXPECT_TRUE(kept.contains(2));
  EXPECT_TRUE(kept.contains(59));  // the recent window
  Check();
}

// H2O with decay (h2o.decay): at each attention report the daemon ages what
// it holds by decay^(tokens committed since the last report), so slots 0..19,
// heavy 20 tokens ago (1.0 each), rank below slots 20..39, attended now (0.5
// each) -- undecayed, the other way round. Either way the window keeps the
// newest and as many slots go to the heaviest.
TEST_F(CompactionTest, DecayedH2oAgesHeldMassByTheTokensCommittedSinceTheLastReport) {
  std::vector<int> heavy;  // slots kept of the heavier half, per policy
  for (const char* policy : {"h2o", "h2o{h2o.decay=0.9}"}) {
    const bool decayed = std::string_view(policy) != "h2o";
    SetQos("a", policy, 32);
    Sess s = Open("a");
    EXPECT_FLOAT_EQ(s.wants.attention_decay, decayed ? 0.9f : 1.f) << policy;
    ASSERT_TRUE(Append(s, 40).ok());
    ReportSlotsRequest first;
    Values(first, ScoreStream::kAttention).assign(40, 0.f);
    std::fill_n(Values(first, ScoreStream::kAttention).begin(), 20, 1.f);
    ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, first).ok());
    ASSERT_TRUE(Append(s, 20).ok());
    ReportSlotsRequest now;
    Values(now, ScoreStream::kAttention).assign(60, 0.f);
    std::fill_n(Values(now, ScoreStream::kAttention).begin() + 20, 20, 0.5f);
    ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, now).ok());
    ASSERT_TRUE(Sync(s).value());
    ASSERT_EQ(s.committed, 28u) << policy;
    int old_heavy = 0, new_heavy = 0;
    for (int64_t p : s.positions) {
      old_heavy += p < 20;
      new_heavy += p >= 20 && p < 40;
    }
    EXPECT_EQ(decayed ? old_heavy : new_heavy, 0) << policy;
    heavy.push_back(decayed ? new_heavy : old_heavy);
    Check();
    ASSERT_TRUE(pool_->Close(s.id, s.token, peer_).ok());
  }
  EXPECT_GT(heavy[0], 0);
  EXPECT_EQ(heavy[1], heavy[0]);
}

// Requantization (issue 12, item 3): a policy's cold block gets new pages in
// the coarser format, the tables say so per block, the session's bytes drop
// by the difference, and the slots decode to their rows as that format
// encodes them (VerifyContent). Slots 0..15 are the least attended (evicted
// at the 48-token budget), 16..31 the coldest kept: a third of what is kept.
TEST_F(CompactionTest, ColdBlocksAreRequantizedIntoNewPagesOfTheirFormat) {
  SetQos("a", "h2o{cold.format=int4,cold.fraction=0.34}", 48);
  Sess s = Open("a");
  ASSERT_TRUE(Append(s, 64).ok());
  std::vector<float> attn(64);
  for (int i = 0; i < 64; ++i) attn[i] = i < 16 ? 0.f : i < 32 ? 1.f : 10.f;
  ReportSlotsRequest r;
  Values(r, ScoreStream::kAttention) = attn;
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, r).ok());
  ASSERT_TRUE(Sync(s).value());  // verifies every slot's content
  ASSERT_EQ(s.committed, 48u);
  EXPECT_EQ(s.positions.front(), 16);
  using F = kernels::PageFormat;
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(s.blocks[0].pages[2 * l].format, F::kF32);
    EXPECT_EQ(s.blocks[0].pages[2 * l + 1].format, F::kInt4);
    for (size_t b = 1; b < s.blocks.size(); ++b) {
      EXPECT_EQ(s.blocks[b].pages[2 * l + 1].format, F::kF32) << "block " << b;
    }
  }
  const kernels::PageShape shape{kBlock, kHeads, kDim};
  const uint64_t f32_page = kernels::PageBytes(F::kF32, kernels::KvKind::kKey, shape);
  const uint64_t int4_page = kernels::PageBytes(F::kInt4, kernels::KvKind::kValue, shape);
  EXPECT_EQ(s.blocks[0].pages[1].size_bytes, int4_page);
  EXPECT_EQ(pool_->used_bytes(), kLayers * (3 * f32_page + 2 * f32_page + int4_page));
  EXPECT_EQ(pool_->pending_bytes(), 0u);
  Check();
  // The worker goes on appending in f32 (4 more: under budget + 10%).
  ASSERT_TRUE(Append(s, 4).ok());
  EXPECT_EQ(s.blocks.size(), 4u);
  EXPECT_EQ(s.blocks[3].pages[1].format, F::kF32);
  Check();
  ASSERT_TRUE(pool_->Close(s.id, s.token, peer_).ok());
  EXPECT_EQ(pool_->used_bytes(), 0u);
  Check();
}

// Merging policies cluster by key similarity, and the daemon reads the keys
// from the session's pages (issue 12, item 4). Keys of even positions point
// along channel 0, odd ones along channel 1: merges happen (without keys
// every slot would be its own group, i.e. eviction) and never mix parities,
// so a merged key is still exactly one channel.
TEST_F(CompactionTest, MergingPoliciesReadKeysFromThePages) {
  pattern_ = [](int64_t pos, int layer, bool value, int h, int d) {
    if (value) return Pattern(pos, layer, value, h, d);
    return d == int(pos % 2) ? 1.f : 0.f;
  };
  SetQos("a", "merge{window.size=8}", 32);
  Sess s = Open("a");
  ASSERT_TRUE(Append(s, 64).ok());
  ReportSlotsRequest r;
  r.slots.resize(64);
  for (auto& m : r.slots) m.tag.block_id = 1;  // one structural block: merges may happen
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, r).ok());
  ASSERT_TRUE(Sync(s).value());
  EXPECT_EQ(s.committed, 32u);
  EXPECT_GT(pool_->Stats().merged_tokens_by_policy.at(0).second, 0u);
  const kernels::PageShape shape{kBlock, kHeads, kDim};
  std::vector<float> rows(kBlock * kHeads * kDim);
  int merged = 0;
  for (size_t slot = 0; slot < s.committed; ++slot) {
    if (s.counts[slot] == 1) continue;
    ++merged;
    const PageDesc& page = s.blocks[slot / kBlock].pages[0];
    ASSERT_TRUE(kernels::DequantizePage(kernels::Exec{}, shape, kernels::KvKind::kKey, page.format,
                                        Addr(page), kBlock, rows.data())
                    .ok());
    const float* k = rows.data() + (slot % kBlock) * kHeads * kDim;
    const int parity = int(s.positions[slot] % 2);
    EXPECT_NEAR(k[parity], 1.f, 1e-5) << "slot " << slot;
    EXPECT_EQ(k[1 - parity], 0.f) << "slot " << slot << " merged keys of both parities";
  }
  EXPECT_GT(merged, 0);
  Check();
}

uint64_t TotalMergedTokens(const KvPool& pool) {
  uint64_t n = 0;
  for (const auto& [name, tokens] : pool.Stats().merged_tokens_by_policy) n += tokens;
  return n;
}

// merge.bias=0: the same merges, but the worker is told every slot counts
// once (its attention then adds no log-count bias), as the plan says.
TEST_F(CompactionTest, MergeWithoutBiasSendsCountsOfOne) {
  pattern_ = [](int64_t pos, int layer, bool value, int h, int d) {
    if (value) return Pattern(pos, layer, value, h, d);
    return d == int(pos % 2) ? 1.f : 0.f;
  };
  for (const char* policy : {"merge{window.size=8}", "merge{window.size=8,merge.bias=0}"}) {
    const std::string agent = absl::StrCat("a", std::string(policy).size());
    SetQos(agent, policy, 32);
    Sess s = Open(agent);
    ASSERT_TRUE(Append(s, 64).ok());
    ReportSlotsRequest r;
    r.slots.resize(64);
    for (auto& m : r.slots) m.tag.block_id = 1;
    ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, r).ok());
    const uint64_t merged_before = TotalMergedTokens(*pool_);
    // Not the fixture's Sync: its content check tells merged slots by their
    // counts, which are what this test takes away.
    auto reply = pool_->Sync(s.id, s.token, peer_, s.epoch);
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_TRUE(reply->changed) << policy;
    EXPECT_EQ(reply->committed_tokens, 32u) << policy;
    ASSERT_EQ(reply->slot_counts.size(), 32u);
    EXPECT_GT(TotalMergedTokens(*pool_), merged_before) << policy << ": merged nothing";
    const bool bias = std::string(policy).find("merge.bias=0") == std::string::npos;
    const uint32_t most = *std::max_element(reply->slot_counts.begin(), reply->slot_counts.end());
    if (bias) {
      EXPECT_GT(most, 1u) << policy;
    } else {
      EXPECT_EQ(most, 1u) << policy;
    }
    ASSERT_TRUE(pool_->Ack(s.id, s.token, peer_, reply->epoch).ok());
  }
  Check();
}

// The worker's intent probe (the intent stream) is what `intent` ranks by;
// slots committed after the probe have none yet and rank with the most
// relevant (they are the turn in progress), not below everything.
TEST_F(CompactionTest, IntentKeepsTheSlotsMostRelevantToTheReportedIntent) {
  SetQos("a", "intent", 32);
  Sess s = Open("a");
  ASSERT_TRUE(Append(s, 60).ok());
  ReportSlotsRequest r;
  r.slots.resize(60);
  for (int i = 0; i < 60; ++i) r.slots[i].turn = i / 8;  // 8 turns: past intent.min_turns
  Values(r, ScoreStream::kIntent).assign(56, 0.01f);  // slots 56..59: after the probe
  for (int i = 20; i < 28; ++i) Values(r, ScoreStream::kIntent)[i] = 5.f;
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, r).ok());
  ASSERT_TRUE(Sync(s).value());
  EXPECT_EQ(s.committed, 28u);
  std::set<int64_t> kept(s.positions.begin(), s.positions.end());
  for (int64_t p : {0, 1, 2, 3}) EXPECT_TRUE(kept.contains(p)) << "sink " << p;
  for (int64_t p = 20; p < 28; ++p) EXPECT_TRUE(kept.contains(p)) << "relevant " << p;
  for (int64_t p = 56; p < 60; ++p) EXPECT_TRUE(kept.contains(p)) << "newer than the probe " << p;
  Check();
  // A later report replaces the relevance: now 40..47 matter, and the kept
  // slots of the old intent are no longer special.
  ASSERT_TRUE(Append(s, 24).ok());  // 52 slots
  ReportSlotsRequest next;
  next.epoch = s.epoch;
  Values(next, ScoreStream::kIntent).assign(52, 0.01f);
  for (size_t i = 0; i < 52; ++i) {
    if (s.positions.size() > i && s.positions[i] >= 60 && s.positions[i] < 68) {
      Values(next, ScoreStream::kIntent)[i] = 9.f;
    }
  }
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, next).ok());
  ASSERT_TRUE(Sync(s).value());
  std::set<int64_t> kept2(s.positions.begin(), s.positions.end());
  for (int64_t p = 60; p < 68; ++p) EXPECT_TRUE(kept2.contains(p)) << "relevant now " << p;
  Check();
}

// `kvzip` ranks by the importance the worker's reconstruction probes report
// (the importance stream); each slot keeps the most it was ever given, and
// slots no probe scored yet rank with the most important.
// An operator switches the agent's policy mid-session: the next Sync tells
// the worker which score streams the new policy reads.
TEST_F(CompactionTest, AQosChangeMidSessionChangesTheStreamsSyncAsksFor) {
  SetQos("a", "h2o", 0);
  Sess s = Open("a");
  EXPECT_FALSE(s.wants.has(ScoreStream::kImportance));
  auto r = pool_->Sync(s.id, s.token, peer_, s.epoch);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->wants.streams, policies::StreamSet{ScoreStream::kAttention});
  SetQos("a", "kvzip", 0);
  r = pool_->Sync(s.id, s.token, peer_, s.epoch);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->wants.has(ScoreStream::kImportance));
  EXPECT_FALSE(r->wants.has(ScoreStream::kObservation));
  SetQos("a", "snapkv", 0);
  r = pool_->Sync(s.id, s.token, peer_, s.epoch);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->wants.has(ScoreStream::kImportance));
  EXPECT_TRUE(r->wants.has(ScoreStream::kObservation));
  EXPECT_FALSE(r->changed);
  Check();
}

TEST_F(CompactionTest, KvzipKeepsTheSlotsItsReconstructionFoundImportant) {
  SetQos("a", "kvzip{window.size=4}", 32);
  SetQos("b", "h2o", 32);
  Sess s = Open("a");
  EXPECT_TRUE(s.wants.has(ScoreStream::kImportance));
  EXPECT_FALSE(Open("b").wants.has(ScoreStream::kImportance));
  ASSERT_TRUE(Append(s, 60).ok());
  ReportSlotsRequest r;
  // slots 52..59: after the last probe
  Values(r, ScoreStream::kImportance).assign(52, 0.01f);
  for (int i = 10; i < 18; ++i) Values(r, ScoreStream::kImportance)[i] = 2.f;
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, r).ok());
  // A later, smaller value for 10..17 does not lower them; 30..33 rise.
  ReportSlotsRequest later;
  later.first_slot = 10;
  Values(later, ScoreStream::kImportance).assign(24, 0.f);
  for (int i = 20; i < 24; ++i) {
    Values(later, ScoreStream::kImportance)[i] = 3.f;  // slots 30..33
  }
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, later).ok());
  ASSERT_TRUE(Sync(s).value());
  // 28 slots (as for `intent` above): 4 sinks, the 4-slot window (56..59),
  // the unscored 52..55, the 12 important ones, and the 4 most recent of the
  // tied rest (48..51).
  EXPECT_EQ(s.committed, 28u);
  std::set<int64_t> kept(s.positions.begin(), s.positions.end());
  for (int64_t p : {0, 1, 2, 3}) EXPECT_TRUE(kept.contains(p)) << "sink " << p;
  for (int64_t p = 10; p < 18; ++p) EXPECT_TRUE(kept.contains(p)) << "important " << p;
  for (int64_t p = 30; p < 34; ++p) EXPECT_TRUE(kept.contains(p)) << "raised later " << p;
  for (int64_t p = 52; p < 60; ++p) EXPECT_TRUE(kept.contains(p)) << "not scored yet " << p;
  EXPECT_FALSE(kept.contains(40));
  Check();
}

// A layer-uniform plan moves every layer's pages, however many the model
// has (a plan over one record list has one layer offset for all of them).
TEST_F(CompactionTest, ALayerUniformPlanCompactsEveryLayer) {
  SetQos("a", "window", 32);
  Sess s = Open("a", 5);
  ASSERT_TRUE(Append(s, 60).ok());
  ASSERT_TRUE(Sync(s).value());
  EXPECT_EQ(s.committed, 28u);
  for (const BlockDesc& b : s.blocks) EXPECT_EQ(b.pages.size(), 10u);
  Check();
}

// A policy that ranks by importance waits for the worker's first report: a
// worker that runs no reconstruction probes keeps its session whole rather
// than have it cut by scores that are all unknown.
TEST_F(CompactionTest, ImportancePoliciesWaitForTheFirstReport) {
  SetQos("a", "kvzip{select=layer,layers=importance,window.size=16}", 32);
  Sess s = Open("a");
  ASSERT_TRUE(Append(s, 60).ok());  // 60 > 32 + 3
  EXPECT_FALSE(Sync(s).value());
  EXPECT_EQ(s.committed, 60u);
  ReportSlotsRequest attention;  // another stream does not count
  Values(attention, ScoreStream::kAttention).assign(60, 1.f);
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, attention).ok());
  EXPECT_FALSE(Sync(s).value());
  ReportSlotsRequest r;
  Values(r, ScoreStream::kImportance, true).assign(kLayers * 60, 1.f);
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, r).ok());
  ASSERT_TRUE(Sync(s).value());
  EXPECT_LE(s.committed, 32u);
  Check();
}

// kvzip{select=layer}: each layer keeps the slots ITS reconstruction found
// important (importance reported per layer), as many in every layer, so the
// layers' pages then hold different tokens; Sync says which
// (layer_slot_positions). A later QoS without select=layer applies layer 0's
// plan to every layer, each keeping its own tokens.
TEST_F(CompactionTest, PerLayerSelectionKeepsEachLayersOwnImportantSlots) {
  SetQos("a", "kvzip{select=layer,window.size=16}", 40);
  Sess s = Open("a");
  EXPECT_TRUE(s.wants.has(ScoreStream::kImportance));
  EXPECT_TRUE(s.wants.per_layer);
  EXPECT_FALSE(Open("b").wants.per_layer);
  ASSERT_TRUE(Append(s, 60).ok());
  ReportSlotsRequest r;
  Values(r, ScoreStream::kImportance, true).assign(kLayers * 60, 0.01f);
  std::vector<float>& per_layer = Values(r, ScoreStream::kImportance, true);
  for (int i = 8; i < 24; ++i) per_layer[i] = 2.f;        // layer 0
  for (int i = 28; i < 44; ++i) per_layer[60 + i] = 2.f;  // layer 1
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, r).ok());
  Check();  // the layers' records: one per slot, each
  ASSERT_TRUE(Append(s, 8).ok());  // 68 > 40 + 4: down to 36 (whole blocks go)
  ASSERT_TRUE(Sync(s).value());    // VerifyContent checks every layer's pages
  ASSERT_EQ(s.committed, 36u);
  ASSERT_EQ(s.layer_positions.size(), kLayers * 36u);
  // 4 sinks, 16 of the layer's own important slots, the 16-slot window.
  for (int l = 0; l < kLayers; ++l) {
    std::vector<int64_t> want = {0, 1, 2, 3};
    for (int64_t p = l == 0 ? 8 : 28; p < (l == 0 ? 24 : 44); ++p) want.push_back(p);
    for (int64_t p = 52; p < 68; ++p) want.push_back(p);
    const std::vector<int64_t> got(s.layer_positions.begin() + l * 36,
                                   s.layer_positions.begin() + (l + 1) * 36);
    EXPECT_EQ(got, want) << "layer " << l;
  }
  Check();

  // New tokens go to every layer; a layer-uniform policy now decides by
  // layer 0's records and every layer keeps its slots of the same indices.
  SetQos("a", "kvzip{window.size=16}", 24);
  ASSERT_TRUE(Append(s, 20).ok());  // 56 > 24 + 2: down to 24
  ASSERT_TRUE(Sync(s).value());
  ASSERT_EQ(s.committed, 24u);
  ASSERT_EQ(s.layer_positions.size(), kLayers * 24u);  // still apart
  for (size_t i = 0; i < 24; ++i) {
    const int64_t p0 = s.position(0, i), p1 = s.position(1, i);
    // Where layer 0 keeps one of its important slots, layer 1 keeps its own.
    if (p0 >= 8 && p0 < 24) {
      EXPECT_EQ(p1, p0 + 20) << "slot " << i;
    }
    if (p0 < 4 || p0 >= 52) {
      EXPECT_EQ(p1, p0) << "slot " << i;
    }
  }
  Check();
}

// kvzip{select=layer,layers=entropy}: the worker's entropy report decides
// which layer keeps more (the most focused gets 1.2x the mean, the other
// 0.8x; IntentKV); without one the allocator falls back to depth (the top
// layer focused). Everything else equal, the two sessions come out mirrored.
TEST_F(CompactionTest, EntropyReportsSetWhichLayerKeepsMore) {
  SetQos("a", "kvzip{select=layer,layers=entropy,window.size=16}", 40);
  auto held = [&](const Sess& s, int layer) {
    int64_t n = 0;
    for (size_t i = 0; i < s.committed; ++i) n += s.position(layer, i) >= 0;
    return n;
  };
  for (bool entropy : {true, false}) {
    Sess s = Open("a");
    EXPECT_EQ(s.wants.streams,
              (policies::StreamSet{ScoreStream::kImportance, ScoreStream::kEntropy}));
    ASSERT_TRUE(Append(s, 60).ok());
    ReportSlotsRequest r;
    Values(r, ScoreStream::kImportance, true).assign(kLayers * 60, 1.f);
    if (entropy) Values(r, ScoreStream::kEntropy) = {0.5f, 3.f};  // layer 0 focused
    ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, r).ok());
    ASSERT_TRUE(Append(s, 8).ok());  // 68 > 44: down to 36 per layer on average
    ASSERT_TRUE(Sync(s).value());
    // 72 in all, 1.2 : 0.8 = 43 : 29, the smaller rounded to whole blocks
    // from the larger: 27.
    EXPECT_EQ(held(s, entropy ? 0 : 1), 43) << entropy;
    EXPECT_EQ(held(s, entropy ? 1 : 0), 27) << entropy;
    Check();
  }
}

// kvzip{select=layer,layers=importance}: one importance threshold over both
// layers' slots sets how many each keeps, so a layer whose tokens matter
// more keeps more. The table is right-aligned: the layer that keeps fewer
// holds none of the oldest blocks (no pages there: the session's bytes
// shrink by them), and its slot positions there are -1. New tokens go to
// every layer; the next compaction starts from the late layer's offset; a
// Release that leaves it no slot and a layer-uniform policy are refused,
// changing nothing.
TEST_F(CompactionTest, ImportanceBudgetsGiveTheLayerThatNeedsMoreMoreSlots) {
  SetQos("a", "kvzip{select=layer,layers=importance,window.size=16}", 40);
  Sess s = Open("a");
  EXPECT_TRUE(s.wants.per_layer);
  ASSERT_TRUE(Append(s, 60).ok());
  ReportSlotsRequest r;
  Values(r, ScoreStream::kImportance, true).assign(kLayers * 60, 0.01f);
  std::vector<float>& per_layer = Values(r, ScoreStream::kImportance, true);
  for (int i = 8; i < 12; ++i) per_layer[i] = 2.f;       // layer 0: 4 slots
  for (int i = 4; i < 52; ++i) per_layer[60 + i] = 2.f;  // layer 1: 48 slots
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, r).ok());
  ASSERT_TRUE(Append(s, 8).ok());  // 68 > 40 + 4: 36 per layer on average, 72 in all
  const uint64_t full_block = pool_->used_bytes() / 5;  // 5 blocks of both layers
  ASSERT_TRUE(Sync(s).value());  // VerifyContent: every page a layer holds
  // The 68 slots scored 2 (the 8 unscored newest rank with the most
  // important), then 4 of the 68 tied at 0.01, shared by how many each layer
  // has (56 and 12): 3.3 and 0.7, so 15 and 57. Layer 0's count is rounded
  // to differ from 57 by whole blocks, at least a block: 25.
  ASSERT_EQ(s.committed, 57u);
  EXPECT_EQ(std::vector<int64_t>(s.layer_positions.begin(), s.layer_positions.begin() + 32),
            std::vector<int64_t>(32, -1));  // blocks 0 and 1: layer 1's only
  const std::set<int64_t> kept0(s.layer_positions.begin() + 32, s.layer_positions.begin() + 57);
  ASSERT_EQ(kept0.size(), 25u);
  for (int64_t p : {0, 1, 2, 3, 8, 9, 10, 11}) EXPECT_TRUE(kept0.contains(p)) << p;
  for (int64_t p = 52; p < 68; ++p) EXPECT_TRUE(kept0.contains(p)) << "window " << p;
  std::set<int64_t> kept1(s.layer_positions.begin() + 57, s.layer_positions.end());
  ASSERT_EQ(kept1.size(), 57u);
  for (int64_t p : {0, 1, 2, 3}) EXPECT_TRUE(kept1.contains(p)) << "sink " << p;
  for (int64_t p = 52; p < 68; ++p) EXPECT_TRUE(kept1.contains(p)) << "window " << p;
  EXPECT_EQ(std::count_if(kept1.begin(), kept1.end(), [](int64_t p) { return p >= 4 && p < 52; }),
            37);  // 36 of its 48 important ones and the tied one it won
  ASSERT_EQ(s.blocks.size(), 4u);
  for (int b = 0; b < 4; ++b) EXPECT_EQ(s.blocks[b].pages.size(), b < 2 ? 2u : 4u) << b;
  EXPECT_EQ(pool_->used_bytes(), 6 * full_block / 2);  // 6 layer-blocks of 8
  Check();

  // Refused, changing nothing: a Release that leaves layer 0 no slot, and a
  // layer-uniform policy (it would apply one plan to layers that differ).
  auto rel = pool_->Release(s.id, s.token, peer_, 32);  // layer 0 would hold none
  EXPECT_EQ(rel.status().code(), absl::StatusCode::kFailedPrecondition) << rel.status();
  EXPECT_EQ(pool_->used_bytes(), 6 * full_block / 2);
  SetQos("a", "kvzip{window.size=16}", 40);
  ASSERT_TRUE(Append(s, 30).ok());  // layers hold 87 - 32 and 87: 71 > 44 (positions to 97)
  const uint64_t before = pool_->used_bytes();
  EXPECT_FALSE(Sync(s).value());
  EXPECT_EQ(pool_->used_bytes(), before);
  Check();
  // The refusal is reported once, with its reason, and not retried (nor
  // counted) at every idle Sync until the session changes (issue 40).
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(Sync(s).value());
  EXPECT_EQ(CompactionFailures(), 1u);
  const std::vector<std::string> errors = pool_->TakeCompactionErrors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("kvzip{window.size=16}"), std::string::npos) << errors[0];
  EXPECT_TRUE(pool_->TakeCompactionErrors().empty());
  ASSERT_TRUE(Append(s, 1).ok());  // changed: tried again
  EXPECT_FALSE(Sync(s).value());
  EXPECT_EQ(CompactionFailures(), 2u);

  // Back to per-layer budgets: the next compaction reads layer 0 from its
  // offset on, and new tokens were appended to both layers alike.
  SetQos("a", "kvzip{select=layer,layers=importance,window.size=16}", 40);
  ASSERT_TRUE(Sync(s).value());
  EXPECT_LT(pool_->used_bytes(), before);
  const size_t n = s.committed;
  for (int l = 0; l < kLayers; ++l) {
    for (int64_t p = 82; p < 98; ++p) {
      EXPECT_NE(std::find(s.layer_positions.begin() + l * n, s.layer_positions.begin() + (l + 1) * n,
                          p),
                s.layer_positions.begin() + (l + 1) * n)
          << "layer " << l << " window " << p;
    }
  }
  Check();
  ASSERT_TRUE(pool_->Release(s.id, s.token, peer_, n).ok());
  // Releasing everything is allowed (no layer is left with a hole; issue 40:
  // a client resetting its session got FAILED_PRECONDITION), and the
  // session then fills again, every layer alike.
  auto all = pool_->Release(s.id, s.token, peer_, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->committed_tokens, 0u);
  EXPECT_EQ(all->reserved_tokens, 0u);
  Check();
  s.committed = 0;
  s.blocks.clear();
  s.positions.clear();
  auto refill = Append(s, 20);
  ASSERT_TRUE(refill.ok()) << refill;
  Check();
  ASSERT_TRUE(pool_->Close(s.id, s.token, peer_).ok());
  EXPECT_EQ(pool_->used_bytes(), 0u);
  Check();
}

// A compaction that finds no room for its new pages (the pool is full of
// another session's) is counted and tried again at the next Sync, though
// the session has not changed: the room depends on other sessions. (Other
// failures wait for the session to change; see the test above.)
TEST_F(CompactionTest, ACompactionWithoutRoomForItsPagesIsRetriedAtTheNextSync) {
  SetQos("a", "streaming", 32);  // 4 sinks + the newest: a new first block
  SetQos("b", "full", 0);
  Sess a = Open("a");
  ASSERT_TRUE(Append(a, 60).ok());
  Sess b = Open("b");
  while (pool_->Reserve(b.id, b.token, peer_, 16).ok()) {
  }
  EXPECT_FALSE(Sync(a).value());
  EXPECT_EQ(CompactionFailures(), 1u);
  EXPECT_FALSE(Sync(a).value());  // unchanged, and tried again
  EXPECT_EQ(CompactionFailures(), 2u);
  const std::vector<std::string> errors = pool_->TakeCompactionErrors();
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(errors[0].find("no room"), std::string::npos) << errors[0];
  ASSERT_TRUE(pool_->Close(b.id, b.token, peer_).ok());
  ASSERT_TRUE(Sync(a).value());
  EXPECT_EQ(a.committed, 28u);
  Check();
}

// `snapkv` ranks by the observation window the worker probes at the end of
// each user or tool message (the observation stream), not by the decayed
// attention; slots newer than the window rank with the most observed.
TEST_F(CompactionTest, SnapkvKeepsWhatItsObservationWindowAttended) {
  SetQos("a", "snapkv{window.size=4,snapkv.kernel=1}", 32);
  SetQos("b", "h2o", 32);
  Sess s = Open("a");
  EXPECT_TRUE(s.wants.has(ScoreStream::kObservation));
  EXPECT_FALSE(s.wants.has(ScoreStream::kImportance));
  EXPECT_FALSE(Open("b").wants.has(ScoreStream::kObservation));
  ASSERT_TRUE(Append(s, 60).ok());
  ReportSlotsRequest attention;
  Values(attention, ScoreStream::kAttention).assign(60, 0.f);
  for (int i = 20; i < 28; ++i) {
    Values(attention, ScoreStream::kAttention)[i] = 50.f;  // heavy, but not observed
  }
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, attention).ok());
  ReportSlotsRequest first;
  Values(first, ScoreStream::kObservation).assign(52, 0.01f);
  for (int i = 30; i < 34; ++i) Values(first, ScoreStream::kObservation)[i] = 5.f;
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, first).ok());
  // A later window replaces the first: 30..33 fall back among the rest.
  ReportSlotsRequest later;
  // slots 52..59: after the window
  Values(later, ScoreStream::kObservation).assign(52, 0.01f);
  for (int i = 10; i < 18; ++i) Values(later, ScoreStream::kObservation)[i] = 2.f;
  ASSERT_TRUE(pool_->ReportSlots(s.id, s.token, peer_, later).ok());
  ASSERT_TRUE(Sync(s).value());
  EXPECT_LE(s.committed, 32u);
  std::set<int64_t> kept(s.positions.begin(), s.positions.end());
  for (int64_t p = 10; p < 18; ++p) EXPECT_TRUE(kept.contains(p)) << "observed " << p;
  for (int64_t p = 52; p < 60; ++p) EXPECT_TRUE(kept.contains(p)) << "after the window " << p;
  for (int64_t p = 20; p < 28; ++p) EXPECT_FALSE(kept.contains(p)) << "only attended " << p;
  for (int64_t p = 30; p < 34; ++p) EXPECT_FALSE(kept.contains(p)) << "observed before " << p;
  Check();
}

TEST_F(CompactionTest, BadReportSlotsChangesNothing) {
  SetQos("a", "window", 32);
  Sess s = Open("a");
  ASSERT_TRUE(Append(s, 40).ok());
  auto report = [&](ReportSlotsRequest r) { return pool_->ReportSlots(s.id, s.token, peer_, r); };
  ReportSlotsRequest bad;
  bad.first_slot = 3;
  bad.slots.resize(2);
  bad.slots[0].pinned = true;  // valid, but the request fails as a whole
  bad.slots[1].role = static_cast<policies::Role>(9);
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.slots[1].role = policies::Role::kUser;
  bad.slots[1].tag.kind = static_cast<policies::BlockKind>(11);
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.slots[1].tag.kind = policies::BlockKind::kNone;
  Values(bad, ScoreStream::kAttention) = {1.f, std::nanf("")};
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  Values(bad, ScoreStream::kAttention) = {1.f, -1.f};
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  Erase(bad, ScoreStream::kAttention);
  Values(bad, ScoreStream::kIntent) = {0.5f, std::numeric_limits<float>::infinity()};
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  Erase(bad, ScoreStream::kIntent);
  Values(bad, ScoreStream::kImportance) = {0.5f, -0.5f};
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  Values(bad, ScoreStream::kImportance) = {0.5f, std::nanf("")};
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  Erase(bad, ScoreStream::kImportance);
  Values(bad, ScoreStream::kObservation) = {0.5f, -0.5f};
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  Values(bad, ScoreStream::kObservation) = {std::numeric_limits<float>::infinity()};
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  Erase(bad, ScoreStream::kObservation);
  Values(bad, ScoreStream::kImportance, true) = {0.5f, 0.5f, 0.5f};  // not [layers x n]
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  Values(bad, ScoreStream::kImportance, true) = {0.5f, 0.5f, -0.5f, 0.5f};
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  Values(bad, ScoreStream::kImportance, true) = {0.5f, 0.5f, 0.5f, 0.5f};
  Values(bad, ScoreStream::kImportance) = {0.5f, 0.5f};  // one or the other
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.scores.clear();
  Values(bad, ScoreStream::kEntropy) = {1.f};  // one per layer
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  Values(bad, ScoreStream::kEntropy) = {1.f, -1.f};
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.scores.clear();
  bad.scores.push_back({static_cast<ScoreStream>(policies::kNumScoreStreams), false, {1.f}});
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.scores.clear();
  bad.first_slot = 39;  // slots 39, 40: 40 is not committed
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.first_slot = 3;
  bad.epoch = 1;
  EXPECT_EQ(report(bad).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool_->ReportSlots(s.id, "wrong-token", peer_, bad).code(),
            absl::StatusCode::kPermissionDenied);
  Check();
  // Nothing was pinned: window keeps only the most recent (40 - 16).
  ASSERT_TRUE(Sync(s).value());
  EXPECT_EQ(s.positions.front(), 16);
  EXPECT_EQ(pool_->Stats().compaction_shared_blocks, 2u);  // no copy: blocks 1, 2 reused
  // A valid report of the new epoch pins slot 0 (position 16).
  ReportSlotsRequest ok;
  ok.epoch = s.epoch;
  ok.slots.resize(1);
  ok.slots[0].pinned = true;
  ASSERT_TRUE(report(ok).ok());
  ASSERT_TRUE(Append(s, 16).ok());
  ASSERT_TRUE(Sync(s).value());
  EXPECT_EQ(s.positions.front(), 16);
  // 40 slots, budget 32: one block's worth goes; pinned 16, then the 23 most recent.
  EXPECT_EQ(s.committed, 24u);
  EXPECT_EQ(s.positions[1], 55 - 22);
  Check();
}

TEST_F(CompactionTest, FullPolicyNeverCompactsAndUnknownPoliciesAreRefused) {
  SetQos("a", "full", 16);
  Sess s = Open("a");
  ASSERT_TRUE(Append(s, 64).ok());
  EXPECT_FALSE(Sync(s).value());
  QosRecord q;
  q.agent_id = "b";
  q.policy = "no-such-policy";
  EXPECT_EQ(pool_->SetQos(q).status().code(), absl::StatusCode::kInvalidArgument);
  q.policy = "h2o{window.size=8";
  EXPECT_EQ(pool_->SetQos(q).status().code(), absl::StatusCode::kInvalidArgument);
  q.policy = "h2o{window.size=8}";
  EXPECT_TRUE(pool_->SetQos(q).ok());
  Check();
}

TEST_F(CompactionTest, PressureLadderCompactsLowestPriorityFirstThenRefusesIt) {
  // 4 MiB pool, low watermark 512 KiB. A block of this shape is 16 KiB.
  pool_ = MakePool(4 * kMiB, kMiB / 2);
  arenas_.Reset(pool_.get());
  // Value floors at the fill format: the ladder's step 1 (requantization)
  // has nothing to do, so this is step 2 on its own.
  SetQos("low", "window", 0, Priority::kLow, 0, kernels::PageFormat::kF32);
  SetQos("mid", "window", 0, Priority::kNormal, 0, kernels::PageFormat::kF32);
  SetQos("high", "full", 0, Priority::kHigh);
  Sess lo = Open("low");
  Sess mid = Open("mid");
  Sess hi = Open("high");
  ASSERT_TRUE(Append(lo, 100 * kBlock).ok());
  ASSERT_TRUE(Append(mid, 20 * kBlock).ok());
  ASSERT_TRUE(Append(hi, 100 * kBlock).ok());
  EXPECT_TRUE(pool_->RunPressureLadder().empty());  // 576 KiB free
  ASSERT_TRUE(Append(hi, 20 * kBlock).ok());        // 256 KiB free
  // Compacting "low" (into what still fits) is expected to be enough.
  auto steps = pool_->RunPressureLadder();
  ASSERT_EQ(steps, std::vector<std::string>{"compact"});
  EXPECT_FALSE(Sync(mid).value());
  EXPECT_FALSE(Sync(hi).value());
  ASSERT_TRUE(Sync(lo).value());
  EXPECT_EQ(lo.committed, 224u);  // 90% of 256 KiB, in whole blocks
  EXPECT_EQ(lo.positions.front(), 1600 - 224);
  Check();
  // Fill up again with "high" (full: never compacted). "low" is compacted
  // down to one block; then nothing is left to compact and low's
  // reservations are refused; high's are not.
  ASSERT_TRUE(pool_->Close(mid.id, mid.token, peer_).ok());
  ASSERT_TRUE(Append(hi, 110 * kBlock).ok());
  for (int round = 0; round < 20; ++round) {
    pool_->RunPressureLadder();
    (void)Sync(lo);
    Check();
  }
  EXPECT_EQ(lo.committed, uint64_t{kBlock});
  auto r = pool_->Reserve(lo.id, lo.token, peer_, 64);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("retry"), std::string::npos) << r.status();
  EXPECT_TRUE(Append(hi, kBlock).ok());
  PoolSummary st = pool_->Stats();
  std::map<std::string, uint64_t> ladder(st.ladder_steps.begin(), st.ladder_steps.end());
  EXPECT_GE(ladder["compact"], 3u);
  EXPECT_EQ(ladder["refuse"], 1u);
  EXPECT_EQ(ladder["compaction_failed"], 0u);
  Check();
  // Memory comes back: reservations resume.
  ASSERT_TRUE(pool_->Close(hi.id, hi.token, peer_).ok());
  steps = pool_->RunPressureLadder();
  ASSERT_EQ(steps, std::vector<std::string>{"resume"});
  EXPECT_TRUE(pool_->Reserve(lo.id, lo.token, peer_, 64).ok());
  ASSERT_TRUE(pool_->Close(lo.id, lo.token, peer_).ok());
  EXPECT_EQ(pool_->used_bytes(), 0u);
  Check();
}

// Step 1 of the ladder: below the watermark the lowest-priority session is
// first asked to requantize its coldest blocks' values (int4 here: no
// floor), as many as fit in the free bytes and the watermark needs, which
// evicts nothing; a session whose value floor is its fill format is never
// requantized and is compacted instead. Under lasting pressure the ladder
// goes on until only the recent window is left in the fill format, and only
// then compacts.
TEST_F(CompactionTest, PressureLadderRequantizesColdBlocksBeforeEvicting) {
  // An 8 MiB pool, low watermark 1 MiB: room for the int4 pages' own
  // superblocks (a requantization that finds none fails and the ladder
  // compacts next round instead).
  const uint64_t pool = 8 * kMiB, low = kMiB;
  pool_ = MakePool(pool, low);
  arenas_.Reset(pool_.get());
  using F = kernels::PageFormat;
  SetQos("low", "window", 0, Priority::kLow);
  SetQos("mid", "window", 0, Priority::kNormal, 0, F::kF32);
  SetQos("high", "full", 0, Priority::kHigh);
  Sess lo = Open("low");
  Sess mid = Open("mid");
  Sess hi = Open("high");
  ASSERT_TRUE(Append(lo, 200 * kBlock).ok());
  ASSERT_TRUE(Append(mid, 20 * kBlock).ok());
  while (pool - pool_->used_bytes() >= low) ASSERT_TRUE(Append(hi, kBlock).ok());
  const size_t cold_blocks = 200 - kLadderRequantWindow / kBlock;
  // Requantized blocks of "low": a prefix (oldest first), values only.
  auto requantized = [&] {
    size_t k = 0;
    for (size_t b = 0; b < lo.blocks.size(); ++b) {
      for (int l = 0; l < kLayers; ++l) {
        EXPECT_EQ(lo.blocks[b].pages[2 * l].format, F::kF32) << "block " << b;
        EXPECT_EQ(lo.blocks[b].pages[2 * l + 1].format, lo.blocks[b].pages[1].format);
      }
      if (lo.blocks[b].pages[1].format == F::kInt4) {
        EXPECT_EQ(k, b) << "block " << b << " requantized before an older one";
        ++k;
      }
    }
    return k;
  };
  const uint64_t used = pool_->used_bytes();
  auto steps = pool_->RunPressureLadder();
  ASSERT_EQ(steps, (std::vector<std::string>{"requant", "compact"}));
  ASSERT_TRUE(Sync(lo).value());  // verifies every slot's content in its format
  EXPECT_EQ(lo.committed, 3200u);  // nothing evicted
  for (uint64_t i = 0; i < lo.committed; ++i) ASSERT_EQ(lo.positions[i], int64_t(i));
  const size_t k = requantized();
  EXPECT_GT(k, 0u);
  EXPECT_LT(k, cold_blocks);  // only what fits in the free bytes
  ASSERT_TRUE(Sync(mid).value());
  EXPECT_LT(mid.committed, 20u * kBlock);
  for (const BlockDesc& b : mid.blocks) {
    for (const PageDesc& p : b.pages) EXPECT_EQ(p.format, F::kF32);
  }
  const kernels::PageShape shape{kBlock, kHeads, kDim};
  const uint64_t f32_page = kernels::PageBytes(F::kF32, kernels::KvKind::kValue, shape);
  const uint64_t int4_page = kernels::PageBytes(F::kInt4, kernels::KvKind::kValue, shape);
  const uint64_t mid_freed = (20 - mid.blocks.size()) * kLayers * 2 * f32_page;
  EXPECT_EQ(pool_->used_bytes(), used - k * kLayers * (f32_page - int4_page) - mid_freed);
  EXPECT_EQ(pool_->pending_bytes(), 0u);
  Check();
  // Lasting pressure ("high" keeps growing): more of "low" is requantized,
  // round by round, and nothing evicted, until only its window is f32.
  ASSERT_TRUE(pool_->Close(mid.id, mid.token, peer_).ok());
  for (int round = 0; round < 50 && requantized() < cold_blocks; ++round) {
    while (pool - pool_->used_bytes() >= low) ASSERT_TRUE(Append(hi, kBlock).ok());
    ASSERT_EQ(pool_->RunPressureLadder(), std::vector<std::string>{"requant"});
    ASSERT_TRUE(Sync(lo).value());
    ASSERT_EQ(lo.committed, 3200u);
    Check();
  }
  EXPECT_EQ(requantized(), cold_blocks);
  // Nothing left to requantize: now it is compacted.
  while (pool - pool_->used_bytes() >= low) ASSERT_TRUE(Append(hi, kBlock).ok());
  ASSERT_EQ(pool_->RunPressureLadder(), std::vector<std::string>{"compact"});
  ASSERT_TRUE(Sync(lo).value());
  EXPECT_LT(lo.committed, 3200u);
  PoolSummary st = pool_->Stats();
  std::map<std::string, uint64_t> ladder(st.ladder_steps.begin(), st.ladder_steps.end());
  EXPECT_GE(ladder["requant"], 2u);
  EXPECT_EQ(ladder["compaction_failed"], 0u);
  Check();
  for (Sess* s : {&lo, &hi}) ASSERT_TRUE(pool_->Close(s->id, s->token, peer_).ok());
  EXPECT_EQ(pool_->used_bytes(), 0u);
  Check();
}

TEST(CompactionExecutorTest, LowersMergeGroupsAndAveragesTheirRows) {
  std::vector<SlotRecord> slots(5);
  for (int i = 0; i < 5; ++i) {
    slots[i].meta.position = 10 + i;
    slots[i].score[ScoreStream::kAttention] = float(i);
  }
  policies::Plan plan;
  plan.layers.resize(1);
  auto& lp = plan.layers[0];
  lp.keep = {0, 4};
  lp.evict = {1};
  policies::MergeGroup g;
  g.members = {2, 3};
  g.weights = {0.25f, 0.75f};
  g.representative = 3;
  g.count = 2;
  lp.merges.push_back(g);
  const auto view = BuildView(slots, kernels::PageShape{16, 1, 8}, TableFormats{}, 0);
  auto groups = LowerPlan(view, slots, plan);
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->num_out(), 3u);
  EXPECT_EQ(groups->group_offsets, (std::vector<int32_t>{0, 1, 3, 4}));
  EXPECT_EQ(groups->members, (std::vector<int32_t>{0, 2, 3, 4}));
  EXPECT_EQ(groups->slots[1].meta.position, 13);
  EXPECT_EQ(groups->slots[1].count, 2u);
  EXPECT_FLOAT_EQ(groups->slots[1].score[ScoreStream::kAttention], 5.f);
  EXPECT_EQ(groups->evicted_tokens, 1u);
  EXPECT_EQ(groups->merged_tokens, 1u);

  // Execute on heap pages: 1 layer, f32, block of 4 -> 2 source blocks.
  const kernels::PageShape shape{4, 1, 8};
  const size_t pb = kernels::PageBytes(kernels::PageFormat::kF32, kernels::KvKind::kKey, shape);
  std::vector<void*> pages;
  auto page = [&] {
    void* p = std::aligned_alloc(256, pb);
    std::memset(p, 0, pb);
    pages.push_back(p);
    return reinterpret_cast<uintptr_t>(p);
  };
  LayerTables t;
  for (int b = 0; b < 2; ++b) t.src.push_back({page(), page()});
  t.dst.push_back({page(), page()});
  for (auto& e : t.src) e.k_format = e.v_format = kernels::PageFormat::kF32;
  t.dst[0].k_format = t.dst[0].v_format = kernels::PageFormat::kF32;
  std::vector<float> row(8);
  for (int s = 0; s < 5; ++s) {
    for (int d = 0; d < 8; ++d) row[d] = float(s * 10 + d);
    const auto& e = t.src[s / 4];
    ASSERT_TRUE(kernels::WritePageRows(shape, kernels::PageFormat::kF32, row.data(), s % 4, 1,
                                       reinterpret_cast<void*>(e.k_offset))
                    .ok());
    ASSERT_TRUE(kernels::WritePageRows(shape, kernels::PageFormat::kF32, row.data(), s % 4, 1,
                                       reinterpret_cast<void*>(e.v_offset))
                    .ok());
  }
  t.num_src = 5;
  ASSERT_TRUE(ExecuteCompaction(shape, {t}, {&*groups}).ok());
  std::vector<float> out(4 * 8);
  ASSERT_TRUE(kernels::DequantizePage(kernels::Exec{}, shape, kernels::KvKind::kKey,
                                      kernels::PageFormat::kF32,
                                      reinterpret_cast<void*>(t.dst[0].k_offset), 3, out.data())
                  .ok());
  for (int d = 0; d < 8; ++d) {
    EXPECT_FLOAT_EQ(out[0 * 8 + d], float(d));
    EXPECT_NEAR(out[1 * 8 + d], 0.25f * (20 + d) + 0.75f * (30 + d), 1e-4);
    EXPECT_FLOAT_EQ(out[2 * 8 + d], float(40 + d));
  }
  for (void* p : pages) std::free(p);
}

}  // namespace
}  // namespace polykv::daemon

namespace polykv::daemon {
namespace {

// The copy of a compaction runs without the pool lock. A Close racing with it
// (from another thread) must neither free pages under the copy nor leak them;
// other sessions' calls go on meanwhile. Whichever order the threads take,
// the pool must end empty and consistent.
TEST(CompactionConcurrencyTest, CloseDuringTheUnlockedCopyLeaksNothing) {
  KvPoolOptions o;
  o.pool_bytes = 256ull << 20;
  o.arena_bytes = 64ull << 20;
  o.superblock_bytes = 2ull << 20;
  o.arena_factory = CreateHostShmArena;
  auto pool = *KvPool::Create(o);
  QosRecord q;
  q.agent_id = "a";
  q.policy = "h2o";  // scattered evictions: most blocks are copied
  q.budget_tokens = 512;
  ASSERT_TRUE(pool->SetQos(q).ok());
  const PeerCreds peer{1, 1, 1};
  for (int round = 0; round < 3; ++round) {
    OpenRequest r;
    r.agent_id = "a";
    r.tenant = "t";
    r.profile = {16, 4, 128, DType::kF16, "m"};
    r.peer = peer;
    auto s = *pool->Open(r);
    auto other = *pool->Open(r);
    ASSERT_TRUE(pool->Reserve(s.session_id, s.token, peer, 1024).ok());
    ASSERT_TRUE(pool->Commit(s.session_id, s.token, peer, 1024).ok());
    ReportSlotsRequest rep;
    std::vector<float>& mass = Values(rep, ScoreStream::kAttention);
    mass.resize(1024);
    for (size_t i = 0; i < mass.size(); ++i) mass[i] = float((i * 7919) % 997);
    ASSERT_TRUE(pool->ReportSlots(s.session_id, s.token, peer, rep).ok());
    absl::StatusOr<SyncResult> synced;
    std::thread worker([&] { synced = pool->Sync(s.session_id, s.token, peer, 0); });
    // Another session works meanwhile; then the first one is closed.
    if (round > 0) absl::SleepFor(absl::Milliseconds(round));
    ASSERT_TRUE(pool->Reserve(other.session_id, other.token, peer, 64).ok());
    ASSERT_TRUE(pool->Close(s.session_id, s.token, peer).ok());
    worker.join();
    EXPECT_TRUE(synced.ok() || absl::IsNotFound(synced.status())) << synced.status();
    std::printf("round %d: Sync: %s\n", round,
                synced.ok() ? "OK (Close came after it)" : synced.status().ToString().c_str());
    ASSERT_TRUE(pool->Close(other.session_id, other.token, peer).ok());
    EXPECT_EQ(pool->used_bytes(), 0u);
    EXPECT_EQ(pool->num_sessions(), 0u);
    auto inv = pool->CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv;
  }
}

}  // namespace
}  // namespace polykv::daemon
