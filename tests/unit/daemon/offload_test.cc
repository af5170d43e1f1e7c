// An idle session's pages out of the pool and back (issue 42, scope 2): the
// test plays the worker (paged_session_fixture.h). What comes back is byte
// for byte what went out, from host memory and from disk; every call but
// Sync and Close is refused meanwhile; a store that cannot take the pages,
// a pool with no room to restore them, and pages lost on disk are clear
// errors; nothing leaks, and the accounting holds after every step.
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "tests/unit/daemon/paged_session_fixture.h"

namespace polykv::daemon {
namespace {

namespace fs = std::filesystem;

class OffloadTest : public PagedSessionTest {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("polykv-offload-pool-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    PagedSessionTest::SetUp();
  }
  void TearDown() override {
    pool_.reset();
    store_.reset();
    fs::remove_all(dir_);
  }
  void Configure(KvPoolOptions& o) override {
    o.ladder_evict_idle = evict_idle_;
    if (host_bytes_ == 0 && disk_bytes_ == 0) return;
    auto store = OffloadStore::Create(
        {host_bytes_, disk_bytes_ ? dir_.string() : "", disk_bytes_, 0x5eed});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    o.offload_store = store_;
    o.offload_idle = offload_idle_;
  }
  void Remake(uint64_t pool_bytes = 16 * kMiB, uint64_t low_watermark = 0) {
    pool_.reset();
    store_.reset();
    pool_ = MakePool(pool_bytes, low_watermark);
    arenas_.Reset(pool_.get());
  }

  // Every page's bytes, in table order: what the worker could read.
  std::vector<std::vector<uint8_t>> Bytes(const Sess& s) {
    std::vector<std::vector<uint8_t>> out;
    const kernels::PageShape shape{kBlock, kHeads, kDim};
    for (const BlockDesc& b : s.blocks) {
      for (const PageDesc& p : b.pages) {
        const auto kind = p.is_value ? kernels::KvKind::kValue : kernels::KvKind::kKey;
        const uint8_t* a = Addr(p);
        out.emplace_back(a, a + kernels::PageBytes(p.format, kind, shape));
      }
    }
    return out;
  }
  absl::Status Idle(Sess& s) {
    return pool_->Sync(s.id, s.token, peer_, s.epoch, /*then_idle=*/true).status();
  }
  SessionSummary Summary(uint64_t id) {
    for (const SessionSummary& x : pool_->ListSessions("", "")) {
      if (x.session_id == id) return x;
    }
    ADD_FAILURE() << "no session " << id;
    return {};
  }
  // An idle session of `agent` with n tokens, offloaded; its bytes before.
  std::vector<std::vector<uint8_t>> Offloaded(Sess& s, int n) {
    EXPECT_TRUE(Append(s, n).ok());
    EXPECT_TRUE(Sync(s).ok());
    auto before = Bytes(s);
    EXPECT_TRUE(Idle(s).ok());
    const uint64_t used = pool_->used_bytes();
    auto moved = pool_->Offload(s.id);
    EXPECT_TRUE(moved.ok()) << moved.status();
    if (moved.ok()) EXPECT_EQ(used - pool_->used_bytes(), *moved);
    EXPECT_EQ(Summary(s.id).bytes, 0u);
    Check();
    return before;
  }

  uint64_t host_bytes_ = 8 * kMiB, disk_bytes_ = 0;
  bool evict_idle_ = false;
  absl::Duration offload_idle_ = absl::InfiniteDuration();
  fs::path dir_;
  std::shared_ptr<OffloadStore> store_;
};

TEST_F(OffloadTest, AnIdleSessionComesBackFromHostMemoryByteForByte) {
  Sess s = Open("a");
  const auto before = Offloaded(s, 40);
  EXPECT_EQ(Summary(s.id).offloaded_to, "host");
  PoolSummary st = pool_->Stats();
  EXPECT_EQ(st.offloaded_sessions, 1u);
  ASSERT_TRUE(st.offload_store.has_value());
  EXPECT_EQ(st.offload_store->host_bytes, st.offloaded_bytes);
  // Meanwhile only Sync (which restores) and Close are taken.
  for (absl::Status refused :
       {pool_->Reserve(s.id, s.token, peer_, 16).status(),
        pool_->Commit(s.id, s.token, peer_, 40).status(),
        pool_->Release(s.id, s.token, peer_, 16).status(),
        pool_->Ack(s.id, s.token, peer_, s.epoch)}) {
    EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
    EXPECT_NE(refused.message().find("offloaded"), std::string::npos) << refused;
  }
  Check();
  const uint64_t epoch = s.epoch;
  auto changed = Sync(s);  // checks every slot's pattern too
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(s.epoch, epoch + 1);
  EXPECT_TRUE(s.same_slots);  // the worker keeps what it holds of them
  EXPECT_EQ(s.committed, 40u);
  EXPECT_EQ(Bytes(s), before);
  st = pool_->Stats();
  EXPECT_EQ(st.offloaded_sessions, 0u);
  EXPECT_EQ(st.offload.offloaded, 1u);
  EXPECT_EQ(st.offload.restored, 1u);
  EXPECT_EQ(std::accumulate(st.offload.restore_buckets.begin(),
                            st.offload.restore_buckets.end(), uint64_t{0}), 1u);
  EXPECT_EQ(st.offload_store->host_bytes, 0u);
  EXPECT_EQ(Summary(s.id).offloaded_to, "");
  Check();
  ASSERT_TRUE(Append(s, 20).ok());  // the worker goes on
  ASSERT_TRUE(Sync(s).ok());
  Check();
}

TEST_F(OffloadTest, FromDiskByteForByteAndAFileChangedThereEndsTheSessionCleanly) {
  host_bytes_ = 0;
  disk_bytes_ = 64 * kMiB;
  Remake();
  Sess a = Open("a"), b = Open("b");
  const auto before = Offloaded(a, 50);
  EXPECT_EQ(Summary(a.id).offloaded_to, "disk");
  ASSERT_TRUE(Sync(a).ok());
  EXPECT_EQ(Bytes(a), before);
  EXPECT_EQ(pool_->Stats().offload_store->disk_bytes, 0u);  // the file is gone
  EXPECT_TRUE(fs::is_empty(dir_));
  Check();

  Offloaded(b, 33);
  fs::path file = fs::directory_iterator(dir_)->path();
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  auto lost = pool_->Sync(b.id, b.token, peer_, b.epoch);
  EXPECT_TRUE(absl::IsDataLoss(lost.status())) << lost.status();
  EXPECT_NE(lost.status().message().find("has ended"), std::string::npos) << lost.status();
  EXPECT_TRUE(absl::IsNotFound(pool_->Sync(b.id, b.token, peer_, b.epoch).status()));
  const PoolSummary st = pool_->Stats();
  EXPECT_EQ(st.offload.lost, 1u);
  EXPECT_EQ(st.offloaded_sessions, 0u);
  EXPECT_EQ(st.offload_store->disk_entries, 0u);
  EXPECT_EQ(pool_->num_sessions(), 1u);
  Check();
}

TEST_F(OffloadTest, OnlyAnIdleSessionGoesAndAFullStoreLeavesItsPagesInPlace) {
  Sess s = Open("a");
  ASSERT_TRUE(Append(s, 40).ok());
  ASSERT_TRUE(Sync(s).ok());
  auto busy = pool_->Offload(s.id);
  EXPECT_TRUE(absl::IsFailedPrecondition(busy.status())) << busy.status();
  EXPECT_NE(busy.status().message().find("not idle"), std::string::npos);
  EXPECT_TRUE(absl::IsNotFound(pool_->Offload(s.id + 1).status()));
  // A call after Idle makes it busy again: no offload.
  ASSERT_TRUE(Idle(s).ok());
  ASSERT_TRUE(pool_->Commit(s.id, s.token, peer_, 40).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(pool_->Offload(s.id).status()));

  host_bytes_ = 4096;  // far less than the session
  Remake();
  Sess t = Open("a");
  ASSERT_TRUE(Append(t, 40).ok());
  ASSERT_TRUE(Sync(t).ok());
  const auto before = Bytes(t);
  ASSERT_TRUE(Idle(t).ok());
  const uint64_t used = pool_->used_bytes();
  auto full = pool_->Offload(t.id);
  EXPECT_TRUE(absl::IsResourceExhausted(full.status())) << full.status();
  EXPECT_EQ(pool_->used_bytes(), used);
  EXPECT_EQ(pool_->Stats().offload.refused, 1u);
  Check();
  auto changed = Sync(t);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);  // the same tables, never gone
  EXPECT_EQ(Bytes(t), before);

  host_bytes_ = 0;
  Remake();
  Sess u = Open("a");
  ASSERT_TRUE(Append(u, 16).ok());
  ASSERT_TRUE(Sync(u).ok());
  ASSERT_TRUE(Idle(u).ok());
  auto off = pool_->Offload(u.id);
  EXPECT_TRUE(absl::IsFailedPrecondition(off.status())) << off.status();
  EXPECT_NE(off.status().message().find("not configured"), std::string::npos);
}

TEST_F(OffloadTest, ClosingOrEvictingAnOffloadedSessionDropsItsPages) {
  host_bytes_ = 1 * kMiB;
  disk_bytes_ = 64 * kMiB;
  Remake();
  Sess a = Open("a"), b = Open("b");
  Offloaded(a, 40);
  Offloaded(b, 40);
  ASSERT_TRUE(pool_->Close(a.id, a.token, peer_).ok());
  ASSERT_TRUE(pool_->Evict(b.id, "test").ok());
  const PoolSummary st = pool_->Stats();
  EXPECT_EQ(st.offloaded_sessions, 0u);
  EXPECT_EQ(st.offload_store->host_bytes + st.offload_store->disk_bytes, 0u);
  EXPECT_EQ(pool_->used_bytes(), 0u);
  EXPECT_EQ(pool_->num_sessions(), 0u);
  Check();
}

TEST_F(OffloadTest, SessionsIdleLongEnoughGoOnTheirOwn) {
  offload_idle_ = absl::Seconds(30);
  Remake();
  Sess idle = Open("a"), working = Open("b");
  ASSERT_TRUE(Append(idle, 20).ok());
  ASSERT_TRUE(Append(working, 20).ok());
  ASSERT_TRUE(Sync(idle).ok());
  ASSERT_TRUE(Idle(idle).ok());
  clock_.now += absl::Seconds(29);
  EXPECT_EQ(pool_->OffloadIdle(), 0u);
  clock_.now += absl::Seconds(2);
  EXPECT_EQ(pool_->OffloadIdle(), 1u);  // not the working one
  EXPECT_EQ(Summary(idle.id).offloaded_to, "host");
  EXPECT_EQ(Summary(working.id).offloaded_to, "");
  EXPECT_EQ(pool_->OffloadIdle(), 0u);
  Check();
  ASSERT_TRUE(Sync(idle).ok());
  Check();
}

TEST_F(OffloadTest, NoRoomToRestoreIsUnavailableAndTheSessionWaitsOffloaded) {
  Remake(/*pool_bytes=*/1 * kMiB);
  Sess a = Open("a");
  const auto before = Offloaded(a, 64);
  // Another session takes the room back meanwhile.
  Sess b = Open("b");
  absl::Status st;
  while ((st = Append(b, kBlock)).ok()) {
  }
  auto wait = pool_->Sync(a.id, a.token, peer_, a.epoch);
  EXPECT_TRUE(absl::IsUnavailable(wait.status())) << wait.status();
  EXPECT_NE(wait.status().message().find("cannot be restored now"), std::string::npos);
  EXPECT_EQ(Summary(a.id).offloaded_to, "host");
  Check();
  ASSERT_TRUE(pool_->Close(b.id, b.token, peer_).ok());
  ASSERT_TRUE(Sync(a).ok());
  EXPECT_EQ(Bytes(a), before);
  Check();
}

// Offloads racing the worker's own Syncs: a Sync that comes while the pages
// are on their way out waits for them, then brings them back; every restore
// gives the worker its bytes back, whatever the interleaving.
TEST_F(OffloadTest, OffloadsRacingTheWorkersSyncsNeverLoseAByte) {
  Sess s = Open("a");
  ASSERT_TRUE(Append(s, 100).ok());
  ASSERT_TRUE(Sync(s).ok());
  const auto before = Bytes(s);
  std::atomic<bool> done{false};
  std::atomic<int> offloaded{0};
  std::thread ops([&] {
    while (!done.load()) offloaded += pool_->Offload(s.id).ok();
  });
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(Idle(s).ok());
    auto changed = Sync(s);  // checks every slot's pattern when the tables changed
    ASSERT_TRUE(changed.ok()) << changed.status();
    if (*changed) ASSERT_EQ(Bytes(s), before) << "round " << i;
  }
  done = true;
  ops.join();
  const PoolSummary st = pool_->Stats();
  EXPECT_EQ(st.offload.offloaded, uint64_t(offloaded.load()));
  EXPECT_EQ(st.offload.restored, st.offload.offloaded - st.offloaded_sessions);
  Check();
}

// The ladder under pressure: active sessions are asked to compact at their
// next Sync; idle ones leave the pool at once, offloaded (lowest class and
// longest idle first), or evicted when offload cannot take them.
TEST_F(OffloadTest, TheLadderOffloadsIdleSessionsThenEvictsWhatItCannotOffload) {
  host_bytes_ = 1 * kMiB;  // room for one idle session
  evict_idle_ = true;
  // 4 MiB pool, 1.5 MiB watermark. A block here is 16 KiB.
  Remake(4 * kMiB, 3 * kMiB / 2);
  SetQos("busy", "h2o", 64);
  SetQos("low", "full", 0, Priority::kLow);
  SetQos("critical", "full", 0, Priority::kCritical);
  Sess busy = Open("busy"), low = Open("low"), normal = Open("normal"),
       critical = Open("critical");
  ASSERT_TRUE(Append(busy, 48 * kBlock).ok());  // 768 KiB
  for (Sess* s : {&low, &normal, &critical}) {
    ASSERT_TRUE(Append(*s, 48 * kBlock).ok());
    ASSERT_TRUE(Sync(*s).ok());
  }
  ASSERT_TRUE(Idle(normal).ok());
  clock_.now += absl::Seconds(10);  // normal has been idle longer
  ASSERT_TRUE(Idle(low).ok());
  ASSERT_TRUE(Idle(critical).ok());
  clock_.now += absl::Seconds(1);
  const auto low_bytes = Bytes(low);
  std::vector<std::string> steps = pool_->RunPressureLadder();
  Check();
  // Steps in the ladder's order: the active session is asked first (to
  // requantize, at its next Sync), then idle ones leave at once.
  EXPECT_EQ(steps, (std::vector<std::string>{"requant", "offload", "evict_idle"}));
  EXPECT_EQ(Summary(low.id).offloaded_to, "host");  // the low class first
  // The store is full now: the next idle one, the normal session, is evicted;
  // the critical one never is.
  EXPECT_TRUE(absl::IsNotFound(pool_->Sync(normal.id, normal.token, peer_, normal.epoch).status()));
  EXPECT_EQ(Summary(critical.id).offloaded_to, "");
  EXPECT_EQ(pool_->Stats().offload.evicted_idle, 1u);
  // The offloaded one comes back whole when its worker does.
  ASSERT_TRUE(Sync(low).ok());
  EXPECT_EQ(Bytes(low), low_bytes);
  Check();
}

}  // namespace
}  // namespace polykv::daemon
