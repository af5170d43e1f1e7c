#include "daemon/rpc/uds_listener.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

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

absl::StatusOr<std::unique_ptr<UdsListener>> UdsListener::Create(UdsListenerOptions options) {
  auto fd = BindUnixSocket(options.path, options.mode);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<UdsListener>(new UdsListener(std::move(options), *fd));
}

UdsListener::UdsListener(UdsListenerOptions options, int fd)
    : options_(std::move(options)), listen_fd_(fd) {}

UdsListener::~UdsListener() {
  Stop();
  close(listen_fd_);
  unlink(options_.path.c_str());
}

void UdsListener::Start() { thread_ = std::thread([this] { Loop(); }); }

void UdsListener::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void UdsListener::Loop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    // gRPC's event engine needs non-blocking sockets.
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    auto creds = PeerCredsOf(fd);
    if (!creds.ok() || !options_.policy.Allows(*creds)) {
      if (options_.on_reject) options_.on_reject(creds.ok() ? *creds : PeerCreds{});
      close(fd);
      continue;
    }
    options_.on_accept(fd, *creds);
  }
}

}  // namespace polykv::daemon
