// CompactionRun's phases one by one on a session built by hand (no KvPool,
// no lock): the exact state each leaves, and the copy's bytes. (The epoch
// and the pending blocks are KvPool::RunStaged's, tested with the pool.)
#include "daemon/pool/compaction_run.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/ops.h"

namespace polykv::daemon {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB;
constexpr int kLayers = 2, kHeads = 2, kDim = 32, kBlock = 16, kSlots = 64;

float Pattern(int64_t pos, int layer, int v, int i) {
  return float(pos) + 0.25f * float(layer) + 0.125f * float(v) + 0.001f * float(i);
}

class CompactionRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    s_.id = 1;
    s_.account = {"t", "a", 0};
    s_.profile = {kLayers, kHeads, kDim, DType::kF32, "tiny"};
    s_.block_tokens = kBlock;
    auto shape = MakeBlockShape(kLayers, s_.page_shape(), PageFormat::kF32, PageFormat::kF32,
                                256 * kKiB);
    ASSERT_TRUE(shape.ok()) << shape.status();
    s_.shape = *shape;
    pool_.AttachSession(s_.account);
    auto blocks = pool_.Allocate(s_.account, s_.shape, kSlots / kBlock);
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    s_.tables.blocks = *std::move(blocks);
    s_.tables.committed_tokens = kSlots;
    std::vector<float> row(kHeads * kDim);
    for (int i = 0; i < kSlots; ++i) {
      SlotRecord r;
      r.meta.position = 100 + i;
      s_.policy.records[0].push_back(r);
      for (int l = 0; l < kLayers; ++l) {
        for (int v = 0; v < 2; ++v) {
          for (size_t k = 0; k < row.size(); ++k) row[k] = Pattern(100 + i, l, v, int(k));
          const PageId page = s_.tables.blocks[i / kBlock].pages[2 * l + v];
          ASSERT_TRUE(kernels::WritePageRows(s_.page_shape(), PageFormat::kF32, row.data(),
                                             i % kBlock, 1, Page(page))
                          .ok());
        }
      }
    }
  }
  uint8_t* Page(PageId page) {
    return reinterpret_cast<uint8_t*>(pool_.HostAddress(s_.tenant(), page));
  }

  BlockPool pool_{BlockPoolOptions{16 * kMiB, 4 * kMiB, 256 * kKiB, CreateHostShmArena}};
  Session s_;
};

TEST_F(CompactionRunTest, EachPhaseLeavesTheSessionInItsStatedState) {
  auto policy = policies::MakePolicy("window", {{"window.size", "24"}});
  ASSERT_TRUE(policy.ok()) << policy.status();
  CompactionRun run(**policy, "window{window.size=24}", 32, std::nullopt, 256 * kKiB);
  const uint64_t bytes_before = s_.account.bytes;

  ASSERT_TRUE(run.Prepare(s_, QosRecord{}, pool_,
                          LayerHoles(s_.tables.blocks, kLayers, kBlock))
                  .ok());
  auto changes = run.Decide(s_);
  ASSERT_TRUE(changes.ok()) << changes.status();
  ASSERT_TRUE(*changes);
  // Deciding changes nothing of the session.
  EXPECT_EQ(s_.tables.committed_tokens, uint64_t(kSlots));
  EXPECT_EQ(s_.tables.epoch, 0u);
  EXPECT_EQ(s_.account.bytes, bytes_before);

  // The window's 24 newest slots start mid-block (slot 40, in block 2): no
  // output block is an old one as it was, so both are written anew.
  auto shapes = run.NewShapes(s_);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), 2u);
  for (const BlockShape& shape : *shapes) EXPECT_EQ(shape, s_.shape);
  for (const BlockShape& shape : *shapes) {
    auto staged = pool_.Allocate(s_.account, shape, 1, /*zero=*/false);
    ASSERT_TRUE(staged.ok());
    s_.tables.staged.push_back(std::move(staged->front()));
  }
  ASSERT_TRUE(run.Address(s_, pool_).ok());
  ASSERT_TRUE(run.Copy(s_).ok());

  std::vector<Block> old = run.Publish(s_);
  const CompactionRun::Published& done = run.published();
  EXPECT_EQ(done.shared_blocks, 0u);
  EXPECT_EQ(done.copied_blocks, 2u);
  EXPECT_EQ(done.evicted_tokens, uint64_t(kSlots - 24));
  EXPECT_EQ(s_.tables.epoch, 0u);
  EXPECT_EQ(s_.tables.committed_tokens, 24u);
  EXPECT_TRUE(s_.tables.staged.empty());
  EXPECT_EQ(s_.tables.blocks.size(), 2u);
  // No output block shares an old one: every old block is returned.
  EXPECT_EQ(old.size(), size_t(kSlots / kBlock));
  EXPECT_TRUE(s_.tables.pending.empty());
  ASSERT_EQ(s_.policy.records[0].size(), 24u);
  // Every kept slot's rows, in every layer, are its position's.
  std::vector<float> rows(kBlock * kHeads * kDim);
  const kernels::Exec exec;
  for (size_t b = 0; b < s_.tables.blocks.size(); ++b) {
    const int n = std::min<int>(kBlock, 24 - int(b) * kBlock);
    for (int l = 0; l < kLayers; ++l) {
      for (int v = 0; v < 2; ++v) {
        const auto kind = v ? kernels::KvKind::kValue : kernels::KvKind::kKey;
        ASSERT_TRUE(kernels::DequantizePage(exec, s_.page_shape(), kind, PageFormat::kF32,
                                            Page(s_.tables.blocks[b].pages[2 * l + v]), n,
                                            rows.data())
                        .ok());
        for (int t = 0; t < n; ++t) {
          const int64_t pos = s_.policy.records[0][b * kBlock + t].meta.position;
          EXPECT_EQ(pos, 100 + kSlots - 24 + int64_t(b) * kBlock + t);
          for (int k = 0; k < kHeads * kDim; ++k) {
            ASSERT_EQ(rows[t * kHeads * kDim + k], Pattern(pos, l, v, k)) << b << " " << t;
          }
        }
      }
    }
  }
  for (auto* table : {&s_.tables.blocks, &old}) {
    for (Block& b : *table) pool_.Free(s_.account, b);
  }
  EXPECT_EQ(pool_.used_bytes(), 0u);
}

}  // namespace
}  // namespace polykv::daemon
