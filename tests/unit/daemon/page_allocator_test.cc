#include "daemon/pool/page_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

namespace polykv::daemon {
namespace {

constexpr uint64_t kSb = 64 * 1024;

void ExpectConsistent(const PageAllocator& a) {
  auto s = a.CheckInvariants();
  ASSERT_TRUE(s.ok()) << s;
}

TEST(PageAllocatorTest, SizeClassesRoundUpTo256) {
  EXPECT_EQ(PageAllocator::SizeClass(1), 256u);
  EXPECT_EQ(PageAllocator::SizeClass(256), 256u);
  EXPECT_EQ(PageAllocator::SizeClass(257), 512u);
  EXPECT_EQ(PageAllocator::SizeClass(6144), 6144u);
}

TEST(PageAllocatorTest, PagesAreAlignedDisjointAndInsideTheArena) {
  PageAllocator a({kSb});
  ASSERT_TRUE(a.AddArena(1, 4 * kSb).ok());
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (int i = 0; i < 100; ++i) {
    auto p = a.Alloc(i % 2 ? 1000 : 3000);
    ASSERT_TRUE(p.ok()) << p.status();
    auto loc = a.Locate(*p);
    ASSERT_TRUE(loc.ok());
    EXPECT_EQ(loc->offset % 256, 0u);
    EXPECT_LE(loc->offset + loc->size_bytes, 4 * kSb);
    ranges.push_back({loc->offset, loc->offset + loc->size_bytes});
    ExpectConsistent(a);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);
}

TEST(PageAllocatorTest, SuperblockServesOneClassAndReturnsWhenEmpty) {
  PageAllocator a({kSb});
  ASSERT_TRUE(a.AddArena(1, 2 * kSb).ok());
  EXPECT_EQ(a.num_free_superblocks(), 2u);
  auto p = a.Alloc(1024);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(a.num_free_superblocks(), 1u);
  auto q = a.Alloc(2048);  // another class takes the other superblock
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(a.num_free_superblocks(), 0u);
  ASSERT_TRUE(a.Free(*p).ok());
  EXPECT_EQ(a.num_free_superblocks(), 1u);
  ExpectConsistent(a);
  // The freed superblock now serves the 2048 class.
  for (uint64_t i = 0; i < 2 * kSb / 2048 - 1; ++i) ASSERT_TRUE(a.Alloc(2048).ok()) << i;
  EXPECT_TRUE(absl::IsResourceExhausted(a.Alloc(2048).status()));
  ExpectConsistent(a);
}

TEST(PageAllocatorTest, ExhaustionIsANormalResultAndChangesNothing) {
  PageAllocator a({kSb});
  ASSERT_TRUE(a.AddArena(1, kSb).ok());
  for (uint64_t i = 0; i < kSb / 4096; ++i) ASSERT_TRUE(a.Alloc(4096).ok());
  const uint64_t used = a.used_bytes();
  auto p = a.Alloc(4096);
  EXPECT_TRUE(absl::IsResourceExhausted(p.status())) << p.status();
  EXPECT_EQ(a.used_bytes(), used);
  ExpectConsistent(a);
}

TEST(PageAllocatorTest, ImpossibleRequestsAreInvalidArguments) {
  PageAllocator a({kSb});
  ASSERT_TRUE(a.AddArena(1, kSb).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(a.Alloc(0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(a.Alloc(kSb + 1).status()));
  EXPECT_FALSE(a.AddArena(0, kSb).ok());
  EXPECT_FALSE(a.AddArena(1, kSb).ok());       // duplicate
  EXPECT_FALSE(a.AddArena(2, kSb - 1).ok());   // smaller than a superblock
}

TEST(PageAllocatorTest, DoubleFreeAndForgedIdsAreRefusedWithoutStateChange) {
  PageAllocator a({kSb});
  ASSERT_TRUE(a.AddArena(1, kSb).ok());
  auto p = a.Alloc(512);
  auto keep = a.Alloc(512);
  ASSERT_TRUE(p.ok() && keep.ok());
  ASSERT_TRUE(a.Free(*p).ok());
  const uint64_t used = a.used_bytes();
  EXPECT_TRUE(absl::IsInvalidArgument(a.Free(*p)));             // double free
  EXPECT_TRUE(absl::IsInvalidArgument(a.Free(kNoPage)));
  EXPECT_TRUE(absl::IsInvalidArgument(a.Free(*keep + 1000)));   // slot out of range
  EXPECT_TRUE(absl::IsInvalidArgument(a.Free((7ull << 48) | 1)));  // unknown arena
  EXPECT_EQ(a.used_bytes(), used);
  ExpectConsistent(a);
}

TEST(PageAllocatorTest, RemoveArenaOnlyWhenEmpty) {
  PageAllocator a({kSb});
  ASSERT_TRUE(a.AddArena(1, kSb).ok());
  ASSERT_TRUE(a.AddArena(2, kSb).ok());
  auto p = a.Alloc(512);  // lowest offsets of the most recently added arena go first
  ASSERT_TRUE(p.ok());
  auto loc = a.Locate(*p);
  const uint32_t busy = loc->arena_id, idle = busy == 1 ? 2 : 1;
  EXPECT_TRUE(absl::IsFailedPrecondition(a.RemoveArena(busy)));
  EXPECT_EQ(a.EmptyArenas(), std::vector<uint32_t>{idle});
  ASSERT_TRUE(a.RemoveArena(idle).ok());
  EXPECT_EQ(a.arena_bytes(), kSb);
  ExpectConsistent(a);
}

// Random alloc/free of mixed classes: invariants after every step, and once
// everything is freed every superblock is free again (no stranded memory).
TEST(PageAllocatorTest, ChurnKeepsInvariantsAndLeavesNoFragmentation) {
  const uint32_t seed = 20261130;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  PageAllocator a({kSb});
  ASSERT_TRUE(a.AddArena(1, 16 * kSb).ok());
  ASSERT_TRUE(a.AddArena(2, 16 * kSb).ok());
  const uint64_t sizes[] = {256, 768, 1536, 4096, 6144, 12288};
  std::vector<PageId> live;
  std::set<PageId> ids;
  uint64_t refused = 0;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      auto p = a.Alloc(sizes[rng() % 6]);
      if (!p.ok()) {
        ASSERT_TRUE(absl::IsResourceExhausted(p.status()));
        ++refused;
        continue;
      }
      ASSERT_TRUE(ids.insert(*p).second) << "page handed out twice";
      live.push_back(*p);
    } else {
      size_t i = rng() % live.size();
      ASSERT_TRUE(a.Free(live[i]).ok());
      ids.erase(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
    if (step % 500 == 0) ExpectConsistent(a);
  }
  ExpectConsistent(a);
  for (PageId p : live) ASSERT_TRUE(a.Free(p).ok());
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.num_pages(), 0u);
  EXPECT_EQ(a.num_free_superblocks(), a.num_superblocks());
  ExpectConsistent(a);
  std::printf("refused %llu allocations at the limit\n", (unsigned long long)refused);
}

}  // namespace
}  // namespace polykv::daemon
