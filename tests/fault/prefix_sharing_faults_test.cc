// Shared prefix blocks between worker processes of a live polykvd (issue
// 42): shared within a tenant, found by no other tenant, read intact by a
// second process while the sharer is SIGKILLed, refcounts exact after the
// reclaim (the blocks cached, nothing leaked), and revived by a third.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/fault/fault_test.h"

namespace polykv::testing {
namespace {

// 4 layers x (K + V) x 16 tokens x 2 heads x 64 dims x 4 bytes (test_worker.cc).
constexpr uint64_t kBlockBytes = 64 << 10;

class PrefixSharingFaultTest : public FaultTest {
 protected:
  v1::PrefixStats Prefix() {
    auto s = daemon_->Stats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->prefix() : v1::PrefixStats{};
  }
  uint64_t UsedBytes() {
    auto s = daemon_->Stats();
    return s.ok() ? s->pool().used_bytes() : ~0ull;
  }
};

TEST_F(PrefixSharingFaultTest, ASecondProcessReadsTheSharedPagesWhileTheSharerIsKilled) {
  const std::vector<std::string> ids = {"--ids", "5000"};
  Subprocess sharer(Worker("share", "tenant-a", "sharer", 64, 7, ids));
  const std::string shared = sharer.ReadLine();
  ASSERT_EQ(Field(shared, "ok"), "true") << shared;
  EXPECT_EQ(Field(shared, "shared"), "64");
  EXPECT_EQ(Prefix().shared_bytes(), 4 * kBlockBytes);

  // Another tenant, or other token ids, find nothing.
  auto [code, out] = RunProgram(Worker("attach", "tenant-b", "stranger", 64, 7, ids));
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(Field(out, "attached"), "0") << out;
  std::tie(code, out) = RunProgram(Worker("attach", "tenant-a", "other", 64, 7, {"--ids", "6000"}));
  EXPECT_EQ(Field(out, "attached"), "0") << out;
  EXPECT_EQ(Prefix().hit_blocks(), 0u);

  // A reader of the tenant attaches the four blocks, holds them while the
  // sharer is SIGKILLed and its session reclaimed, then checks every byte.
  Subprocess reader(Worker("attach", "tenant-a", "reader", 64, 7,
                           {"--ids", "5000", "--hold-ms", "6000"}));
  ASSERT_TRUE(WaitUntil([&] { return Prefix().hit_blocks() == 4; }))
      << "the reader did not attach the shared blocks";
  EXPECT_EQ(UsedBytes(), 4 * kBlockBytes);  // nothing new in memory
  sharer.Signal(SIGKILL);
  EXPECT_EQ(sharer.Wait(), 128 + SIGKILL);
  ASSERT_TRUE(WaitUntil([&] { return NumSessions() == 1; }))
      << "the killed sharer's session was not reclaimed";
  const std::string read = reader.ReadLine();
  EXPECT_EQ(Field(read, "ok"), "true") << read;
  EXPECT_EQ(Field(read, "attached"), "64") << read;
  EXPECT_EQ(reader.Wait(), 0) << read;

  // No session holds them now: cached, exactly, and nothing else is used.
  ASSERT_TRUE(WaitUntil([&] { return NumSessions() == 0; }));
  v1::PrefixStats p = Prefix();
  EXPECT_EQ(p.shared_bytes(), 0u);
  EXPECT_EQ(p.cached_bytes(), 4 * kBlockBytes);
  EXPECT_EQ(UsedBytes(), 4 * kBlockBytes);
  EXPECT_EQ(Sample(daemon_->Metrics(), "polykv_pool_invariants_ok"), 1);
  auto [ctl_code, status] = daemon_->Ctl({"status"});
  EXPECT_EQ(ctl_code, 0);
  EXPECT_NE(status.find("0 B shared, 256.0 KiB cached"), std::string::npos) << status;

  // Revived by a third process, the sharer's bytes intact.
  std::tie(code, out) = RunProgram(Worker("attach", "tenant-a", "late", 64, 7, ids));
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(Field(out, "attached"), "64") << out;
  EXPECT_EQ(Prefix().hit_blocks(), 8u);
  EXPECT_EQ(Sample(daemon_->Metrics(), "polykv_pool_invariants_ok"), 1);
}

}  // namespace
}  // namespace polykv::testing
