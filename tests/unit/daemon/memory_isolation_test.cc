// Memory isolation between tenants and sessions (the memory findings of
// issue 14, [harden], each marked `// finding N`): arenas re-lent across tenants (2), pages neither reused while
// their previous worker can still write them nor handed out unscrubbed (6),
// and pool_bytes capping the memory of arenas whatever workers keep mapped
// (10). Each failed before its fix.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/daemon.h"
#include "daemon/memory/process_ref.h"
#include "daemon/pool/block_pool.h"
#include "daemon/pool/kv_pool.h"
#include "polykv/client.h"
#include "tests/unit/daemon/no_memory_arena.h"

namespace polykv::daemon {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB;

// Processes the test kills at will: a watcher over pids that are not real.
class FakeProcesses {
 public:
  ProcessWatcher Watcher() {
    return [this](pid_t pid) -> std::shared_ptr<const ProcessRef> {
      if (pid <= 0) return nullptr;
      auto& alive = alive_[pid];
      if (!alive) alive = std::make_shared<std::atomic<bool>>(true);
      return std::make_shared<Ref>(pid, alive);
    };
  }
  void Kill(pid_t pid) { alive_.at(pid)->store(false); }

 private:
  struct Ref final : ProcessRef {
    Ref(pid_t p, std::shared_ptr<std::atomic<bool>> a) : pid_(p), alive_(std::move(a)) {}
    pid_t pid() const override { return pid_; }
    bool Alive() const override { return alive_->load(); }
    pid_t pid_;
    std::shared_ptr<std::atomic<bool>> alive_;
  };
  std::map<pid_t, std::shared_ptr<std::atomic<bool>>> alive_;
};

uint64_t Resident(int fd) {
  struct stat st;
  EXPECT_EQ(fstat(fd, &st), 0);
  return uint64_t(st.st_blocks) * 512;
}

PoolSummary Summary(const BlockPool& p) {
  PoolSummary s;
  p.Summarize(s);
  return s;
}

// Two layers, K pages of 4 KiB, V pages of 2 KiB: blocks of 12 KiB.
const BlockShape kShape{2, 4096, 2048, PageFormat::kF16, PageFormat::kInt8};

ArenaFactory NoMemory() {
  return [](const ArenaOptions& o) -> absl::StatusOr<std::unique_ptr<Arena>> {
    return std::make_unique<NoMemoryArena>(o);
  };
}

// Finding 2: every tenant with pages held a whole 64 MiB arena, so a 1 GiB
// pool refused the 17th tenant's first block at 512 KiB used.
TEST(MemoryIsolationTest, SmallTenantsAreNotLockedOutByLargeArenas) {  // finding 2
  BlockPool pool(BlockPoolOptions{1024 * kMiB, 64 * kMiB, 2 * kMiB, NoMemory()});
  std::vector<BlockAccount> accounts(256);
  for (size_t i = 0; i < accounts.size(); ++i) {
    accounts[i] = {"t" + std::to_string(i), "a" + std::to_string(i), 0};
    pool.AttachSession(accounts[i]);
    ASSERT_TRUE(pool.Allocate(accounts[i], kShape, 1).ok()) << "tenant " << i;
  }
  // A tenant's first arena is arena_bytes / 16: 256 of them fill the pool,
  // and the 257th tenant is refused with 3 MiB of the 1 GiB used.
  const PoolSummary s = Summary(pool);
  EXPECT_EQ(s.num_arenas, 256u);
  EXPECT_EQ(s.arena_bytes, 1024 * kMiB);
  BlockAccount extra{"t-extra", "x", 0};
  pool.AttachSession(extra);
  EXPECT_TRUE(absl::IsResourceExhausted(pool.Allocate(extra, kShape, 1).status()));
  // A growing tenant's arenas double: 4, 8, 16, 32, 64, 64 MiB.
  BlockPool big(BlockPoolOptions{1024 * kMiB, 64 * kMiB, 2 * kMiB, NoMemory()});
  BlockAccount a{"t", "a", 0};
  big.AttachSession(a);
  ASSERT_TRUE(big.Allocate(a, BlockShape{1, 2 * 1024 * 1024, 2 * 1024 * 1024, PageFormat::kF16,
                                         PageFormat::kF16},
                           (4 + 8 + 16 + 32 + 64 + 64) / 4)
                  .ok());
  EXPECT_EQ(Summary(big).num_arenas, 6u);
  EXPECT_EQ(Summary(big).arena_bytes, 188 * kMiB);
}

// Finding 2: a tenant that once filled the pool and kept one empty session
// blocked every other tenant at 0 bytes used.
TEST(MemoryIsolationTest, EmptyArenasOfATenantWithASessionAreLentToOthers) {  // finding 2
  BlockPool pool(BlockPoolOptions{64 * kMiB, 16 * kMiB, 1 * kMiB, NoMemory()});
  BlockAccount hog{"hog", "h", 0}, other{"other", "o", 0};
  pool.AttachSession(hog);
  pool.AttachSession(other);
  std::vector<Block> held;
  for (;;) {
    auto got = pool.Allocate(hog, kShape, 16);
    if (!got.ok()) break;
    for (Block& b : *got) held.push_back(std::move(b));
  }
  ASSERT_GT(held.size(), 4000u);
  const uint64_t hog_arena_bytes = Summary(pool).arena_bytes;
  EXPECT_GE(hog_arena_bytes, 60 * kMiB);
  for (Block& b : held) pool.Free(hog, b);
  EXPECT_EQ(pool.used_bytes(), 0u);  // the hog's session stays open, empty

  // The other tenant can have as much of the pool as the hog had.
  uint64_t blocks = 0;
  while (pool.Allocate(other, kShape, 16).ok()) blocks += 16;
  EXPECT_EQ(blocks, held.size());
  PoolSummary s = Summary(pool);
  EXPECT_EQ(s.arena_bytes, hog_arena_bytes);
  for (const auto& t : s.tenants) {
    EXPECT_EQ(t.arena_bytes, t.tenant == "hog" ? 0 : hog_arena_bytes) << t.tenant;
  }
}

// Finding 10: a worker that kept its mappings after its sessions closed
// pinned 255 MiB of memfds on a 128 MiB pool while polykvd reported 0 arenas.
TEST(MemoryIsolationTest, ArenasCostNoMoreThanPoolBytesWhateverWorkersKeepMapped) {  // finding 10
  FakeProcesses procs;
  BlockPoolOptions o{8 * kMiB, 8 * kMiB, 256 * kKiB, CreateHostShmArena};
  o.first_arena_bytes = 8 * kMiB;
  o.watcher = procs.Watcher();
  BlockPool pool(o);
  BlockAccount a{"a", "x", 0}, b{"b", "y", 0};
  pool.AttachSession(a);
  auto ga = pool.Allocate(a, kShape, 8);
  ASSERT_TRUE(ga.ok());
  const uint32_t arena = pool.Locate("a", (*ga)[0].pages[0])->arena_id;
  // The worker (pid 77) maps the whole arena and writes all of it.
  auto fd = pool.DupArenaFd("a", arena, 77);
  ASSERT_TRUE(fd.ok()) << fd.status();
  void* map = mmap(nullptr, 8 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd->fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  std::memset(map, 0x5a, 8 * kMiB);
  EXPECT_EQ(Resident(fd->fd), 8 * kMiB);

  // Its tenant's last session ends; the worker keeps its mapping.
  for (Block& blk : *ga) pool.Free(a, blk);
  pool.DetachSession(a);
  PoolSummary s = Summary(pool);
  EXPECT_EQ(s.num_arenas, 0u);
  EXPECT_EQ(s.retired_arenas, 1u);  // kept while pid 77 lives
  EXPECT_EQ(Resident(fd->fd), 0u);     // but its memory is back
  EXPECT_EQ(static_cast<unsigned char*>(map)[12345], 0);  // and it reads zeros

  // The worker writes it all again (it should not; nothing of it is its
  // own any more). Another tenant then takes the whole pool: the retired
  // arena is punched again, so the two together stay within pool_bytes.
  std::memset(map, 0x6b, 8 * kMiB);
  EXPECT_EQ(Summary(pool).retired_resident_bytes, 8 * kMiB);
  pool.AttachSession(b);
  auto gb = pool.Allocate(b, kShape, 8);
  ASSERT_TRUE(gb.ok()) << gb.status();
  const uint32_t arena_b = pool.Locate("b", (*gb)[0].pages[0])->arena_id;
  EXPECT_NE(arena_b, arena);  // a retired arena's id is not reused
  auto fd_b = pool.DupArenaFd("b", arena_b, 78);
  ASSERT_TRUE(fd_b.ok());
  void* map_b = mmap(nullptr, 8 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd_b->fd, 0);
  ASSERT_NE(map_b, MAP_FAILED);
  std::memset(map_b, 0x11, 8 * kMiB);
  EXPECT_LE(Resident(fd->fd) + Resident(fd_b->fd), 8 * kMiB);
  EXPECT_EQ(static_cast<unsigned char*>(map)[0], 0);  // b's KV is not in a's memfd

  // Once pid 77 is gone the retired arena is dropped.
  procs.Kill(77);
  pool.SweepRetired();
  EXPECT_EQ(Summary(pool).retired_arenas, 0u);
  munmap(map, 8 * kMiB);
  munmap(map_b, 8 * kMiB);
  close(fd->fd);
  close(fd_b->fd);
}

// Finding 6 (second half): freshly reserved pages held the previous
// session's KV.
TEST(MemoryIsolationTest, ReservedPagesAreZeroed) {  // finding 6
  BlockPoolOptions o{1 * kMiB, 1 * kMiB, 256 * kKiB, CreateHostShmArena};
  BlockPool pool(o);
  BlockAccount a{"t", "x", 0};
  pool.AttachSession(a);
  auto first = pool.Allocate(a, kShape, 1);
  ASSERT_TRUE(first.ok());
  const std::vector<PageId> pages = (*first)[0].pages;
  for (size_t i = 0; i < pages.size(); ++i) {
    auto* p = reinterpret_cast<unsigned char*>(pool.HostAddress("t", pages[i]));
    std::memset(p, 0xab, kShape.page_bytes(i));
  }
  pool.Free(a, (*first)[0]);
  auto again = pool.Allocate(a, kShape, 1);
  ASSERT_TRUE(again.ok());
  // The allocator hands the same pages back (in another order)...
  ASSERT_EQ(std::set<PageId>((*again)[0].pages.begin(), (*again)[0].pages.end()),
            std::set<PageId>(pages.begin(), pages.end()));
  for (size_t i = 0; i < pages.size(); ++i) {
    auto* p = reinterpret_cast<unsigned char*>(pool.HostAddress("t", (*again)[0].pages[i]));
    for (uint32_t j = 0; j < kShape.page_bytes(i); ++j) {
      ASSERT_EQ(p[j], 0) << "page " << i << " byte " << j;  // ...scrubbed
    }
  }
}

// Found by the soak: an arena announced to a session (OpenSession lists the
// tenant's arenas, empty ones too) and retired under pressure before the
// worker fetched it made the fetch PERMISSION_DENIED, and the client's
// OpenSession failed. It is NOT_FOUND now (the client skips it: nothing of
// the session is in it); to other tenants it stays PERMISSION_DENIED.
TEST(MemoryIsolationTest, AnArenaRetiredBeforeItsFetchIsNotFoundAndAnnouncedAgainIfReused) {  // finding 2
  KvPoolOptions o;
  o.pool_bytes = 8 * kMiB;
  o.arena_bytes = 4 * kMiB;
  o.first_arena_bytes = 4 * kMiB;
  o.superblock_bytes = 256 * kKiB;
  o.arena_factory = CreateHostShmArena;
  auto pool = *KvPool::Create(o);
  const PeerCreds peer{0, 1000, 1000};
  auto open = [&](const std::string& tenant, const std::string& agent) {
    OpenRequest r;
    r.agent_id = agent;
    r.tenant = tenant;
    r.profile = {4, 2, 64, DType::kF32, "tiny"};
    r.peer = peer;
    auto s = pool->Open(r);
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  };
  const OpenResult a = open("t1", "a");
  ASSERT_TRUE(pool->Reserve(a.session_id, a.token, peer, 64).ok());
  ASSERT_TRUE(pool->Release(a.session_id, a.token, peer, 0).ok());  // t1's arena is empty
  const OpenResult b = open("t1", "b");
  ASSERT_EQ(b.arenas.size(), 1u);
  const uint32_t listed = b.arenas[0].arena_id;
  const OpenResult c = open("t2", "c");
  ASSERT_TRUE(pool->Reserve(c.session_id, c.token, peer, 1280).ok());  // retires t1's
  EXPECT_EQ(pool->Stats().tenants.size(), 2u);
  auto fd = pool->DupArenaFd(b.session_id, b.token, peer, listed);
  EXPECT_TRUE(absl::IsNotFound(fd.status())) << fd.status();
  // An id that was never t1's stays PERMISSION_DENIED, live or not.
  EXPECT_TRUE(absl::IsPermissionDenied(pool->DupArenaFd(b.session_id, b.token, peer, 999).status()));
  // t1 grows again; whatever id its new arena has, b is told of it.
  ASSERT_TRUE(pool->Release(c.session_id, c.token, peer, 0).ok());
  auto rb = pool->Reserve(b.session_id, b.token, peer, 16);
  ASSERT_TRUE(rb.ok()) << rb.status();
  ASSERT_EQ(rb->new_arenas.size(), 1u);
  const uint32_t mine = rb->blocks[0].pages[0].arena_id;
  EXPECT_EQ(rb->new_arenas[0].arena_id, mine);
  auto fd2 = pool->DupArenaFd(b.session_id, b.token, peer, mine);
  ASSERT_TRUE(fd2.ok()) << fd2.status();
  close(fd2->fd);
  ASSERT_TRUE(pool->CheckInvariants().ok());
}

// --- Finding 6: a worker stopped past its lease kept a writable mapping; its
// pages went to another session, and on resume it overwrote all 8 of them.

class QuarantineTest : public ::testing::Test {
 protected:
  void SetUp() override { MakePool(); }
  void MakePool(uint32_t max_sessions_per_uid = 0) {
    KvPoolOptions o;
    o.max_sessions_per_uid = max_sessions_per_uid;
    o.pool_bytes = 16 * kMiB;
    o.arena_bytes = 4 * kMiB;
    o.superblock_bytes = 256 * kKiB;
    o.default_lease_ms = 1000;
    o.arena_factory = CreateHostShmArena;
    o.clock = [this] { return now_; };
    o.process_watcher = procs_.Watcher();
    auto p = KvPool::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    pool_ = *std::move(p);
  }

  // 4 layers x 2 heads x 64 f32: blocks of 64 KiB.
  OpenResult Open(const std::string& agent, pid_t pid) {
    OpenRequest r;
    r.agent_id = agent;
    r.tenant = "t1";
    r.profile = {4, 2, 64, DType::kF32, "tiny"};
    r.peer = {pid, 1000, 1000};
    auto s = pool_->Open(r);
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }

  std::set<PageId> Reserve(const OpenResult& s, pid_t pid, uint64_t tokens) {
    auto r = pool_->Reserve(s.session_id, s.token, {pid, 1000, 1000}, tokens);
    EXPECT_TRUE(r.ok()) << r.status();
    std::set<PageId> pages;
    if (r.ok()) {
      for (const auto& b : r->blocks) {
        for (const auto& p : b.pages) pages.insert(p.page_id);
      }
    }
    return pages;
  }

  static bool Disjoint(const std::set<PageId>& a, const std::set<PageId>& b) {
    for (PageId p : a) {
      if (b.contains(p)) return false;
    }
    return true;
  }

  FakeProcesses procs_;
  absl::Time now_ = absl::FromUnixSeconds(1000000);
  std::unique_ptr<KvPool> pool_;
};

TEST_F(QuarantineTest, PagesOfAnExpiredLiveWorkerAreNotGivenToAnotherSession) {  // finding 6
  const OpenResult stale = Open("stale", 101);
  const std::set<PageId> stale_pages = Reserve(stale, 101, 8 * 16);
  ASSERT_EQ(stale_pages.size(), 8u * 8);
  const uint64_t held = pool_->used_bytes();
  // pid 101 is stopped (SIGSTOP) past its lease; the daemon reclaims it.
  now_ += absl::Seconds(5);
  ASSERT_EQ(pool_->ReclaimExpired().size(), 1u);
  EXPECT_EQ(pool_->num_sessions(), 0u);
  PoolSummary s = pool_->Stats();
  EXPECT_EQ(s.quarantined_sessions, 1u);
  EXPECT_EQ(s.quarantined_bytes, held);
  EXPECT_EQ(pool_->used_bytes(), held);  // still charged: not reusable
  ASSERT_TRUE(pool_->CheckInvariants().ok()) << pool_->CheckInvariants();

  // Another session of the same tenant gets other pages.
  const OpenResult fresh = Open("fresh", 202);
  EXPECT_TRUE(Disjoint(stale_pages, Reserve(fresh, 202, 8 * 16)));
  ASSERT_TRUE(pool_->CheckInvariants().ok()) << pool_->CheckInvariants();

  // A call with the wrong token, or from another uid, learns nothing and
  // frees nothing; nor does the worker's heartbeat thread, which runs beside
  // the thread that writes the pages.
  const PeerCreds stale_peer{101, 1000, 1000};
  EXPECT_TRUE(absl::IsNotFound(pool_->Commit(stale.session_id, "wrong", stale_peer, 16).status()));
  EXPECT_TRUE(absl::IsNotFound(
      pool_->Commit(stale.session_id, stale.token, {101, 1001, 1000}, 16).status()));
  EXPECT_TRUE(absl::IsNotFound(pool_->Heartbeat(stale.session_id, stale.token, stale_peer).status()));
  EXPECT_EQ(pool_->Stats().quarantined_sessions, 1u);

  // Resumed, the worker's next call says the session is gone: from then on
  // it does not write its pages, and they are released.
  auto c = pool_->Commit(stale.session_id, stale.token, stale_peer, 16);
  EXPECT_TRUE(absl::IsNotFound(c.status())) << c.status();
  s = pool_->Stats();
  EXPECT_EQ(s.quarantined_sessions, 0u);
  EXPECT_EQ(s.quarantined_bytes, 0u);
  EXPECT_EQ(pool_->used_bytes(), held);  // only fresh's now
  ASSERT_TRUE(pool_->CheckInvariants().ok()) << pool_->CheckInvariants();
}

TEST_F(QuarantineTest, PagesOfAnEvictedWorkerComeBackWhenItsProcessIsGone) {  // finding 6
  const OpenResult a = Open("a", 101);
  Reserve(a, 101, 4 * 16);
  ASSERT_TRUE(pool_->Evict(a.session_id, "test").ok());
  EXPECT_EQ(pool_->Stats().quarantined_sessions, 1u);
  pool_->ReclaimExpired();
  EXPECT_EQ(pool_->Stats().quarantined_sessions, 1u);  // pid 101 still runs
  procs_.Kill(101);
  pool_->ReclaimExpired();
  EXPECT_EQ(pool_->Stats().quarantined_sessions, 0u);
  EXPECT_EQ(pool_->used_bytes(), 0u);
  EXPECT_EQ(pool_->Stats().bytes_by_agent.size(), 0u);
  ASSERT_TRUE(pool_->CheckInvariants().ok()) << pool_->CheckInvariants();
}

TEST_F(QuarantineTest, PagesGivenBackOrOfDeadWorkersAreReusedAtOnce) {  // finding 6
  // Close: the worker itself gives them back, and the next session of the
  // tenant may have them.
  const OpenResult a = Open("a", 101);
  const OpenResult b = Open("b", 102);
  const std::set<PageId> pages = Reserve(a, 101, 4 * 16);
  ASSERT_TRUE(pool_->Close(a.session_id, a.token, {101, 1000, 1000}).ok());
  EXPECT_EQ(pool_->Stats().quarantined_sessions, 0u);
  EXPECT_EQ(pool_->used_bytes(), 0u);
  EXPECT_FALSE(Disjoint(pages, Reserve(b, 102, 4 * 16)));
  // A worker already dead when its lease runs out (SIGKILL) cannot write.
  procs_.Kill(102);
  now_ += absl::Seconds(5);
  ASSERT_EQ(pool_->ReclaimExpired().size(), 1u);
  PoolSummary s = pool_->Stats();
  EXPECT_EQ(s.quarantined_sessions, 0u);
  EXPECT_EQ(s.used_bytes, 0u);
  ASSERT_TRUE(pool_->CheckInvariants().ok()) << pool_->CheckInvariants();
}

// The finding as found, end to end: a real polykvd (in this process, so the
// worker it watches — this process — stays alive) and the client library.
// A worker stops past its lease; its pages must not go to the next session
// of its tenant, or its writes on resume land in that session's KV.
TEST(MemoryIsolationEndToEndTest, AWorkerResumedPastItsLeaseCannotOverwriteAnotherSession) {  // finding 6
  char tmpl[] = "/tmp/polykv-finding6-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  DaemonConfig cfg;
  cfg.socket = dir + "/d.sock";
  cfg.metrics_address = "off";
  cfg.pool_bytes = 16 * kMiB;
  cfg.arena_bytes = 4 * kMiB;
  cfg.superblock_bytes = 256 * kKiB;
  cfg.lease_ms = 300;
  auto d = Daemon::Create(cfg);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE((*d)->Start().ok());
  auto client = polykv::Client::Connect(cfg.socket);
  ASSERT_TRUE(client.ok()) << client.status();

  auto open = [&](const std::string& agent, bool heartbeat) {
    polykv::SessionOptions o;
    o.agent_id = agent;
    o.tenant = "t";
    o.profile = {4, 2, 64, DType::kF32, "tiny"};
    o.heartbeat = heartbeat;
    auto s = (*client)->OpenSession(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  };
  auto fill = [](const std::vector<polykv::Block>& blocks, unsigned char byte) {
    for (const polykv::Block& b : blocks) {
      for (const polykv::Page& p : b.pages) std::memset(p.addr, byte, p.size_bytes);
    }
  };
  // Keeps the tenant's arena in use, so freed pages would be reused in it.
  auto keeper = open("keeper", true);
  ASSERT_NE(keeper, nullptr);
  ASSERT_TRUE(keeper->Reserve(16).ok());
  auto stale = open("stale", /*heartbeat=*/false);  // as if stopped (SIGSTOP)
  ASSERT_NE(stale, nullptr);
  auto stale_blocks = stale->Reserve(8 * 16);
  ASSERT_TRUE(stale_blocks.ok()) << stale_blocks.status();
  fill(*stale_blocks, 0x11);

  // Its lease runs out and the daemon takes the session.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((*d)->pool()->Stats().lease_expiries == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ((*d)->pool()->Stats().lease_expiries, 1u);
  EXPECT_EQ((*d)->pool()->Stats().quarantined_sessions, 1u);

  auto fresh = open("fresh", true);
  ASSERT_NE(fresh, nullptr);
  auto fresh_blocks = fresh->Reserve(8 * 16);
  ASSERT_TRUE(fresh_blocks.ok()) << fresh_blocks.status();
  fill(*fresh_blocks, 0x77);

  // Resumed, the stale worker writes the pages it still maps...
  fill(*stale_blocks, 0xee);
  // ...and the fresh session's KV is intact.
  for (const polykv::Block& b : *fresh_blocks) {
    for (const polykv::Page& p : b.pages) {
      const auto* bytes = static_cast<const unsigned char*>(p.addr);
      for (uint32_t i = 0; i < p.size_bytes; ++i) {
        ASSERT_EQ(bytes[i], 0x77) << "page " << p.page_id << " byte " << i << " overwritten";
      }
    }
  }
  // Its next call tells it the session is gone; then its pages come back.
  EXPECT_TRUE(absl::IsNotFound(stale->Commit(16)));
  EXPECT_EQ((*d)->pool()->Stats().quarantined_sessions, 0u);
  EXPECT_TRUE((*d)->pool()->CheckInvariants().ok());
  stale.reset();
  fresh.reset();
  keeper.reset();
  EXPECT_EQ((*d)->pool()->used_bytes(), 0u);
  (*d)->Shutdown();
}

// Letting leases run out does not get a uid more sessions than its cap.
TEST_F(QuarantineTest, QuarantinedSessionsCountAgainstTheUidsSessionCap) {  // finding 6
  MakePool(/*max_sessions_per_uid=*/2);
  const OpenResult a = Open("a", 101);
  Reserve(a, 101, 16);
  const OpenResult b = Open("b", 101);
  Reserve(b, 101, 16);
  now_ += absl::Seconds(5);
  ASSERT_EQ(pool_->ReclaimExpired().size(), 2u);
  EXPECT_EQ(pool_->Stats().quarantined_sessions, 2u);
  OpenRequest r;
  r.agent_id = "c";
  r.tenant = "t1";
  r.profile = {4, 2, 64, DType::kF32, "tiny"};
  r.peer = {101, 1000, 1000};
  EXPECT_TRUE(absl::IsResourceExhausted(pool_->Open(r).status()));
  // Once the worker has heard of one, it may open one more.
  EXPECT_TRUE(absl::IsNotFound(pool_->Sync(a.session_id, a.token, r.peer, 0).status()));
  EXPECT_TRUE(pool_->Open(r).ok());
}

// The watcher polykvd uses: a pidfd notices a real child's exit, whatever
// becomes of its pid number.
TEST(ProcessRefTest, PidfdSeesAChildExit) {
  if (!PidfdsSupported()) GTEST_SKIP() << "kernel without pidfd_open";
  const ProcessWatcher watch = PidfdWatcher();
  EXPECT_EQ(watch(0), nullptr);
  auto self = watch(getpid());
  ASSERT_NE(self, nullptr);
  EXPECT_TRUE(self->Alive());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  auto ref = watch(child);
  ASSERT_NE(ref, nullptr);
  EXPECT_EQ(ref->pid(), child);
  EXPECT_TRUE(ref->Alive());
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_FALSE(ref->Alive());
  EXPECT_EQ(watch(child), nullptr);  // reaped: nothing to wait for
}

}  // namespace
}  // namespace polykv::daemon

namespace polykv::daemon {
namespace {

// Issue 40: one pidfd was kept per process that ever fetched an arena, so a
// uid forking fetchers grew the daemon's fds without bound. Live holders of
// an arena are capped; a dead one makes room.
TEST(MemoryIsolationTest, TheProcessesWatchedPerArenaAreBounded) {
  FakeProcesses procs;
  BlockPoolOptions o{16 * kMiB, 4 * kMiB, 256 * kKiB, CreateHostShmArena};
  o.watcher = procs.Watcher();
  BlockPool pool(o);
  BlockAccount a{"t", "a", 0};
  pool.AttachSession(a);
  auto blocks = pool.Allocate(a, kShape, 1);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  const uint32_t arena = PageAllocator::ArenaOf(blocks->front().pages[0]);
  for (pid_t pid = 1000; pid < 1064; ++pid) {
    auto fd = pool.DupArenaFd("t", arena, pid);
    ASSERT_TRUE(fd.ok()) << pid << ": " << fd.status();
    close(fd->fd);
  }
  auto again = pool.DupArenaFd("t", arena, 1000);  // a known holder: served
  ASSERT_TRUE(again.ok()) << again.status();
  close(again->fd);
  auto refused = pool.DupArenaFd("t", arena, 2000);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  procs.Kill(1001);
  auto room = pool.DupArenaFd("t", arena, 2000);
  ASSERT_TRUE(room.ok()) << room.status();
  close(room->fd);
}

}  // namespace
}  // namespace polykv::daemon
