// CUDA kernels against the CPU reference. Every test skips cleanly when the
// library was built without CUDA or no device is present (CTest label: gpu).
#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace polykv::kernels {
namespace {

using testing::kAllFormats;

// Device allocation freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    auto p = DeviceAlloc(bytes == 0 ? 1 : bytes);
    EXPECT_TRUE(p.ok()) << p.status();
    ptr_ = p.ok() ? *p : nullptr;
  }
  DeviceBuffer(const void* host, size_t bytes) : DeviceBuffer(bytes) {
    EXPECT_TRUE(CopyToDevice(ptr_, host, bytes).ok());
  }
  ~DeviceBuffer() {
    if (ptr_) {
      EXPECT_TRUE(DeviceFree(ptr_).ok());
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  template <typename T>
  std::vector<T> ToHost(size_t n) const {
    std::vector<T> out(n);
    EXPECT_TRUE(DeviceSynchronize().ok());
    EXPECT_TRUE(CopyToHost(out.data(), ptr_, n * sizeof(T)).ok());
    return out;
  }

 private:
  void* ptr_ = nullptr;
};

// A host PagedKv mirrored on the device (same offsets, device base).
struct DevicePaged {
  explicit DevicePaged(const testing::PagedKv& kv)
      : arena(kv.arena.get(), kv.arena_bytes),
        blocks(kv.blocks.data(), kv.blocks.size() * sizeof(BlockEntry)),
        shape(kv.shape),
        num_blocks(int(kv.blocks.size())),
        num_tokens(kv.num_tokens) {}
  PagedKvView View() const {
    return PagedKvView{shape, arena.as<uint8_t>(), blocks.as<BlockEntry>(), num_blocks, num_tokens};
  }
  PagedKvMut Mut() const {
    return PagedKvMut{shape, arena.as<uint8_t>(), blocks.as<BlockEntry>(), num_blocks, num_tokens};
  }
  DeviceBuffer arena, blocks;
  PageShape shape;
  int num_blocks, num_tokens;
};

class GpuKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaBuilt()) GTEST_SKIP() << "polykv_kernels built without CUDA";
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(GpuKernelsTest, QuantizeGivesReferenceBytes) {
  std::mt19937 rng(testing::TestSeed(100));
  const PageShape s{16, 3, 64};
  const int pages = 3;
  const size_t elems = size_t(16) * 3 * 64 * pages;
  for (PageFormat f : kAllFormats) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      SCOPED_TRACE(::testing::Message() << FormatShortName(f) << " kind " << int(kind));
      const auto src = kind == KvKind::kKey ? testing::OutlierKeys(16 * pages, 3, 64, rng)
                                            : testing::RandomNormal(elems, rng);
      const size_t bytes = PageBytes(f, kind, s) * pages;
      std::vector<uint8_t> want(bytes);
      ASSERT_TRUE(QuantizePages(Exec{Backend::kReference}, s, kind, f, src.data(),
                                SourceType::kF32, pages, want.data())
                      .ok());
      DeviceBuffer d_src(src.data(), elems * 4), d_pages(bytes), d_out(elems * 4);
      ASSERT_TRUE(QuantizePages(Exec{Backend::kCuda}, s, kind, f, d_src.as<float>(),
                                SourceType::kF32, pages, d_pages.as<void>())
                      .ok());
      EXPECT_EQ(d_pages.ToHost<uint8_t>(bytes), want);
      ASSERT_TRUE(DequantizePages(Exec{Backend::kCuda}, s, kind, f, d_pages.as<void>(), pages,
                                  d_out.as<float>())
                      .ok());
      std::vector<float> ref(elems);
      ASSERT_TRUE(DequantizePages(Exec{Backend::kReference}, s, kind, f, want.data(), pages,
                                  ref.data())
                      .ok());
      EXPECT_LE(testing::MaxAbsDiff(d_out.ToHost<float>(elems), ref), 1e-5);
    }
  }
}

TEST_F(GpuKernelsTest, DecodeAttentionMatchesReferenceForEveryFormatPair) {
  std::mt19937 rng(testing::TestSeed(101));
  const PageShape s{16, 3, 64};
  const int T = 16 * 9 + 5, Hq = 9;
  const auto k = testing::OutlierKeys(T, 3, 64, rng);
  const auto v = testing::RandomNormal(size_t(T) * 192, rng);
  const auto q = testing::RandomNormal(Hq * 64, rng, 2.0f);
  DeviceBuffer d_q(q.data(), q.size() * 4), d_out(Hq * 64 * 4), d_lse(Hq * 4), d_mass(3 * T * 4);
  for (PageFormat kf : kAllFormats) {
    for (PageFormat vf : kAllFormats) {
      SCOPED_TRACE(::testing::Message() << FormatShortName(kf) << "/" << FormatShortName(vf));
      const testing::PagedKv kv = testing::BuildPaged(
          s, k, v, T, [&](int b) { return b < T / 16 ? std::make_pair(kf, vf)
                                                     : std::make_pair(PageFormat::kF16, PageFormat::kF16); });
      std::vector<float> out(Hq * 64), lse(Hq), mass(3 * T);
      ASSERT_TRUE(PagedDecodeAttention(Exec{Backend::kReference}, kv.View(), AttentionParams{Hq},
                                       q.data(), out.data(), lse.data(), mass.data())
                      .ok());
      const DevicePaged dkv(kv);
      ASSERT_TRUE(PagedDecodeAttention(Exec{Backend::kCuda}, dkv.View(), AttentionParams{Hq},
                                       d_q.as<float>(), d_out.as<float>(), d_lse.as<float>(),
                                       d_mass.as<float>())
                      .ok());
      EXPECT_LE(testing::RelL2(d_out.ToHost<float>(Hq * 64), out), 1e-4);
      EXPECT_LE(testing::MaxAbsDiff(d_lse.ToHost<float>(Hq), lse), 1e-3);
      EXPECT_LE(testing::MaxAbsDiff(d_mass.ToHost<float>(3 * T), mass), 1e-4);
      // The mass as the most over each group's heads (KVzip's score).
      AttentionParams most{Hq};
      most.mass_reduce = MassReduce::kMax;
      ASSERT_TRUE(PagedDecodeAttention(Exec{Backend::kReference}, kv.View(), most, q.data(),
                                       out.data(), nullptr, mass.data())
                      .ok());
      ASSERT_TRUE(PagedDecodeAttention(Exec{Backend::kCuda}, dkv.View(), most, d_q.as<float>(),
                                       d_out.as<float>(), nullptr, d_mass.as<float>())
                      .ok());
      EXPECT_LE(testing::MaxAbsDiff(d_mass.ToHost<float>(3 * T), mass), 1e-4) << "kMax";
    }
  }
}

TEST_F(GpuKernelsTest, PrefillAttentionMatchesReference) {
  std::mt19937 rng(testing::TestSeed(102));
  const PageShape s{16, 2, 128};
  const int T = 16 * 6 + 3, Hq = 8, num_new = 19;
  const auto k = testing::RandomNormal(size_t(T) * 256, rng);
  const auto v = testing::RandomNormal(size_t(T) * 256, rng);
  const auto q = testing::RandomNormal(size_t(num_new) * Hq * 128, rng, 2.0f);
  const testing::PagedKv kv = testing::BuildPaged(s, k, v, T, [](int b) {
    return b < 4 ? std::make_pair(PageFormat::kInt4, PageFormat::kInt8)
                 : std::make_pair(PageFormat::kF16, PageFormat::kBF16);
  });
  std::vector<float> out(q.size()), lse(num_new * Hq);
  ASSERT_TRUE(PagedPrefillAttention(Exec{Backend::kReference}, kv.View(), AttentionParams{Hq},
                                    num_new, q.data(), out.data(), lse.data())
                  .ok());
  const DevicePaged dkv(kv);
  DeviceBuffer d_q(q.data(), q.size() * 4), d_out(q.size() * 4), d_lse(lse.size() * 4);
  ASSERT_TRUE(PagedPrefillAttention(Exec{Backend::kCuda}, dkv.View(), AttentionParams{Hq},
                                    num_new, d_q.as<float>(), d_out.as<float>(), d_lse.as<float>())
                  .ok());
  EXPECT_LE(testing::RelL2(d_out.ToHost<float>(q.size()), out), 1e-4);
  EXPECT_LE(testing::MaxAbsDiff(d_lse.ToHost<float>(lse.size()), lse), 1e-3);
}

// Merged slots' log-count bias (a device array on CUDA): decode with mass,
// and prefill, against the reference with the same host bias.
TEST_F(GpuKernelsTest, SlotBiasMatchesReference) {
  std::mt19937 rng(testing::TestSeed(105));
  const PageShape s{16, 2, 128};
  const int T = 16 * 7 + 9, Hq = 8;
  const auto k = testing::OutlierKeys(T, 2, 128, rng);
  const auto v = testing::RandomNormal(size_t(T) * 256, rng);
  std::vector<float> bias(T, 0.0f);
  for (int t = 0; t < T; t += 5) bias[t] = std::log(float(1 + t % 4));
  bias[T / 2] = std::log(7.0f);
  const testing::PagedKv kv = testing::BuildPaged(s, k, v, T, [](int b) {
    return b < 5 ? std::make_pair(PageFormat::kInt4, PageFormat::kInt8)
                 : std::make_pair(PageFormat::kF16, PageFormat::kF16);
  });
  const DevicePaged dkv(kv);
  DeviceBuffer d_bias(bias.data(), bias.size() * 4);
  for (int num_queries : {1, 11}) {
    SCOPED_TRACE(::testing::Message() << "num_queries=" << num_queries);
    const auto q = testing::RandomNormal(size_t(num_queries) * Hq * 128, rng, 2.0f);
    const bool decode = num_queries == 1;
    std::vector<float> out(q.size()), lse(size_t(num_queries) * Hq), mass(2 * T);
    const AttentionParams host{Hq, 0.0f, bias.data()};
    const AttentionParams dev{Hq, 0.0f, d_bias.as<float>()};
    DeviceBuffer d_q(q.data(), q.size() * 4), d_out(q.size() * 4), d_lse(lse.size() * 4),
        d_mass(mass.size() * 4);
    if (decode) {
      ASSERT_TRUE(PagedDecodeAttention(Exec{Backend::kReference}, kv.View(), host, q.data(),
                                       out.data(), lse.data(), mass.data())
                      .ok());
      ASSERT_TRUE(PagedDecodeAttention(Exec{Backend::kCuda}, dkv.View(), dev, d_q.as<float>(),
                                       d_out.as<float>(), d_lse.as<float>(), d_mass.as<float>())
                      .ok());
      EXPECT_LE(testing::MaxAbsDiff(d_mass.ToHost<float>(mass.size()), mass), 1e-4);
    } else {
      ASSERT_TRUE(PagedPrefillAttention(Exec{Backend::kReference}, kv.View(), host, num_queries,
                                        q.data(), out.data(), lse.data())
                      .ok());
      ASSERT_TRUE(PagedPrefillAttention(Exec{Backend::kCuda}, dkv.View(), dev, num_queries,
                                        d_q.as<float>(), d_out.as<float>(), d_lse.as<float>())
                      .ok());
    }
    EXPECT_LE(testing::RelL2(d_out.ToHost<float>(q.size()), out), 1e-4);
    EXPECT_LE(testing::MaxAbsDiff(d_lse.ToHost<float>(lse.size()), lse), 1e-3);
    // The bias is applied: the reference without it differs.
    std::vector<float> plain(q.size()), plain_lse(lse.size());
    ASSERT_TRUE(PagedPrefillAttention(Exec{Backend::kReference}, kv.View(), AttentionParams{Hq},
                                      num_queries, q.data(), plain.data(), plain_lse.data())
                    .ok());
    EXPECT_GT(testing::MaxAbsDiff(plain_lse, lse), 1e-2);
  }
}

TEST_F(GpuKernelsTest, ScoringMatchesReference) {
  std::mt19937 rng(testing::TestSeed(104));
  const PageShape s{16, 3, 64};
  const int T = 16 * 5 + 7, nq = 2;
  const auto k = testing::OutlierKeys(T, 3, 64, rng);
  const auto v = testing::RandomNormal(size_t(T) * 192, rng);
  const auto q = testing::RandomNormal(size_t(nq) * 3 * 64, rng);
  const testing::PagedKv kv = testing::BuildPaged(s, k, v, T, [](int b) {
    return std::make_pair(b % 2 ? PageFormat::kInt4 : PageFormat::kF16, PageFormat::kF16);
  });
  std::vector<float> norms(3 * T), scores(nq * 3 * T);
  ASSERT_TRUE(KeyNorms(Exec{Backend::kReference}, kv.View(), norms.data()).ok());
  ASSERT_TRUE(QkScores(Exec{Backend::kReference}, kv.View(), q.data(), nq, 0.125f, scores.data()).ok());
  const DevicePaged dkv(kv);
  DeviceBuffer d_q(q.data(), q.size() * 4), d_norms(norms.size() * 4), d_scores(scores.size() * 4);
  ASSERT_TRUE(KeyNorms(Exec{Backend::kCuda}, dkv.View(), d_norms.as<float>()).ok());
  ASSERT_TRUE(QkScores(Exec{Backend::kCuda}, dkv.View(), d_q.as<float>(), nq, 0.125f,
                       d_scores.as<float>())
                  .ok());
  EXPECT_LE(testing::RelL2(d_norms.ToHost<float>(norms.size()), norms), 1e-5);
  EXPECT_LE(testing::RelL2(d_scores.ToHost<float>(scores.size()), scores), 1e-5);
}

TEST_F(GpuKernelsTest, CompactMatchesReference) {
  std::mt19937 rng(testing::TestSeed(103));
  const PageShape s{16, 3, 64};
  const int T = 16 * 4 + 2;
  const auto k = testing::RandomNormal(size_t(T) * 192, rng);
  const auto v = testing::RandomNormal(size_t(T) * 192, rng);
  const testing::PagedKv src = testing::BuildPaged(
      s, k, v, T, [](int) { return std::make_pair(PageFormat::kF16, PageFormat::kInt8); });
  // 20 outputs: slot 3*j, with every fourth output merging three slots.
  std::vector<int32_t> offsets = {0}, members;
  std::vector<float> weights;
  for (int j = 0; j < 20; ++j) {
    members.push_back(3 * j);
    weights.push_back(1.0f);
    if (j % 4 == 0) {
      members.push_back(3 * j + 1);
      members.push_back(3 * j + 2);
      weights.push_back(2.0f);
      weights.push_back(0.5f);
    }
    offsets.push_back(int32_t(members.size()));
  }
  const auto fmt = [](int b) { return std::make_pair(PageFormat::kInt4, PageFormat::kF16); };
  testing::PagedKv want = testing::AllocPaged(s, 20, fmt);
  ASSERT_TRUE(CompactSlots(Exec{Backend::kReference}, src.View(),
                           CompactPlan{20, offsets.data(), members.data(), weights.data()},
                           want.Mut())
                  .ok());
  testing::PagedKv got = testing::AllocPaged(s, 20, fmt);
  const DevicePaged dsrc(src), ddst(got);
  DeviceBuffer d_off(offsets.data(), offsets.size() * 4), d_mem(members.data(), members.size() * 4),
      d_w(weights.data(), weights.size() * 4);
  ASSERT_TRUE(CompactSlots(Exec{Backend::kCuda}, dsrc.View(),
                           CompactPlan{20, d_off.as<int32_t>(), d_mem.as<int32_t>(), d_w.as<float>()},
                           ddst.Mut())
                  .ok());
  const auto bytes = ddst.arena.ToHost<uint8_t>(got.arena_bytes);
  std::memcpy(got.arena.get(), bytes.data(), bytes.size());
  for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
    for (int b = 0; b < 2; ++b) {
      const BlockEntry& e = want.blocks[b];
      const bool key = kind == KvKind::kKey;
      const int n = b == 0 ? 16 : 4;
      std::vector<float> a(n * 192), c(n * 192);
      ASSERT_TRUE(DequantizePage(Exec{Backend::kReference}, s, kind, key ? e.k_format : e.v_format,
                                 want.arena.get() + (key ? e.k_offset : e.v_offset), n, a.data())
                      .ok());
      ASSERT_TRUE(DequantizePage(Exec{Backend::kReference}, s, kind, key ? e.k_format : e.v_format,
                                 got.arena.get() + (key ? e.k_offset : e.v_offset), n, c.data())
                      .ok());
      // Merged sums may round differently (FMA on the device): allow one code step.
      EXPECT_LE(testing::RelL2(c, a), key ? 0.1 : 1e-3);
    }
  }
}

}  // namespace
}  // namespace polykv::kernels
