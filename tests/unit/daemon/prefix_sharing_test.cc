// Shared prefix blocks (issue 42): a session shares its leading full blocks,
// a fresh session of the same tenant and model attaches them and reads the
// sharer's pages; a compaction keeps them whole outside the budget; cached
// after the last session, revived, dropped for room; copied for each holder
// out of an arena being emptied; never found across tenants or models;
// accounting exact throughout.
// The test plays the workers (paged_session_fixture.h) and checks every
// slot's content against the pattern of its position.
#include <cstdint>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/pool/kv_pool.h"
#include "tests/unit/daemon/prefix_fixture.h"

namespace polykv::daemon {
namespace {

TEST_F(PrefixSharingTest, AFreshSessionAttachesTheSharedBlocksAndReadsTheSharersPages) {
  Sess a = Open("a");
  ASSERT_TRUE(Append(a, 40).ok());
  const std::vector<int32_t> ids = Ids(40);
  // Two full blocks; the third holds 8 tokens and is not shared.
  EXPECT_EQ(Share(a, ids).value(), 32u);
  const uint64_t used = pool_->used_bytes();
  Check();

  Sess b = Open("b");
  std::vector<int32_t> longer = Ids(70);  // same start, more of its own
  ASSERT_EQ(Attach(b, longer).value(), 32u);
  EXPECT_EQ(pool_->used_bytes(), used);  // nothing new in memory
  for (size_t i = 0; i < 2; ++i) {
    for (size_t p = 0; p < a.blocks[i].pages.size(); ++p) {
      EXPECT_EQ(b.blocks[i].pages[p].page_id, a.blocks[i].pages[p].page_id);
    }
  }
  VerifyContent(b);
  Check();
  // b goes on in its own pages; a's are untouched.
  ASSERT_TRUE(Append(b, 20).ok());
  VerifyContent(b);
  VerifyContent(a);
  PoolSummary st = pool_->Stats();
  EXPECT_EQ(st.prefix_hit_blocks, 2u);
  EXPECT_EQ(st.prefix_miss_blocks, 2u);  // blocks 2 and 3 of b's ids
  EXPECT_EQ(st.prefix_shared_bytes, 2 * kBlockBytes);
  EXPECT_EQ(st.prefix_cached_bytes, 0u);
  Check();
  // Sharing again (or past what is shared) changes nothing shared.
  EXPECT_EQ(Share(a, ids).value(), 32u);
  EXPECT_EQ(pool_->Stats().prefix_shared_bytes, 2 * kBlockBytes);
  Check();
  ASSERT_TRUE(pool_->Close(a.id, a.token, peer_).ok());
  VerifyContent(b);  // the shared pages live on while b holds them
  Check();
  ASSERT_TRUE(pool_->Close(b.id, b.token, peer_).ok());
  Check();
}

TEST_F(PrefixSharingTest, OtherTenantsModelsAndContextsFindNothing) {
  Sess a = Sharer("a", 48);

  Sess other_tenant = Open("a", kLayers, "t2");
  EXPECT_EQ(Attach(other_tenant, Ids(48)).value(), 0u);
  Sess other_model = Open("a", kLayers, "t1", "another-model");
  EXPECT_EQ(Attach(other_model, Ids(48)).value(), 0u);
  Sess other_start = Open("a");
  EXPECT_EQ(Attach(other_start, Ids(48, 101)).value(), 0u);
  // Differing in the second block: the first one only.
  std::vector<int32_t> ids = Ids(48);
  ids[20] = -7;
  Sess second_differs = Open("a");
  EXPECT_EQ(Attach(second_differs, ids).value(), 16u);
  VerifyContent(second_differs);
  EXPECT_EQ(pool_->Stats().prefix_hit_blocks, 1u);
  Check();
}

TEST_F(PrefixSharingTest, ACompactionKeepsTheSharedBlocksWholeAndBudgetsTheRest) {
  Sess a = Sharer("a", 48);
  // b's policy would keep a heavy hitter inside shared block 0 and evict
  // around it; the shared blocks are kept whole instead, outside its budget.
  SetQos("b", "h2o", 16);
  Sess b = Attacher("b", 48);
  ASSERT_TRUE(Append(b, 40).ok());  // 40 of its own > 16 + 10%
  std::vector<float> attn(88, 0.01f);
  attn[5] = 50.f;
  attn[70] = 40.f;
  ReportSlotsRequest r;
  Values(r, ScoreStream::kAttention) = attn;
  ASSERT_TRUE(pool_->ReportSlots(b.id, b.token, peer_, r).ok());
  auto changed = Sync(b);  // checks every slot of b's new tables, acks
  ASSERT_TRUE(changed.ok()) << changed.status();
  ASSERT_TRUE(*changed);
  // The three shared blocks by reference (a's pages), then what b's budget
  // keeps of its own 40: whole blocks' worth evicted (40 - 32), its latest.
  EXPECT_EQ(b.committed, 48u + 8u);
  for (int i = 0; i < 48; ++i) EXPECT_EQ(b.positions[i], i);
  EXPECT_EQ(b.positions.back(), 87);
  for (size_t i = 0; i < 3; ++i) {
    for (size_t p = 0; p < a.blocks[i].pages.size(); ++p) {
      EXPECT_EQ(b.blocks[i].pages[p].page_id, a.blocks[i].pages[p].page_id);
    }
  }
  VerifyContent(a);
  EXPECT_EQ(pool_->Stats().prefix_shared_bytes, 3 * kBlockBytes);
  EXPECT_EQ(pool_->used_bytes(), 4 * kBlockBytes);  // the shared three, b's one
  Check();
}

// A policy whose layers keep budgets of their own keeps the prefix in place
// in every layer: a layer that keeps fewer slots than another holds none of
// the blocks after the prefix (its hole), so the prefix blocks stay shared,
// by reference, through compaction after compaction.
TEST_F(PrefixSharingTest, PerLayerBudgetsKeepThePrefixSharedInPlace) {
  Sess a = Sharer("a", 32);
  SetQos("b", "kvzip{select=layer,layers=importance,window.size=4}", 24);
  Sess b = Attacher("b", 32);
  ASSERT_TRUE(Append(b, 32).ok());  // 32 of its own > 24 + 10%
  const auto report = [&](uint64_t n) {
    ReportSlotsRequest r;
    r.epoch = b.epoch;
    std::vector<float>& v = Values(r, ScoreStream::kImportance, true);
    v.assign(kLayers * n, 0.01f);
    for (uint64_t i = 0; i < n; ++i) v[n + i] = 2.f;  // layer 1's slots matter more
    return pool_->ReportSlots(b.id, b.token, peer_, r);
  };
  const auto expect_prefix_shared = [&] {
    for (int l = 0; l < kLayers; ++l) {
      for (int i = 0; i < 32; ++i) EXPECT_EQ(b.position(l, i), i) << "layer " << l;
    }
    for (size_t i = 0; i < 2; ++i) {
      for (size_t p = 0; p < a.blocks[i].pages.size(); ++p) {
        EXPECT_EQ(b.blocks[i].pages[p].page_id, a.blocks[i].pages[p].page_id);
      }
    }
    EXPECT_EQ(pool_->Stats().prefix_shared_bytes, 2 * kBlockBytes);
  };
  ASSERT_TRUE(report(64).ok());
  ASSERT_TRUE(Sync(b).value());  // checks every layer's slots
  // Layer 1 keeps more of the rest: layer 0 holds none of block 2 (its
  // hole); both the prefix in its shared blocks.
  expect_prefix_shared();
  EXPECT_EQ(b.position(0, 32), -1);
  EXPECT_GE(b.position(1, 32), 32);
  Check();
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(Append(b, 32).ok());
    ASSERT_TRUE(report(b.committed).ok());
    ASSERT_TRUE(Sync(b).value());
    expect_prefix_shared();
    EXPECT_EQ(b.position(0, 32), -1);
    VerifyContent(a);
    Check();
  }
}

TEST_F(PrefixSharingTest, CachedAfterTheLastSessionRevivedThenDroppedForRoom) {
  pool_ = MakePool(2 * kMiB);
  arenas_.Reset(pool_.get());
  Sess a = Open("a");
  ASSERT_TRUE(Append(a, 64).ok());
  ASSERT_EQ(Share(a, Ids(64)).value(), 64u);
  ASSERT_TRUE(pool_->Close(a.id, a.token, peer_).ok());
  PoolSummary st = pool_->Stats();
  EXPECT_EQ(st.prefix_cached_bytes, 4 * kBlockBytes);
  EXPECT_EQ(st.used_bytes, 4 * kBlockBytes);
  Check();

  Sess b = Open("b");
  ASSERT_EQ(Attach(b, Ids(64)).value(), 64u);  // revived
  VerifyContent(b);
  EXPECT_EQ(pool_->Stats().prefix_cached_bytes, 0u);
  ASSERT_TRUE(pool_->Close(b.id, b.token, peer_).ok());
  Check();

  // Another context wants the whole pool: the cached blocks make room.
  Sess c = Open("c");
  const uint64_t blocks = 2 * kMiB / kBlockBytes - 2;
  auto appended = Append(c, static_cast<int>(blocks * kBlock));
  ASSERT_TRUE(appended.ok()) << appended;
  // As many as the room needed, the coldest first: the last blocks of the
  // chain (an attach refreshes a chain's first blocks last).
  st = pool_->Stats();
  EXPECT_EQ(st.prefix_dropped_blocks, 2u);
  EXPECT_EQ(st.prefix_cached_bytes, 2 * kBlockBytes);
  VerifyContent(c);
  Check();
  Sess d = Open("d");
  EXPECT_EQ(Attach(d, Ids(64)).value(), 32u);
  VerifyContent(d);
  Check();
}

TEST_F(PrefixSharingTest, BadCallsAreRefusedAndChangeNothing) {
  Sess a = Open("a");
  ASSERT_TRUE(Append(a, 32).ok());
  // More ids than committed tokens.
  EXPECT_TRUE(absl::IsInvalidArgument(Share(a, Ids(33)).status()));
  ASSERT_EQ(Share(a, Ids(32)).value(), 32u);
  // Ids that contradict what block 0 was shared as.
  EXPECT_TRUE(absl::IsInvalidArgument(Share(a, Ids(32, 5)).status()));
  // A session that reserved already cannot attach.
  EXPECT_TRUE(absl::IsFailedPrecondition(pool_->AttachPrefix(a.id, a.token, peer_, Ids(32))
                                             .status()));
  // A forged token.
  std::string forged = a.token;
  forged[0] ^= 1;
  EXPECT_TRUE(absl::IsPermissionDenied(pool_->SharePrefix(a.id, forged, peer_, Ids(32))
                                           .status()));
  Sess b = Open("b");
  EXPECT_TRUE(absl::IsPermissionDenied(pool_->AttachPrefix(b.id, forged, peer_, Ids(32))
                                           .status()));
  ASSERT_EQ(Attach(b, Ids(32)).value(), 32u);
  // The worker would write on from keep_tokens: not inside a shared block.
  EXPECT_TRUE(absl::IsFailedPrecondition(
      pool_->Release(b.id, b.token, peer_, 20).status()));
  EXPECT_EQ(pool_->Release(b.id, b.token, peer_, 16).value().committed_tokens, 16u);
  VerifyContent(a);
  Check();
  // A compacted session's slots are no longer its first tokens in order.
  SetQos("c", "window", 32);
  Sess c = Open("c");
  ASSERT_TRUE(Append(c, 48).ok());
  ASSERT_TRUE(Sync(c).value());
  EXPECT_TRUE(absl::IsFailedPrecondition(Share(c, Ids(32, 900)).status()));
  Check();
}

TEST_F(PrefixSharingTest, AnAgentsCapCountsTheSharedBlocksItsSessionsHold) {
  Sess a = Sharer("a", 64);
  QosRecord q;
  q.agent_id = "capped";
  q.max_bytes = 2 * kBlockBytes + kBlockBytes / 2;
  ASSERT_TRUE(pool_->SetQos(q).ok());
  Sess b = Open("capped");
  EXPECT_EQ(Attach(b, Ids(64)).value(), 32u);
  // Its cap is reached: no room for a block of its own.
  EXPECT_TRUE(absl::IsResourceExhausted(pool_->Reserve(b.id, b.token, peer_, 16).status()));
  Check();
}

TEST_F(PrefixSharingTest, AnEvictedSessionLetsItsSharedBlocksGo) {
  Sess a = Sharer("a", 32);
  Sess b = Attacher("b", 32);
  ASSERT_TRUE(pool_->Evict(b.id, "test").ok());
  Check();
  ASSERT_TRUE(pool_->Close(a.id, a.token, peer_).ok());
  Check();
  EXPECT_EQ(pool_->Stats().prefix_cached_bytes, 2 * kBlockBytes);
  EXPECT_EQ(pool_->used_bytes(), 2 * kBlockBytes);
}

// A shared block in an arena being emptied: each holder's next Sync gives it
// a copy in its own pages, byte for byte; once the last holder has moved,
// the entry (cached, in that arena) is dropped so the arena can go, and the
// other tenant gets its room. Refcounts exact after every step.
TEST_F(PrefixSharingTest, ASharedBlockInAVacatedArenaIsCopiedForEachHolder) {
  // 16 sessions fill the pool (1 MiB each), then keep one block each,
  // shared under ids of their own and attached by a second session.
  std::vector<Sess> sharers, attachers;
  for (int i = 0; i < 16; ++i) {
    Sess s = Open("s" + std::to_string(i));
    auto r = pool_->Reserve(s.id, s.token, peer_, 1024);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    Map(s.id, s.token, r->new_arenas);
    s.blocks = {r->blocks[0]};
    sharers.push_back(s);
  }
  for (int i = 0; i < 16; ++i) {
    Sess& s = sharers[i];
    ASSERT_TRUE(pool_->Release(s.id, s.token, peer_, kBlock).ok());
    ASSERT_TRUE(Append(s, kBlock).ok());
    ASSERT_EQ(Share(s, Ids(kBlock, 1000 * i)).value(), uint64_t(kBlock));
    Sess a = Open("a" + std::to_string(i));
    ASSERT_EQ(Attach(a, Ids(kBlock, 1000 * i)).value(), uint64_t(kBlock));
    attachers.push_back(a);
  }
  EXPECT_EQ(pool_->Stats().prefix_shared_bytes, 16 * kBlockBytes);
  Check();

  // Another tenant asks for half the pool: refused, sparse arenas vacated.
  Sess other = Open("o", kLayers, "t2");
  auto refused = pool_->Reserve(other.id, other.token, peer_, 8 * kMiB / kBlockBytes * kBlock);
  ASSERT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  ASSERT_GT(pool_->Stats().vacating_arenas, 0u);

  // Sharers first, then attachers: each copy checked slot by slot (Sync).
  uint64_t moved = 0;
  for (auto* group : {&sharers, &attachers}) {
    for (Sess& s : *group) {
      auto changed = Sync(s);
      ASSERT_TRUE(changed.ok()) << changed.status();
      if (!*changed) continue;
      ++moved;
      EXPECT_TRUE(s.same_slots);
      EXPECT_EQ(s.committed, uint64_t(kBlock));
      Check();
    }
  }
  ASSERT_GT(moved, 0u);
  ASSERT_EQ(moved % 2, 0u) << "a block moved for one of its holders only";
  const PoolSummary after = pool_->Stats();
  EXPECT_EQ(after.vacating_arenas, 0u);
  EXPECT_EQ(after.relocated_blocks, moved);
  // The moved blocks are their holders' own now, twice; the others shared.
  EXPECT_EQ(after.prefix_shared_bytes, (16 - moved / 2) * kBlockBytes);
  EXPECT_EQ(after.prefix_cached_bytes, 0u);
  EXPECT_EQ(after.prefix_dropped_blocks, moved / 2);
  EXPECT_EQ(pool_->used_bytes(), (16 + moved / 2) * kBlockBytes);

  auto granted = pool_->Reserve(other.id, other.token, peer_, 8 * kMiB / kBlockBytes * kBlock);
  ASSERT_TRUE(granted.ok()) << granted.status();
  Check();
  for (auto* group : {&sharers, &attachers}) {
    for (Sess& s : *group) ASSERT_TRUE(pool_->Close(s.id, s.token, peer_).ok());
  }
  ASSERT_TRUE(pool_->Close(other.id, other.token, peer_).ok());
  Check();
  // What stayed shared is cached now, nothing else.
  EXPECT_EQ(pool_->used_bytes(), pool_->Stats().prefix_cached_bytes);
}

}  // namespace
}  // namespace polykv::daemon
