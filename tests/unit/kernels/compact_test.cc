// Compaction (gather + merge into new pages) and scoring helpers.
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace polykv::kernels {
namespace {

constexpr PageShape kShape{16, 3, 64};

std::vector<float> Dequant(const testing::PagedKv& kv, KvKind kind) {
  const size_t row = size_t(kv.shape.num_kv_heads) * kv.shape.head_dim;
  std::vector<float> out(kv.num_tokens * row);
  const PagedKvView v = kv.View();
  for (int b = 0; b < v.num_blocks; ++b) {
    const BlockEntry& e = v.blocks[b];
    const int n = std::min(kv.shape.block_tokens, kv.num_tokens - b * kv.shape.block_tokens);
    const bool key = kind == KvKind::kKey;
    EXPECT_TRUE(DequantizePage(Exec{Backend::kReference}, kv.shape, kind,
                               key ? e.k_format : e.v_format,
                               PagePtr(v.base, key ? e.k_offset : e.v_offset), n,
                               out.data() + size_t(b) * kv.shape.block_tokens * row)
                    .ok());
  }
  return out;
}

testing::FormatFn All(PageFormat k, PageFormat v) {
  return [=](int) { return std::make_pair(k, v); };
}

TEST(CompactSlotsTest, GatherCopiesChosenSlotsExactlyInOrder) {
  std::mt19937 rng(testing::TestSeed(11));
  const int T = 16 * 6 + 3;
  const size_t row = 3 * 64;
  const auto k = testing::RandomNormal(T * row, rng), v = testing::RandomNormal(T * row, rng);
  const testing::PagedKv src = testing::BuildPaged(kShape, k, v, T, All(PageFormat::kF16, PageFormat::kF32));
  const std::vector<int32_t> keep = {0, 1, 2, 3, 17, 18, 40, 41, 42, 63, 64, 65, 80, 81, 90, 95,
                                     96, 97, 98};  // 19 slots: one full page + a partial one
  for (Backend b : {Backend::kReference, Backend::kCpu}) {
    testing::PagedKv dst = testing::AllocPaged(kShape, int(keep.size()),
                                               All(PageFormat::kF16, PageFormat::kF32));
    CompactPlan plan;
    plan.num_out = int(keep.size());
    plan.members = keep.data();
    ASSERT_TRUE(CompactSlots(Exec{b}, src.View(), plan, dst.Mut()).ok());
    const auto src_k = Dequant(src, KvKind::kKey), dst_k = Dequant(dst, KvKind::kKey);
    const auto src_v = Dequant(src, KvKind::kValue), dst_v = Dequant(dst, KvKind::kValue);
    for (size_t j = 0; j < keep.size(); ++j) {
      for (size_t x = 0; x < row; ++x) {
        ASSERT_EQ(dst_k[j * row + x], src_k[keep[j] * row + x]) << BackendName(b) << " slot " << j;
        ASSERT_EQ(dst_v[j * row + x], src_v[keep[j] * row + x]) << BackendName(b) << " slot " << j;
      }
    }
  }
}

TEST(CompactSlotsTest, GatherRequantizesToAnotherFormat) {
  std::mt19937 rng(testing::TestSeed(12));
  const int T = 16 * 4;
  const size_t row = 3 * 64;
  const auto k = testing::OutlierKeys(T, 3, 64, rng), v = testing::RandomNormal(T * row, rng);
  const testing::PagedKv src = testing::BuildPaged(kShape, k, v, T, All(PageFormat::kF16, PageFormat::kF16));
  std::vector<int32_t> keep;
  for (int s = 0; s < T; s += 2) keep.push_back(s);  // 32 slots = 2 full pages
  std::vector<std::vector<uint8_t>> arenas;
  for (Backend b : {Backend::kReference, Backend::kCpu}) {
    testing::PagedKv dst = testing::AllocPaged(kShape, int(keep.size()),
                                               All(PageFormat::kInt4, PageFormat::kInt8));
    CompactPlan plan{int(keep.size()), nullptr, keep.data(), nullptr};
    ASSERT_TRUE(CompactSlots(Exec{b}, src.View(), plan, dst.Mut()).ok());
    arenas.emplace_back(dst.arena.get(), dst.arena.get() + dst.arena_bytes);
    const auto src_v = Dequant(src, KvKind::kValue), dst_v = Dequant(dst, KvKind::kValue);
    std::vector<float> want(keep.size() * row);
    for (size_t j = 0; j < keep.size(); ++j) {
      std::copy_n(src_v.begin() + keep[j] * row, row, want.begin() + j * row);
    }
    EXPECT_LE(testing::RelL2(dst_v, want), 0.01);  // int8 values
  }
  EXPECT_EQ(arenas[0], arenas[1]);  // same codes from both backends
}

TEST(CompactSlotsTest, MergeIsWeightedAverageAndMetadataFollows) {
  std::mt19937 rng(testing::TestSeed(13));
  const int T = 16 * 3 + 1;
  const size_t row = 3 * 64;
  const auto k = testing::RandomNormal(T * row, rng), v = testing::RandomNormal(T * row, rng);
  const testing::PagedKv src = testing::BuildPaged(kShape, k, v, T, All(PageFormat::kF32, PageFormat::kF32));
  // Three outputs: keep 0; merge {5, 6, 7} weighted 1:2:1; merge {48, 20} equally.
  const std::vector<int32_t> offsets = {0, 1, 4, 6};
  const std::vector<int32_t> members = {0, 5, 6, 7, 48, 20};
  const std::vector<float> weights = {3.0f, 1.0f, 2.0f, 1.0f, 0.5f, 0.5f};
  const CompactPlan plan{3, offsets.data(), members.data(), weights.data()};
  for (Backend b : {Backend::kReference, Backend::kCpu}) {
    testing::PagedKv dst = testing::AllocPaged(kShape, 3, All(PageFormat::kF32, PageFormat::kF32));
    ASSERT_TRUE(CompactSlots(Exec{b}, src.View(), plan, dst.Mut()).ok());
    const auto dk = Dequant(dst, KvKind::kKey), dv = Dequant(dst, KvKind::kValue);
    for (size_t x = 0; x < row; ++x) {
      EXPECT_EQ(dk[x], k[x]);
      EXPECT_NEAR(dk[row + x], 0.25f * k[5 * row + x] + 0.5f * k[6 * row + x] + 0.25f * k[7 * row + x], 1e-5);
      EXPECT_NEAR(dv[2 * row + x], 0.5f * (v[48 * row + x] + v[20 * row + x]), 1e-5);
    }
  }
  std::vector<int32_t> positions(T), counts(T, 1);
  for (int s = 0; s < T; ++s) positions[s] = 100 + s;
  counts[6] = 4;  // slot 6 is itself a merge of 4 tokens
  std::vector<int32_t> out_pos(3), out_count(3);
  ASSERT_TRUE(CompactMetadata(plan, T, positions.data(), counts.data(), out_pos.data(),
                              out_count.data())
                  .ok());
  EXPECT_EQ(out_pos, (std::vector<int32_t>{100, 107, 148}));
  EXPECT_EQ(out_count, (std::vector<int32_t>{1, 6, 2}));
}

TEST(CompactSlotsTest, RejectsMalformedPlans) {
  std::mt19937 rng(testing::TestSeed(14));
  const int T = 20;
  const auto k = testing::RandomNormal(T * 192, rng);
  const testing::PagedKv src = testing::BuildPaged(kShape, k, k, T, All(PageFormat::kF16, PageFormat::kF16));
  testing::PagedKv dst = testing::AllocPaged(kShape, 2, All(PageFormat::kF16, PageFormat::kF16));
  const std::vector<int32_t> out_of_range = {0, 20};
  EXPECT_EQ(CompactSlots(Exec{Backend::kCpu}, src.View(), CompactPlan{2, nullptr, out_of_range.data(), nullptr},
                         dst.Mut())
                .code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> offsets = {0, 1, 1}, members = {3};
  EXPECT_EQ(CompactSlots(Exec{Backend::kCpu}, src.View(), CompactPlan{2, offsets.data(), members.data(), nullptr},
                         dst.Mut())
                .code(),
            absl::StatusCode::kInvalidArgument);  // empty group
  const std::vector<int32_t> ok = {1, 2};
  EXPECT_EQ(CompactSlots(Exec{Backend::kCpu}, src.View(), CompactPlan{3, nullptr, ok.data(), nullptr},
                         dst.Mut())
                .code(),
            absl::StatusCode::kInvalidArgument);  // num_out != dst.num_tokens
  const std::vector<float> zero = {0.0f, 0.0f};
  EXPECT_EQ(CompactSlots(Exec{Backend::kCpu}, src.View(), CompactPlan{2, nullptr, ok.data(), zero.data()},
                         dst.Mut())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ScoringTest, KeyNormsAndQkScoresMatchDense) {
  std::mt19937 rng(testing::TestSeed(15));
  const int T = 16 * 3 + 7;
  const auto k = testing::OutlierKeys(T, 3, 64, rng), v = testing::RandomNormal(T * 192, rng);
  const testing::PagedKv kv = testing::BuildPaged(kShape, k, v, T, All(PageFormat::kF32, PageFormat::kF32));
  const int nq = 2;
  const auto q = testing::RandomNormal(nq * 3 * 64, rng);
  for (Backend b : {Backend::kReference, Backend::kCpu}) {
    std::vector<float> norms(3 * T), scores(nq * 3 * T);
    ASSERT_TRUE(KeyNorms(Exec{b}, kv.View(), norms.data()).ok());
    ASSERT_TRUE(QkScores(Exec{b}, kv.View(), q.data(), nq, 0.5f, scores.data()).ok());
    for (int h = 0; h < 3; ++h) {
      for (int s = 0; s < T; ++s) {
        double n2 = 0;
        for (int d = 0; d < 64; ++d) n2 += double(k[(s * 3 + h) * 64 + d]) * k[(s * 3 + h) * 64 + d];
        EXPECT_NEAR(norms[h * T + s], std::sqrt(n2), 1e-4 * std::sqrt(n2));
        for (int i = 0; i < nq; ++i) {
          double dot = 0;
          for (int d = 0; d < 64; ++d) dot += double(q[(i * 3 + h) * 64 + d]) * k[(s * 3 + h) * 64 + d];
          EXPECT_NEAR(scores[(i * 3 + h) * T + s], 0.5 * dot, 1e-3);
        }
      }
    }
  }
}

}  // namespace
}  // namespace polykv::kernels
