// Unix-socket peers for the findings tests: plain connections, connections
// from another process (another pid, and another uid when run as root), and
// waits for events with generous deadlines (never assertions on durations).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "tests/integration/unix_socket.h"
#include "tests/integration/wait_until.h"

namespace polykv::testing {

// A uid no one on a test box uses; allowed in the tests' daemons.
inline constexpr uid_t kOtherUid = 4242;

// A blocked server fails a findings test after this long instead of hanging it.
inline constexpr int kReadTimeoutMs = 10000;

// Reads (and drops) what the server sends until it closes the connection
// (EOF or a reset); false if it is still open after `timeout`.
inline bool WaitForClose(int fd, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

// A connection made by a child process (so SO_PEERCRED names another pid),
// with effective uid `uid` (needs root when it is not ours). The child sends
// the connected fd back over a socket pair; TakeFd() receives it.
class PeerProcess {
 public:
  // With connect_now false, the child waits for Connect().
  PeerProcess(const std::string& path, uid_t uid, bool connect_now = true) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl_) != 0) return;
    pid_ = fork();
    if (pid_ == 0) Child(path, uid, connect_now);  // does not return
    close(ctl_[1]);
  }
  ~PeerProcess() {
    if (ctl_[0] >= 0) close(ctl_[0]);
    Reap();
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  pid_t pid() const { return pid_; }
  void Connect() { (void)!write(ctl_[0], "c", 1); }
  // The child's connected fd, or -1 (it failed; see its stderr).
  int TakeFd() {
    FdMessage m;
    int fd = -1;
    if (recvmsg(ctl_[0], &m.header, MSG_CMSG_CLOEXEC) == 1 && CMSG_FIRSTHDR(&m.header) != nullptr) {
      std::memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m.header)), sizeof(fd));
    }
    Reap();
    return fd;
  }

 private:
  // One byte with room for one fd (SCM_RIGHTS), for sendmsg and recvmsg.
  struct FdMessage {
    FdMessage() {
      header.msg_iov = &iov;
      header.msg_iovlen = 1;
      header.msg_control = space;
      header.msg_controllen = sizeof(space);
    }
    FdMessage(const FdMessage&) = delete;  // header points into itself
    FdMessage& operator=(const FdMessage&) = delete;
    char byte = 'c';
    iovec iov{&byte, 1};
    alignas(cmsghdr) char space[CMSG_SPACE(sizeof(int))] = {};
    msghdr header{};
  };

  [[noreturn]] void Child(const std::string& path, uid_t uid, bool connect_now) {
    close(ctl_[0]);
    // Raw syscalls: only this (single-threaded) child changes. The fs uid
    // goes back to root so the 0660 socket stays reachable; SO_PEERCRED
    // reports the effective uid.
    if (uid != geteuid()) {
      if (syscall(SYS_setresuid, -1, uid, -1) != 0) _exit(2);
      syscall(SYS_setfsuid, 0);  // returns the previous fs uid, never an error
    }
    char go;
    if (!connect_now && read(ctl_[1], &go, 1) != 1) _exit(3);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || !ConnectSocket(fd, path)) _exit(4);
    FdMessage m;
    cmsghdr* c = CMSG_FIRSTHDR(&m.header);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(fd));
    _exit(sendmsg(ctl_[1], &m.header, 0) == 1 ? 0 : 5);
  }
  void Reap() {
    if (pid_ > 0 && !reaped_) waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }

  int ctl_[2] = {-1, -1};
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// Lowers RLIMIT_NOFILE's soft limit for its lifetime.
class FdLimit {
 public:
  explicit FdLimit(rlim_t soft) {
    getrlimit(RLIMIT_NOFILE, &old_);
    rlimit lower{soft, old_.rlim_max};
    setrlimit(RLIMIT_NOFILE, &lower);
  }
  ~FdLimit() { setrlimit(RLIMIT_NOFILE, &old_); }
  FdLimit(const FdLimit&) = delete;
  FdLimit& operator=(const FdLimit&) = delete;

 private:
  rlimit old_{};
};

}  // namespace polykv::testing
