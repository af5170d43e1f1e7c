// Quantize / dequantize: per-format round-trip error bounds, reference and
// fast CPU produce identical bytes, partial pages, batched == single.
#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu.h"
#include "kernels/numeric.h"
#include "kernels/ops.h"
#include "kernels/page_codec.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace polykv::kernels {
namespace {

using testing::kAllFormats;

// Bound on |x - decode(encode(x))| given the element's stored params.
double ErrorBound(PageFormat f, float x, QuantParams p) {
  const double ax = std::fabs(x);
  switch (f) {
    case PageFormat::kF32: return 0.0;
    case PageFormat::kF16: return ax * std::ldexp(1.0, -11) + std::ldexp(1.0, -25);
    case PageFormat::kBF16: return ax * std::ldexp(1.0, -8) + 1e-38;
    case PageFormat::kFP8E4M3:
      return ax * std::ldexp(1.0, -4) + p.scale * std::ldexp(1.0, -10) + ax * 1e-6;
    default: return p.scale * 0.5 * (1 + 1e-4) + ax * 1e-6 + 1e-7;
  }
}

struct Case {
  PageShape shape;
  int rows;
};

class QuantizeTest : public ::testing::TestWithParam<PageFormat> {};

TEST_P(QuantizeTest, RoundTripWithinBoundAndBackendsAgree) {
  const PageFormat f = GetParam();
  std::mt19937 rng(testing::TestSeed(1234));
  for (const Case& c : {Case{{16, 3, 64}, 16}, Case{{16, 2, 128}, 16}, Case{{16, 3, 64}, 5},
                        Case{{8, 1, 32}, 1}}) {
    const PageGeom g = GeomOf(c.shape);
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      SCOPED_TRACE(::testing::Message() << FormatShortName(f) << (kind == KvKind::kKey ? " K" : " V")
                                      << " H=" << g.num_kv_heads << " D=" << g.head_dim
                                      << " rows=" << c.rows);
      std::vector<float> src = kind == KvKind::kKey
                                   ? testing::OutlierKeys(c.rows, g.num_kv_heads, g.head_dim, rng)
                                   : testing::RandomNormal(size_t(c.rows) * g.num_kv_heads *
                                                               g.head_dim,
                                                           rng);
      const size_t bytes = PageBytes(f, kind, c.shape);
      ASSERT_GT(bytes, 0u);
      std::vector<uint8_t> page_ref(bytes, 0xA5), page_cpu(bytes, 0x5A);
      ASSERT_TRUE(QuantizePage(Exec{Backend::kReference}, c.shape, kind, f, src.data(),
                               SourceType::kF32, c.rows, page_ref.data())
                      .ok());
      for (bool baseline : {false, true}) {
        cpu::ForceBaselineForTesting(baseline);
        std::fill(page_cpu.begin(), page_cpu.end(), 0x5A);
        ASSERT_TRUE(QuantizePage(Exec{Backend::kCpu}, c.shape, kind, f, src.data(),
                                 SourceType::kF32, c.rows, page_cpu.data())
                        .ok());
        // Codes, params and padding are bit-identical (padding is zeroed).
        EXPECT_EQ(std::memcmp(page_ref.data(), page_cpu.data(), bytes), 0) << "baseline=" << baseline;
      }
      cpu::ForceBaselineForTesting(false);

      std::vector<float> out_ref(src.size()), out_cpu(src.size());
      ASSERT_TRUE(DequantizePage(Exec{Backend::kReference}, c.shape, kind, f, page_ref.data(),
                                 c.rows, out_ref.data())
                      .ok());
      for (bool baseline : {false, true}) {
        cpu::ForceBaselineForTesting(baseline);
        ASSERT_TRUE(DequantizePage(Exec{Backend::kCpu}, c.shape, kind, f, page_ref.data(), c.rows,
                                   out_cpu.data())
                        .ok());
        EXPECT_LE(testing::MaxAbsDiff(out_ref, out_cpu), 1e-6) << "baseline=" << baseline;
      }
      cpu::ForceBaselineForTesting(false);

      int violations = 0;
      for (int t = 0; t < c.rows; ++t) {
        for (int h = 0; h < g.num_kv_heads; ++h) {
          for (int d = 0; d < g.head_dim; ++d) {
            const size_t i = g.DenseIndex(t, h, d);
            const QuantParams p = IsScaledFormat(f)
                                      ? LoadParams(page_ref.data(), g, f, kind, t, h, d)
                                      : QuantParams{0, 0};
            const double err = std::fabs(double(out_ref[i]) - src[i]);
            if (err > ErrorBound(f, src[i], p)) {
              if (++violations < 5) {
                ADD_FAILURE() << "t=" << t << " h=" << h << " d=" << d << " x=" << src[i]
                              << " got=" << out_ref[i] << " scale=" << p.scale;
              }
            }
          }
        }
      }
      EXPECT_EQ(violations, 0);
    }
  }
}

TEST_P(QuantizeTest, F16SourceEqualsConvertedF32Source) {
  const PageFormat f = GetParam();
  std::mt19937 rng(testing::TestSeed(99));
  const PageShape s{16, 3, 64};
  for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
    std::vector<float> src = testing::RandomNormal(size_t(16) * 3 * 64, rng, 3.0f);
    std::vector<uint16_t> half(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      half[i] = F32ToF16(src[i]);
      src[i] = F16ToF32(half[i]);
    }
    const size_t bytes = PageBytes(f, kind, s);
    std::vector<uint8_t> a(bytes), b(bytes);
    for (Backend be : {Backend::kReference, Backend::kCpu}) {
      ASSERT_TRUE(QuantizePage(Exec{be}, s, kind, f, src.data(), SourceType::kF32, 16, a.data()).ok());
      ASSERT_TRUE(QuantizePage(Exec{be}, s, kind, f, half.data(), SourceType::kF16, 16, b.data()).ok());
      EXPECT_EQ(a, b) << BackendName(be);
    }
  }
}

TEST_P(QuantizeTest, BatchedPagesEqualSinglePages) {
  const PageFormat f = GetParam();
  std::mt19937 rng(testing::TestSeed(7));
  const PageShape s{16, 3, 64};
  const int num_pages = 5;
  const size_t elems = size_t(16) * 3 * 64;
  for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
    const std::vector<float> src = testing::RandomNormal(elems * num_pages, rng);
    const size_t bytes = PageBytes(f, kind, s);
    std::vector<uint8_t> batched(bytes * num_pages), single(bytes * num_pages);
    ASSERT_TRUE(QuantizePages(Exec{Backend::kCpu, 2}, s, kind, f, src.data(), SourceType::kF32,
                              num_pages, batched.data())
                    .ok());
    for (int p = 0; p < num_pages; ++p) {
      ASSERT_TRUE(QuantizePage(Exec{Backend::kReference}, s, kind, f, src.data() + p * elems,
                               SourceType::kF32, 16, single.data() + p * bytes)
                      .ok());
    }
    EXPECT_EQ(batched, single);
    std::vector<float> a(src.size()), b(src.size());
    ASSERT_TRUE(DequantizePages(Exec{Backend::kCpu, 2}, s, kind, f, batched.data(), num_pages,
                                a.data())
                    .ok());
    ASSERT_TRUE(DequantizePages(Exec{Backend::kReference}, s, kind, f, batched.data(), num_pages,
                                b.data())
                    .ok());
    EXPECT_LE(testing::MaxAbsDiff(a, b), 1e-6);
  }
}

// A full page of `src` quantized by the reference and by the fast backend
// (its chosen copy and its baseline copy): byte for byte the same. Returns
// the reference's page.
std::vector<uint8_t> ExpectFastEncodesAsReference(const PageShape& s, KvKind kind, PageFormat f,
                                                  const std::vector<float>& src) {
  const size_t bytes = PageBytes(f, kind, s);
  std::vector<uint8_t> a(bytes), b(bytes);
  EXPECT_TRUE(QuantizePage(Exec{Backend::kReference}, s, kind, f, src.data(), SourceType::kF32,
                           s.block_tokens, a.data())
                  .ok());
  for (bool baseline : {false, true}) {
    cpu::ForceBaselineForTesting(baseline);
    EXPECT_TRUE(QuantizePage(Exec{Backend::kCpu}, s, kind, f, src.data(), SourceType::kF32,
                             s.block_tokens, b.data())
                    .ok());
    EXPECT_EQ(a, b) << "baseline=" << baseline << " kind=" << int(kind);
  }
  cpu::ForceBaselineForTesting(false);
  return a;
}

TEST_P(QuantizeTest, EdgeValuesEncodeIdenticallyOnAllBackends) {
  const PageFormat f = GetParam();
  const PageShape s{16, 1, 64};
  std::vector<float> src(16 * 64);
  for (int t = 0; t < 16; ++t) {
    for (int d = 0; d < 64; ++d) {
      float x = 0.0f;
      switch (d % 8) {
        case 0: x = 3.0f; break;                      // constant channel: scale 0
        case 1: x = t % 2 ? 1e5f : -1e5f; break;      // beyond the f16 range
        case 2: x = 1e-8f * t; break;                 // below f16 subnormals
        case 3: x = 70000.0f; break;                  // constant, beyond f16
        case 4: x = -0.0f; break;
        case 5: x = t == 3 ? std::nanf("") : float(t); break;  // NaN skipped by params
        default: x = float(t - d) * 0.37f; break;
      }
      src[t * 64 + d] = x;
    }
  }
  for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
    const std::vector<uint8_t> a = ExpectFastEncodesAsReference(s, kind, f, src);
    std::vector<float> out(src.size());
    ASSERT_TRUE(DequantizePage(Exec{Backend::kCpu}, s, kind, f, a.data(), 16, out.data()).ok());
    for (int i = 0; i < 16 * 64; i += 8) {
      if (f != PageFormat::kF32 && f != PageFormat::kBF16) continue;
      EXPECT_EQ(out[i], 3.0f);  // exact formats keep constants exactly
    }
    if (IsIntFormat(f)) {
      for (float x : out) EXPECT_FALSE(std::isnan(x));  // NaN input encodes as code 0
    }
  }
}

// A group (or channel) whose least or greatest value is zero, with zeros
// of both signs in either order: the stored zero point's sign is the
// sequential scan's, on every backend (vectorized ranges reduce lane-wise).
TEST_P(QuantizeTest, ZeroExtremesOfEitherSignEncodeIdenticallyOnAllBackends) {
  const PageFormat f = GetParam();
  const PageShape s{16, 2, 64};
  std::vector<float> src(size_t(16) * 2 * 64);
  for (size_t i = 0; i < src.size(); ++i) {
    const int k = int(i % 32);
    const bool first_negative = (i / 32) % 2 == 0;
    if (k == 6) src[i] = first_negative ? -0.0f : 0.0f;
    else if (k == 9) src[i] = first_negative ? 0.0f : -0.0f;
    else src[i] = ((i / 64) % 3 == 0 ? -1.0f : 1.0f) * float(1 + k % 7);
  }
  for (KvKind kind : {KvKind::kKey, KvKind::kValue}) ExpectFastEncodesAsReference(s, kind, f, src);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, QuantizeTest, ::testing::ValuesIn(testing::kAllFormats),
                         [](const auto& info) { return std::string(FormatShortName(info.param)); });

TEST(WritePageRowsTest, AppendingRowsEqualsEncodingThemTogether) {
  std::mt19937 rng(testing::TestSeed(55));
  const PageShape s{16, 3, 64};
  const size_t row = 3 * 64;
  const std::vector<float> src = testing::RandomNormal(10 * row, rng);
  for (PageFormat f : {PageFormat::kF32, PageFormat::kF16, PageFormat::kBF16}) {
    std::vector<uint8_t> appended(PageBytes(f, KvKind::kValue, s), 0), whole(appended.size());
    ASSERT_TRUE(WritePageRows(s, f, src.data(), 0, 4, appended.data()).ok());
    ASSERT_TRUE(WritePageRows(s, f, src.data() + 4 * row, 4, 6, appended.data()).ok());
    ASSERT_TRUE(QuantizePage(Exec{Backend::kCpu}, s, KvKind::kValue, f, src.data(),
                             SourceType::kF32, 10, whole.data())
                    .ok());
    EXPECT_EQ(appended, whole) << FormatShortName(f);  // rows 10..15 zero in both
  }
  std::vector<uint8_t> page(PageBytes(PageFormat::kInt4, KvKind::kValue, s));
  EXPECT_EQ(WritePageRows(s, PageFormat::kInt4, src.data(), 0, 1, page.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WritePageRows(s, PageFormat::kF16, src.data(), 10, 7, page.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// Every fp8 code, keys and values, scaled by params of both signs of
// exponent: the fast copies decode the reference's bits (NaN and -0 too).
TEST(Fp8DecodeTest, EveryCodeDecodesToTheReferenceBits) {
  const PageShape s{16, 1, 64};
  const PageGeom g = GeomOf(s);
  const PageFormat f = PageFormat::kFP8E4M3;
  for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
    std::vector<uint8_t> page(PageBytes(f, kind, s));
    for (size_t i = 0; i < g.Elems(); ++i) page[i] = uint8_t(i % 256);
    uint16_t* params = reinterpret_cast<uint16_t*>(page.data() + g.DataBytes(f));
    for (size_t p = 0; p < g.NumParams(f, kind); ++p) {
      params[2 * p] = p % 2 ? 0x4100 : 0x2e66;  // 2.5, ~0.1
      params[2 * p + 1] = 0;
    }
    std::vector<float> want(g.Elems()), got(g.Elems());
    ASSERT_TRUE(DequantizePage(Exec{Backend::kReference}, s, kind, f, page.data(), 16, want.data())
                    .ok());
    for (bool baseline : {false, true}) {
      cpu::ForceBaselineForTesting(baseline);
      ASSERT_TRUE(DequantizePage(Exec{Backend::kCpu}, s, kind, f, page.data(), 16, got.data()).ok());
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
          << (kind == KvKind::kKey ? "K" : "V") << " baseline=" << baseline;
    }
    cpu::ForceBaselineForTesting(false);
  }
}

TEST(QuantizeValidationTest, RejectsBadArguments) {
  std::vector<float> src(16 * 64);
  std::vector<uint8_t> page(PageBytes(PageFormat::kInt4, KvKind::kValue, {16, 1, 64}));
  const Exec exec{Backend::kCpu};
  EXPECT_EQ(QuantizePage(exec, {16, 1, 64}, KvKind::kValue, PageFormat::kInt4, src.data(),
                         SourceType::kF32, 17, page.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizePage(exec, {16, 1, 48}, KvKind::kValue, PageFormat::kInt4, src.data(),
                         SourceType::kF32, 16, page.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizePage(exec, {16, 1, 64}, KvKind::kValue, static_cast<PageFormat>(0),
                         src.data(), SourceType::kF32, 16, page.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizePage(exec, {16, 1, 64}, KvKind::kValue, PageFormat::kInt4, nullptr,
                         SourceType::kF32, 16, page.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace polykv::kernels
