// Number formats and page descriptors.
#include "kernels/page_format.h"

#include <cmath>

#include "gtest/gtest.h"
#include "kernels/numeric.h"
#include "kernels/page_layout.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace polykv::kernels {
namespace {

using testing::kAllFormats;

TEST(NumericTest, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16ToF32(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(F32ToF16(f), h) << h;
  }
}

TEST(NumericTest, F16RoundsToNearestEven) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(1.0f + 1.0f / 2048), 0x3c00);                // tie -> even
  EXPECT_EQ(F32ToF16(1.0f + 3.0f / 2048), 0x3c02);                // tie -> even (up)
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);                          // overflow -> inf
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -24)), 0x8001);            // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -26)), 0x0000);             // underflow
  EXPECT_LE(F16ToF32(F32ToF16Down(0.1f)), 0.1f);
  EXPECT_GE(F16ToF32(F32ToF16Up(0.1f)), 0.1f);
  EXPECT_LE(F16ToF32(F32ToF16Down(0.0f)), 0.0f);
}

TEST(NumericTest, Bf16AndFp8RoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = BF16ToF32(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(F32ToBF16(f), h) << h;
  }
  for (int c = 0; c < 256; ++c) {
    const float f = Fp8E4M3ToF32(uint8_t(c));
    if (std::isnan(f)) continue;
    EXPECT_EQ(F32ToFp8E4M3(f), c) << c;
  }
  EXPECT_EQ(Fp8E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(F32ToFp8E4M3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(F32ToFp8E4M3(-1000.0f), 0xfe);
}

TEST(PageFormatTest, NamesParseBack) {
  for (PageFormat f : kAllFormats) {
    EXPECT_TRUE(IsValidFormat(int(f)));
    EXPECT_EQ(ParseFormat(FormatShortName(f)), f);
    EXPECT_EQ(FormatBits(f), BitsOf(f));
  }
  EXPECT_FALSE(IsValidFormat(0));
  EXPECT_FALSE(IsValidFormat(8));
  EXPECT_FALSE(ParseFormat("int3").has_value());
}

TEST(PageFormatTest, PageBytesAreAlignedAndCoverDataAndParams) {
  const PageShape s{16, 3, 64};
  for (PageFormat f : kAllFormats) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      const size_t bytes = PageBytes(f, kind, s);
      EXPECT_EQ(bytes % kPageAlignment, 0u);
      const size_t data = size_t(16) * 3 * 64 * FormatBits(f) / 8;
      EXPECT_GE(bytes, data);
      EXPECT_LT(bytes, data + GeomOf(s).NumParams(f, kind) * 4 + 16 + kPageAlignment);
    }
  }
  // Exact sizes for the default shape of a Llama-8B layer (16 tokens, 8 heads, 128).
  const PageShape llama{16, 8, 128};
  EXPECT_EQ(PageBytes(PageFormat::kF16, KvKind::kKey, llama), 32768u);
  EXPECT_EQ(PageBytes(PageFormat::kInt4, KvKind::kKey, llama), 8192u + 4096u);
  EXPECT_EQ(PageBytes(PageFormat::kInt4, KvKind::kValue, llama), 8192u + 2048u);
  EXPECT_EQ(PageBytes(PageFormat::kInt2, KvKind::kValue, llama), 4096u + 2048u);
}

TEST(PageFormatTest, PageBytesRejectsUnsupportedShapes) {
  EXPECT_EQ(PageBytes(PageFormat::kF16, KvKind::kKey, PageShape{0, 1, 64}), 0u);
  EXPECT_EQ(PageBytes(PageFormat::kInt4, KvKind::kKey, PageShape{16, 1, 12}), 0u);
  EXPECT_EQ(PageBytes(PageFormat::kInt8, KvKind::kValue, PageShape{16, 1, 48}), 0u);
  EXPECT_GT(PageBytes(PageFormat::kInt8, KvKind::kKey, PageShape{16, 1, 48}), 0u);
  EXPECT_GT(PageBytes(PageFormat::kF32, KvKind::kValue, PageShape{16, 1, 12}), 0u);
  EXPECT_EQ(PageBytes(static_cast<PageFormat>(9), KvKind::kKey, PageShape{16, 1, 64}), 0u);
}

}  // namespace
}  // namespace polykv::kernels
