// BlockPool: per-tenant arenas and allocators, all-or-nothing block
// allocation, the account / agent / pool / per-format counts, arena release
// when a tenant's last session ends, and DescribeBlock's arithmetic against
// the allocator's Locate. Exact state after every step.
#include "daemon/pool/block_pool.h"

#include <unistd.h>

#include <cstring>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "tests/unit/daemon/no_memory_arena.h"

namespace polykv::daemon {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kSb = 64 * kKiB;      // superblock
constexpr uint64_t kArena = 2 * kSb;     // two superblocks per arena
constexpr uint64_t kPool = 4 * kArena;   // four arenas, eight superblocks

// Two layers; K pages of 4 KiB (16 per superblock), V pages of 2 KiB (32 per
// superblock): one block is 2 x (4096 + 2048) = 12 KiB, and a K superblock
// holds the K pages of 8 blocks, a V superblock the V pages of 16.
BlockShape Shape() {
  return BlockShape{2, 4096, 2048, PageFormat::kF16, PageFormat::kInt8};
}
constexpr uint64_t kBlockBytes = 2 * (4096 + 2048);

class BlockPoolTest : public ::testing::Test {
 protected:
  std::unique_ptr<BlockPool> Make(uint64_t pool_bytes = kPool, ArenaFactory f = {}) {
    BlockPoolOptions o;
    o.pool_bytes = pool_bytes;
    o.arena_bytes = kArena;
    o.superblock_bytes = kSb;
    o.first_arena_bytes = kArena;  // fixed-size arenas; growth is tested apart
    o.arena_factory = f ? f : ArenaFactory([this](const ArenaOptions& ao) {
      ++arenas_made_;
      return CreateHostShmArena(ao);
    });
    return std::make_unique<BlockPool>(std::move(o));
  }

  // The pool's own counts against what the test's accounts hold.
  void Check(const BlockPool& p, const std::vector<const BlockAccount*>& accounts,
             uint64_t pages) {
    BlockPool::Holdings held;
    held.pages = pages;
    for (const BlockAccount* a : accounts) {
      held.agent_bytes[a->agent_id] += a->bytes;
      held.bytes += a->bytes;
    }
    auto s = p.CheckInvariants(held);
    ASSERT_TRUE(s.ok()) << s;
  }

  static PoolSummary Summary(const BlockPool& p) {
    PoolSummary s;
    p.Summarize(s);
    return s;
  }

  static uint64_t FormatPages(const PoolSummary& s, PageFormat f, bool value) {
    for (const auto& [k, n] : s.pages_by_format) {
      if (k == std::make_pair(f, value)) return n;
    }
    return 0;
  }

  static const TenantSummary* TenantOf(const PoolSummary& s, const std::string& name) {
    for (const auto& t : s.tenants) {
      if (t.tenant == name) return &t;
    }
    return nullptr;
  }

  int arenas_made_ = 0;
};

TEST_F(BlockPoolTest, AllocateChargesAccountAgentPoolAndFormatsExactly) {
  auto pool = Make();
  BlockAccount a{"t1", "agent-x", 0};
  pool->AttachSession(a);
  EXPECT_EQ(pool->agent_bytes("agent-x"), 0u);
  ASSERT_EQ(pool->bytes_by_agent().size(), 1u);  // the agent is known at 0 bytes
  Check(*pool, {&a}, 0);

  auto got = pool->Allocate(a, Shape(), 3);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 3u);
  std::set<PageId> distinct;
  for (const Block& b : *got) {
    ASSERT_EQ(b.pages.size(), 4u);  // K, V of two layers
    for (PageId p : b.pages) distinct.insert(p);
  }
  EXPECT_EQ(distinct.size(), 12u);
  EXPECT_EQ(a.bytes, 3 * kBlockBytes);
  EXPECT_EQ(pool->used_bytes(), 3 * kBlockBytes);
  EXPECT_EQ(pool->free_bytes(), kPool - 3 * kBlockBytes);
  EXPECT_EQ(pool->agent_bytes("agent-x"), 3 * kBlockBytes);
  PoolSummary s = Summary(*pool);
  EXPECT_EQ(s.used_bytes, 3 * kBlockBytes);
  EXPECT_EQ(s.num_arenas, 1u);
  EXPECT_EQ(s.arena_bytes, kArena);
  EXPECT_EQ(s.num_pages, 12u);
  EXPECT_EQ(s.num_superblocks_used, 2u);  // one per size class
  EXPECT_EQ(FormatPages(s, PageFormat::kF16, false), 6u);
  EXPECT_EQ(FormatPages(s, PageFormat::kInt8, true), 6u);
  EXPECT_EQ(arenas_made_, 1);
  ASSERT_NE(TenantOf(s, "t1"), nullptr);
  EXPECT_EQ(TenantOf(s, "t1")->used_bytes, 3 * kBlockBytes);
  EXPECT_EQ(TenantOf(s, "t1")->num_sessions, 1u);
  Check(*pool, {&a}, 12);

  // Free one block: exactly one block's worth comes back, the block is emptied.
  Block& middle = (*got)[1];
  pool->Free(a, middle);
  EXPECT_TRUE(middle.empty());
  EXPECT_EQ(a.bytes, 2 * kBlockBytes);
  EXPECT_EQ(pool->used_bytes(), 2 * kBlockBytes);
  s = Summary(*pool);
  EXPECT_EQ(FormatPages(s, PageFormat::kF16, false), 4u);
  EXPECT_EQ(FormatPages(s, PageFormat::kInt8, true), 4u);
  Check(*pool, {&a}, 8);
  // Freeing an empty block is a no-op.
  pool->Free(a, middle);
  EXPECT_EQ(a.bytes, 2 * kBlockBytes);
  Check(*pool, {&a}, 8);

  pool->Free(a, (*got)[0]);
  pool->Free(a, (*got)[2]);
  EXPECT_EQ(a.bytes, 0u);
  EXPECT_EQ(pool->used_bytes(), 0u);
  EXPECT_EQ(pool->agent_bytes("agent-x"), 0u);
  s = Summary(*pool);
  EXPECT_EQ(s.num_pages, 0u);
  EXPECT_EQ(s.num_superblocks_used, 0u);
  EXPECT_EQ(s.num_arenas, 1u);  // the session is still open: its arena stays
  Check(*pool, {&a}, 0);
}

TEST_F(BlockPoolTest, ZeroBlocksIsAnEmptySuccess) {
  auto pool = Make();
  BlockAccount a{"t1", "x", 0};
  pool->AttachSession(a);
  auto got = pool->Allocate(a, Shape(), 0);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
  EXPECT_EQ(Summary(*pool).num_arenas, 0u);
  Check(*pool, {&a}, 0);
}

TEST_F(BlockPoolTest, DescribeBlockEqualsLocateForEveryAllocatedPage) {
  auto pool = Make();
  BlockAccount a{"t1", "x", 0};
  BlockAccount b{"t2", "y", 0};
  pool->AttachSession(a);
  pool->AttachSession(b);
  // Interleave two tenants and frees so pages land in several arenas and in
  // reused slots.
  std::vector<Block> as, bs;
  for (int round = 0; round < 5; ++round) {
    auto ga = pool->Allocate(a, Shape(), 4);
    ASSERT_TRUE(ga.ok()) << ga.status();
    auto gb = pool->Allocate(b, Shape(), 2);
    ASSERT_TRUE(gb.ok()) << gb.status();
    for (Block& x : *ga) as.push_back(std::move(x));
    for (Block& x : *gb) bs.push_back(std::move(x));
    pool->Free(a, as[as.size() - 3]);
    Check(*pool, {&a, &b}, 4 * (as.size() + bs.size() - round - 1));
  }
  std::erase_if(as, [](const Block& x) { return x.empty(); });
  EXPECT_EQ(Summary(*pool).num_arenas, 4u);  // two per tenant: the whole budget
  std::set<std::pair<uint32_t, uint64_t>> where;
  for (const auto& [tenant, blocks] :
       {std::pair<std::string, std::vector<Block>*>{"t1", &as}, {"t2", &bs}}) {
    for (uint32_t i = 0; i < blocks->size(); ++i) {
      const Block& blk = (*blocks)[i];
      const BlockDesc d = DescribeBlock(kSb, blk, i);
      EXPECT_EQ(d.block_index, i);
      ASSERT_EQ(d.pages.size(), blk.pages.size());
      for (size_t j = 0; j < blk.pages.size(); ++j) {
        auto loc = pool->Locate(tenant, blk.pages[j]);
        ASSERT_TRUE(loc.ok()) << loc.status();
        const PageDesc& p = d.pages[j];
        EXPECT_EQ(p.page_id, blk.pages[j]);
        EXPECT_EQ(p.arena_id, loc->arena_id);
        EXPECT_EQ(p.offset, loc->offset);
        EXPECT_EQ(p.size_bytes, loc->size_bytes);
        EXPECT_EQ(p.layer, j / 2);
        EXPECT_EQ(p.is_value, j % 2 == 1);
        EXPECT_EQ(p.format, j % 2 ? PageFormat::kInt8 : PageFormat::kF16);
        EXPECT_EQ(p.block_index, i);
        EXPECT_TRUE(where.insert({p.arena_id, p.offset}).second) << "page placed twice";
        // A tenant's page is not found in the other tenant's allocator.
        EXPECT_FALSE(pool->Locate(tenant == "t1" ? "t2" : "t1", blk.pages[j]).ok());
      }
    }
  }
}

TEST_F(BlockPoolTest, HostAddressIsArenaBasePlusOffsetAndZeroWhenUnknown) {
  auto pool = Make();
  BlockAccount a{"t1", "x", 0};
  pool->AttachSession(a);
  auto got = pool->Allocate(a, Shape(), 2);
  ASSERT_TRUE(got.ok());
  const PageId p0 = (*got)[0].pages[0], p1 = (*got)[1].pages[0];  // two K pages, same superblock
  const uint64_t h0 = pool->HostAddress("t1", p0), h1 = pool->HostAddress("t1", p1);
  ASSERT_NE(h0, 0u);
  EXPECT_EQ(h1 - h0, pool->Locate("t1", p1)->offset - pool->Locate("t1", p0)->offset);
  EXPECT_EQ(h1 - h0, 8192u);  // K pages go K0, K1 of block 0, then K0 of block 1
  // The address is the daemon's mapping of the arena: writable memory.
  std::memset(reinterpret_cast<void*>(h1), 0xab, 4096);
  Block first = (*got)[0];
  pool->Free(a, (*got)[0]);
  EXPECT_EQ(pool->HostAddress("t1", first.pages[0]), 0u);  // freed: no address
  Check(*pool, {&a}, 4);
}

TEST_F(BlockPoolTest, DeviceArenasHaveNoHostAddressAndNoFd) {
  auto pool = Make(kPool, [](const ArenaOptions& o) -> absl::StatusOr<std::unique_ptr<Arena>> {
    return std::make_unique<NoMemoryArena>(o);
  });
  BlockAccount a{"t1", "x", 0};
  pool->AttachSession(a);
  auto got = pool->Allocate(a, Shape(), 1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(pool->HostAddress("t1", (*got)[0].pages[0]), 0u);
  auto loc = pool->Locate("t1", (*got)[0].pages[0]);
  ASSERT_TRUE(loc.ok());
  auto fd = pool->DupArenaFd("t1", loc->arena_id, 0);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kFailedPrecondition) << fd.status();
  Check(*pool, {&a}, 4);
}

TEST_F(BlockPoolTest, FailedAllocateRollsBackPagesAndTheArenasItAdded) {
  auto pool = Make();
  BlockAccount a{"t1", "x", 0};
  pool->AttachSession(a);
  // 8 blocks: one K superblock and one V superblock: one arena.
  auto first = pool->Allocate(a, Shape(), 8);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(Summary(*pool).num_arenas, 1u);
  // 40 blocks need 5 K + 3 V superblocks = the whole pool; 41 need 9.
  auto too_many = pool->Allocate(a, Shape(), 33);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted) << too_many.status();
  PoolSummary s = Summary(*pool);
  EXPECT_EQ(s.num_arenas, 1u);  // the three arenas added for the call are gone
  EXPECT_EQ(s.arena_bytes, kArena);
  EXPECT_EQ(s.num_pages, 32u);
  EXPECT_EQ(s.num_superblocks_used, 2u);
  EXPECT_EQ(a.bytes, 8 * kBlockBytes);
  EXPECT_EQ(pool->used_bytes(), 8 * kBlockBytes);
  EXPECT_EQ(FormatPages(s, PageFormat::kF16, false), 16u);
  EXPECT_EQ(FormatPages(s, PageFormat::kInt8, true), 16u);
  EXPECT_EQ(arenas_made_, 4);
  Check(*pool, {&a}, 32);
  // Exactly what fits still succeeds.
  auto rest = pool->Allocate(a, Shape(), 32);
  ASSERT_TRUE(rest.ok()) << rest.status();
  s = Summary(*pool);
  EXPECT_EQ(s.num_arenas, 4u);
  EXPECT_EQ(s.arena_bytes, kPool);
  EXPECT_EQ(s.num_superblocks_used, 8u);
  EXPECT_EQ(a.bytes, 40 * kBlockBytes);
  EXPECT_EQ(pool->free_bytes(), kPool - 40 * kBlockBytes);
  Check(*pool, {&a}, 160);
  // Full: one more block fails and nothing changes.
  EXPECT_TRUE(absl::IsResourceExhausted(pool->Allocate(a, Shape(), 1).status()));
  EXPECT_EQ(a.bytes, 40 * kBlockBytes);
  EXPECT_EQ(Summary(*pool).num_pages, 160u);
  Check(*pool, {&a}, 160);
}

TEST_F(BlockPoolTest, ImpossiblePagesAndFailingArenaFactoriesChangeNothing) {
  int calls = 0;
  auto pool = Make(kPool, [&](const ArenaOptions& o) -> absl::StatusOr<std::unique_ptr<Arena>> {
    if (++calls == 2) return absl::InternalError("memfd_create failed");
    return CreateHostShmArena(o);
  });
  BlockAccount a{"t1", "x", 0};
  pool->AttachSession(a);
  // A K page larger than a superblock: INVALID_ARGUMENT, no arena kept.
  BlockShape huge = Shape();
  huge.key_page_bytes = 2 * kSb;
  EXPECT_EQ(pool->Allocate(a, huge, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Summary(*pool).num_arenas, 0u);
  Check(*pool, {&a}, 0);
  // The first arena is made; the second (needed for block 9's K pages) fails.
  auto got = pool->Allocate(a, Shape(), 40);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal) << got.status();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(Summary(*pool).num_arenas, 0u);
  EXPECT_EQ(Summary(*pool).num_pages, 0u);
  EXPECT_EQ(a.bytes, 0u);
  Check(*pool, {&a}, 0);
  got = pool->Allocate(a, Shape(), 40);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(calls, 6);
  EXPECT_EQ(Summary(*pool).num_arenas, 4u);
  Check(*pool, {&a}, 160);
}

TEST_F(BlockPoolTest, ArenasArePrivateToTheirTenant) {
  auto pool = Make();
  BlockAccount a{"t1", "x", 0};
  BlockAccount b{"t2", "x", 0};  // same agent, other tenant
  pool->AttachSession(a);
  pool->AttachSession(b);
  auto ga = pool->Allocate(a, Shape(), 1);
  auto gb = pool->Allocate(b, Shape(), 20);  // 3 K + 2 V superblocks: three arenas
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_EQ(pool->agent_bytes("x"), 21 * kBlockBytes);
  const uint32_t arena_a = pool->Locate("t1", (*ga)[0].pages[0])->arena_id;
  std::set<uint32_t> arenas_b;
  for (const Block& blk : *gb) {
    for (PageId p : blk.pages) arenas_b.insert(pool->Locate("t2", p)->arena_id);
  }
  ASSERT_EQ(arenas_b.size(), 3u);
  EXPECT_FALSE(arenas_b.contains(arena_a));

  auto fd = pool->DupArenaFd("t1", arena_a, 0);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_GE(fd->fd, 0);
  close(fd->fd);
  for (uint32_t id : arenas_b) {
    EXPECT_EQ(pool->DupArenaFd("t1", id, 0).status().code(), absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(pool->DupArenaFd("t1", 999, 0).status().code(), absl::StatusCode::kPermissionDenied);

  // NewArenas: only the tenant's own, once each; `known` stays sorted.
  std::vector<uint32_t> known;
  auto exports = pool->NewArenas("t2", known);
  ASSERT_EQ(exports.size(), 3u);
  for (const auto& e : exports) {
    EXPECT_TRUE(arenas_b.contains(e.arena_id));
    EXPECT_EQ(e.size_bytes, kArena);
  }
  EXPECT_EQ(known, std::vector<uint32_t>(arenas_b.begin(), arenas_b.end()));
  EXPECT_TRUE(pool->NewArenas("t2", known).empty());
  std::vector<uint32_t> known_a;
  ASSERT_EQ(pool->NewArenas("t1", known_a).size(), 1u);
  EXPECT_EQ(known_a, std::vector<uint32_t>{arena_a});
  Check(*pool, {&a, &b}, 84);
}

TEST_F(BlockPoolTest, LastSessionOfATenantReleasesItsArenas) {
  auto pool = Make();
  BlockAccount a1{"t1", "x", 0}, a2{"t1", "y", 0}, other{"t2", "z", 0};
  pool->AttachSession(a1);
  pool->AttachSession(a2);
  pool->AttachSession(other);
  auto g1 = pool->Allocate(a1, Shape(), 8);
  auto g2 = pool->Allocate(a2, Shape(), 8);
  auto go = pool->Allocate(other, Shape(), 1);
  ASSERT_TRUE(g1.ok() && g2.ok() && go.ok());
  EXPECT_EQ(Summary(*pool).num_arenas, 3u);  // t1: 2 K + 1 V superblocks; t2: 1
  for (Block& b : *g1) pool->Free(a1, b);
  pool->DetachSession(a1);
  pool->ForgetAgent("x");
  EXPECT_EQ(pool->bytes_by_agent().count("x"), 0u);
  EXPECT_EQ(Summary(*pool).num_arenas, 3u);  // t1 still has a session
  Check(*pool, {&a2, &other}, 36);
  for (Block& b : *g2) pool->Free(a2, b);
  EXPECT_EQ(Summary(*pool).num_arenas, 3u);  // empty, but the session lives
  pool->DetachSession(a2);
  PoolSummary s = Summary(*pool);
  EXPECT_EQ(s.num_arenas, 1u);  // only t2's
  EXPECT_EQ(s.arena_bytes, kArena);
  ASSERT_NE(TenantOf(s, "t1"), nullptr);
  EXPECT_EQ(TenantOf(s, "t1")->arena_bytes, 0u);
  EXPECT_EQ(TenantOf(s, "t1")->num_sessions, 0u);
  // ForgetAgent keeps agents that still hold bytes.
  pool->ForgetAgent("z");
  EXPECT_EQ(pool->agent_bytes("z"), kBlockBytes);
  EXPECT_EQ(pool->bytes_by_agent().count("z"), 1u);
  pool->ForgetAgent("y");
  Check(*pool, {&other}, 4);
}

TEST_F(BlockPoolTest, GrowRetiresEmptyArenasOfEveryTenant) {
  auto pool = Make();
  BlockAccount a{"t1", "x", 0}, b{"t2", "y", 0};
  pool->AttachSession(a);
  pool->AttachSession(b);
  auto ga = pool->Allocate(a, Shape(), 40);  // the whole budget
  ASSERT_TRUE(ga.ok()) << ga.status();
  for (Block& blk : *ga) pool->Free(a, blk);
  EXPECT_EQ(Summary(*pool).num_arenas, 4u);  // empty, kept while nobody needs them
  // t1's session lives, but its four empty arenas are budget nobody uses:
  // t2's growth retires them (issue 14, finding 2). Nobody is watched, so
  // they are dropped at once.
  auto gb = pool->Allocate(b, Shape(), 40);
  ASSERT_TRUE(gb.ok()) << gb.status();
  PoolSummary s = Summary(*pool);
  EXPECT_EQ(s.num_arenas, 4u);
  EXPECT_EQ(s.retired_arenas, 0u);
  EXPECT_EQ(TenantOf(s, "t1")->arena_bytes, 0u);
  EXPECT_EQ(TenantOf(s, "t2")->arena_bytes, kPool);
  EXPECT_EQ(b.bytes, 40 * kBlockBytes);
  Check(*pool, {&a, &b}, 160);
  // Arenas with pages are never taken: t1 cannot grow now.
  EXPECT_TRUE(absl::IsResourceExhausted(pool->Allocate(a, Shape(), 1).status()));
  Check(*pool, {&a, &b}, 160);
}

TEST_F(BlockPoolTest, LastArenaIsCutToTheBudgetInWholeSuperblocks) {
  // 2.5 arenas of budget: the third arena gets one superblock (the half
  // superblock left over is not used).
  auto pool = Make(2 * kArena + kSb + kSb / 2);
  BlockAccount a{"t1", "x", 0};
  pool->AttachSession(a);
  // 5 superblocks hold 24 blocks (3 K + 2 V superblocks)...
  auto got = pool->Allocate(a, Shape(), 24);
  ASSERT_TRUE(got.ok()) << got.status();
  PoolSummary s = Summary(*pool);
  EXPECT_EQ(s.num_arenas, 3u);
  EXPECT_EQ(s.arena_bytes, 2 * kArena + kSb);
  // ...and block 25 needs a fourth K superblock.
  EXPECT_TRUE(absl::IsResourceExhausted(pool->Allocate(a, Shape(), 1).status()));
  EXPECT_EQ(Summary(*pool).arena_bytes, 2 * kArena + kSb);
  Check(*pool, {&a}, 96);
}

}  // namespace
}  // namespace polykv::daemon
