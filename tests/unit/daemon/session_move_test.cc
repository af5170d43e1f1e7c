// Moving a session between two pools (daemon/pool/session_move.h), as
// Admin.MoveSession and Peer.ImportSession drive it, with the wire form in
// between (daemon/rpc/move_convert.h): the worker parks at its Sync, the
// target gets the same bytes and policy state, the worker's next Sync names
// the target; a move that fails or times out leaves the session as it was.
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>

#include "absl/synchronization/notification.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/rpc/move_convert.h"
#include "tests/unit/daemon/mapped_arenas.h"
#include "gtest/gtest.h"

namespace polykv::daemon {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// A worker at its step boundaries: Syncs until its session moved or it is
// stopped, counting the Syncs that found it parked; stopped on destruction.
class SyncingWorker {
 public:
  SyncingWorker(KvPool* pool, uint64_t id, std::string token, PeerCreds peer)
      : thread_([=, this] {
          while (!stop_.load()) {
            auto r = pool->Sync(id, token, peer, 0);
            if (!r.ok()) return;
            if (r->moved_to) {
              moved_ = r->moved_to;
              return;
            }
            if (r->parked) ++parked_;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }) {}
  ~SyncingWorker() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Stops it, then what it heard.
  const std::optional<MovedTo>& moved() {
    Stop();
    return moved_;
  }
  // Waits until it heard where the session went (or its Sync failed).
  const std::optional<MovedTo>& Join() {
    if (thread_.joinable()) thread_.join();
    return moved_;
  }
  int parked() const { return parked_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> parked_{0};
  std::optional<MovedTo> moved_;
  std::thread thread_;  // last: it starts once the fields above exist
};

struct Opened {
  uint64_t id = 0;
  std::string token;
  std::vector<BlockDesc> blocks;
};

class SessionMoveTest : public ::testing::Test {
 protected:
  KvPoolOptions Options() {
    KvPoolOptions o;
    // Real time (the park waits in it), shifted by what a test skips.
    o.clock = [this] { return absl::Now() + skew_; };
    o.pool_bytes = 16 * kMiB;
    o.arena_bytes = 4 * kMiB;
    o.superblock_bytes = 256 * 1024;
    o.default_lease_ms = 5000;
    o.arena_factory = CreateHostShmArena;
    o.tenant_bindings["bound"].uids = {4242};
    return o;
  }
  void SetUp() override {
    source_ = *KvPool::Create(Options());
    target_ = *KvPool::Create(Options());
    src_map_ = std::make_unique<MappedArenas>(source_.get());
    dst_map_ = std::make_unique<MappedArenas>(target_.get());
  }
  void TearDown() override {
    for (KvPool* p : {source_.get(), target_.get()}) {
      auto s = p->CheckInvariants();
      EXPECT_TRUE(s.ok()) << s;
    }
  }

  // A session of `tokens` committed tokens whose pages hold a byte pattern
  // of the session's own, with attention reported for its slots.
  Opened Open(uint64_t tokens, uint8_t seed) {
    OpenRequest r;
    r.agent_id = "mover";
    r.tenant = "t1";
    r.profile = {4, 2, 64, DType::kF32, "tiny"};
    r.key_format = PageFormat::kInt8;
    r.value_format = PageFormat::kInt4;
    r.peer = peer_;
    auto o = source_->Open(r);
    EXPECT_TRUE(o.ok()) << o.status();
    Opened s{o->session_id, o->token, {}};
    src_map_->Map(s.id, s.token, peer_, o->arenas);
    auto res = source_->Reserve(s.id, s.token, peer_, tokens);
    EXPECT_TRUE(res.ok()) << res.status();
    src_map_->Map(s.id, s.token, peer_, res->new_arenas);
    s.blocks = res->blocks;
    uint8_t x = seed;
    for (const BlockDesc& b : s.blocks) {
      for (const PageDesc& p : b.pages) {
        uint8_t* a = src_map_->Addr(p);
        for (uint32_t i = 0; i < p.size_bytes; ++i) a[i] = x = uint8_t(x * 131 + 7);
      }
    }
    EXPECT_TRUE(source_->Commit(s.id, s.token, peer_, tokens).ok());
    ReportSlotsRequest rep;
    rep.epoch = 0;
    rep.first_slot = 0;
    rep.current_turn = 3;
    for (uint64_t i = 0; i < tokens; ++i) {
      policies::SlotMeta m;
      m.turn = static_cast<int32_t>(i / 10);
      m.role = policies::Role::kToolOutput;
      m.tag.block_id = static_cast<uint32_t>(i / 7);
      rep.slots.push_back(m);
    }
    policies::ScoreValues att{policies::ScoreStream::kAttention, false, {}};
    for (uint64_t i = 0; i < tokens; ++i) att.values.push_back(0.25f * float(i % 5));
    rep.scores.push_back(att);
    auto st = source_->ReportSlots(s.id, s.token, peer_, rep);
    EXPECT_TRUE(st.ok()) << st;
    return s;
  }

  // Parks session `s` with a worker syncing: the move's source.
  absl::StatusOr<MoveSource> Park(const Opened& s, std::unique_ptr<SyncingWorker>& worker) {
    worker = std::make_unique<SyncingWorker>(source_.get(), s.id, s.token, peer_);
    return source_->ParkForMove(s.id, absl::Seconds(10));
  }

  // Source to target through the wire form, as the daemons do it.
  absl::StatusOr<MovedTo> Import(const MoveSource& src) {
    v1::MovedSession wire;
    ToProto(src.session, &wire);
    auto back = FromProto(wire);
    if (!back.ok()) return back.status();
    auto t = target_->BeginImport(*back);
    if (!t.ok()) return t.status();
    EXPECT_EQ(t->pages.size(), src.pages.size());
    EXPECT_EQ(t->bytes, src.bytes);
    for (size_t i = 0; i < t->pages.size(); ++i) {
      EXPECT_EQ(t->pages[i].size(), src.pages[i].size());
      std::memcpy(t->pages[i].data(), src.pages[i].data(), src.pages[i].size());
    }
    return target_->CompleteImport(t->session_id);
  }

  PeerCreds peer_{1234, 1000, 1000};
  std::atomic<absl::Duration> skew_{absl::ZeroDuration()};
  std::unique_ptr<KvPool> source_, target_;
  std::unique_ptr<MappedArenas> src_map_, dst_map_;
};

// Scores compared bit for bit, NaN (unreported) included.
bool SameScores(const policies::SlotScores& a, const policies::SlotScores& b) {
  return std::memcmp(a.v.data(), b.v.data(), sizeof(a.v)) == 0;
}

TEST_F(SessionMoveTest, TheTargetHoldsTheSameBytesAndStateAndTheWorkerIsForwarded) {
  const Opened s = Open(40, 1);
  std::unique_ptr<SyncingWorker> worker;
  auto src = Park(s, worker);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ(src->session.committed_tokens, 40u);
  // Parked: the session takes no writes meanwhile.
  EXPECT_EQ(source_->Reserve(s.id, s.token, peer_, 16).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const MovedSession before = src->session;
  auto to = Import(*src);
  ASSERT_TRUE(to.ok()) << to.status();
  ASSERT_TRUE(source_->FinishMove(s.id, MovedTo{"/run/b.sock", to->session_id, to->token}).ok());
  const std::optional<MovedTo>& moved = worker->Join();
  EXPECT_GT(worker->parked(), 0);
  ASSERT_TRUE(moved.has_value());
  EXPECT_EQ(moved->socket_path, "/run/b.sock");
  EXPECT_EQ(moved->session_id, to->session_id);
  EXPECT_EQ(moved->token, to->token);
  // Gone here, pages and all, once the worker heard of it; asked again,
  // the source knows nothing of it.
  EXPECT_EQ(source_->num_sessions(), 0u);
  EXPECT_EQ(source_->used_bytes(), 0u);
  EXPECT_EQ(source_->Sync(s.id, s.token, peer_, 0).status().code(), absl::StatusCode::kNotFound);

  // Another uid cannot take the session over; its own worker can.
  PeerCreds other = peer_;
  other.uid = 1001;
  EXPECT_EQ(target_->Attach(to->session_id, to->token, other).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto att = target_->Attach(to->session_id, to->token, peer_);
  ASSERT_TRUE(att.ok()) << att.status();
  EXPECT_EQ(att->key_format, PageFormat::kInt8);
  EXPECT_EQ(att->value_format, PageFormat::kInt4);
  dst_map_->Map(to->session_id, to->token, peer_, att->arenas);
  // The worker's tables, at its epoch, in the target's pages.
  EXPECT_EQ(att->epoch, 0u);
  ASSERT_EQ(att->blocks.size(), s.blocks.size());
  for (size_t b = 0; b < s.blocks.size(); ++b) {
    ASSERT_EQ(att->blocks[b].pages.size(), s.blocks[b].pages.size());
    for (size_t p = 0; p < s.blocks[b].pages.size(); ++p) {
      const PageDesc& dp = att->blocks[b].pages[p];
      ASSERT_EQ(dp.size_bytes, s.blocks[b].pages[p].size_bytes);
      EXPECT_EQ(dp.format, s.blocks[b].pages[p].format);
    }
  }
  // The source's pages are freed: the bytes are checked against Open's
  // pattern, generated again from its seed.
  uint8_t x = 1;
  for (size_t b = 0; b < att->blocks.size(); ++b) {
    for (const PageDesc& p : att->blocks[b].pages) {
      const uint8_t* a = dst_map_->Addr(p);
      for (uint32_t i = 0; i < p.size_bytes; ++i) {
        x = uint8_t(x * 131 + 7);
        ASSERT_EQ(a[i], x) << "block " << b << " page of layer " << p.layer << " byte " << i;
      }
    }
  }
  // Its next Sync there is an ordinary step boundary: nothing new.
  auto sync = target_->Sync(to->session_id, to->token, peer_, att->epoch);
  ASSERT_TRUE(sync.ok()) << sync.status();
  EXPECT_FALSE(sync->changed);
  EXPECT_EQ(sync->committed_tokens, 40u);

  // The policy's state arrived whole: park it at the target and compare.
  std::thread again([&] {
    while (true) {
      auto r = target_->Sync(to->session_id, to->token, peer_, sync->epoch);
      if (!r.ok() || r->parked) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  auto there = target_->ParkForMove(to->session_id, absl::Seconds(10));
  again.join();
  ASSERT_TRUE(there.ok()) << there.status();
  const MovedSession& after = there->session;
  EXPECT_EQ(after.agent_id, before.agent_id);
  EXPECT_EQ(after.tenant, before.tenant);
  EXPECT_EQ(after.committed_tokens, before.committed_tokens);
  EXPECT_EQ(after.next_position, before.next_position);
  EXPECT_GT(before.attention_aged_at, 0);  // attention was reported before the move
  EXPECT_EQ(after.attention_aged_at, before.attention_aged_at);
  EXPECT_EQ(after.current_turn, 3);
  EXPECT_EQ(after.current_turn, before.current_turn);
  EXPECT_EQ(after.reports, before.reports);
  ASSERT_EQ(after.records.size(), before.records.size());
  for (size_t l = 0; l < after.records.size(); ++l) {
    ASSERT_EQ(after.records[l].size(), before.records[l].size());
    for (size_t i = 0; i < after.records[l].size(); ++i) {
      const auto& a = after.records[l][i];
      const auto& b = before.records[l][i];
      EXPECT_EQ(a.meta.position, b.meta.position);
      EXPECT_EQ(a.meta.turn, b.meta.turn);
      EXPECT_EQ(a.meta.role, b.meta.role);
      EXPECT_EQ(a.meta.tag.block_id, b.meta.tag.block_id);
      EXPECT_EQ(a.count, b.count);
      EXPECT_TRUE(SameScores(a.score, b.score)) << "slot " << i;
    }
  }
  EXPECT_EQ(before.records[0][3].score[policies::ScoreStream::kAttention], 0.75f);
  target_->AbortMove(to->session_id);
  // Unparked: it takes writes again.
  EXPECT_TRUE(target_->Reserve(to->session_id, to->token, peer_, 16).ok());
}

TEST_F(SessionMoveTest, AWorkerThatDoesNotReachAStepBoundaryIsNotMoved) {
  const Opened s = Open(20, 2);
  auto src = source_->ParkForMove(s.id, absl::Milliseconds(50));
  EXPECT_EQ(src.status().code(), absl::StatusCode::kDeadlineExceeded) << src.status();
  auto r = source_->Sync(s.id, s.token, peer_, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->parked);
  EXPECT_TRUE(source_->Reserve(s.id, s.token, peer_, 16).ok());
  EXPECT_EQ(source_->ParkForMove(12345, absl::Milliseconds(1)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SessionMoveTest, AnIdleWorkerIsParkedAtOnceAndItsNextSyncFollows) {
  const Opened s = Open(40, 7);
  // Any call ends the idle state: nobody syncs, so the park times out.
  ASSERT_TRUE(source_->Sync(s.id, s.token, peer_, 0, /*then_idle=*/true).ok());
  ASSERT_TRUE(source_->Commit(s.id, s.token, peer_, 40).ok());
  EXPECT_EQ(source_->ParkForMove(s.id, absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // Idle again, and nothing since: parked without waiting for a Sync.
  ASSERT_TRUE(source_->Sync(s.id, s.token, peer_, 0, /*then_idle=*/true).ok());
  EXPECT_TRUE(source_->Heartbeat(s.id, s.token, peer_).ok());  // beats do not count
  auto src = source_->ParkForMove(s.id, absl::ZeroDuration());
  ASSERT_TRUE(src.ok()) << src.status();
  auto to = Import(*src);
  ASSERT_TRUE(to.ok()) << to.status();
  ASSERT_TRUE(source_->FinishMove(s.id, MovedTo{"/run/b.sock", to->session_id, to->token}).ok());
  auto next = source_->Sync(s.id, s.token, peer_, 0);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(next->moved_to.has_value());
  EXPECT_EQ(next->moved_to->session_id, to->session_id);
}

TEST_F(SessionMoveTest, AFailedMoveLeavesTheSessionAsItWas) {
  const Opened s = Open(40, 3);
  const uint64_t used = source_->used_bytes();
  std::unique_ptr<SyncingWorker> worker;
  auto src = Park(s, worker);
  ASSERT_TRUE(src.ok()) << src.status();
  // A second move of the same session meanwhile is refused.
  EXPECT_EQ(source_->ParkForMove(s.id, absl::Milliseconds(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The target refuses (its tenant is bound to another uid): the import
  // leaves nothing there, and the source lets the worker go on.
  MovedSession bad = src->session;
  bad.tenant = "bound";
  EXPECT_EQ(target_->BeginImport(bad).status().code(), absl::StatusCode::kPermissionDenied);
  source_->AbortMove(s.id);
  EXPECT_FALSE(worker->moved().has_value());
  EXPECT_EQ(target_->num_sessions(), 0u);
  EXPECT_EQ(target_->used_bytes(), 0u);
  EXPECT_EQ(source_->used_bytes(), used);
  auto r = source_->Sync(s.id, s.token, peer_, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->parked);
  EXPECT_EQ(r->committed_tokens, 40u);
  EXPECT_TRUE(source_->Commit(s.id, s.token, peer_, 40).ok());
  EXPECT_TRUE(source_->Reserve(s.id, s.token, peer_, 16).ok());
}

TEST_F(SessionMoveTest, AnImportThatIsCutShortOrInconsistentLeavesNothing) {
  const Opened s = Open(40, 4);
  std::unique_ptr<SyncingWorker> worker;
  auto src = Park(s, worker);
  ASSERT_TRUE(src.ok()) << src.status();
  // Records that do not match the committed tokens.
  MovedSession bad = src->session;
  bad.records[0].pop_back();
  EXPECT_EQ(target_->BeginImport(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = src->session;
  bad.committed_tokens = 10000;
  EXPECT_EQ(target_->BeginImport(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = src->session;
  bad.records[0][5].score[policies::ScoreStream::kAttention] = -1.f;
  EXPECT_EQ(target_->BeginImport(bad).status().code(), absl::StatusCode::kInvalidArgument);
  // A stream cut short: the importing session is removed whole.
  auto t = target_->BeginImport(src->session);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(target_->num_sessions(), 1u);
  EXPECT_EQ(target_->used_bytes(), src->bytes);
  target_->AbortImport(t->session_id);
  EXPECT_EQ(target_->num_sessions(), 0u);
  EXPECT_EQ(target_->used_bytes(), 0u);
  source_->AbortMove(s.id);
}

TEST_F(SessionMoveTest, AForwardNobodyAsksForExpires) {
  const Opened s = Open(40, 6);
  std::unique_ptr<SyncingWorker> worker;
  auto src = Park(s, worker);
  ASSERT_TRUE(src.ok()) << src.status();
  // The worker stops before it hears of the move.
  worker->Stop();
  ASSERT_TRUE(source_->FinishMove(s.id, MovedTo{"/run/b.sock", 7, "t"}).ok());
  skew_ = absl::Minutes(11);
  source_->ReclaimExpired();
  EXPECT_EQ(source_->Sync(s.id, s.token, peer_, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(source_->used_bytes(), 0u);
}

TEST_F(SessionMoveTest, AnEvictionDuringTheMoveEndsIt) {
  const Opened s = Open(40, 5);
  std::unique_ptr<SyncingWorker> worker;
  auto src = Park(s, worker);
  ASSERT_TRUE(src.ok()) << src.status();
  ASSERT_TRUE(source_->Evict(s.id, "by operator").ok());
  EXPECT_EQ(source_->FinishMove(s.id, MovedTo{"x", 1, "t"}).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(worker->moved().has_value());
  EXPECT_EQ(source_->num_sessions(), 0u);
  EXPECT_EQ(source_->used_bytes(), 0u);
}

}  // namespace
}  // namespace polykv::daemon
