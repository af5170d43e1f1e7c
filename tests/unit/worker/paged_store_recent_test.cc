// PagedKvStore's recent window (PagedKvStoreOptions::recent_f16_tokens,
// KIVI's residual): the newest blocks are attended from f16 copies while the
// source's pages keep the session's (here int2) formats. While every block is
// in the window the store must attend exactly as an f16 store does; past it,
// older blocks are int2 and the window f16; the copies count in bytes(); an
// intent probe (whose rows take ring slots of window blocks) must leave the
// window as it was. No model: K, V and queries are random.
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "client/worker/paged_kv_store.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/random_steps.h"

namespace polykv::worker {
namespace {

using kernels::PageFormat;
using testing::kBlock;
using testing::kLayers;
using testing::RandomQ;
using testing::RandomRows;
using testing::RelL2;
using testing::Rows;
using testing::Shape;
using testing::Step;

std::unique_ptr<PagedKvStore> NewStore(PageFormat format, int recent_f16_tokens) {
  PagedKvStoreOptions o;
  o.shape = Shape();
  o.recent_f16_tokens = recent_f16_tokens;
  auto store = PagedKvStore::Create(o, testing::HeapSource(format));
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

// Writes `rows` in steps of `chunk` tokens (the last one shorter) from
// position `first`; returns the outputs of the last step.
std::vector<float> Feed(PagedKvStore* store, const Rows& rows, int chunk, int first,
                        std::mt19937& rng) {
  std::vector<float> out;
  for (int i = 0; i < rows.num_tokens(); i += chunk) {
    const int n = std::min(chunk, rows.num_tokens() - i);
    std::vector<int> slots;
    for (int s = i; s < i + n; ++s) slots.push_back(s);
    out = Step(store, testing::Pick(rows, slots), RandomQ(n, rng), first + i);
  }
  return out;
}

struct Stores {
  std::unique_ptr<PagedKvStore> windowed, f16, int2;
};

// int2 pages with the window, f16 pages and int2 pages without it, each fed
// `context` in chunks with the same queries.
Stores ThreeStores(int recent_f16_tokens, const Rows& context, int chunk) {
  Stores s{NewStore(PageFormat::kInt2, recent_f16_tokens), NewStore(PageFormat::kF16, 0),
           NewStore(PageFormat::kInt2, 0)};
  for (PagedKvStore* store : {s.windowed.get(), s.f16.get(), s.int2.get()}) {
    std::mt19937 q(3);
    Feed(store, context, chunk, 0, q);
  }
  return s;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// 40 tokens of recent_f16_tokens = 48 (4 blocks): all of them in the window.
TEST(PagedKvStoreRecentTest, InsideTheWindowAttentionIsTheF16Stores) {
  std::mt19937 rng(11);
  const Rows context = RandomRows(40, rng);
  auto [windowed, f16, int2] = ThreeStores(48, context, 7);  // chunks straddle pages
  for (int t = 0; t < 12; ++t) {  // decode across a page boundary (40 -> 52)
    const Rows tok = RandomRows(1, rng);
    const std::vector<float> q = RandomQ(1, rng);
    const auto w = Step(windowed.get(), tok, q, 40 + t);
    const auto f = Step(f16.get(), tok, q, 40 + t);
    const auto i = Step(int2.get(), tok, q, 40 + t);
    ASSERT_TRUE(SameBits(w, f)) << "decode step " << t;
    ASSERT_FALSE(SameBits(w, i)) << "decode step " << t;
  }
}

// 200 tokens, recent_f16_tokens = 32 (3 blocks): the window is f16, the
// older 10 blocks int2, so the output lies between the int2 and f16 stores'.
TEST(PagedKvStoreRecentTest, PastTheWindowOlderBlocksAreTheSessionsFormat) {
  std::mt19937 rng(12);
  const Rows context = RandomRows(200, rng);
  auto [windowed, f16, int2] = ThreeStores(32, context, 24);
  // A query that looks at the newest tokens: their keys, scaled up.
  Rows tok = RandomRows(1, rng);
  std::vector<float> q = RandomQ(1, rng);
  const size_t per_layer = q.size() / kLayers;
  for (int l = 0; l < kLayers; ++l) {
    for (size_t j = 0; j < per_layer; ++j) {
      const size_t d = j % testing::kHeadDim, g = (j / testing::kHeadDim) / 2;  // GQA group
      q[l * per_layer + j] = 3.0f * context.k[l][(195 * testing::kKvHeads + g) * testing::kHeadDim + d];
    }
  }
  const auto w = Step(windowed.get(), tok, q, 200);
  const auto f = Step(f16.get(), tok, q, 200);
  const auto i = Step(int2.get(), tok, q, 200);
  EXPECT_FALSE(SameBits(w, f));  // older blocks are int2
  const double err_w = RelL2(w, f), err_i = RelL2(i, f);
  std::printf("rel. L2 error vs f16: int2 %.4f, int2 + f16 window %.4f\n", err_i, err_w);
  EXPECT_LT(err_w, 0.5 * err_i);
  // The window's copies are counted: recent_blocks = 32/16 + 1 = 3 per layer.
  const int64_t f16_pair = 2 * static_cast<int64_t>(kernels::PageBytes(
                                   PageFormat::kF16, kernels::KvKind::kKey,
                                   {kBlock, testing::kKvHeads, testing::kHeadDim}));
  EXPECT_EQ(windowed->bytes(), int2->bytes() + 3 * kLayers * f16_pair);
  EXPECT_GE(windowed->peak_bytes(), windowed->bytes());
}

// A probe of 40 tokens from slot 30 writes blocks 1..4, so with 2 window
// blocks its rows overwrite the ring slots of blocks 0 and 1; after EndProbe
// the store must attend exactly as one that never probed.
TEST(PagedKvStoreRecentTest, AProbeLeavesTheWindowAsItWas) {
  std::mt19937 rng(13);
  const Rows context = RandomRows(30, rng), probe = RandomRows(40, rng);
  auto probed = NewStore(PageFormat::kInt4, 16);
  auto plain = NewStore(PageFormat::kInt4, 16);
  std::mt19937 qa(5), qb(5);
  Feed(probed.get(), context, 9, 0, qa);
  Feed(plain.get(), context, 9, 0, qb);
  ASSERT_TRUE(probed->BeginProbe(ProbeKind::kIntent).ok());
  std::mt19937 qp(6);
  Feed(probed.get(), probe, 40, 30, qp);
  ASSERT_TRUE(probed->EndProbe().ok());
  EXPECT_EQ(probed->num_slots(), 30);
  for (int t = 0; t < 20; ++t) {  // through block 2 into block 3
    const Rows tok = RandomRows(1, rng);
    const std::vector<float> q = RandomQ(1, rng);
    ASSERT_TRUE(SameBits(Step(probed.get(), tok, q, 30 + t), Step(plain.get(), tok, q, 30 + t)))
        << "decode step " << t << " after the probe";
  }
}

TEST(PagedKvStoreRecentTest, ANegativeWindowIsRefused) {
  PagedKvStoreOptions o;
  o.shape = Shape();
  o.recent_f16_tokens = -1;
  EXPECT_FALSE(PagedKvStore::Create(o, testing::HeapSource()).ok());
}

// The window's copies are host memory: a store whose pages are on the GPU
// (the CUDA backend) takes none, and says why.
TEST(PagedKvStoreRecentTest, PagesOnTheDeviceTakeNoWindow) {
  PagedKvStoreOptions o;
  o.shape = Shape();
  o.recent_f16_tokens = 64;
  o.exec.backend = kernels::Backend::kCuda;
  auto store = PagedKvStore::Create(o, testing::HeapSource());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("device"), std::string::npos) << store.status();
}

}  // namespace
}  // namespace polykv::worker
