// PagedKvStore and shared prefixes, model-free: the store offers its full
// blocks at each commit with the ids it wrote (until its table changes), and
// a store that attaches another's blocks attends over them exactly as the
// store that wrote them does.
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "client/worker/paged_kv_store.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/random_steps.h"

namespace polykv::worker::testing {
namespace {

// Heap pages that republish their table when asked (a compaction), a
// recorded SharePrefix and a table to attach.
class PrefixSource : public RepublishingSource {
 public:
  PrefixSource() : RepublishingSource(HeapSource(), {}) {}
  absl::StatusOr<std::optional<PagedTable>> AttachPrefix(
      std::span<const StepToken> tokens) override {
    return attach_;
  }
  absl::StatusOr<int64_t> SharePrefix(std::span<const int32_t> ids) override {
    shares_.emplace_back(ids.begin(), ids.end());
    EXPECT_LE(static_cast<int64_t>(ids.size()), committed());
    return static_cast<int64_t>(ids.size()) / kBlock * kBlock;
  }

  std::vector<std::vector<int32_t>> shares_;
  std::optional<PagedTable> attach_;
};

std::unique_ptr<PagedKvStore> NewStore(PrefixSource* src, bool share) {
  PagedKvStoreOptions po;
  po.shape = Shape();
  po.sync_every_steps = 1;
  po.share_prefix_messages = share ? 1 : 0;
  auto store = PagedKvStore::Create(po, std::unique_ptr<PageSource>(src));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

TEST(PagedStorePrefixTest, FullBlocksAreSharedAtCommitsUntilTheTableChanges) {
  auto* src = new PrefixSource;
  auto store = NewStore(src, /*share=*/true);
  std::mt19937 rng(3);
  for (int step = 0; step < 5; ++step) {  // 5 x 8 tokens, committed at each next step
    Step(store.get(), RandomRows(8, rng), RandomQ(8, rng), 8 * step, 100 + 8 * step);
  }
  // Committed 32 at the last step's start: shared at 16 and at 32 only.
  ASSERT_EQ(src->shares_.size(), 2u);
  EXPECT_EQ(src->shares_[0].size(), 16u);
  ASSERT_EQ(src->shares_[1].size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(src->shares_[1][i], 100 + i);
  // A compaction's table (here the same pages at a new epoch): its slots are
  // not the ids as written any more, so nothing more is shared.
  ASSERT_TRUE(store->BeginTurn(TurnInfo{1, Role::kUser, ""}).ok());  // commits 40
  src->Publish();
  ASSERT_TRUE(store->BeginTurn(TurnInfo{2, Role::kUser, ""}).ok());
  EXPECT_EQ(store->epoch(), 1u);
  for (int step = 0; step < 6; ++step) {
    Step(store.get(), RandomRows(8, rng), RandomQ(8, rng), 40 + 8 * step, 500 + 8 * step);
  }
  ASSERT_TRUE(store->BeginTurn(TurnInfo{3, Role::kUser, ""}).ok());
  EXPECT_EQ(src->shares_.size(), 2u);
}

TEST(PagedStorePrefixTest, OnlyTheFirstMessagesWholePagesAreShared) {
  auto* src = new PrefixSource;
  auto store = NewStore(src, /*share=*/true);  // the first message
  std::mt19937 rng(6);
  Step(store.get(), RandomRows(24, rng), RandomQ(24, rng), 0, 100, /*turn=*/0);
  Step(store.get(), RandomRows(24, rng), RandomQ(24, rng), 24, 200, /*turn=*/1);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->BeginTurn(TurnInfo{2 + i, Role::kUser, ""}).ok());
  // Message 0 fills one page (16 of its 24 tokens); message 1 is its own.
  ASSERT_EQ(src->shares_.size(), 1u);
  ASSERT_EQ(src->shares_[0].size(), 24u);
  EXPECT_EQ(src->shares_[0][23], 123);
}

TEST(PagedStorePrefixTest, AStoreWithoutTheOptionSharesNothing) {
  auto* src = new PrefixSource;
  auto store = NewStore(src, /*share=*/false);
  std::mt19937 rng(4);
  for (int step = 0; step < 5; ++step) {
    Step(store.get(), RandomRows(8, rng), RandomQ(8, rng), 8 * step, 100 + 8 * step);
  }
  ASSERT_TRUE(store->BeginTurn(TurnInfo{1, Role::kUser, ""}).ok());
  EXPECT_TRUE(src->shares_.empty());
}

TEST(PagedStorePrefixTest, AnAttachedPrefixIsAttendedAsItsWriterAttendsIt) {
  std::mt19937 rng(5);
  const Rows prefix = RandomRows(32, rng), next = RandomRows(8, rng);
  const std::vector<float> q_prefix = RandomQ(32, rng), q = RandomQ(8, rng);
  // The writer: 32 tokens, committed, then 8 more.
  auto* writer_src = new PrefixSource;
  auto writer = NewStore(writer_src, /*share=*/true);
  Step(writer.get(), prefix, q_prefix, 0, 100);
  ASSERT_TRUE(writer->BeginTurn(TurnInfo{1, Role::kUser, ""}).ok());
  // The reader attaches the writer's first two blocks, as the daemon hands
  // them out, and writes the same 8 tokens at the same positions.
  auto* reader_src = new PrefixSource;
  reader_src->attach_ = PagedTable{{writer_src->blocks()[0], writer_src->blocks()[1]}, 32, 0};
  auto reader = NewStore(reader_src, /*share=*/true);
  std::vector<StepToken> context;
  for (int i = 0; i < 40; ++i) context.push_back({100 + i, i, 0, Role::kUser});
  auto attached = reader->AttachPrefix(context);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ(*attached, 32);
  EXPECT_EQ(reader->num_slots(), 32);
  // Attaching is for a fresh store only.
  EXPECT_TRUE(absl::IsFailedPrecondition(reader->AttachPrefix(context).status()));
  const std::vector<float> want = Step(writer.get(), next, q, 32, 132);
  const std::vector<float> got = Step(reader.get(), next, q, 32, 132);
  EXPECT_EQ(got, want);
  // The reader goes on sharing from where the attached blocks end.
  ASSERT_TRUE(reader->BeginTurn(TurnInfo{1, Role::kUser, ""}).ok());
  ASSERT_TRUE(reader->BeginTurn(TurnInfo{2, Role::kUser, ""}).ok());
  EXPECT_TRUE(reader_src->shares_.empty());  // 40 committed: no new full block
}

}  // namespace
}  // namespace polykv::worker::testing
