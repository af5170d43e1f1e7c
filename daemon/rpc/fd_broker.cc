#include "daemon/rpc/fd_broker.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/rpc/fd_wire.h"
#include "proto/polykv/v1/fd_socket.h"

namespace polykv::daemon {

absl::StatusOr<std::unique_ptr<FdBroker>> FdBroker::Create(FdBrokerOptions options) {
  if (options.pool == nullptr) return absl::InvalidArgumentError("fd broker needs a pool");
  auto wake = WakeFd::Create();
  if (!wake.ok()) return wake.status();
  auto fd = BindUnixSocket(options.path, options.mode);
  if (!fd.ok()) return fd.status();
  // Non-blocking: the loop accepts until EAGAIN.
  if (fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) | O_NONBLOCK) != 0) {
    close(*fd);
    return absl::InternalError(absl::StrCat("fcntl(O_NONBLOCK): ", std::strerror(errno)));
  }
  return std::unique_ptr<FdBroker>(new FdBroker(std::move(options), *fd, *std::move(wake)));
}

FdBroker::~FdBroker() {
  Stop();
  close(listen_fd_);
  unlink(options_.path.c_str());
}

void FdBroker::Start() { thread_ = std::thread([this] { Loop(); }); }

void FdBroker::Stop() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

struct FdBroker::Conn {
  int fd = -1;
  PeerCreds creds;
  v1::FdRequest req;
  size_t got = 0;
  absl::Time deadline;
};

namespace {

constexpr size_t kMaxConnections = 256;
constexpr absl::Duration kRequestTimeout = absl::Seconds(2);

void Fail(int fd, const absl::Status& s) {
  v1::FdReply reply;
  reply.status = static_cast<int32_t>(s.code());
  std::snprintf(reply.message, sizeof(reply.message), "%s", std::string(s.message()).c_str());
  (void)!send(fd, &reply, sizeof(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

void FdBroker::Loop() {
  std::vector<Conn> conns;
  std::vector<pollfd> fds;
  auto drop = [](Conn& c) {
    close(c.fd);
    c.fd = -1;
  };
  constexpr size_t kFirstConn = 2;  // fds: the stop eventfd, the listening socket, then conns
  while (true) {
    const absl::Time now = absl::Now();
    absl::Time next = now + absl::Seconds(1);
    for (Conn& c : conns) {
      if (now >= c.deadline) drop(c);
      next = std::min(next, c.deadline);
    }
    std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
    fds.assign({{stop_.fd(), POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    for (const Conn& c : conns) fds.push_back({c.fd, POLLIN, 0});
    const int wait_ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(next - now)) + 1);
    if (poll(fds.data(), fds.size(), wait_ms) <= 0) continue;
    if (fds[0].revents != 0) break;
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      if (fds[i + kFirstConn].revents == 0) continue;
      const ssize_t n = recv(c.fd, reinterpret_cast<char*>(&c.req) + c.got,
                             sizeof(c.req) - c.got, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        if (c.got > 0) Fail(c.fd, absl::InvalidArgumentError("short fd request"));
        drop(c);
        continue;
      }
      c.got += static_cast<size_t>(n);
      if (c.got == sizeof(c.req)) {
        Serve(c);
        drop(c);
      }
    }
    std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
    if ((fds[1].revents & POLLIN) == 0) continue;
    while (true) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;  // EAGAIN: all pending connections accepted
      auto creds = PeerCredsOf(fd);
      if (!creds.ok() || !options_.policy.Allows(*creds)) {
        if (options_.on_reject) options_.on_reject(creds.ok() ? *creds : PeerCreds{});
        close(fd);  // Same as the gRPC socket: refused peers get nothing.
        continue;
      }
      conns.push_back({fd, *creds, {}, 0, absl::Now() + kRequestTimeout});
      if (conns.size() > kMaxConnections) {
        // The uid holding most loses its oldest (the one that has waited
        // longest for its request): a flood only ever drops its own.
        std::map<uid_t, size_t> per_uid;
        for (const Conn& c : conns) ++per_uid[c.creds.uid];
        const uid_t victim = std::max_element(per_uid.begin(), per_uid.end(),
                                              [](const auto& x, const auto& y) {
                                                return x.second < y.second;
                                              })->first;
        auto oldest = std::find_if(conns.begin(), conns.end(),
                                   [&](const Conn& c) { return c.creds.uid == victim; });
        drop(*oldest);
        conns.erase(oldest);
      }
    }
  }
  for (Conn& c : conns) drop(c);
}

void FdBroker::Serve(const Conn& c) {
  const int fd = c.fd;
  const v1::FdRequest& req = c.req;
  auto fail = [&](absl::Status s) { Fail(fd, s); };
  auto parsed = ParseFdRequest(
      absl::string_view(reinterpret_cast<const char*>(&req), sizeof(req)));
  if (!parsed.ok()) return fail(parsed.status());
  auto arena_fd =
      options_.pool->DupArenaFd(parsed->session_id, parsed->token, c.creds, parsed->arena_id);
  if (!arena_fd.ok()) return fail(arena_fd.status());
  v1::FdReply reply;
  reply.status = 0;
  reply.size_bytes = arena_fd->size_bytes;
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
  std::memcpy(CMSG_DATA(cm), &arena_fd->fd, sizeof(int));
  // 256 bytes into a fresh socket's buffer: never blocks in practice, and
  // must not (MSG_DONTWAIT) — a peer that does not read loses its fd.
  (void)!sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  close(arena_fd->fd);
}

}  // namespace polykv::daemon
