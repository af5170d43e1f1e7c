// Issue 40 ([harden-2]), finding 2 in its second form: a tenant's few pages
// left in many arenas kept every one of them, and the pool then refused
// other tenants while mostly free. Sparse arenas are now vacated: their
// blocks move at their sessions' next Sync, and emptied arenas go back.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "daemon/pool/kv_pool.h"
#include "daemon/pool/page_allocator.h"
#include "tests/unit/daemon/mapped_arenas.h"

namespace polykv::daemon {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB;

TEST(PageAllocatorVacateTest, AVacatingArenaHandsOutNothingAndIsRemovableWhenEmptied) {
  PageAllocator a({64 * kKiB});
  ASSERT_TRUE(a.AddArena(1, 256 * kKiB).ok());
  ASSERT_TRUE(a.AddArena(2, 256 * kKiB).ok());
  auto in1 = a.Alloc(4 * kKiB);  // lowest offsets of the last arena pushed first
  ASSERT_TRUE(in1.ok());
  const uint32_t first = PageAllocator::ArenaOf(*in1);
  const uint32_t other = first == 1 ? 2 : 1;
  ASSERT_TRUE(a.Vacate(first).ok());
  EXPECT_TRUE(a.Vacating(first));
  EXPECT_EQ(a.num_vacating(), 1u);
  // 4 superblocks of the other arena, none of the vacating one's free ones.
  EXPECT_EQ(a.num_free_superblocks(), 4u);
  EXPECT_EQ(a.FreePagesFor(4 * kKiB), 4u * 16);
  for (int i = 0; i < 64; ++i) {
    auto p = a.Alloc(4 * kKiB);
    ASSERT_TRUE(p.ok()) << i;
    EXPECT_EQ(PageAllocator::ArenaOf(*p), other);
  }
  EXPECT_TRUE(absl::IsResourceExhausted(a.Alloc(4 * kKiB).status()));
  ASSERT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
  ASSERT_TRUE(a.Free(*in1).ok());
  EXPECT_EQ(a.EmptyArenas(), std::vector<uint32_t>{first});
  ASSERT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
  ASSERT_TRUE(a.RemoveArena(first).ok());
  EXPECT_EQ(a.num_vacating(), 0u);
  ASSERT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
}

TEST(PageAllocatorVacateTest, UnvacateOffersTheFreeSpaceAgain) {
  PageAllocator a({64 * kKiB});
  ASSERT_TRUE(a.AddArena(1, 256 * kKiB).ok());
  auto p = a.Alloc(4 * kKiB);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(a.Vacate(1).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(a.Alloc(4 * kKiB).status()));
  a.Unvacate(1);
  EXPECT_EQ(a.num_vacating(), 0u);
  EXPECT_EQ(a.FreePagesFor(4 * kKiB), 4u * 16 - 1);
  EXPECT_TRUE(a.Alloc(4 * kKiB).ok());
  ASSERT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
}

class ArenaVacatingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KvPoolOptions o;
    o.pool_bytes = 16 * kMiB;
    o.arena_bytes = 4 * kMiB;
    o.superblock_bytes = 256 * kKiB;
    o.default_lease_ms = 60000;
    o.arena_factory = CreateHostShmArena;
    auto p = KvPool::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    pool_ = *std::move(p);
  }
  OpenResult Open(const std::string& agent, const std::string& tenant) {
    OpenRequest r;
    r.agent_id = agent;
    r.tenant = tenant;
    r.profile = {4, 2, 64, DType::kF32, "tiny"};  // 8 KiB pages, 64 KiB blocks
    r.peer = peer_;
    auto s = pool_->Open(r);
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }
  void Check() {
    auto st = pool_->CheckInvariants();
    ASSERT_TRUE(st.ok()) << st;
  }
  PeerCreds peer_{getpid(), getuid(), getgid()};
  std::unique_ptr<KvPool> pool_;
};

TEST_F(ArenaVacatingTest, AFewPagesLeftInManyArenasDoNotKeepThePoolFromOtherTenants) {
  // Tenant a fills the pool, one session at a time, then each session keeps
  // its first block only: 16 blocks (1 MiB) in arenas of all 16 MiB.
  std::vector<OpenResult> a;
  std::vector<BlockDesc> kept;
  for (int i = 0; i < 16; ++i) {
    a.push_back(Open("a" + std::to_string(i), "ta"));
    auto r = pool_->Reserve(a.back().session_id, a.back().token, peer_, 256);  // 1 MiB
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    kept.push_back(r->blocks[0]);
  }
  EXPECT_FALSE(pool_->Reserve(a[0].session_id, a[0].token, peer_, 256).ok());
  MappedArenas ta(pool_.get());  // the arenas of tenant ta, all of a's sessions
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(pool_->Release(a[i].session_id, a[i].token, peer_, 16).ok());
    ASSERT_TRUE(pool_->Commit(a[i].session_id, a[i].token, peer_, 16).ok());
    for (const PageDesc& d : kept[i].pages) {
      std::memset(ta.At(a[i].session_id, a[i].token, peer_, d),
                  int(i * 16 + d.layer * 2 + d.is_value), d.size_bytes);
    }
  }
  EXPECT_EQ(pool_->used_bytes(), 16 * 64 * kKiB);
  Check();

  // Tenant b asks for 8 MiB: refused now, with the reason.
  OpenResult b = Open("b", "tb");
  auto refused = pool_->Reserve(b.session_id, b.token, peer_, 2048);
  ASSERT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  const PoolSummary before = pool_->Stats();
  EXPECT_GT(before.vacating_arenas, 0u);

  // At their next step boundary a's sessions move those blocks, byte for
  // byte, and let go of the old pages when they acknowledge.
  uint64_t moved = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    auto sync = pool_->Sync(a[i].session_id, a[i].token, peer_, 0);
    ASSERT_TRUE(sync.ok()) << sync.status();
    EXPECT_EQ(sync->committed_tokens, 16u);
    if (!sync->changed) continue;
    ++moved;
    EXPECT_TRUE(sync->same_slots);  // only the pages moved: the worker keeps its rows
    ASSERT_EQ(sync->blocks.size(), 1u);
    for (const PageDesc& d : sync->blocks[0].pages) {
      const uint8_t* p = ta.At(a[i].session_id, a[i].token, peer_, d);
      const int want = int(i * 16 + d.layer * 2 + d.is_value);
      for (uint32_t k = 0; k < d.size_bytes; ++k) ASSERT_EQ(p[k], want) << i << " " << k;
    }
    ASSERT_TRUE(pool_->Ack(a[i].session_id, a[i].token, peer_, sync->epoch).ok());
    Check();
  }
  EXPECT_GT(moved, 0u);
  const PoolSummary after = pool_->Stats();
  EXPECT_EQ(after.vacating_arenas, 0u);
  EXPECT_EQ(after.relocated_blocks, moved);
  EXPECT_EQ(pool_->used_bytes(), 16 * 64 * kKiB);

  // Now b gets its 8 MiB.
  auto granted = pool_->Reserve(b.session_id, b.token, peer_, 2048);
  ASSERT_TRUE(granted.ok()) << granted.status();
  Check();
  for (const auto& s : a) ASSERT_TRUE(pool_->Close(s.session_id, s.token, peer_).ok());
  ASSERT_TRUE(pool_->Close(b.session_id, b.token, peer_).ok());
  EXPECT_EQ(pool_->used_bytes(), 0u);
  Check();
}

}  // namespace
}  // namespace polykv::daemon
