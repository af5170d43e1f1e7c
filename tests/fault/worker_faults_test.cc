// Workers that fail under a live polykvd, as real processes: SIGKILLed (gone
// for good, mid-decode or idle) and SIGSTOPped past their lease (back later,
// with a session the daemon has already reclaimed).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tests/fault/fault_test.h"

namespace polykv::testing {
namespace {

// Two idle workers hold pages in two tenants, two agents are mid-decode
// (between Reserve, Commit and Sync); all four are SIGKILLed. The daemon has
// no way to know but the lease: every session is reclaimed by it and the pool
// is exactly empty after.
TEST_F(FaultTest, KilledWorkersAreReclaimedAfterTheLeaseWithNoLeakedPages) {
  std::vector<std::unique_ptr<Subprocess>> workers;
  workers.push_back(std::make_unique<Subprocess>(Worker("hang", "tenant-a", "idle-a", 200, 1)));
  workers.push_back(std::make_unique<Subprocess>(Worker("hang", "tenant-b", "idle-b", 64, 2)));
  for (auto& w : workers) {
    const std::string line = w->ReadLine();
    ASSERT_EQ(Field(line, "ok"), "true") << line;
  }
  // 6144 tokens of 4 KiB each: the agents are still decoding when killed.
  for (const char* tenant : {"tenant-a", "tenant-b"}) {
    workers.push_back(std::make_unique<Subprocess>(
        Worker("agent", tenant, absl::StrCat("decoder-", tenant), 6144, 3, {"--step", "16"})));
  }
  ASSERT_TRUE(WaitUntil([&] {
    auto l = daemon_->admin().ListSessions();
    if (!l.ok() || l->sessions_size() != 4) return false;
    for (const auto& s : l->sessions()) {
      if (s.committed_tokens() == 0) return false;
    }
    return true;
  })) << "the four workers did not all commit tokens";
  for (auto& w : workers) w->Signal(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  for (auto& w : workers) EXPECT_EQ(w->Wait(), 128 + SIGKILL);

  ASSERT_TRUE(WaitUntil([&] { return NumSessions() == 0; }))
      << NumSessions() << " sessions of killed workers still open";
  // Printed, not asserted: on a shared box the reaper may run late.
  std::printf("sessions of 4 SIGKILLed workers reclaimed after %lld ms (lease %d ms)\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - killed_at)
                                         .count()),
              options_.lease_ms);
  EXPECT_EQ(WaitForPoolEmptyAndExact(*daemon_), "");
  auto stats = daemon_->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->lease_expiries(), 4u);
}

// A worker SIGSTOPped past its lease: the daemon reclaims its session (and
// only its: a neighbour in the same tenant keeps exactly its bytes). Its pages
// stay quarantined — allocated and charged, reused by nobody — while the
// stopped process lives and has not learned it. Resumed with SIGCONT, its
// next call is NOT_FOUND with a message that says why, not a hang; that call
// frees the quarantined pages, and the worker can open a new session. (That
// its old mapping cannot hurt anyone is finding 6's test.)
TEST_F(FaultTest, StoppedWorkerIsReclaimedAndItsNextCallIsNotFoundOnResume) {
  Subprocess neighbour(Worker("hang", "t", "neighbour", 64, 1));
  const std::string held = neighbour.ReadLine();
  ASSERT_EQ(Field(held, "ok"), "true") << held;
  Subprocess stopped(Worker("resume", "t", "stopped", 128, 2));
  const std::string opened = stopped.ReadLine();
  ASSERT_EQ(Field(opened, "ok"), "true") << opened;
  const uint64_t stopped_id = FieldNum(opened, "session_id");
  const uint64_t neighbour_bytes = FieldNum(held, "bytes"),
                 stopped_bytes = FieldNum(opened, "bytes");
  ASSERT_GT(neighbour_bytes, 0u);
  ASSERT_GT(stopped_bytes, 0u);

  stopped.Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntil([&] { return NumSessions() == 1; }))
      << "the stopped worker's session was not reclaimed";
  auto list = daemon_->admin().ListSessions();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->sessions_size(), 1);
  EXPECT_NE(list->sessions(0).session_id(), stopped_id);
  EXPECT_EQ(list->sessions(0).bytes(), neighbour_bytes);
  // Exact accounting with one session open and one quarantined, to the byte.
  auto stats = daemon_->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pool().used_bytes(), neighbour_bytes + stopped_bytes);
  EXPECT_EQ(stats->lease_expiries(), 1u);
  std::string page = daemon_->Metrics();
  EXPECT_EQ(Sample(page, "polykv_quarantined_bytes"), double(stopped_bytes));
  EXPECT_EQ(Sample(page, "polykv_pool_invariants_ok"), 1);

  stopped.Signal(SIGCONT);
  const std::string resumed = stopped.ReadLine(60000);
  ASSERT_FALSE(resumed.empty()) << "the resumed worker's next call did not return";
  EXPECT_EQ(Field(resumed, "code"), "5") << resumed;  // NOT_FOUND
  EXPECT_NE(Field(resumed, "message").find("lease expired"), std::string::npos) << resumed;
  EXPECT_EQ(Field(resumed, "reopen_code"), "0") << resumed;
  EXPECT_EQ(stopped.Wait(), 0) << resumed;
  // Learned: the quarantined pages are free; the neighbour's are untouched.
  stats = daemon_->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pool().used_bytes(), neighbour_bytes);
  EXPECT_EQ(stats->num_sessions(), 1u);
  page = daemon_->Metrics();
  EXPECT_EQ(Sample(page, "polykv_quarantined_bytes"), 0);
  EXPECT_EQ(Sample(page, "polykv_pool_invariants_ok"), 1);

  neighbour.Signal(SIGKILL);
  neighbour.Wait();
  EXPECT_EQ(WaitForPoolEmptyAndExact(*daemon_), "");
}

}  // namespace
}  // namespace polykv::testing
