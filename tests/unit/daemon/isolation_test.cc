// Isolation of tenants, uids and sessions from each other in a live daemon:
// a name does not open another uid's tenant, guarantees hold under pressure,
// one uid cannot take every session, Watch stream or fd connection, a silent
// peer delays no one, and the metrics server answers past idle connections.
// Each is a finding of the adversarial run in issue 14 ([harden]), marked
// `// finding N`, and failed before its fix.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "client/lib/arena_mapper.h"
#include "daemon/metrics/http_server.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/rpc/fd_broker.h"
#include "polykv/client.h"
#include "proto/polykv/v1/fd_socket.h"
#include "tests/integration/http.h"
#include "tests/unit/daemon/in_process_daemon.h"
#include "tests/unit/daemon/socket_peers.h"

namespace polykv::daemon {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

class IsolationTest : public ::testing::Test {
 protected:
  std::unique_ptr<KvPool> MakePool(uint64_t bytes) {
    KvPoolOptions o;
    o.pool_bytes = bytes;
    o.arena_bytes = 4 * kMiB;
    o.superblock_bytes = 256 * 1024;
    o.default_lease_ms = 1000;
    o.arena_factory = CreateHostShmArena;
    o.clock = [this] { return now_; };
    auto p = KvPool::Create(o);
    EXPECT_TRUE(p.ok()) << p.status();
    return *std::move(p);
  }

  // 4 layers x 2 heads x 64 f32: pages of 8 KiB, blocks of 64 KiB.
  absl::StatusOr<OpenResult> Open(KvPool& pool, const std::string& agent) {
    OpenRequest r;
    r.agent_id = agent;
    r.tenant = "t1";
    r.profile = {4, 2, 64, DType::kF32, "tiny"};
    r.peer = peer_;
    return pool.Open(r);
  }

  absl::Time now_ = absl::FromUnixSeconds(1000000);
  PeerCreds peer_{1234, 1000, 1000};
};

// Finding 1 (HIGH): OpenSessionRequest.tenant was whatever the caller wrote,
// so an allowed uid opened a session named after another uid's tenant, got
// that tenant's arena fd and read its KV.
TEST_F(IsolationTest, ANameDoesNotOpenAnotherUidsTenant) {  // finding 1
  auto pool = MakePool(16 * kMiB);
  const PeerCreds victim{10, 1000, 1000}, thief{20, 2000, 2000};
  OpenRequest r;
  r.agent_id = "v";
  r.tenant = "victim";
  r.profile = {4, 2, 64, DType::kF32, "tiny"};
  r.peer = victim;
  auto vs = pool->Open(r);
  ASSERT_TRUE(vs.ok());
  auto vr = pool->Reserve(vs->session_id, vs->token, victim, 16);
  ASSERT_TRUE(vr.ok());
  ASSERT_EQ(vr->new_arenas.size(), 1u);
  const uint32_t victim_arena = vr->new_arenas[0].arena_id;

  r.agent_id = "t";
  r.peer = thief;
  auto ts = pool->Open(r);  // the same name: the thief's own, empty tenant
  ASSERT_TRUE(ts.ok()) << ts.status();
  EXPECT_TRUE(ts->arenas.empty());
  auto fd = pool->DupArenaFd(ts->session_id, ts->token, thief, victim_arena);
  ASSERT_FALSE(fd.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(fd.status())) << fd.status();
  auto tr = pool->Reserve(ts->session_id, ts->token, thief, 16);
  ASSERT_TRUE(tr.ok());
  ASSERT_EQ(tr->new_arenas.size(), 1u);
  EXPECT_NE(tr->new_arenas[0].arena_id, victim_arena);
  // Both are listed under the name they chose.
  EXPECT_EQ(pool->ListSessions("victim", "").size(), 2u);
  EXPECT_EQ(pool->Stats().tenants.size(), 2u);
  ASSERT_TRUE(pool->CheckInvariants().ok());
}

// Tenants the config binds are shared by exactly their identities.
TEST_F(IsolationTest, BoundTenantsAdmitOnlyTheirIdentities) {  // finding 1
  KvPoolOptions o;
  o.pool_bytes = 16 * kMiB;
  o.arena_bytes = 4 * kMiB;
  o.superblock_bytes = 256 * 1024;
  o.arena_factory = CreateHostShmArena;
  o.tenant_bindings["team"] = TenantBinding{{1000}, {3000}};
  auto pool = *KvPool::Create(o);
  OpenRequest r;
  r.agent_id = "a";
  r.tenant = "team";
  r.profile = {4, 2, 64, DType::kF32, "tiny"};
  r.peer = {1, 1000, 1000};
  auto a = pool->Open(r);
  ASSERT_TRUE(a.ok()) << a.status();
  auto ar = pool->Reserve(a->session_id, a->token, r.peer, 16);
  ASSERT_TRUE(ar.ok());
  r.peer = {2, 2000, 3000};  // by gid
  auto b = pool->Open(r);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->arenas.size(), 1u);  // the team's arena
  EXPECT_EQ(b->arenas[0].arena_id, ar->new_arenas[0].arena_id);
  r.peer = {3, 4000, 4000};
  auto c = pool->Open(r);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(c.status())) << c.status();
  EXPECT_EQ(pool->num_sessions(), 2u);
}

// Finding 7a: the ladder's refusal was checked before guarantees, so an agent
// whose guarantee was unused was refused under pressure like any other.
TEST_F(IsolationTest, UnusedGuaranteeIsNotRefusedUnderPressure) {  // finding 7
  auto pool = MakePool(16 * kMiB);
  QosRecord g;
  g.agent_id = "guaranteed";
  g.priority = Priority::kLow;
  g.guaranteed_bytes = 1 * kMiB;
  ASSERT_TRUE(pool->SetQos(g).ok());
  auto gs = Open(*pool, "guaranteed");
  ASSERT_TRUE(gs.ok()) << gs.status();
  // Another agent takes everything the guarantee leaves: 15 MiB = 240 blocks.
  auto xs = Open(*pool, "other");
  ASSERT_TRUE(xs.ok()) << xs.status();
  auto fill = pool->Reserve(xs->session_id, xs->token, peer_, 240 * 16);
  ASSERT_TRUE(fill.ok()) << fill.status();
  EXPECT_FALSE(pool->Reserve(xs->session_id, xs->token, peer_, 16).ok());
  // Nothing compacts ("full"), so the ladder refuses the lowest class present.
  const auto steps = pool->RunPressureLadder();
  ASSERT_EQ(steps, std::vector<std::string>{"refuse"});

  // Within its guarantee the low-priority agent still gets its memory...
  auto r = pool->Reserve(gs->session_id, gs->token, peer_, 16 * 16);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->session_bytes, 16 * 64 * 1024u);
  // ...and past it, it is refused like everyone of its class.
  auto over = pool->Reserve(gs->session_id, gs->token, peer_, 16);
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_EQ(pool->used_bytes(), 16 * kMiB);
  ASSERT_TRUE(pool->CheckInvariants().ok());
}

// Finding 7b: guarantees were summed in uint64 without a bound, so a huge one
// wrapped the sum around, was accepted, and cancelled the others' promises.
TEST_F(IsolationTest, GuaranteeSumsDoNotWrapAround) {  // finding 7
  auto pool = MakePool(16 * kMiB);
  QosRecord a;
  a.agent_id = "a";
  a.guaranteed_bytes = 4 * kMiB;
  ASSERT_TRUE(pool->SetQos(a).ok());
  QosRecord huge;
  huge.agent_id = "huge";
  huge.guaranteed_bytes = std::numeric_limits<uint64_t>::max() - 4 * kMiB + 2;
  auto r = pool->SetQos(huge);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_EQ(pool->GetQos("huge").guaranteed_bytes, 0u);

  // a's promise still holds: another agent cannot take its 4 MiB.
  auto bs = Open(*pool, "b");
  ASSERT_TRUE(bs.ok());
  EXPECT_TRUE(pool->Reserve(bs->session_id, bs->token, peer_, 192 * 16).ok());  // 12 MiB
  EXPECT_FALSE(pool->Reserve(bs->session_id, bs->token, peer_, 16).ok());
  ASSERT_TRUE(pool->CheckInvariants().ok());
}

// Finding 9: session ids restarted at 1 with the daemon, so a client of the
// old daemon named a new session and got PERMISSION_DENIED (wrong token), not
// NOT_FOUND, and its heartbeat loop never stopped.
TEST_F(IsolationTest, SessionIdsFromBeforeARestartAreNotFound) {  // finding 9
  auto before = MakePool(16 * kMiB);
  auto old = Open(*before, "a");
  ASSERT_TRUE(old.ok());
  before.reset();  // the daemon restarts
  auto after = MakePool(16 * kMiB);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    auto s = Open(*after, "a");
    ASSERT_TRUE(s.ok());
    ids.push_back(s->session_id);
    EXPECT_NE(s->session_id, old->session_id);
  }
  EXPECT_EQ(ids[1], ids[0] + 1);
  auto hb = after->Heartbeat(old->session_id, old->token, peer_);
  ASSERT_FALSE(hb.ok());
  EXPECT_TRUE(absl::IsNotFound(hb.status())) << hb.status();
  EXPECT_NE(hb.status().message().find("restarted"), absl::string_view::npos) << hb.status();
}

// Finding 5: one thread per Watch stream and no cap: 2,000 streams of one
// client made 2,017 daemon threads. A session may have two at once.
TEST_F(IsolationTest, WatchStreamsPerSessionAreBounded) {  // finding 5
  auto pool = MakePool(16 * kMiB);
  auto s = Open(*pool, "a");
  ASSERT_TRUE(s.ok());
  auto ch = pool->Watch(s->session_id, s->token, peer_);
  ASSERT_TRUE(ch.ok());
  EXPECT_TRUE((*ch)->AddWatcher());
  EXPECT_TRUE((*ch)->AddWatcher());
  EXPECT_FALSE((*ch)->AddWatcher());
  (*ch)->RemoveWatcher();
  EXPECT_TRUE((*ch)->AddWatcher());
}

// Finding 5: one client could open all 4,096 session slots in 1.9 s.
TEST_F(IsolationTest, OneUidCannotOpenEverySession) {  // finding 5
  KvPoolOptions o;
  o.max_sessions = 8;  // per uid: 8 / 4 = 2 by default
  o.arena_factory = CreateHostShmArena;
  auto pool = *KvPool::Create(o);
  EXPECT_TRUE(Open(*pool, "a").ok());
  EXPECT_TRUE(Open(*pool, "a").ok());
  auto third = Open(*pool, "a");
  ASSERT_FALSE(third.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  OpenRequest other;
  other.agent_id = "b";
  other.tenant = "t2";
  other.profile = {4, 2, 64, DType::kF32, "tiny"};
  other.peer = {99, 2000, 2000};
  EXPECT_TRUE(pool->Open(other).ok());
  EXPECT_EQ(pool->num_sessions(), 3u);
}

using testing::ConnectUnix;

// Finding 3: the fd socket served one connection at a time with 1 s each, so
// N silent connections delayed every arena fetch by ~N s (15 made a worker
// lose its 5 s lease).
TEST_F(IsolationTest, SilentConnectionsDoNotDelayAnArenaFetch) {  // finding 3
  auto pool = MakePool(16 * kMiB);
  peer_ = {getpid(), getuid(), getgid()};  // the broker sees this process's credentials
  auto s = Open(*pool, "a");
  ASSERT_TRUE(s.ok()) << s.status();
  auto r = pool->Reserve(s->session_id, s->token, peer_, 16);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->new_arenas.size(), 1u);
  const TestFdBroker o = StartFdBroker(pool.get(), "findings-fd", 0600, {getuid()});
  ASSERT_NE(o.broker, nullptr);

  std::vector<int> silent;
  for (int i = 0; i < 30; ++i) silent.push_back(ConnectUnix(o.path, testing::kReadTimeoutMs));
  for (int fd : silent) ASSERT_GE(fd, 0);
  // The client library's fetch, with its own 2 s timeout.
  auto arena_fd = FetchArenaFd(o.path, SessionRef{s->session_id, s->token},
                               r->new_arenas[0].arena_id);
  ASSERT_TRUE(arena_fd.ok()) << arena_fd.status() << " behind " << silent.size()
                             << " silent connections";
  struct stat st {};
  ASSERT_EQ(fstat(*arena_fd, &st), 0);
  EXPECT_EQ(uint64_t(st.st_size), r->new_arenas[0].size_bytes);
  close(*arena_fd);

  // A short request still gets its error once the peer stops writing.
  const int shortfd = ConnectUnix(o.path, testing::kReadTimeoutMs);
  const v1::FdRequest req;
  ASSERT_EQ(send(shortfd, &req, 8, MSG_NOSIGNAL), 8);
  shutdown(shortfd, SHUT_WR);
  v1::FdReply err;
  ASSERT_EQ(recv(shortfd, &err, sizeof(err), MSG_WAITALL), ssize_t(sizeof(err)));
  EXPECT_EQ(err.status, int32_t(absl::StatusCode::kInvalidArgument)) << err.message;
  close(shortfd);
  for (int f : silent) close(f);
}

// Issue 40: the fd socket's connection cap was global and dropped the
// oldest connection, so one uid's flood of idle connections made other
// uids' fetches fail (83 of 1,472). Now a flood only drops its own.
TEST_F(IsolationTest, AFloodOfFdConnectionsOfOneUidDropsOnlyItsOwn) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  auto pool = MakePool(16 * kMiB);
  const TestFdBroker o =
      StartFdBroker(pool.get(), "findings-fdflood", 0666, {getuid(), testing::kOtherUid});
  ASSERT_NE(o.broker, nullptr);

  // The other uid's worker connects first (so it is the oldest connection),
  // then this uid floods 300 idle connections.
  testing::PeerProcess other(o.path, testing::kOtherUid);
  const int legit = other.TakeFd();
  ASSERT_GE(legit, 0);
  peer_ = {other.pid(), testing::kOtherUid, testing::kOtherUid};
  auto s = Open(*pool, "a");
  ASSERT_TRUE(s.ok()) << s.status();
  auto r = pool->Reserve(s->session_id, s->token, peer_, 16);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<int> flood;
  for (int i = 0; i < 300; ++i) {
    const int fd = ConnectUnix(o.path, testing::kReadTimeoutMs);
    ASSERT_GE(fd, 0);
    flood.push_back(fd);
  }
  // At the 256-connection cap the flood loses its own oldest, the worker's
  // connection is not: its request is answered with the arena's fd.
  ASSERT_TRUE(testing::WaitForClose(flood.front()));
  v1::FdRequest req;
  req.session_id = s->session_id;
  std::memcpy(req.token, s->token.data(), sizeof(req.token));
  req.arena_id = r->new_arenas[0].arena_id;
  ASSERT_EQ(send(legit, &req, sizeof(req), MSG_NOSIGNAL), ssize_t(sizeof(req)));
  v1::FdReply reply;
  int arena_fd = -1;
  ASSERT_EQ(internal::RecvFdReply(legit, &reply, &arena_fd), ssize_t(sizeof(reply)))
      << "the flood of another uid dropped this connection";
  EXPECT_EQ(reply.status, 0) << reply.message;
  EXPECT_GE(arena_fd, 0);
  if (arena_fd >= 0) close(arena_fd);
  close(legit);
  for (int fd : flood) close(fd);
}

// Requests time out after 10 s, so a blocked server fails the test instead
// of hanging it.
constexpr int kTimeoutMs = 10000;

std::string Request(int port, const std::string& text) {
  return testing::HttpRequest(port, text, kTimeoutMs);
}

// Finding 8: the metrics endpoint (civetweb, two threads, 30 s request
// timeout) let two idle TCP connections block every scrape for 29.7 s.
TEST(MetricsHttpServerTest, IdleConnectionsDoNotBlockAScrape) {  // finding 8
  MetricsHttpOptions o;
  o.address = "127.0.0.1:0";
  o.max_connections = 8;
  int renders = 0;
  auto server = MetricsHttpServer::Start(o, [&] {
    ++renders;
    return std::string("polykv_up 1\n");
  });
  ASSERT_TRUE(server.ok()) << server.status();
  // More idle connections than the server keeps: the oldest make room.
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(testing::ConnectLoopback((*server)->port()));
  for (int fd : idle) ASSERT_GE(fd, 0);
  const std::string page = Request((*server)->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(page.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << page;
  EXPECT_NE(page.find("Content-Length: 12\r\n"), std::string::npos) << page;
  EXPECT_EQ(page.substr(page.size() - 12), "polykv_up 1\n");
  EXPECT_EQ(renders, 1);
  for (int fd : idle) close(fd);
}

TEST(MetricsHttpServerTest, AnswersOnlyGetOfMetricsAndBoundsRequests) {
  MetricsHttpOptions o;
  o.address = "127.0.0.1:0";
  o.max_request_bytes = 256;
  auto server = MetricsHttpServer::Start(o, [] { return std::string("x 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_EQ(Request(port, "GET /other HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(Request(port, "POST /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(Request(port, "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(Request(port, "GET /metrics HTTP/1.0\r\nX: " + std::string(400, 'a')).rfind("HTTP/1.1 431", 0), 0u);
  const std::string head = Request(port, "HEAD /metrics?x=1 HTTP/1.0\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK", 0), 0u) << head;
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << head;  // no body
  EXPECT_FALSE(MetricsHttpServer::Start({.address = "no-port"}, [] { return std::string(); }).ok());
}

TEST(MetricsHttpServerTest, HealthAndReadinessProbes) {
  std::atomic<bool> draining{false};  // read on the server's thread
  auto server = MetricsHttpServer::Start(
      {.address = "127.0.0.1:0"}, [] { return std::string("x 1\n"); },
      [&] { return draining ? absl::UnavailableError("draining") : absl::OkStatus(); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_EQ(Request(port, "GET /healthz HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(Request(port, "GET /readyz HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  draining = true;
  const std::string not_ready = Request(port, "GET /readyz HTTP/1.0\r\n\r\n");
  EXPECT_EQ(not_ready.rfind("HTTP/1.1 503", 0), 0u) << not_ready;
  EXPECT_NE(not_ready.find("not ready: draining"), std::string::npos) << not_ready;
  EXPECT_EQ(Request(port, "GET /healthz HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
}

}  // namespace
}  // namespace polykv::daemon
