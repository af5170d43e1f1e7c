#include "daemon/metrics/http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace polykv::daemon {
namespace {

struct Conn {
  int fd = -1;
  std::string in;
  std::string out;
  size_t sent = 0;
  bool replying = false;  // a complete request was read; `out` is the reply
  absl::Time opened;
  absl::Time deadline;
};

std::string Reply(int code, absl::string_view reason, absl::string_view type,
                  absl::string_view body) {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

// The reply to one request head ("GET /metrics HTTP/1.1\r\n...").
std::string Answer(absl::string_view head, const std::function<std::string()>& render,
                   const std::function<absl::Status()>& ready) {
  const size_t sp1 = head.find(' ');
  const size_t sp2 = sp1 == absl::string_view::npos ? sp1 : head.find(' ', sp1 + 1);
  if (sp2 == absl::string_view::npos) {
    return Reply(400, "Bad Request", "text/plain", "malformed request line\n");
  }
  const absl::string_view method = head.substr(0, sp1);
  absl::string_view path = head.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET" && method != "HEAD") {
    return Reply(405, "Method Not Allowed", "text/plain", "only GET /metrics\n");
  }
  int code = 200;
  absl::string_view reason = "OK";
  std::string page;
  std::string type = "text/plain; charset=utf-8";
  if (path == "/metrics" || path == "/") {
    page = render();
    type = "text/plain; version=0.0.4; charset=utf-8";
  } else if (path == "/healthz") {
    page = "ok\n";
  } else if (path == "/readyz") {
    const absl::Status s = ready ? ready() : absl::OkStatus();
    if (s.ok()) {
      page = "ready\n";
    } else {
      code = 503;
      reason = "Service Unavailable";
      page = absl::StrCat("not ready: ", s.message(), "\n");
    }
  } else {
    return Reply(404, "Not Found", "text/plain", "try /metrics, /healthz or /readyz\n");
  }
  std::string r = Reply(code, reason, type, page);
  return method == "HEAD" ? r.substr(0, r.size() - page.size()) : r;
}

void CloseConn(Conn& c) {
  if (c.fd >= 0) close(c.fd);
  c.fd = -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const MetricsHttpOptions& options, std::function<std::string()> render,
    std::function<absl::Status()> ready) {
  const size_t colon = options.address.rfind(':');
  if (colon == std::string::npos || colon + 1 == options.address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", options.address, "' is not HOST:PORT"));
  }
  std::string host = options.address.substr(0, colon);
  const std::string port = options.address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", options.address, "': ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string last_error = "no address";
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on ", options.address, ": ", last_error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  auto wake = WakeFd::Create();
  if (!wake.ok()) {
    close(fd);
    return wake.status();
  }
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(options, std::move(render), std::move(ready), fd, *std::move(wake),
                            bound_port));
}

MetricsHttpServer::MetricsHttpServer(const MetricsHttpOptions& options,
                                     std::function<std::string()> render,
                                     std::function<absl::Status()> ready, int listen_fd,
                                     WakeFd wake, int port)
    : options_(options),
      render_(std::move(render)),
      ready_(std::move(ready)),
      listen_fd_(listen_fd),
      wake_(std::move(wake)),
      port_(port),
      thread_([this] { Loop(); }) {}

MetricsHttpServer::~MetricsHttpServer() {
  stop_ = true;
  wake_.Notify();
  thread_.join();
  close(listen_fd_);
}

void MetricsHttpServer::Loop() {
  std::vector<Conn> conns;
  std::vector<pollfd> fds;
  while (!stop_.load()) {
    const absl::Time now = absl::Now();
    // Expired connections go first: a slow or silent peer gets its timeout,
    // no more.
    for (Conn& c : conns) {
      if (now >= c.deadline) CloseConn(c);
    }
    std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
    absl::Time next = now + absl::Seconds(1);
    fds.assign({{wake_.fd(), POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    for (const Conn& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.replying ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.deadline);
    }
    const int timeout_ms =
        static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(next - now)) + 1);
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    if (stop_.load()) break;

    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      const short ev = fds[i + 2].revents;
      if (ev == 0) continue;
      if (!c.replying && (ev & (POLLIN | POLLHUP | POLLERR))) {
        char buf[4096];
        const ssize_t n = read(c.fd, buf, sizeof(buf));
        if (n <= 0) {
          if (n == 0 || (errno != EAGAIN && errno != EINTR)) CloseConn(c);
          continue;
        }
        c.in.append(buf, static_cast<size_t>(n));
        const size_t end = c.in.find("\r\n\r\n");
        if (end == std::string::npos) {
          if (c.in.size() > options_.max_request_bytes) {
            c.out = Reply(431, "Request Header Fields Too Large", "text/plain", "request too large\n");
            c.replying = true;
          }
          continue;
        }
        c.out = Answer(absl::string_view(c.in).substr(0, end), render_, ready_);
        c.replying = true;
      }
      if (c.replying && (ev & (POLLOUT | POLLIN | POLLHUP | POLLERR))) {
        const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
          CloseConn(c);
          continue;
        }
        if (n > 0) c.sent += static_cast<size_t>(n);
        if (c.sent == c.out.size()) CloseConn(c);
      }
    }
    std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });

    if (fds[1].revents & POLLIN) {
      while (true) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;  // EAGAIN: accepted everything pending
        if (conns.size() >= options_.max_connections) {
          // Full: the connection waiting longest without a request makes room.
          auto idle = std::min_element(conns.begin(), conns.end(), [](const Conn& a, const Conn& b) {
            if (a.replying != b.replying) return !a.replying;
            return a.opened < b.opened;
          });
          if (idle == conns.end() || idle->replying) {
            close(fd);
            continue;
          }
          CloseConn(*idle);
          conns.erase(idle);
        }
        const absl::Time t = absl::Now();
        conns.push_back({fd, {}, {}, 0, false, t, t + options_.request_timeout});
      }
    }
  }
  for (Conn& c : conns) CloseConn(c);
}

}  // namespace polykv::daemon
