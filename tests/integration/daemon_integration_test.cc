// End to end: a real polykvd, real worker processes in two tenants, polykvctl,
// and the metrics endpoint.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "polykv/admin.h"
#include "polykv/client.h"
#include "tests/integration/http.h"
#include "tests/integration/probe.h"
#include "tests/integration/subprocess.h"

namespace polykv {
namespace {

using testing::BinDir;
using testing::Field;
using testing::HttpGet;
using testing::RunProgram;
using testing::Subprocess;

constexpr int kLeaseMs = 1500;

std::set<std::string> Arenas(const std::string& json) {
  std::string list = Field(json, "arenas");
  std::set<std::string> out;
  std::regex num("[0-9]+");
  for (std::sregex_iterator it(list.begin(), list.end(), num), end; it != end; ++it) out.insert(it->str());
  return out;
}

class DaemonIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "polykv-it-", getpid());
    mkdir(dir_.c_str(), 0700);
    socket_ = dir_ + "/d.sock";
    daemon_ = std::make_unique<Subprocess>(std::vector<std::string>{
        BinDir() + "/polykvd", "--socket", socket_, "--metrics-address", "127.0.0.1:0",
        "--pool-bytes", "64MiB", "--arena-bytes", "8MiB", "--lease-ms",
        std::to_string(kLeaseMs)});
    auto admin = AdminClient::Connect(socket_, 20000);
    ASSERT_TRUE(admin.ok()) << admin.status();
    admin_ = *std::move(admin);
  }
  void TearDown() override {
    if (daemon_) {
      daemon_->Signal(SIGTERM);
      EXPECT_EQ(daemon_->Wait(), 0) << "polykvd did not exit cleanly on SIGTERM";
    }
  }

  std::vector<std::string> Worker(const std::string& mode, const std::string& tenant,
                                  const std::string& agent, int tokens, int seed, int hold_ms = 0) {
    return {BinDir() + "/polykv-test-worker", mode, "--socket", socket_, "--tenant", tenant,
            "--agent", agent, "--tokens", std::to_string(tokens), "--seed", std::to_string(seed),
            "--hold-ms", std::to_string(hold_ms)};
  }

  uint64_t UsedBytes() {
    auto s = admin_->GetStats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->pool().used_bytes() : ~0ull;
  }

  std::string dir_, socket_;
  std::unique_ptr<Subprocess> daemon_;
  std::unique_ptr<AdminClient> admin_;
};

TEST_F(DaemonIntegrationTest, WorkersInTwoTenantsShareThePoolInIsolation) {
  // Three workers hold their pages at the same time, each with its own pattern.
  Subprocess a1(Worker("run", "tenant-a", "agent-a1", 200, 11, 1500));
  Subprocess a2(Worker("run", "tenant-a", "agent-a2", 120, 22, 1500));
  Subprocess b1(Worker("run", "tenant-b", "agent-b1", 300, 33, 1500));
  // A hanging tenant-A worker keeps its session open for the token checks.
  Subprocess holder(Worker("hang", "tenant-a", "agent-a3", 64, 44));
  const std::string held = holder.ReadLine();
  ASSERT_EQ(Field(held, "ok"), "true") << held;
  const std::string a1_out = a1.ReadLine(), a2_out = a2.ReadLine(), b1_out = b1.ReadLine();
  EXPECT_EQ(a1.Wait(), 0) << a1_out;
  EXPECT_EQ(a2.Wait(), 0) << a2_out;
  EXPECT_EQ(b1.Wait(), 0) << b1_out;

  // Tenant B's arenas are never tenant A's.
  std::set<std::string> a_arenas = Arenas(a1_out), b_arenas = Arenas(b1_out);
  for (auto& x : Arenas(a2_out)) a_arenas.insert(x);
  for (auto& x : Arenas(held)) a_arenas.insert(x);
  ASSERT_FALSE(a_arenas.empty());
  ASSERT_FALSE(b_arenas.empty());
  for (const auto& x : b_arenas) EXPECT_FALSE(a_arenas.contains(x)) << "arena " << x << " shared";

  // A forged token, and another session's token, are refused by separate processes.
  const std::string sid = Field(held, "session_id"), token = Field(held, "token");
  std::string forged = token;
  forged[0] = forged[0] == '0' ? '1' : '0';
  auto [code, out] = RunProgram({BinDir() + "/polykv-test-worker", "forge", "--socket", socket_,
                          "--session", sid, "--token", forged});
  EXPECT_NE(code, 0);
  EXPECT_EQ(Field(out, "code"), "7") << out;  // PERMISSION_DENIED
  Subprocess b2(Worker("hang", "tenant-b", "agent-b2", 16, 55));
  const std::string b2_out = b2.ReadLine();
  ASSERT_EQ(Field(b2_out, "ok"), "true") << b2_out;
  std::tie(code, out) = RunProgram({BinDir() + "/polykv-test-worker", "forge", "--socket", socket_,
                             "--session", sid, "--token", Field(b2_out, "token")});
  EXPECT_EQ(Field(out, "code"), "7") << out;
  // Tenant B cannot fetch tenant A's arena with its own valid token either.
  std::tie(code, out) = RunProgram({BinDir() + "/polykv-test-worker", "fetch", "--socket", socket_,
                             "--session", Field(b2_out, "session_id"), "--token",
                             Field(b2_out, "token"), "--arena", *a_arenas.begin()});
  EXPECT_EQ(Field(out, "code"), "7") << out;
  // Nor with a forged token for the arena's own session.
  std::tie(code, out) = RunProgram({BinDir() + "/polykv-test-worker", "fetch", "--socket", socket_,
                             "--session", sid, "--token", forged, "--arena", *a_arenas.begin()});
  EXPECT_EQ(Field(out, "code"), "7") << out;

  // What happens to the holders when they are SIGKILLed: tests/fault/.
}

TEST_F(DaemonIntegrationTest, QosSetLowersMaxBytesAndTheNextReservationFails) {
  // 4 layers x (K+V) x 16 tokens x 2 heads x 64 dims x 4 bytes = 64 KiB per block.
  auto [code, out] = RunProgram({BinDir() + "/polykvctl", "--socket", socket_, "qos", "set", "capped",
                          "--max-bytes", "128KiB", "--priority", "low", "--json"});
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(Field(out, "max_bytes"), "131072") << out;
  EXPECT_EQ(Field(out, "priority"), "PRIORITY_LOW") << out;
  Subprocess ok(Worker("run", "t", "capped", 32, 1));
  EXPECT_EQ(ok.Wait(), 0) << ok.ReadAll();
  Subprocess over(Worker("run", "t", "capped", 48, 2));
  const std::string line = over.ReadLine();
  EXPECT_NE(over.Wait(), 0);
  EXPECT_EQ(Field(line, "code"), "8") << line;  // RESOURCE_EXHAUSTED
  EXPECT_NE(line.find("max_bytes"), std::string::npos) << line;
  EXPECT_NE(line.find("polykvctl qos set capped"), std::string::npos) << line;
  std::tie(code, out) = RunProgram({BinDir() + "/polykvctl", "--socket", socket_, "qos", "get", "capped"});
  EXPECT_NE(out.find("128.0 KiB"), std::string::npos) << out;
  EXPECT_EQ(UsedBytes(), 0u);
}

// The budget as a share of the context, set as an operator would; the
// daemon refuses a share outside (0, 1] and keeps the one it had.
TEST_F(DaemonIntegrationTest, QosSetTakesABudgetFractionAndRefusesABadOne) {
  const std::string ctl = BinDir() + "/polykvctl";
  auto [code, out] = RunProgram({ctl, "--socket", socket_, "qos", "set", "share", "--policy",
                                 "window", "--budget-fraction", "0.75", "--budget-tokens", "64",
                                 "--json"});
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(Field(out, "budget_fraction"), "0.75") << out;
  EXPECT_EQ(Field(out, "budget_tokens"), "64") << out;
  // polykvctl reports on stderr: through a shell, to read it.
  std::tie(code, out) = RunProgram({"/bin/sh", "-c",
                                    ctl + " --socket " + socket_ +
                                        " qos set share --budget-fraction 1.5 2>&1"});
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("budget_fraction must be"), std::string::npos) << out;
  std::tie(code, out) =
      RunProgram({ctl, "--socket", socket_, "qos", "set", "share", "--budget-fraction", "most"});
  EXPECT_EQ(code, 2) << out;
  std::tie(code, out) = RunProgram({ctl, "--socket", socket_, "qos", "get", "share"});
  EXPECT_NE(out.find("budget_fraction     0.75 of each session's context"), std::string::npos)
      << out;
}

// Finding 11 of issue 14: a worker holding arena fds was dumpable, so any
// process of its uid could take the fds from /proc/<worker>/fd and map another
// session's pages. libpolykv_client makes the process non-dumpable before it
// receives its first arena fd.
TEST_F(DaemonIntegrationTest, WorkersHoldingArenaFdsAreNotDumpable) {  // finding 11
  Subprocess holder(Worker("hang", "t", "holder", 16, 1));
  const std::string held = holder.ReadLine();
  ASSERT_EQ(Field(held, "ok"), "true") << held;
  EXPECT_FALSE(Arenas(held).empty()) << held;
  EXPECT_EQ(Field(held, "dumpable"), "0") << held;
}

TEST_F(DaemonIntegrationTest, MetricsEndpointListsPolykvMetrics) {
  auto stats = admin_->GetStats();
  ASSERT_TRUE(stats.ok());
  const std::string addr = stats->metrics_address();
  const int port = std::stoi(addr.substr(addr.rfind(':') + 1));
  Subprocess w(Worker("run", "t", "metered", 16, 3));
  ASSERT_EQ(w.Wait(), 0);
  const std::string body = HttpGet(port, "/metrics");
  for (const char* name : {"polykv_pool_bytes", "polykv_rpc_total", "polykv_rpc_duration_seconds",
                           "polykv_sessions", "polykv_lease_expiries_total",
                           "polykv_reservations_refused_total", "polykv_pages"}) {
    EXPECT_NE(body.find(name), std::string::npos) << name << " missing from\n" << body;
  }
  EXPECT_NE(body.find("rpc=\"Reserve\""), std::string::npos);

  // Finding 8 of issue 14, on the live daemon: idle TCP connections (these
  // two blocked every scrape for 29.7 s) do not delay it.
  int idle[2];
  for (int& fd : idle) {
    fd = testing::ConnectLoopback(port);
    ASSERT_GE(fd, 0);
  }
  const std::string again = HttpGet(port, "/metrics", 10000);
  EXPECT_NE(again.find("polykv_pool_bytes"), std::string::npos) << again;
  for (int fd : idle) close(fd);
}

// Kubernetes' probes: /healthz while the daemon runs; /readyz until it drains.
TEST_F(DaemonIntegrationTest, ReadinessEndsWhenTheDaemonDrains) {
  auto stats = admin_->GetStats();
  ASSERT_TRUE(stats.ok());
  const std::string addr = stats->metrics_address();
  const int port = std::stoi(addr.substr(addr.rfind(':') + 1));
  EXPECT_EQ(HttpGet(port, "/healthz").rfind("HTTP/1.1 200", 0), 0u);
  const std::string ready = HttpGet(port, "/readyz");
  EXPECT_EQ(ready.rfind("HTTP/1.1 200", 0), 0u) << ready;
  ASSERT_TRUE(admin_->Drain(0).ok());
  const std::string draining = HttpGet(port, "/readyz");
  EXPECT_EQ(draining.rfind("HTTP/1.1 503", 0), 0u) << draining;
  EXPECT_NE(draining.find("not ready: draining"), std::string::npos) << draining;
  EXPECT_EQ(HttpGet(port, "/healthz").rfind("HTTP/1.1 200", 0), 0u);
}

// Finding 9 of issue 14: a name that is not valid UTF-8 made protobuf refuse
// the whole request (INTERNAL, empty message, a log line per request).
TEST_F(DaemonIntegrationTest, InvalidUtf8NamesAreInvalidArgument) {  // finding 9
  auto client = Client::Connect(socket_);
  ASSERT_TRUE(client.ok()) << client.status();
  SessionOptions o;
  o.agent_id = "agent\xff\xfe";
  o.tenant = "t";
  o.profile = {4, 2, 64, DType::kF32, "test"};
  auto s = (*client)->OpenSession(o);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  EXPECT_NE(s.status().message().find("agent_id"), absl::string_view::npos) << s.status();
  EXPECT_NE(s.status().message().find("byte 0xff"), absl::string_view::npos) << s.status();
  EXPECT_EQ(UsedBytes(), 0u);
}

TEST_F(DaemonIntegrationTest, SocketIsNotOpenToOthers) {
  struct stat st;
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  ASSERT_EQ(stat((socket_ + ".fds").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

// A peer whose uid is not allowed is disconnected before gRPC sees it.
TEST(DaemonPeerCredentialsTest, DisallowedUidIsRefused) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "polykv-peer-", getpid());
  mkdir(dir.c_str(), 0700);
  const std::string config = dir + "/polykvd.yaml";
  std::ofstream(config) << "allowed_uids: [4242]\nadmin_uids: [4242]\nmetrics_address: 'off'\n";
  Subprocess d({BinDir() + "/polykvd", "--socket", dir + "/d.sock", "--config", config});
  // Wait for the socket file.
  for (int i = 0; i < 500 && access((dir + "/d.sock").c_str(), F_OK) != 0; ++i) usleep(20000);
  auto admin = AdminClient::Connect(dir + "/d.sock", 2000);
  if (admin.ok()) {
    auto s = (*admin)->GetStats();
    EXPECT_FALSE(s.ok()) << "uid " << getuid() << " is not allowed but got stats";
  }
  auto [code, out] = RunProgram({BinDir() + "/polykv-test-worker", "run", "--socket", dir + "/d.sock",
                          "--tenant", "t", "--agent", "a", "--tokens", "16", "--seed", "1"});
  EXPECT_NE(code, 0);
  EXPECT_EQ(Field(out, "code"), "14") << out;  // UNAVAILABLE: connection refused
  d.Signal(SIGTERM);
  EXPECT_EQ(d.Wait(), 0);
}

}  // namespace
}  // namespace polykv
