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

// Heap pages, a recorded SharePrefix, a table to attach, and one
// republished table (a compaction) when asked.
class PrefixSource : public PageSource {
 public:
  int block_tokens() const override { return kBlock; }
  absl::StatusOr<std::vector<PagedBlock>> Reserve(int64_t total) override {
    auto b = inner_->Reserve(total);
    if (b.ok()) blocks_.insert(blocks_.end(), b->begin(), b->end());
    return b;
  }
  absl::Status Commit(int64_t total, std::span<const StepToken>) override {
    committed_ = total;
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<PagedTable>> Sync() override {
    return std::exchange(republish_, std::nullopt);
  }
  absl::StatusOr<std::optional<PagedTable>> AttachPrefix(
      std::span<const StepToken> tokens) override {
    return attach_;
  }
  absl::StatusOr<int64_t> SharePrefix(std::span<const int32_t> ids) override {
    shares_.emplace_back(ids.begin(), ids.end());
    EXPECT_LE(static_cast<int64_t>(ids.size()), committed_);
    return static_cast<int64_t>(ids.size()) / kBlock * kBlock;
  }
  int64_t bytes() const override { return inner_->bytes(); }
  std::string name() const override { return "prefix"; }

  std::unique_ptr<PageSource> inner_ = HeapSource();
  std::vector<PagedBlock> blocks_;  // every block reserved, in order
  std::vector<std::vector<int32_t>> shares_;
  std::optional<PagedTable> attach_;
  std::optional<PagedTable> republish_;
  int64_t committed_ = 0;
};

// One step of `rows` with ids first_id.. at positions first_position..
std::vector<float> IdStep(PagedKvStore* store, const Rows& rows, const std::vector<float>& q,
                          int first_position, int first_id) {
  const int n = rows.num_tokens();
  std::vector<StepToken> meta;
  for (int i = 0; i < n; ++i) meta.push_back({first_id + i, first_position + i, 0, Role::kUser});
  EXPECT_TRUE(store->BeginStep(meta).ok());
  const size_t per_layer = static_cast<size_t>(n) * kQHeads * kHeadDim;
  std::vector<float> out(kLayers * per_layer);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(store->Append(l, rows.k[l].data(), rows.v[l].data()).ok());
    EXPECT_TRUE(store->Attend(l, kQHeads, q.data() + l * per_layer, out.data() + l * per_layer).ok());
  }
  EXPECT_TRUE(store->EndStep().ok());
  return out;
}

std::unique_ptr<PagedKvStore> NewStore(PrefixSource* src, bool share) {
  PagedKvStoreOptions po;
  po.shape = Shape();
  po.sync_every_steps = 1;
  po.share_prefix = share;
  auto store = PagedKvStore::Create(po, std::unique_ptr<PageSource>(src));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

TEST(PagedStorePrefixTest, FullBlocksAreSharedAtCommitsUntilTheTableChanges) {
  auto* src = new PrefixSource;
  auto store = NewStore(src, /*share=*/true);
  std::mt19937 rng(3);
  for (int step = 0; step < 5; ++step) {  // 5 x 8 tokens, committed at each next step
    IdStep(store.get(), RandomRows(8, rng), RandomQ(8, rng), 8 * step, 100 + 8 * step);
  }
  // Committed 32 at the last step's start: shared at 16 and at 32 only.
  ASSERT_EQ(src->shares_.size(), 2u);
  EXPECT_EQ(src->shares_[0].size(), 16u);
  ASSERT_EQ(src->shares_[1].size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(src->shares_[1][i], 100 + i);
  // A compaction's table (here the same pages at a new epoch): its slots are
  // not the ids as written any more, so nothing more is shared.
  ASSERT_TRUE(store->BeginTurn(TurnInfo{1, Role::kUser, ""}).ok());  // commits 40
  src->republish_ = PagedTable{src->blocks_, 40, 1};
  ASSERT_TRUE(store->BeginTurn(TurnInfo{2, Role::kUser, ""}).ok());
  EXPECT_EQ(store->epoch(), 1u);
  for (int step = 0; step < 6; ++step) {
    IdStep(store.get(), RandomRows(8, rng), RandomQ(8, rng), 40 + 8 * step, 500 + 8 * step);
  }
  ASSERT_TRUE(store->BeginTurn(TurnInfo{3, Role::kUser, ""}).ok());
  EXPECT_EQ(src->shares_.size(), 2u);
}

TEST(PagedStorePrefixTest, AStoreWithoutTheOptionSharesNothing) {
  auto* src = new PrefixSource;
  auto store = NewStore(src, /*share=*/false);
  std::mt19937 rng(4);
  for (int step = 0; step < 5; ++step) {
    IdStep(store.get(), RandomRows(8, rng), RandomQ(8, rng), 8 * step, 8 * step);
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
  IdStep(writer.get(), prefix, q_prefix, 0, 100);
  ASSERT_TRUE(writer->BeginTurn(TurnInfo{1, Role::kUser, ""}).ok());
  // The reader attaches the writer's first two blocks, as the daemon hands
  // them out, and writes the same 8 tokens at the same positions.
  auto* reader_src = new PrefixSource;
  reader_src->attach_ = PagedTable{{writer_src->blocks_[0], writer_src->blocks_[1]}, 32, 0};
  auto reader = NewStore(reader_src, /*share=*/true);
  std::vector<StepToken> context;
  for (int i = 0; i < 40; ++i) context.push_back({100 + i, i, 0, Role::kUser});
  auto attached = reader->AttachPrefix(context);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ(*attached, 32);
  EXPECT_EQ(reader->num_slots(), 32);
  // Attaching is for a fresh store only.
  EXPECT_TRUE(absl::IsFailedPrecondition(reader->AttachPrefix(context).status()));
  const std::vector<float> want = IdStep(writer.get(), next, q, 32, 132);
  const std::vector<float> got = IdStep(reader.get(), next, q, 32, 132);
  EXPECT_EQ(got, want);
  // The reader goes on sharing from where the attached blocks end.
  ASSERT_TRUE(reader->BeginTurn(TurnInfo{1, Role::kUser, ""}).ok());
  ASSERT_TRUE(reader->BeginTurn(TurnInfo{2, Role::kUser, ""}).ok());
  EXPECT_TRUE(reader_src->shares_.empty());  // 40 committed: no new full block
}

}  // namespace
}  // namespace polykv::worker::testing
