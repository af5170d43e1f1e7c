// Regression tests for the gRPC-socket findings of issue 14 ([harden]): 4
// (connection caps, idle timeout, no accept spin), 9 (unparseable requests)
// and 11 (peer registry entries). Each failed before its fix. They run a
// daemon in this process and talk to it over its Unix socket; waits are for
// events with generous deadlines, never assertions on durations.
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/daemon.h"
#include "daemon/log.h"
#include "daemon/rpc/connection_table.h"
#include "daemon/rpc/peer_registry.h"
#include "daemon/rpc/uds_listener.h"
#include "polykv/admin.h"
#include "polykv/client.h"
#include "polykv/v1/session.grpc.pb.h"
#include "tests/unit/daemon/in_process_daemon.h"
#include "tests/unit/daemon/socket_peers.h"

namespace polykv::daemon {
namespace {

using testing::PeerProcess;
using testing::ConnectUnix;
using testing::kOtherUid;
using testing::WaitForClose;
using testing::WaitUntil;

// The daemon's log lines while it lives (a sink on DaemonLogger()).
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(log_)) {
    DaemonLogger()->sinks().push_back(sink_);
  }
  ~LogCapture() { Stop(); }
  // Stops capturing; returns what was logged.
  std::string Stop() {
    auto& sinks = DaemonLogger()->sinks();
    if (auto it = std::find(sinks.begin(), sinks.end(), sink_); it != sinks.end()) sinks.erase(it);
    return log_.str();
  }

 private:
  std::ostringstream log_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

size_t CountOf(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A small session of agent `agent` in tenant "t", without heartbeats.
SessionOptions TestSession(const std::string& agent = "a") {
  SessionOptions o;
  o.agent_id = agent;
  o.tenant = "t";
  o.profile = {4, 2, 64, DType::kF32, "test"};
  o.heartbeat = false;
  return o;
}

// A client of this process opens (and closes) a session.
absl::Status OpenOneSession(const std::string& socket, int connect_timeout_ms = 20000) {
  auto client = Client::Connect(socket, connect_timeout_ms);
  if (!client.ok()) return client.status();
  auto s = (*client)->OpenSession(TestSession());
  return s.ok() ? absl::OkStatus() : s.status();
}

// Out of fds, accept() failed at once for the waiting connection, poll() woke
// again at once: 66% CPU. The listener now pauses, and accepts the
// connection once fds are free.
TEST(RpcLimitsTest, AcceptLoopBacksOffWhenOutOfFds) {  // finding 4
  const std::string path = SmallDaemonConfig("emfile").socket;
  std::vector<Connection> accepted;
  absl::Mutex mu;
  UdsListenerOptions o;
  o.path = path;
  o.policy.allowed_uids = {geteuid()};
  o.on_accept = [&](const Connection& c) {
    absl::MutexLock lock(&mu);
    accepted.push_back(c);
  };
  auto listener = UdsListener::Create(o);
  ASSERT_TRUE(listener.ok()) << listener.status();
  (*listener)->Start();

  const int client = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(client, 0);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  std::vector<int> fillers;
  {
    testing::FdLimit limit(256);  // restores the old limit when it goes
    for (int fd; (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.push_back(fd);
    ASSERT_EQ(errno, EMFILE);
    ASSERT_TRUE(testing::ConnectSocket(client, path));
    ASSERT_TRUE(WaitUntil([&] { return (*listener)->num_accept_backoffs() >= 1; }));
    // Not a duration: a spinning loop fails accept() ~10^5 times a second,
    // one that pauses 100 ms about 10 times; a slow machine only lowers it.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    EXPECT_LT((*listener)->num_accept_backoffs(), 100u);
    for (int fd : fillers) close(fd);
  }
  EXPECT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return accepted.size() == 1;
  })) << "the waiting connection was not accepted once fds were free";
  close(client);
  absl::MutexLock lock(&mu);
  for (const Connection& c : accepted) close(c.fd);
}

// The caps' arithmetic, and closes noticed by socket identity: a closed fd,
// and a number reused by another file, both end their connection.
TEST(RpcLimitsTest, ConnectionTableCountsPerUidAndInAll) {  // finding 4
  ConnectionTable t({.max_connections = 3, .max_connections_per_uid = 2});
  int fds[3][2];
  for (auto& p : fds) ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p), 0);
  const PeerCreds u1{1, 1001, 1001}, u2{2, 1002, 1002};
  ASSERT_TRUE(t.Add(fds[0][0], u1).ok());
  ASSERT_TRUE(t.Add(fds[1][0], u1).ok());
  EXPECT_EQ(t.Admits(u1.uid), ConnectionRefusal::kPerUid);
  EXPECT_EQ(t.Admits(u2.uid), ConnectionRefusal::kNone);
  ASSERT_TRUE(t.Add(fds[2][0], u2).ok());
  EXPECT_EQ(t.Admits(3003), ConnectionRefusal::kTotal);
  EXPECT_TRUE(t.RemoveClosed().empty());

  close(fds[0][0]);                                       // closed
  ASSERT_EQ(dup2(fds[0][1], fds[1][0]), fds[1][0]);        // number reused by another socket
  const auto closed = t.RemoveClosed();
  ASSERT_EQ(closed.size(), 2u);
  EXPECT_EQ(t.CountOf(u1.uid), 0u);
  EXPECT_EQ(t.CountOf(u2.uid), 1u);
  EXPECT_EQ(t.Admits(u1.uid), ConnectionRefusal::kNone);
  EXPECT_EQ(t.Remove(fds[2][0])->peer.uid, u2.uid);
  EXPECT_EQ(t.size(), 0u);
  for (int fd : {fds[0][1], fds[1][0], fds[1][1], fds[2][0], fds[2][1]}) close(fd);
}

// Finding 4: ~1,013 idle connections stopped polykvd serving anyone. Now one
// uid holds at most max_connections_per_uid; the rest are closed at once, and
// another uid still opens a session.
TEST(RpcLimitsTest, IdleConnectionsOfOneUidDoNotLockOutAnother) {  // finding 4
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as uid " << kOtherUid;
  DaemonConfig c = SmallDaemonConfig("peruid");
  c.max_connections_per_uid = 8;
  c.max_connections = 64;
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) {
    idle.push_back(PeerProcess(c.socket, kOtherUid).TakeFd());
    ASSERT_GE(idle.back(), 0) << "connection " << i;
  }
  // Accepted in order: all past the 8th are closed by the daemon.
  for (size_t i = 8; i < idle.size(); ++i) {
    EXPECT_TRUE(WaitForClose(idle[i])) << "connection " << i << " past the cap is still open";
  }
  EXPECT_EQ(d->num_connections(), 8u);
  EXPECT_TRUE(OpenOneSession(c.socket).ok());
  for (int fd : idle) close(fd);
  EXPECT_TRUE(WaitUntil([&] { return d->num_connections() == 0; })) << d->num_connections();
}

// Past the cap a connection is refused; once the others close, the count
// goes down and the uid connects again.
TEST(RpcLimitsTest, ConnectionsPastTheCapAreRefusedUntilOthersClose) {  // finding 4
  DaemonConfig c = SmallDaemonConfig("cap");
  c.max_connections_per_uid = 3;
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) held.push_back(ConnectUnix(c.socket, testing::kReadTimeoutMs));
  ASSERT_TRUE(WaitUntil([&] { return d->num_connections() == 3; })) << d->num_connections();
  const int refused = ConnectUnix(c.socket, testing::kReadTimeoutMs);
  ASSERT_GE(refused, 0);
  EXPECT_TRUE(WaitForClose(refused));
  close(refused);
  EXPECT_FALSE(OpenOneSession(c.socket, 2000).ok());
  for (int fd : held) close(fd);
  EXPECT_TRUE(WaitUntil([&] { return d->num_connections() == 0; })) << d->num_connections();
  EXPECT_TRUE(OpenOneSession(c.socket).ok());
}

// No RPC for connection_idle_ms: the daemon closes the connection (gRPC's
// GRPC_ARG_MAX_CONNECTION_IDLE_MS does apply to fds handed over with
// AddInsecureChannelFromFd). A real client reconnects on its next call.
TEST(RpcLimitsTest, IdleConnectionsAreClosedAfterTheTimeout) {  // finding 4
  DaemonConfig c = SmallDaemonConfig("idle");
  c.connection_idle_ms = 300;
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  const int raw = ConnectUnix(c.socket, testing::kReadTimeoutMs);
  ASSERT_GE(raw, 0);
  EXPECT_TRUE(WaitForClose(raw)) << "an idle connection was not closed";
  close(raw);
  EXPECT_TRUE(WaitUntil([&] { return d->num_connections() == 0; })) << d->num_connections();

  auto admin = AdminClient::Connect(c.socket, 20000);
  ASSERT_TRUE(admin.ok()) << admin.status();
  ASSERT_TRUE((*admin)->GetStats().ok());
  EXPECT_TRUE(WaitUntil([&] { return d->num_connections() == 0; })) << d->num_connections();
  auto again = (*admin)->GetStats();
  EXPECT_TRUE(again.ok()) << again.status();
}

// Finding 11: the registry kept an entry per fd number forever. Entries now
// go with their connections.
TEST(RpcLimitsTest, RegistryEntriesGoWhenConnectionsClose) {  // finding 11
  DaemonConfig c = SmallDaemonConfig("registry");
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  for (int i = 0; i < 100; ++i) {
    const int fd = ConnectUnix(c.socket, testing::kReadTimeoutMs);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  ASSERT_TRUE(OpenOneSession(c.socket).ok());
  EXPECT_TRUE(WaitUntil([&] { return d->num_registered_peers() == 0; }))
      << d->num_registered_peers() << " entries left after every connection closed";
  EXPECT_EQ(d->num_connections(), 0u);
}

// A number gRPC closed and accept() hands out again carries the new
// connection's credentials, and the old connection's removal does not erase
// them.
TEST(RpcLimitsTest, AReusedFdNumberGetsTheNewConnectionsCreds) {  // finding 11
  const std::string path = SmallDaemonConfig("reuse").socket;
  PeerRegistry registry;
  absl::Mutex mu;
  std::vector<std::string> events;
  std::vector<Connection> accepted;
  UdsListenerOptions o;
  o.path = path;
  o.policy.allowed_uids = {geteuid(), kOtherUid};
  o.on_accept = [&](const Connection& c) {
    registry.Add(c.fd, c.id, c.peer);
    absl::MutexLock lock(&mu);
    events.push_back(absl::StrCat("accept fd ", c.fd, " id ", c.id));
    accepted.push_back(c);
  };
  o.on_close = [&](const Connection& c) {
    registry.Remove(c.fd, c.id);
    absl::MutexLock lock(&mu);
    events.push_back(absl::StrCat("close fd ", c.fd, " id ", c.id));
  };
  auto listener = UdsListener::Create(o);
  ASSERT_TRUE(listener.ok()) << listener.status();
  (*listener)->Start();
  auto num_accepted = [&] {
    absl::MutexLock lock(&mu);
    return accepted.size();
  };
  const uid_t first_uid = geteuid() == 0 ? kOtherUid : geteuid();

  PeerProcess a(path, first_uid);
  ASSERT_TRUE(WaitUntil([&] { return num_accepted() == 1; }));
  const int n = accepted[0].fd;
  const std::string peer = absl::StrCat("fd:", n);
  ASSERT_EQ(registry.Lookup(peer)->pid, a.pid());
  EXPECT_EQ(registry.Lookup(peer)->uid, first_uid);
  const int a_fd = a.TakeFd();

  PeerProcess b(path, geteuid(), /*connect_now=*/false);  // its socket pair exists now
  close(n);  // what gRPC does when the connection ends; n is free again
  b.Connect();
  ASSERT_TRUE(WaitUntil([&] { return num_accepted() == 2; }));
  ASSERT_EQ(accepted[1].fd, n) << "the kernel did not reuse the number";
  auto creds = registry.Lookup(peer);
  ASSERT_TRUE(creds.has_value());
  EXPECT_EQ(creds->pid, b.pid());
  EXPECT_EQ(creds->uid, geteuid());
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(events.size(), 3u);
    EXPECT_EQ(events[1], absl::StrCat("close fd ", n, " id ", accepted[0].id));
    EXPECT_EQ(events[2], absl::StrCat("accept fd ", n, " id ", accepted[1].id));
  }
  close(a_fd);
  close(b.TakeFd());
  close(n);
  EXPECT_TRUE(WaitUntil([&] { return registry.size() == 0; })) << registry.size();
  EXPECT_EQ((*listener)->num_connections(), 0u);
}

// Calls `method` with raw request bytes; returns the status.
grpc::Status CallRaw(const std::string& socket, const std::string& method,
                     const std::string& bytes) {
  auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, method, request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// Finding 9: requests protobuf cannot parse got INTERNAL with an empty
// message and a log line each. Now INVALID_ARGUMENT naming the method, with
// one log line per method per period; the daemon serves on.
TEST(RpcLimitsTest, UnparseableRequestsAreInvalidArgument) {  // finding 9
  DaemonConfig c = SmallDaemonConfig("parse");
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  LogCapture log;

  const std::string garbage(12, '\xff');         // a varint tag that never ends
  const std::string truncated = "\x0a\x09" "abc";  // field 1 claims 9 bytes, has 3
  const std::string bad_utf8_profile = "\x1a\x04\x2a\x02\xff\xfe";  // profile.model_id
  const std::string bad_utf8_filter = "\x0a\x02\xff\xfe";           // ListSessions.tenant
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/polykv.v1.Session/OpenSession", garbage},
      {"/polykv.v1.Session/OpenSession", truncated},
      {"/polykv.v1.Session/OpenSession", bad_utf8_profile},
      {"/polykv.v1.Session/Reserve", garbage},
      {"/polykv.v1.Admin/GetQos", garbage},
      {"/polykv.v1.Admin/GetQos", truncated},
      {"/polykv.v1.Admin/ListSessions", bad_utf8_filter},
      {"/polykv.v1.PrefixCache/StorePrefix", garbage},
      {"/polykv.v1.PrefixCache/LookupPrefix", truncated},
  };
  for (const auto& [method, bytes] : cases) {
    const grpc::Status s = CallRaw(c.socket, method, bytes);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << s.error_code() << " '" << s.error_message() << "'";
    EXPECT_NE(s.error_message().find(method), std::string::npos) << s.error_message();
  }
  // A flood of one kind makes one line, not one per request.
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(CallRaw(c.socket, "/polykv.v1.Admin/ListSessions", bad_utf8_filter).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  const std::string text = log.Stop();
  auto count = [&](const std::string& needle) { return CountOf(text, needle); };
  // At most two: a 10 s period may end once during the test on a slow box.
  EXPECT_GE(count("rpc /polykv.v1.Admin/ListSessions: unparseable"), 1u) << text;
  EXPECT_LE(count("rpc /polykv.v1.Admin/ListSessions: unparseable"), 2u) << text;
  EXPECT_LE(count("invalid UTF-8"), 4u) << text;  // protobuf's own line, throttled

  EXPECT_TRUE(OpenOneSession(c.socket).ok());
  auto admin = AdminClient::Connect(c.socket, 20000);
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_TRUE((*admin)->GetStats().ok());
}

}  // namespace
}  // namespace polykv::daemon

namespace polykv::daemon {
namespace {

// Each open Watch stream holds a daemon thread: one uid may hold at most
// max_watch_streams_per_uid of them, over all its sessions; past it a stream
// is refused naming the limit, and a cancelled one makes room again.
TEST(RpcQuotaTest, OneUidHoldsAtMostItsWatchStreams) {
  DaemonConfig c = SmallDaemonConfig("watch");
  c.max_watch_streams_per_uid = 2;
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  auto channel = grpc::CreateChannel("unix:" + c.socket, grpc::InsecureChannelCredentials());
  auto stub = v1::Session::NewStub(channel);
  std::vector<v1::SessionRef> sessions;
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest open;
    open.set_agent_id("w");
    open.set_tenant("t");
    open.mutable_profile()->set_num_layers(4);
    open.mutable_profile()->set_num_kv_heads(2);
    open.mutable_profile()->set_head_dim(64);
    open.set_lease_ms(60000);
    v1::OpenSessionResponse opened;
    ASSERT_TRUE(stub->OpenSession(&ctx, open, &opened).ok());
    v1::SessionRef ref;
    ref.set_session_id(opened.session_id());
    ref.set_token(opened.token());
    sessions.push_back(ref);
  }
  // Two streams on the first session, one more on the second: refused.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::SessionEvent>>> streams;
  auto watch = [&](const v1::SessionRef& ref) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    // Bounded, so that a stream wrongly accepted fails the test, not hangs it.
    contexts.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::WatchRequest w;
    *w.mutable_session() = ref;
    streams.push_back(stub->Watch(contexts.back().get(), w));
    return streams.back().get();
  };
  watch(sessions[0]);
  watch(sessions[0]);
  // The first two are open once the daemon counts them; the third ends at
  // once with the refusal.
  auto* third = watch(sessions[1]);
  v1::SessionEvent e;
  EXPECT_FALSE(third->Read(&e));
  grpc::Status refused = third->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("max_watch_streams_per_uid"), std::string::npos)
      << refused.error_message();
  // Cancelling one makes room.
  contexts[0]->TryCancel();
  (void)streams[0]->Finish();
  EXPECT_TRUE(WaitUntil([&] {
    auto* again = watch(sessions[1]);
    grpc::ClientContext* ctx = contexts.back().get();
    // An accepted stream stays open: give it a moment, then cancel it if
    // it is still open (a refusal ends it first).
    std::thread cancel([ctx] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ctx->TryCancel();
    });
    v1::SessionEvent ev;
    while (again->Read(&ev)) {
    }
    cancel.join();
    return again->Finish().error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED;
  }));
  contexts[1]->TryCancel();  // the only stream not finished above
  (void)streams[1]->Finish();
}

}  // namespace
}  // namespace polykv::daemon

namespace polykv::daemon {
namespace {

// Issue 40: every open, close and refused reservation logged a line; one
// client looping over them wrote 1.3 MB/s. Now a burst per uid and kind per
// period, the rest counted.
TEST(RpcQuotaTest, OneUidsSessionChurnLogsABoundedNumberOfLines) {
  DaemonConfig c = SmallDaemonConfig("churn");
  c.pool_bytes = 16ull << 20;
  c.arena_bytes = 4ull << 20;
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  LogCapture log;
  auto client = Client::Connect(c.socket, 20000);
  ASSERT_TRUE(client.ok()) << client.status();
  constexpr int kSessions = 100;
  for (int i = 0; i < kSessions; ++i) {
    auto s = (*client)->OpenSession(TestSession("churn"));
    ASSERT_TRUE(s.ok()) << s.status();
    // ~50 MiB of pages in a 16 MiB pool: refused, a line each before.
    auto refused = (*s)->Reserve(65536);
    EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
    ASSERT_TRUE((*s)->Close().ok());
  }
  const std::string text = log.Stop();
  auto count = [&](const std::string& needle) { return CountOf(text, needle); };
  // 20 per 10 s period; at most three periods pass on a slow box.
  EXPECT_GE(count(" opened: agent churn"), 1u) << text;
  EXPECT_LE(count(" opened: agent churn"), 60u);
  EXPECT_LE(count(" closed, "), 60u);
  EXPECT_LE(count("reservation refused"), 60u);
}

}  // namespace
}  // namespace polykv::daemon
