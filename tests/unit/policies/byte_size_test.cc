#include "policies/byte_size.h"

#include "gtest/gtest.h"

namespace polykv::policies {
namespace {

TEST(ByteSizeTest, ParsesBinaryUnits) {
  EXPECT_EQ(*ParseByteSize("1024"), 1024u);
  EXPECT_EQ(*ParseByteSize("1GiB"), 1ull << 30);
  EXPECT_EQ(*ParseByteSize("64MiB"), 64ull << 20);
  EXPECT_EQ(*ParseByteSize("2G"), 2ull << 30);
  EXPECT_EQ(*ParseByteSize("10M"), 10ull << 20);
  EXPECT_EQ(*ParseByteSize("4K"), 4096u);
  EXPECT_EQ(*ParseByteSize("64KiB"), 64ull << 10);
  EXPECT_EQ(*ParseByteSize("100B"), 100u);
  EXPECT_EQ(*ParseByteSize(" 256MiB\n"), 256ull << 20);
  EXPECT_EQ(*ParseByteSize("0"), 0u);
}

TEST(ByteSizeTest, RefusesWhatIsNotASize) {
  for (const char* bad : {"", "lots", "12XB", "MiB", "-1", "1.5GiB", "1 GiB x", "18446744073709551616",
                          "17179869184GiB"}) {
    auto b = ParseByteSize(bad);
    EXPECT_FALSE(b.ok()) << bad;
    if (!b.ok()) EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace polykv::policies
