// PrefixIndex alone: exact matching along chains, references, the coldest
// cached entry first, and a dropped entry taking its descendants with it.
#include "daemon/pool/prefix_index.h"

#include <gtest/gtest.h>

#include <vector>

namespace polykv::daemon {
namespace {

Block BlockOf(PageId first) {
  Block b;
  b.shape.layers = 1;
  b.shape.key_page_bytes = 256;
  b.shape.value_page_bytes = 256;
  b.pages = {first, first + 1};
  return b;
}

class PrefixIndexTest : public ::testing::Test {
 protected:
  // Inserts a chain of blocks with tokens {k*10, k*10+1} under `parent`.
  std::vector<PrefixId> Chain(PrefixId parent, int n, int seed = 0) {
    std::vector<PrefixId> ids;
    for (int k = 0; k < n; ++k) {
      const std::vector<int32_t> tokens{seed + k * 10, seed + k * 10 + 1};
      Block b = BlockOf(PageId(100 + 2 * next_page_++));
      parent = index_.Insert(parent, tokens, b, {});
      EXPECT_EQ(b.prefix, parent);
      ids.push_back(parent);
    }
    return ids;
  }
  void Check(const std::map<PrefixId, uint32_t>& refs) {
    auto s = index_.CheckInvariants(refs);
    ASSERT_TRUE(s.ok()) << s;
  }

  PrefixIndex index_;
  int next_page_ = 0;
};

TEST_F(PrefixIndexTest, FindsExactTokensUnderTheirParentOnly) {
  const PrefixId root = index_.Root("model/a");
  EXPECT_EQ(index_.Root("model/a"), root);
  const PrefixId other_root = index_.Root("model/b");
  EXPECT_NE(other_root, root);
  auto ids = Chain(root, 3);
  const std::vector<int32_t> first{0, 1}, second{10, 11};
  EXPECT_EQ(index_.Find(root, first), ids[0]);
  EXPECT_EQ(index_.Find(ids[0], second), ids[1]);
  EXPECT_FALSE(index_.Find(root, second));        // right tokens, wrong place
  EXPECT_FALSE(index_.Find(other_root, first));   // another space
  EXPECT_FALSE(index_.Find(root, std::vector<int32_t>{0, 2}));
  Check({{ids[0], 1}, {ids[1], 1}, {ids[2], 1}});
  EXPECT_EQ(index_.shared_bytes(), 3 * 512u);
  EXPECT_EQ(index_.num_pages(), 6u);
}

TEST_F(PrefixIndexTest, UnreferencedEntriesStayCachedColdestFirstAndRevive) {
  const PrefixId root = index_.Root("m");
  auto ids = Chain(root, 2);
  EXPECT_FALSE(index_.Unref(ids[1]));  // cached, not freed
  EXPECT_FALSE(index_.Unref(ids[0]));
  EXPECT_EQ(index_.cached_bytes(), 2 * 512u);
  EXPECT_EQ(index_.shared_bytes(), 0u);
  EXPECT_EQ(index_.Coldest(), ids[0]);  // stamped at insertion: the parent is older
  index_.Ref(ids[0]);
  EXPECT_EQ(index_.Coldest(), ids[1]);
  EXPECT_EQ(index_.cached_bytes(), 512u);
  Check({{ids[0], 1}});
}

TEST_F(PrefixIndexTest, DroppingAnEntryUnlinksItsDescendantsAndFreesTheUnusedOnes) {
  const PrefixId root = index_.Root("m");
  auto ids = Chain(root, 3);
  for (PrefixId id : ids) (void)index_.Unref(id);
  index_.Ref(ids[2]);  // a table still holds the last one
  std::vector<Block> freed = index_.Drop(ids[0]);
  ASSERT_EQ(freed.size(), 2u);  // ids[0] and ids[1]; ids[2] is held
  EXPECT_FALSE(index_.Find(root, std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(index_.Contains(ids[2]));
  Check({{ids[2], 1}});
  // Unreachable now: freed at its last unref instead of cached.
  auto last = index_.Unref(ids[2]);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->pages.size(), 2u);
  EXPECT_EQ(index_.size(), 0u);
  EXPECT_EQ(index_.cached_bytes() + index_.shared_bytes(), 0u);
  Check({});
  // The same tokens can be shared again.
  auto again = Chain(root, 1);
  EXPECT_EQ(index_.Find(root, std::vector<int32_t>{0, 1}), again[0]);
}

TEST_F(PrefixIndexTest, InvariantsCatchAMissingOrExtraReference) {
  const PrefixId root = index_.Root("m");
  auto ids = Chain(root, 1);
  EXPECT_FALSE(index_.CheckInvariants({}).ok());
  EXPECT_FALSE(index_.CheckInvariants({{ids[0], 2}}).ok());
  EXPECT_FALSE(index_.CheckInvariants({{ids[0], 1}, {ids[0] + 7, 1}}).ok());
  EXPECT_TRUE(index_.CheckInvariants({{ids[0], 1}}).ok());
}

}  // namespace
}  // namespace polykv::daemon
