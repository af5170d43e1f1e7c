#include "daemon/rpc/uds_listener.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace polykv::daemon {

absl::StatusOr<int> BindUnixSocket(const std::string& path, mode_t mode) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path must be 1..",
                                                   sizeof(addr.sun_path) - 1, " bytes: '",
                                                   path, "'"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live = probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (probe >= 0) close(probe);
    if (live) {
      return absl::FailedPreconditionError(
          absl::StrCat("another daemon is listening on ", path));
    }
    unlink(path.c_str());
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  // Create the file with no access, then open it up to `mode`: no window in
  // which a peer could connect through a looser umask.
  const mode_t old_umask = umask(0777);
  const int rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old_umask);
  if (rc != 0) {
    absl::Status s = absl::FailedPreconditionError(
        absl::StrCat("bind ", path, ": ", std::strerror(errno)));
    close(fd);
    return s;
  }
  if (chmod(path.c_str(), mode) != 0 || listen(fd, 128) != 0) {
    absl::Status s = absl::InternalError(absl::StrCat("listen ", path, ": ", std::strerror(errno)));
    close(fd);
    unlink(path.c_str());
    return s;
  }
  return fd;
}

absl::StatusOr<PeerCreds> PeerCredsOf(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::InternalError(absl::StrCat("SO_PEERCRED: ", std::strerror(errno)));
  }
  return PeerCreds{cred.pid, cred.uid, cred.gid};
}

const char* RejectReasonName(RejectReason r) {
  switch (r) {
    case RejectReason::kNotAllowed:
      return "not_allowed";
    case RejectReason::kTotalCap:
      return "max_connections";
    case RejectReason::kPerUidCap:
      return "max_connections_per_uid";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<UdsListener>> UdsListener::Create(UdsListenerOptions options) {
  auto wake = WakeFd::Create();
  if (!wake.ok()) return wake.status();
  auto fd = BindUnixSocket(options.path, options.mode);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<UdsListener>(
      new UdsListener(std::move(options), *fd, *std::move(wake)));
}

UdsListener::UdsListener(UdsListenerOptions options, int fd, WakeFd wake)
    : options_(std::move(options)),
      listen_fd_(fd),
      stop_(std::move(wake)),
      table_(options_.limits) {}

UdsListener::~UdsListener() {
  Stop();
  close(listen_fd_);
  unlink(options_.path.c_str());
}

void UdsListener::Start() { thread_ = std::thread([this] { Loop(); }); }

void UdsListener::Stop() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

namespace {
// How often the listener looks for connections gRPC has closed: an fstat per
// connection, so 1024 connections cost ~5k syscalls a second.
constexpr absl::Duration kSweepPeriod = absl::Milliseconds(200);
// Pause after accept() ran out of fds or memory. The connection stays in the
// backlog; without a pause poll() reports it at once and the loop spins.
constexpr int kBackoffMs = 100;
}  // namespace

void UdsListener::Loop() {
  absl::Time next_sweep = absl::Now() + kSweepPeriod;
  while (true) {
    pollfd p[2] = {{stop_.fd(), POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    const int64_t wait_ms = absl::ToInt64Milliseconds(next_sweep - absl::Now()) + 1;
    poll(p, 2, static_cast<int>(std::clamp<int64_t>(wait_ms, 0, 1000)));
    if (p[0].revents != 0) break;
    if (absl::Now() >= next_sweep) {
      SweepClosed();
      next_sweep = absl::Now() + kSweepPeriod;
    }
    if (p[1].revents != 0) AcceptOne();
  }
}

void UdsListener::AcceptOne() {
  // gRPC's event engine needs non-blocking sockets.
  const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd >= 0) {
    Admit(fd);
    return;
  }
  const int error = errno;
  if (error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM) {
    ++num_accept_backoffs_;
    if (options_.on_accept_error) options_.on_accept_error(error);
    // Closed connections free fds: look for them now rather than in 200 ms.
    SweepClosed();
    pollfd p{stop_.fd(), POLLIN, 0};
    poll(&p, 1, kBackoffMs);
  }
  // EAGAIN, ECONNABORTED, EINTR, EPROTO: the peer is gone or nothing waits.
}

void UdsListener::Admit(int fd) {
  // The kernel hands out a number only once it is closed, so a connection
  // still recorded under it has ended: report that before the new one.
  if (auto old = table_.Remove(fd)) Closed(*old);
  auto creds = PeerCredsOf(fd);
  std::optional<RejectReason> why;
  if (!creds.ok() || !options_.policy.Allows(*creds)) {
    why = RejectReason::kNotAllowed;
  } else if (const ConnectionRefusal r = table_.Admits(creds->uid); r != ConnectionRefusal::kNone) {
    why = r == ConnectionRefusal::kTotal ? RejectReason::kTotalCap : RejectReason::kPerUidCap;
  }
  if (why) {
    close(fd);
    if (options_.on_reject) options_.on_reject(creds.ok() ? *creds : PeerCreds{}, *why);
    return;
  }
  auto c = table_.Add(fd, *creds);
  if (!c.ok()) {  // Not trackable, so not countable: do not hand it out.
    close(fd);
    return;
  }
  num_connections_ = table_.size();
  options_.on_accept(*c);
}

void UdsListener::SweepClosed() {
  for (const Connection& c : table_.RemoveClosed()) Closed(c);
}

void UdsListener::Closed(const Connection& c) {
  num_connections_ = table_.size();
  if (options_.on_close) options_.on_close(c);
}

}  // namespace polykv::daemon
