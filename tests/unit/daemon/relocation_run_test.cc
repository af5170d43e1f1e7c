// RelocationRun's phases one by one on a session built by hand (no KvPool,
// no lock): which blocks it moves, the exact state each phase leaves, and
// that the moved pages hold the old bytes. (The epoch and the pending
// blocks are KvPool::RunStaged's; arena_vacating_test runs it in the pool.)
#include "daemon/pool/relocation_run.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace polykv::daemon {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB;

TEST(RelocationRunTest, MovesTheBlocksOfVacatingArenasByteForByteAndReturnsTheOldOnes) {
  BlockPool pool{BlockPoolOptions{16 * kMiB, 4 * kMiB, 256 * kKiB, CreateHostShmArena}};
  Session s;
  s.id = 1;
  s.account = {"ta", "a", 0};
  s.profile = {4, 2, 64, DType::kF32, "tiny"};  // 8 KiB pages, 64 KiB blocks
  s.block_tokens = 16;
  auto shape = MakeBlockShape(4, s.page_shape(), PageFormat::kF32, PageFormat::kF32, 256 * kKiB);
  ASSERT_TRUE(shape.ok()) << shape.status();
  s.shape = *shape;
  pool.AttachSession(s.account);

  // Tenant ta fills the pool, then keeps every 16th block: a few pages in
  // every arena. Nothing moves while nobody needs the room.
  auto all = pool.Allocate(s.account, s.shape, 256);
  ASSERT_TRUE(all.ok()) << all.status();
  for (size_t i = 0; i < all->size(); ++i) {
    if (i % 16 == 0) {
      s.tables.blocks.push_back(std::move((*all)[i]));
    } else {
      pool.Free(s.account, (*all)[i]);
    }
  }
  EXPECT_TRUE(RelocationRun(s, pool).moving().empty());
  for (size_t b = 0; b < s.tables.blocks.size(); ++b) {
    for (PageId p : s.tables.blocks[b].pages) {
      std::memset(reinterpret_cast<void*>(pool.HostAddress("ta", p)), int(b + 1),
                  s.shape.page_bytes(0));
    }
  }

  // Tenant tb's 8 MiB do not fit: sparse arenas of ta are vacated.
  BlockAccount other{"tb", "b", 0};
  pool.AttachSession(other);
  EXPECT_FALSE(pool.Allocate(other, s.shape, 128).ok());
  RelocationRun run(s, pool);
  ASSERT_FALSE(run.moving().empty());
  for (size_t b = 0; b < s.tables.blocks.size(); ++b) {
    const bool moves = std::find(run.moving().begin(), run.moving().end(), b) != run.moving().end();
    EXPECT_EQ(moves, pool.InVacatingArena("ta", s.tables.blocks[b])) << b;
  }

  auto shapes = run.NewShapes(s);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), run.moving().size());
  for (size_t i = 0; i < shapes->size(); ++i) {
    EXPECT_EQ((*shapes)[i], s.tables.blocks[run.moving()[i]].shape);
    auto staged = pool.Allocate(s.account, (*shapes)[i], 1, /*zero=*/true);
    ASSERT_TRUE(staged.ok()) << staged.status();
    EXPECT_FALSE(pool.InVacatingArena("ta", staged->front()));
    s.tables.staged.push_back(std::move(staged->front()));
  }
  const std::vector<Block> before = s.tables.blocks;
  ASSERT_TRUE(run.Address(s, pool).ok());
  ASSERT_TRUE(run.Copy(s).ok());
  const std::vector<Block> old = run.Publish(s);

  // Each moving block is replaced in place by its staged copy; the others
  // stay; the old ones come back, in the order they moved.
  EXPECT_TRUE(s.tables.staged.empty());
  EXPECT_EQ(s.tables.epoch, 0u);
  ASSERT_EQ(old.size(), run.moving().size());
  ASSERT_EQ(s.tables.blocks.size(), before.size());
  for (size_t i = 0, m = 0; i < before.size(); ++i) {
    const bool moved = m < run.moving().size() && run.moving()[m] == i;
    if (moved) {
      EXPECT_EQ(old[m].pages, before[i].pages);
      EXPECT_NE(s.tables.blocks[i].pages, before[i].pages);
      ++m;
    } else {
      EXPECT_EQ(s.tables.blocks[i].pages, before[i].pages);
    }
    for (PageId p : s.tables.blocks[i].pages) {
      const auto* bytes = reinterpret_cast<const uint8_t*>(pool.HostAddress("ta", p));
      for (uint64_t k = 0; k < s.shape.page_bytes(0); ++k) {
        ASSERT_EQ(bytes[k], uint8_t(i + 1)) << i << " " << k;
      }
    }
  }

  for (Block b : old) pool.Free(s.account, b);
  for (Block& b : s.tables.blocks) pool.Free(s.account, b);
  EXPECT_EQ(pool.used_bytes(), 0u);
}

}  // namespace
}  // namespace polykv::daemon
