// Clients of the fd socket (<socket>.fds) that connect and send nothing, or
// half a request, while real workers map their arenas through it. The broker
// must answer the workers regardless (the client library gives up a fetch
// after 2 s, so a blocked broker fails them) and drop the stalled clients.
// The unit test IsolationTest.SilentConnectionsDoNotDelayAnArenaFetch
// (finding 3) covers the broker in-process; this is the
// daemon's, with churn: stalled clients are replaced as soon as they are
// dropped, so every worker's fetch meets them.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proto/polykv/v1/fd_socket.h"
#include "tests/fault/fault_test.h"
#include "tests/integration/unix_socket.h"

namespace polykv::testing {
namespace {

constexpr int kSilent = 100, kHalf = 20;  // under the broker's 256-connection cap

// A stalled client: silent, or the first half of an FdRequest and no more.
int Stall(const std::string& path, bool half) {
  const int fd = ConnectUnix(path);
  if (fd >= 0 && half) {
    const v1::FdRequest req;
    (void)!send(fd, &req, sizeof(req) / 2, MSG_NOSIGNAL);
  }
  return fd;
}

// True when the peer closed `fd`: readable, and EOF or a reset.
bool Dropped(int fd) {
  char b[sizeof(v1::FdReply)];
  const ssize_t n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

TEST_F(FaultTest, StalledFdSocketClientsDelayNoFetchAndAreDropped) {
  const std::string path = options_.socket + ".fds";
  std::vector<int> fds;
  for (int i = 0; i < kSilent + kHalf; ++i) {
    fds.push_back(Stall(path, i >= kSilent));
    ASSERT_GE(fds.back(), 0) << "connect " << path;
  }
  // Keeps kSilent + kHalf stalled clients connected while the workers run,
  // replacing each one the daemon drops.
  std::atomic<bool> stop{false};
  std::atomic<int> dropped{0};
  std::thread staller([&] {
    while (!stop) {
      std::vector<pollfd> p;
      for (int fd : fds) p.push_back({fd, POLLIN, 0});
      if (poll(p.data(), p.size(), 50) <= 0) continue;
      for (size_t i = 0; i < fds.size(); ++i) {
        if (p[i].revents == 0 || !Dropped(fds[i])) continue;
        close(fds[i]);
        ++dropped;
        fds[i] = Stall(path, int(i) >= kSilent);
      }
    }
  });

  // Six workers in two tenants: each opens a session and maps its arenas.
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int i = 0; i < 6; ++i) {
    workers.push_back(std::make_unique<Subprocess>(
        Worker("run", i % 2 ? "tenant-b" : "tenant-a", absl::StrCat("w", i), 256, 10 + i)));
  }
  for (auto& w : workers) {
    const std::string line = w->ReadLine(60000);
    EXPECT_EQ(w->Wait(), 0) << line;
    EXPECT_EQ(Field(line, "ok"), "true") << line;
    EXPECT_FALSE(Field(line, "arenas").empty()) << line;
  }
  stop = true;
  staller.join();
  // Workers that finish within the broker's 2 s request timeout see no drop
  // and no replacement: they were served beside the first batch.
  std::printf("%d stalled fd-socket clients dropped and replaced while 6 workers fetched\n",
              dropped.load());

  // The last stalled clients are dropped too, with nothing to replace them.
  for (int fd : fds) {
    ASSERT_GE(fd, 0);
    EXPECT_TRUE(WaitUntil([&] { return Dropped(fd); })) << "a stalled client was kept";
    close(fd);
  }
  EXPECT_EQ(WaitForPoolEmptyAndExact(*daemon_), "");
}

}  // namespace
}  // namespace polykv::testing
