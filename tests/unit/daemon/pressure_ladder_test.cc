// The pressure ladder's decision (PlanLadder) over plain data, and the policy
// registry the pool decides with (ValidatePolicyName, PolicyRegistry::Get).
#include "daemon/compaction/pressure_ladder.h"

#include <gtest/gtest.h>

#include <thread>

#include "daemon/compaction/policy_registry.h"

namespace polykv::daemon {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kBlockBytes = 16384;  // 16 tokens: 1 KiB per token

using Steps = std::vector<std::pair<uint64_t, uint64_t>>;

LadderCandidate Cand(uint64_t id, int priority, uint64_t committed, uint64_t guaranteed = 0) {
  LadderCandidate c;
  c.session_id = id;
  c.priority = priority;
  c.committed_tokens = committed;
  c.bytes = (committed + 15) / 16 * kBlockBytes;
  c.block_tokens = 16;
  c.block_bytes = kBlockBytes;
  c.guaranteed_bytes = guaranteed;
  return c;
}

LadderInputs At(uint64_t free_bytes, bool refusing = false, bool any_sessions = true) {
  return LadderInputs{free_bytes, kMiB, refusing, any_sessions};
}

TEST(PressureLadderTest, AtTwiceTheWatermarkItResumesAndAsksNothing) {
  const std::vector<LadderCandidate> c{Cand(1, 0, 1600)};
  LadderSteps s = PlanLadder(c, At(2 * kMiB, /*refusing=*/true));
  EXPECT_TRUE(s.resume);
  EXPECT_FALSE(s.refuse);
  EXPECT_TRUE(s.compact.empty());
  s = PlanLadder(c, At(2 * kMiB, /*refusing=*/false));
  EXPECT_FALSE(s.resume);  // nothing to resume
  EXPECT_TRUE(s.compact.empty());
  s = PlanLadder({}, At(5 * kMiB, true));
  EXPECT_TRUE(s.resume);
}

TEST(PressureLadderTest, BetweenOnceAndTwiceTheWatermarkNothingHappens) {
  const std::vector<LadderCandidate> c{Cand(1, 0, 1600)};
  for (uint64_t free : {kMiB, kMiB + 1, 2 * kMiB - 1}) {
    for (bool refusing : {false, true}) {
      LadderSteps s = PlanLadder(c, At(free, refusing));
      EXPECT_FALSE(s.resume) << free;
      EXPECT_FALSE(s.refuse) << free;
      EXPECT_TRUE(s.compact.empty()) << free;
      s = PlanLadder({}, At(free, refusing));  // not even a refusal without candidates
      EXPECT_FALSE(s.refuse) << free;
      EXPECT_FALSE(s.resume) << free;
    }
  }
}

TEST(PressureLadderTest, BelowItAsksLowestPriorityFirstThenLargestUntilTwiceIsExpected) {
  // 512 KiB free of a 1 MiB watermark. Given in the wrong order.
  const std::vector<LadderCandidate> c{Cand(3, 1, 3000), Cand(2, 0, 800), Cand(1, 0, 1600)};
  LadderSteps s = PlanLadder(c, At(512 * 1024));
  // 1: half is 800, but only 90% of 512 KiB = 460 tokens fit -> 448 (whole
  //    blocks); frees 1152 KiB, leaves 64 KiB of room.
  // 2: 90% of 64 KiB = 57 tokens -> 48; frees 752 KiB: 512 + 1152 + 752 KiB
  //    >= 2 MiB, so 3 (higher priority) is not asked.
  EXPECT_EQ(s.compact, (Steps{{1, 448}, {2, 48}}));
  EXPECT_FALSE(s.refuse);
  EXPECT_FALSE(s.resume);
}

TEST(PressureLadderTest, EqualPriorityAndBytesKeepTheirOrder) {
  const std::vector<LadderCandidate> c{Cand(7, 2, 64), Cand(5, 2, 64), Cand(6, 2, 64)};
  LadderSteps s = PlanLadder(c, At(0));
  // No room at all: every target is its floor (one block); 48 tokens each
  // (48 KiB) are far from 2 MiB, so all are asked.
  EXPECT_EQ(s.compact, (Steps{{7, 16}, {5, 16}, {6, 16}}));
}

TEST(PressureLadderTest, WithNoRoomTargetsAreFloorsUntilEnoughIsExpected) {
  const std::vector<LadderCandidate> c{Cand(1, 0, 1000), Cand(2, 0, 2000), Cand(3, 0, 500)};
  LadderSteps s = PlanLadder(c, At(0));
  // By bytes: 2 (frees 1984 KiB), then 1 (984 KiB): 2968 KiB >= 2 MiB.
  EXPECT_EQ(s.compact, (Steps{{2, 16}, {1, 16}}));
}

TEST(PressureLadderTest, TheGuaranteeIsAFloor) {
  // 300 tokens guaranteed (300 KiB). Room for 80 tokens: the floor wins.
  std::vector<LadderCandidate> c{Cand(1, 0, 1000, 300 * 1024)};
  LadderSteps s = PlanLadder(c, At(100 * 1024));
  EXPECT_EQ(s.compact, (Steps{{1, 300}}));
  // With plenty of room the half wins over the floor...
  s = PlanLadder(c, At(kMiB - 1));
  EXPECT_EQ(s.compact, (Steps{{1, 500}}));
  // ...and a floor above the half wins over it.
  c = {Cand(1, 0, 1000, 700 * 1024)};
  s = PlanLadder(c, At(kMiB - 1));
  EXPECT_EQ(s.compact, (Steps{{1, 700}}));
}

TEST(PressureLadderTest, CandidatesAtTheirFloorAreSkippedAndThenItRefuses) {
  const std::vector<LadderCandidate> floors{
      Cand(1, 0, 16),               // one block
      Cand(2, 0, 10),               // less than a block
      Cand(3, 0, 300, 300 * 1024),  // exactly its guarantee
  };
  LadderSteps s = PlanLadder(floors, At(kMiB - 1));
  EXPECT_TRUE(s.compact.empty());
  EXPECT_TRUE(s.refuse);
  EXPECT_FALSE(s.resume);
  // Already refusing: no second refusal. No sessions at all: nobody to refuse.
  EXPECT_FALSE(PlanLadder(floors, At(kMiB - 1, /*refusing=*/true)).refuse);
  EXPECT_FALSE(PlanLadder({}, At(kMiB - 1, false, /*any_sessions=*/false)).refuse);
  EXPECT_TRUE(PlanLadder({}, At(0, false, true)).refuse);
  // One candidate above its floor: it is asked instead of refusing.
  std::vector<LadderCandidate> more = floors;
  more.push_back(Cand(4, 3, 17));
  s = PlanLadder(more, At(kMiB - 1));
  EXPECT_EQ(s.compact, (Steps{{4, 16}}));
  EXPECT_FALSE(s.refuse);
}

// Step 1 first: requantizable candidates, lowest priority first, as many
// blocks as the watermark needs and 90% of the free bytes hold; the rest is
// step 2 as before.
TEST(PressureLadderTest, RequantizationComesBeforeCompaction) {
  using Requants = std::vector<std::pair<uint64_t, uint64_t>>;
  auto requantizable = [](LadderCandidate c, uint64_t blocks) {
    c.requant_blocks = blocks;
    c.requant_saving = 8192;        // a 16 KiB block becomes 8 KiB
    c.requant_block_bytes = 8192;
    c.requant_room = 1000;
    return c;
  };
  const LadderCandidate lo = requantizable(Cand(1, 0, 1600), 100);
  const LadderCandidate mid = requantizable(Cand(2, 1, 1600), 100);
  const LadderCandidate hi = Cand(3, 2, 1600);
  // 1 MiB free of a 2 MiB goal: 128 blocks' savings are needed. lo's 100
  // fit in 90% of the free bytes; of the 224 KiB left, 90% holds 25 of
  // mid's; still 3 blocks' worth short, so hi is compacted.
  LadderSteps s = PlanLadder({hi, mid, lo}, At(kMiB - 1));
  EXPECT_EQ(s.requant, (Requants{{1, 100}, {2, 25}}));
  ASSERT_EQ(s.compact.size(), 1u);
  EXPECT_EQ(s.compact.front().first, 3u);
  EXPECT_FALSE(s.refuse);
  // Small requantized blocks (room is no limit): only the blocks the
  // watermark needs, ceil((2 MiB - 900 KiB) / 8 KiB) = 144.
  LadderCandidate big = requantizable(Cand(5, 0, 3200), 200);
  big.requant_block_bytes = 2048;
  s = PlanLadder({big, hi}, At(900 * 1024));
  EXPECT_EQ(s.requant, (Requants{{5, 144}}));
  EXPECT_TRUE(s.compact.empty());
  // 40 KiB free: 4 blocks fit; then mid, with nothing to requantize, is
  // compacted.
  s = PlanLadder({hi, Cand(2, 1, 1600), lo}, At(40 * 1024));
  EXPECT_EQ(s.requant, (Requants{{1, 4}}));
  ASSERT_FALSE(s.compact.empty());
  EXPECT_EQ(s.compact.front().first, 2u);
  // No room for even one block: compaction instead.
  s = PlanLadder({lo}, At(8 * 1024));
  EXPECT_TRUE(s.requant.empty());
  EXPECT_EQ(s.compact.size(), 1u);
  // The free bytes are slots of other size classes: what the tenant can
  // allocate in the requantized shape bounds it too.
  LadderCandidate fragmented = lo;
  fragmented.requant_room = 3;
  s = PlanLadder({fragmented}, At(kMiB - 1));
  EXPECT_EQ(s.requant, (Requants{{1, 3}}));
  fragmented.requant_room = 0;
  s = PlanLadder({fragmented}, At(kMiB - 1));
  EXPECT_TRUE(s.requant.empty());
  EXPECT_EQ(s.compact.size(), 1u);
  // Above the watermark nothing is asked.
  EXPECT_TRUE(PlanLadder({lo}, At(kMiB)).requant.empty());
  // A candidate at its compaction floor may still requantize: no refusal.
  s = PlanLadder({requantizable(Cand(4, 0, 16), 1)}, At(64 * 1024));
  EXPECT_EQ(s.requant, (Requants{{4, 1}}));
  EXPECT_FALSE(s.refuse);
}

// An idle candidate, idle for `idle_ms`.
LadderCandidate Idle(uint64_t id, int priority, uint64_t committed, int64_t idle_ms) {
  LadderCandidate c = Cand(id, priority, committed);
  c.idle = true;
  c.idle_ms = idle_ms;
  return c;
}

TEST(PressureLadderTest, IdleSessionsAreOffloadedLowestClassAndLongestIdleFirst) {
  // 1 MiB watermark, 0.5 MiB free: 1.5 MiB to find. The active session is
  // asked to compact first; then idle ones go, by class,
  // then by how long they have been idle.
  std::vector<LadderCandidate> c{Cand(1, 3, 1024), Idle(2, 3, 512, 1000),
                                 Idle(3, 2, 512, 10), Idle(4, 3, 512, 5000)};
  LadderInputs in = At(kMiB / 2);
  in.offload_on = true;
  in.offload_room = 64 * kMiB;
  LadderSteps s = PlanLadder(c, in);
  ASSERT_EQ(s.compact.size(), 1u);
  EXPECT_EQ(s.compact[0].first, 1u);  // to 448 tokens: what fits in 90% of the free bytes
  EXPECT_EQ(s.offload, (std::vector<uint64_t>{3, 4}));  // 0.5 + 0.56 + 0.5 + 0.5 MiB
  EXPECT_TRUE(s.evict.empty());
  EXPECT_FALSE(s.refuse);
  // Without offload or idle eviction, idle sessions are asked to compact at
  // their next Sync like the others (and nothing leaves at once).
  s = PlanLadder(c, At(kMiB / 2));
  EXPECT_TRUE(s.offload.empty());
  EXPECT_EQ(s.compact.size(), 3u);
}

TEST(PressureLadderTest, WhatOffloadCannotTakeIsEvictedButNeverACriticalSession) {
  std::vector<LadderCandidate> c{Idle(1, 5, 1024, 9000), Idle(2, 3, 1024, 100),
                                 Idle(3, 3, 1024, 200)};
  c[0].never_evict = true;
  LadderInputs in = At(0);
  in.offload_on = true;
  in.offload_room = kMiB;  // one session's worth
  in.evict_idle = true;
  LadderSteps s = PlanLadder(c, in);
  EXPECT_EQ(s.offload, (std::vector<uint64_t>{3}));
  EXPECT_EQ(s.evict, (std::vector<uint64_t>{2}));
  EXPECT_FALSE(s.refuse);
  // Nothing to offload to, nothing evictable: refuse.
  in.offload_room = 0;
  in.evict_idle = false;
  s = PlanLadder(c, in);
  EXPECT_TRUE(s.offload.empty());
  EXPECT_TRUE(s.evict.empty());
  EXPECT_TRUE(s.refuse);
}

TEST(PressureLadderTest, TheRequantizationStepIsAColdStepOfValues) {
  using F = kernels::PageFormat;
  EXPECT_EQ(LadderValueFormat(std::nullopt), F::kInt4);
  EXPECT_EQ(LadderValueFormat(F::kInt8), F::kInt8);  // a floor finer than int4 wins
  EXPECT_EQ(LadderValueFormat(F::kInt2), F::kInt4);
  // 10 of 100 blocks of 16: fraction (10 + 0.5) x 16 / 1600.
  const policies::ColdStep step = LadderColdStep(F::kInt4, 10, 1600, 16);
  EXPECT_EQ(step.format, F::kInt4);
  EXPECT_FALSE(step.keys);
  EXPECT_TRUE(step.values);
  EXPECT_DOUBLE_EQ(step.fraction, 0.105);
  EXPECT_EQ(step.window, kLadderRequantWindow);
  EXPECT_DOUBLE_EQ(LadderColdStep(F::kInt8, 200, 1600, 16).fraction, 1.0);
}

// A per-layer allocator acts layer-uniform in the daemon, and QoS says so,
// unless the layers select their own slots (then each gets its budget).
TEST(PolicyRegistryTest, PolicyNoteSaysWhereTheDaemonRunsAPolicyDifferently) {
  for (const char* as_written : {"full", "h2o", "hybrid", "merge", "h2o{layers=uniform}", "nope",
                                 "kvzip{select=layer,layers=importance}",
                                 "kvzip{select=layer,layers=pyramid}"}) {
    EXPECT_EQ(PolicyNote(as_written), "") << as_written;
  }
  for (const char* per_layer : {"intent", "h2o{layers=pyramid}", "sinks+intent{layers=entropy}"}) {
    const std::string note = PolicyNote(per_layer);
    EXPECT_NE(note.find("layer-uniform"), std::string::npos) << per_layer << ": " << note;
    EXPECT_EQ(note.rfind("layers=", 0), 0u) << note;
  }
  EXPECT_NE(PolicyNote("intent").find("layers=entropy"), std::string::npos);
}

TEST(PolicyRegistryTest, ValidatePolicyNameAcceptsPresetsComponentsAndParameters) {
  for (const char* ok : {"full", "window", "streaming", "h2o", "snapkv", "hybrid", "merge",
                         "sinks+window", "h2o{window.size=64}", "window{window.size=32}"}) {
    EXPECT_TRUE(ValidatePolicyName(ok).ok()) << ok << ": " << ValidatePolicyName(ok);
  }
  for (const char* bad : {"", "nope", "h2o+nope", "h2o{window.size=64", "h2o{no.such.param=1}",
                          "h2o{window.size}"}) {
    const absl::Status s = ValidatePolicyName(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "': " << s;
  }
  EXPECT_NE(ValidatePolicyName("h2o{window.size=64").message().find("missing closing"),
            absl::string_view::npos);
}

// Compaction stores requantized blocks (issue 12, item 3), so policies that
// requantize are accepted; a format that does not exist is not.
TEST(PolicyRegistryTest, PoliciesThatRequantizeAreAccepted) {
  for (const char* p : {"h2o{cold.format=none}", "h2o{cold.format=int4,cold.fraction=0.5}",
                        "hybrid{cold.format=int2}"}) {
    EXPECT_TRUE(ValidatePolicyName(p).ok()) << p << ": " << ValidatePolicyName(p);
  }
  EXPECT_EQ(ValidatePolicyName("h2o{cold.format=int3}").code(), absl::StatusCode::kInvalidArgument);
}

TEST(PolicyRegistryTest, GetBuildsOncePerTextAndKeepsThePointer) {
  PolicyRegistry reg;
  auto a = reg.Get("h2o");
  auto b = reg.Get("h2o");
  auto c = reg.Get("h2o{window.size=64}");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << c.status();
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  EXPECT_NE((*c)->spec().find("window.size=64"), std::string::npos) << (*c)->spec();
  EXPECT_EQ(*reg.Get("h2o{window.size=64}"), *c);
  // Errors are not cached.
  EXPECT_EQ(reg.Get("nope").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Get("nope").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Get("h2o{window.size=64").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*reg.Get("h2o"), *a);
}

TEST(PolicyRegistryTest, ConcurrentGetsSeeOnePolicy) {
  PolicyRegistry reg;
  constexpr int kThreads = 4;
  std::vector<const policies::Policy*> seen(kThreads * 50, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto p = reg.Get(i % 2 ? "streaming" : "window");
        seen[t * 50 + i] = p.ok() ? *p : nullptr;
      }
    });
  }
  for (auto& t : threads) t.join();
  const policies::Policy* window = *reg.Get("window");
  const policies::Policy* streaming = *reg.Get("streaming");
  ASSERT_NE(window, streaming);
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i % 2 ? streaming : window) << i;
}

}  // namespace
}  // namespace polykv::daemon
