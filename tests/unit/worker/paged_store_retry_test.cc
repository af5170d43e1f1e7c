// PagedKvStore when the pool refuses a reservation under memory pressure
// (polykvd's pressure ladder: RESOURCE_EXHAUSTED, "Sync, then retry in about
// 200 ms"): with reserve_retry_ms it syncs and retries until the pool takes
// the reservation, and gives up with a clear error when the time is up;
// without it, or for any other error, it fails at once and changes nothing.
// Also how far ahead of need it reserves.
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "client/worker/paged_kv_store.h"
#include "gtest/gtest.h"

namespace polykv::worker {
namespace {

constexpr int kBlock = 16;

KvShape Shape() { return KvShape{2, 2, 32}; }

// Heap pages behind a source that refuses the first `refusals` Reserve
// calls with `error`, and counts Syncs.
class RefusingSource : public PageSource {
 public:
  RefusingSource(int refusals, absl::Status error, int block_tokens = kBlock)
      : refusals_(refusals), error_(std::move(error)) {
    HeapPageSourceOptions o;
    o.shape = Shape();
    o.block_tokens = block_tokens;
    auto inner = NewHeapPageSource(o);
    EXPECT_TRUE(inner.ok()) << inner.status();
    inner_ = std::move(*inner);
  }
  int block_tokens() const override { return inner_->block_tokens(); }
  absl::StatusOr<std::vector<PagedBlock>> Reserve(int64_t total) override {
    ++reserves;
    asked.push_back(total);
    if (refusals_ != 0) {
      if (refusals_ > 0) --refusals_;
      return error_;
    }
    return inner_->Reserve(total);
  }
  absl::Status Commit(int64_t total, std::span<const StepToken> t) override {
    return inner_->Commit(total, t);
  }
  absl::StatusOr<std::optional<PagedTable>> Sync() override {
    ++syncs;
    return std::nullopt;
  }
  int64_t bytes() const override { return inner_->bytes(); }
  std::string name() const override { return "refusing"; }

  int reserves = 0, syncs = 0;
  std::vector<int64_t> asked;  // each Reserve's total_tokens

 private:
  std::unique_ptr<PageSource> inner_;
  int refusals_;  // < 0: always
  absl::Status error_;
};

struct Store {
  RefusingSource* src = nullptr;  // owned by store
  std::unique_ptr<PagedKvStore> store;
};

Store NewStore(int refusals, int retry_ms,
               absl::Status error = absl::ResourceExhaustedError(
                   "pool is under memory pressure: Sync, then retry in about 200 ms"),
               int block_tokens = kBlock) {
  Store s;
  s.src = new RefusingSource(refusals, std::move(error), block_tokens);
  PagedKvStoreOptions o;
  o.shape = Shape();
  o.reserve_retry_ms = retry_ms;
  auto store = PagedKvStore::Create(o, std::unique_ptr<PageSource>(s.src));
  EXPECT_TRUE(store.ok()) << store.status();
  s.store = std::move(*store);
  return s;
}

std::vector<StepToken> Tokens(int n) {
  std::vector<StepToken> t(n);
  for (int i = 0; i < n; ++i) t[i].position = i;
  return t;
}

TEST(PagedStoreRetryTest, ARefusedReservationIsRetriedAfterASync) {
  // Each attempt asks twice (with and without the reserve-ahead): 3 attempts
  // are refused, the 4th is taken.
  Store s = NewStore(6, 10000);
  const int syncs_before = s.src->syncs;
  const auto tokens = Tokens(20);
  ASSERT_TRUE(s.store->BeginStep(tokens).ok());
  EXPECT_EQ(s.store->reserve_retries(), 3);
  EXPECT_EQ(s.src->syncs - syncs_before, 1 + 3);  // the first step's own, one per retry
  EXPECT_GT(s.store->bytes(), 0);
}

TEST(PagedStoreRetryTest, WithoutRetriesARefusalFailsAtOnceAndReservesNothing) {
  Store s = NewStore(2, 0);
  const auto tokens = Tokens(20);
  const absl::Status st = s.store->BeginStep(tokens);
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_EQ(s.src->reserves, 2);
  EXPECT_EQ(s.store->reserve_retries(), 0);
  EXPECT_EQ(s.store->num_slots(), 0);
  EXPECT_EQ(s.store->bytes(), 0);
  // The pool takes it the next time: the store is still usable.
  EXPECT_TRUE(s.store->BeginStep(tokens).ok());
}

TEST(PagedStoreRetryTest, ItGivesUpWithAClearErrorWhenTheTimeIsUp) {
  Store s = NewStore(-1, 300);
  const auto tokens = Tokens(20);
  const absl::Status st = s.store->BeginStep(tokens);
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_NE(st.message().find("still refused after"), std::string::npos) << st;
  EXPECT_GE(s.store->reserve_retries(), 1);
  EXPECT_EQ(s.store->bytes(), 0);
}

TEST(PagedStoreRetryTest, OtherErrorsAreNotRetried) {
  Store s = NewStore(-1, 10000, absl::UnavailableError("daemon gone"));
  const auto tokens = Tokens(20);
  const absl::Status st = s.store->BeginStep(tokens);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_EQ(s.store->reserve_retries(), 0);
}

TEST(PagedStoreReserveTest, SmallPagesAreReservedAheadOfNeed) {
  // 16-token pages, reserve_ahead 64: an eighth of the 640 slots ahead.
  Store s = NewStore(0, 0, absl::OkStatus(), 16);
  ASSERT_TRUE(s.store->BeginStep(Tokens(640)).ok());
  EXPECT_EQ(s.src->asked, (std::vector<int64_t>{640 + 64}));
}

TEST(PagedStoreReserveTest, PagesOfReserveAheadTokensAreNotReservedAhead) {
  // 64-token pages: a Reserve comes once a page at most, ahead or not, so
  // the store asks for what it needs and the session holds no spare page.
  Store s = NewStore(0, 0, absl::OkStatus(), 64);
  ASSERT_TRUE(s.store->BeginStep(Tokens(640)).ok());
  EXPECT_EQ(s.src->asked, (std::vector<int64_t>{640}));
  const int64_t bytes = s.store->bytes();
  const KvShape shape = Shape();
  const std::vector<float> rows(640 * shape.num_kv_heads * shape.head_dim, 0.5f);
  for (int l = 0; l < shape.num_layers; ++l) {
    ASSERT_TRUE(s.store->Append(l, rows.data(), rows.data()).ok());
  }
  ASSERT_TRUE(s.store->EndStep().ok());
  // The next token needs a new page, and only one.
  ASSERT_TRUE(s.store->BeginStep(Tokens(1)).ok());
  EXPECT_EQ(s.src->asked, (std::vector<int64_t>{640, 641}));
  EXPECT_EQ(s.store->bytes(), bytes * 11 / 10);
}

}  // namespace
}  // namespace polykv::worker
