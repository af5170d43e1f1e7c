// Fuzz target: a live FdBroker (daemon/rpc/fd_broker.h) on a real Unix
// socket, fed the input as one worker connection's bytes, in chunks, then
// EOF. The reply must come (no hang) and match what the request asked:
// nothing for an empty connection, INVALID_ARGUMENT for a short or
// malformed request, otherwise KvPool::DupArenaFd's answer — with an fd of
// the arena's size exactly when the status is OK.
//
// Input: [flags][chunk][request bytes...]. chunk: bytes per send(), 1..64
// (0: all at once). flags replace fields of a request of >= 56 bytes with
// the setup session's, so the checks past the header are reached:
//   0x01 magic and version   0x02 session_id   0x04 token   0x08 arena_id
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "client/lib/arena_mapper.h"
#include "daemon/rpc/fd_broker.h"
#include "daemon/rpc/fd_wire.h"
#include "proto/polykv/v1/fd_socket.h"
#include "tests/fuzz/fuzz_support.h"

namespace polykv::fuzz {
namespace {

namespace v1 = polykv::v1;

constexpr size_t kMaxRequestBytes = 512;

struct Fixture {
  Fixture() : pool(MakeFuzzPool([] { return absl::FromUnixSeconds(1000000); })) {
    // The broker sees this process's credentials on every connection.
    peer = {getpid(), getuid(), getgid()};
    auto s = pool->Open(FuzzOpenRequest("a", "t1", peer));
    CheckOk(s.status(), "setup Open");
    session_id = s->session_id;
    token = s->token;
    auto r = pool->Reserve(session_id, token, peer, 16);
    CheckOk(r.status(), "setup Reserve");
    if (r->new_arenas.empty()) Fail("setup Reserve created no arena");
    arena_id = r->new_arenas[0].arena_id;
    char tmpl[] = "/tmp/polykv-fuzz-fd-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) Fail("mkdtemp");
    dir = tmpl;
    daemon::FdBrokerOptions o;
    o.path = dir + "/fds.sock";
    o.mode = 0600;
    o.policy.allowed_uids = {getuid()};
    o.pool = pool.get();
    auto b = daemon::FdBroker::Create(o);
    CheckOk(b.status(), "FdBroker::Create");
    broker = *std::move(b);
    broker->Start();
    path = o.path;
  }
  ~Fixture() {
    broker.reset();
    rmdir(dir.c_str());
  }

  std::unique_ptr<daemon::KvPool> pool;
  std::unique_ptr<daemon::FdBroker> broker;
  daemon::PeerCreds peer;
  uint64_t session_id = 0;
  std::string token;
  uint32_t arena_id = 0;
  std::string dir, path;
};

// Built on the first input, destroyed at exit (the broker stops, its socket
// and folder go).
Fixture& GetFixture() {
  static Fixture f;
  return f;
}

// Connected, with reads that give up after 10 s: a broker that never
// answers is a finding, not a stuck fuzzer.
int Connect(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  while (true) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) Fail("socket");
    const timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
    const int err = errno;
    close(fd);
    // A signal (libFuzzer's timer) while the backlog was full: try again.
    if (err != EINTR) Fail(std::string("connect: ") + std::strerror(err));
  }
}

// What the broker must answer for `req`: a status code, -1 for no reply.
int Expected(Fixture& f, const std::string& req) {
  if (req.empty()) return -1;
  if (req.size() < sizeof(v1::FdRequest)) return int(absl::StatusCode::kInvalidArgument);
  auto parsed = daemon::ParseFdRequest(absl::string_view(req).substr(0, sizeof(v1::FdRequest)));
  if (!parsed.ok()) return int(parsed.status().code());
  auto fd = f.pool->DupArenaFd(parsed->session_id, parsed->token, f.peer, parsed->arena_id);
  if (fd.ok()) close(fd->fd);
  return int(fd.status().code());
}

void Put(std::string& req, size_t offset, const void* v, size_t n) {
  std::memcpy(req.data() + offset, v, n);
}

}  // namespace
}  // namespace polykv::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace polykv::fuzz;
  Fixture& f = GetFixture();
  const uint8_t flags = size > 0 ? data[0] : 0;
  const size_t chunk = size > 1 && data[1] % 65 != 0 ? data[1] % 65 : kMaxRequestBytes;
  std::string req(reinterpret_cast<const char*>(data) + std::min<size_t>(size, 2),
                  std::min(size - std::min<size_t>(size, 2), kMaxRequestBytes));
  if (req.size() >= sizeof(v1::FdRequest)) {
    if (flags & 0x01) {
      Put(req, offsetof(v1::FdRequest, magic), &v1::kFdMagic, sizeof(uint32_t));
      Put(req, offsetof(v1::FdRequest, version), &v1::kFdVersion, sizeof(uint32_t));
    }
    if (flags & 0x02) Put(req, offsetof(v1::FdRequest, session_id), &f.session_id, 8);
    if (flags & 0x04) Put(req, offsetof(v1::FdRequest, token), f.token.data(), f.token.size());
    if (flags & 0x08) Put(req, offsetof(v1::FdRequest, arena_id), &f.arena_id, 4);
  }
  const int expected = Expected(f, req);

  const int fd = Connect(f.path);
  // The broker stops reading after 56 bytes and closes; later sends may fail.
  // EINTR: libFuzzer's timeout timer (SIGALRM) interrupts blocking calls.
  for (size_t at = 0; at < req.size();) {
    const ssize_t n = send(fd, req.data() + at, std::min(chunk, req.size() - at), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    at += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  v1::FdReply reply;
  int arena_fd = -1;
  const ssize_t n = polykv::internal::RecvFdReply(fd, &reply, &arena_fd);
  const int recv_errno = errno;
  close(fd);
  if (n < 0 && (recv_errno == EAGAIN || recv_errno == EWOULDBLOCK)) {
    Fail("fd broker: no answer within 10 s");
  }
  if (expected < 0) {
    if (n != 0) Fail("fd broker: answered an empty connection");
    return 0;
  }
  if (n != ssize_t(sizeof(reply))) {
    Fail("fd broker: reply of " + std::to_string(n) + " bytes (errno " +
         std::to_string(recv_errno) + ") for a request of " + std::to_string(req.size()));
  }
  if (reply.status != expected) {
    Fail("fd broker: status " + std::to_string(reply.status) + ", expected " +
         std::to_string(expected));
  }
  if (std::memchr(reply.message, '\0', sizeof(reply.message)) == nullptr) {
    Fail("fd broker: reply message not NUL-terminated");
  }
  if ((reply.status == 0) != (arena_fd >= 0)) Fail("fd broker: fd attached iff OK broken");
  if (arena_fd >= 0) {
    struct stat st {};
    if (fstat(arena_fd, &st) != 0 || uint64_t(st.st_size) != reply.size_bytes) {
      Fail("fd broker: the fd's size differs from the reply's size_bytes");
    }
    close(arena_fd);
  }
  return 0;
}
