// A polykvd restarted under a connected worker: crashed (SIGKILL, its socket
// files left behind) or stopped cleanly (SIGTERM: drain, evict). The worker's
// next call gets a clear error — its session id is NOT_FOUND "opened with an
// earlier polykvd", never another session's — and the same client opens a new
// session on the new daemon.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tests/integration/daemon_process.h"

namespace polykv::testing {
namespace {

class DaemonRestartTest : public ::testing::TestWithParam<int> {};

TEST_P(DaemonRestartTest, OldSessionIsNotFoundAndTheWorkerOpensANewOne) {
  const int sig = GetParam();
  DaemonOptions o;
  o.socket = MakeTempDir("polykv-restart") + "/d.sock";
  auto first = DaemonProcess::Start(o);
  ASSERT_TRUE(first.ok()) << first.status();
  Subprocess worker(TestWorker(o.socket, "resume", "t", "survivor", 64, 1));
  const std::string opened = worker.ReadLine();
  ASSERT_EQ(Field(opened, "ok"), "true") << opened;

  // SIGTERM drains: the worker's session is evicted after the drain timeout.
  EXPECT_EQ((*first)->Stop(sig), sig == SIGKILL ? 128 + SIGKILL : 0);
  first->reset();
  auto second = DaemonProcess::Start(o);
  ASSERT_TRUE(second.ok()) << "polykvd did not start over the old one's socket: "
                           << second.status();

  worker.Signal(SIGUSR1);  // make the next call
  const std::string resumed = worker.ReadLine(90000);
  ASSERT_FALSE(resumed.empty()) << "the worker's call to the new daemon did not return";
  std::printf("after %s: %s\n", sig == SIGKILL ? "SIGKILL" : "SIGTERM", resumed.c_str());
  EXPECT_EQ(Field(resumed, "code"), "5") << resumed;  // NOT_FOUND
  EXPECT_NE(Field(resumed, "message").find("opened with an earlier polykvd"), std::string::npos)
      << resumed;
  EXPECT_EQ(Field(resumed, "reopen_code"), "0") << resumed;
  EXPECT_EQ(worker.Wait(), 0) << resumed;

  EXPECT_EQ(WaitForPoolEmptyAndExact(**second), "");
  auto stats = (*second)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->lease_expiries(), 0u);
  EXPECT_EQ((*second)->Stop(SIGTERM), 0);
}

INSTANTIATE_TEST_SUITE_P(CrashedOrStopped, DaemonRestartTest, ::testing::Values(SIGKILL, SIGTERM),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return p.param == SIGKILL ? "Crashed" : "Stopped";
                         });

}  // namespace
}  // namespace polykv::testing
