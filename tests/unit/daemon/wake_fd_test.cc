#include "daemon/sys/wake_fd.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <thread>

namespace polykv::daemon {
namespace {

bool Readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN) != 0;
}

TEST(WakeFdTest, ReadableOnlyOnceNotifiedAndStaysSo) {
  auto wake = WakeFd::Create();
  ASSERT_TRUE(wake.ok()) << wake.status();
  EXPECT_FALSE(Readable(wake->fd(), 0));
  wake->Notify();
  EXPECT_TRUE(Readable(wake->fd(), 0));
  EXPECT_TRUE(Readable(wake->fd(), 0));  // every loop that polls it sees the stop
  wake->Notify();                        // a second Stop is harmless
  EXPECT_TRUE(Readable(wake->fd(), 0));
}

TEST(WakeFdTest, WakesAPollBlockedInAnotherThread) {
  auto wake = WakeFd::Create();
  ASSERT_TRUE(wake.ok()) << wake.status();
  bool woke = false;
  std::thread waiter([&] { woke = Readable(wake->fd(), -1); });  // no timeout: only Notify ends it
  wake->Notify();
  waiter.join();
  EXPECT_TRUE(woke);
}

TEST(WakeFdTest, AMovedFromWakeFdOwnsNothing) {
  auto wake = WakeFd::Create();
  ASSERT_TRUE(wake.ok()) << wake.status();
  const int fd = wake->fd();
  WakeFd moved = *std::move(wake);
  EXPECT_EQ(moved.fd(), fd);
  EXPECT_EQ(wake->fd(), -1);  // NOLINT(bugprone-use-after-move): checking exactly that
  moved.Notify();
  EXPECT_TRUE(Readable(moved.fd(), 0));
}

}  // namespace
}  // namespace polykv::daemon
