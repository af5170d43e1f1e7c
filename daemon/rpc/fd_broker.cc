#include "daemon/rpc/fd_broker.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/polykv/v1/fd_socket.h"

namespace polykv::daemon {

absl::StatusOr<std::unique_ptr<FdBroker>> FdBroker::Create(FdBrokerOptions options) {
  if (options.pool == nullptr) return absl::InvalidArgumentError("fd broker needs a pool");
  auto fd = BindUnixSocket(options.path, options.mode);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<FdBroker>(new FdBroker(std::move(options), *fd));
}

FdBroker::~FdBroker() {
  Stop();
  close(listen_fd_);
  unlink(options_.path.c_str());
}

void FdBroker::Start() { thread_ = std::thread([this] { Loop(); }); }

void FdBroker::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void FdBroker::Loop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Serve(fd);
    close(fd);
  }
}

void FdBroker::Serve(int fd) {
  // A slow or silent peer must not stall the broker for others.
  timeval tv{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  v1::FdReply reply;
  auto fail = [&](absl::Status s) {
    reply.status = static_cast<int32_t>(s.code());
    std::snprintf(reply.message, sizeof(reply.message), "%s", std::string(s.message()).c_str());
    (void)!send(fd, &reply, sizeof(reply), MSG_NOSIGNAL);
  };
  auto creds = PeerCredsOf(fd);
  if (!creds.ok() || !options_.policy.Allows(*creds)) {
    if (options_.on_reject) options_.on_reject(creds.ok() ? *creds : PeerCreds{});
    return;  // Same as the gRPC socket: refused peers get nothing.
  }
  v1::FdRequest req;
  if (recv(fd, &req, sizeof(req), MSG_WAITALL) != static_cast<ssize_t>(sizeof(req))) {
    return fail(absl::InvalidArgumentError("short fd request"));
  }
  if (req.magic != v1::kFdMagic || req.version != v1::kFdVersion) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("bad fd request header (magic/version ", req.magic, "/", req.version, ")")));
  }
  absl::string_view token(reinterpret_cast<const char*>(req.token), sizeof(req.token));
  auto arena_fd = options_.pool->DupArenaFd(req.session_id, token, *creds, req.arena_id);
  if (!arena_fd.ok()) return fail(arena_fd.status());
  off_t size = lseek(*arena_fd, 0, SEEK_END);
  reply.status = 0;
  reply.size_bytes = size > 0 ? static_cast<uint64_t>(size) : 0;
  iovec iov{&reply, sizeof(reply)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &*arena_fd, sizeof(int));
  (void)!sendmsg(fd, &msg, MSG_NOSIGNAL);
  close(*arena_fd);
}

}  // namespace polykv::daemon
