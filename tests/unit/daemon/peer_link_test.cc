// The peer link end to end, through libpolykv_client: two in-process polykvd
// with mutual TLS (certificates from scripts/make-peer-certs.sh), a session
// moved by Admin.MoveSession. An idle session (Session::Idle) moves without
// waiting for its worker, and its next Sync follows it with the same bytes;
// a busy one that never reaches a step boundary is not moved; a daemon of
// another CA is refused; a daemon without peer TLS cannot move sessions.
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "gtest/gtest.h"
#include "polykv/admin.h"
#include "polykv/client.h"

namespace polykv {
namespace {

using daemon::Daemon;
using daemon::DaemonConfig;

class PeerLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/polykv-peer-link-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    for (const auto& [pki, name] : {std::pair{"pki", "a"}, {"pki", "b"}, {"rogue", "c"}}) {
      const std::string cmd = absl::StrCat("bash ", POLYKV_SOURCE_DIR,
                                           "/scripts/make-peer-certs.sh ", dir_, "/", pki, " ",
                                           name, " >/dev/null");
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    a_ = Start("a", "pki", /*listen=*/false);
    b_ = Start("b", "pki", /*listen=*/true);
    c_ = Start("c", "rogue", /*listen=*/true);
  }
  void TearDown() override {
    for (auto* d : {&a_, &b_, &c_}) d->reset();
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }

  std::unique_ptr<Daemon> Start(const std::string& name, const std::string& pki, bool listen) {
    DaemonConfig cfg;
    cfg.socket = absl::StrCat(dir_, "/", name, ".sock");
    cfg.metrics_address = "off";
    cfg.pool_bytes = 64ull << 20;
    cfg.log_level = "warn";
    cfg.peer = {listen ? "127.0.0.1:0" : "", absl::StrCat(dir_, "/", pki, "/", name, ".pem"),
                absl::StrCat(dir_, "/", pki, "/", name, ".key"),
                absl::StrCat(dir_, "/", pki, "/ca.pem")};
    auto d = Daemon::Create(cfg);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    auto st = (*d)->Start();
    EXPECT_TRUE(st.ok()) << st;
    return *std::move(d);
  }
  std::string Socket(const std::string& name) const { return absl::StrCat(dir_, "/", name, ".sock"); }

  // A session on `a` with 40 committed tokens whose pages hold a pattern.
  std::unique_ptr<Session> Open(Client& client) {
    SessionOptions o;
    o.agent_id = "mover";
    o.profile = {4, 2, 64, DType::kF16, "tiny"};
    auto s = client.OpenSession(o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return nullptr;
    EXPECT_TRUE((*s)->Reserve(40).ok());
    Fill(**s, true);
    EXPECT_TRUE((*s)->Commit(40).ok());
    return *std::move(s);
  }
  // Writes (or checks) the pattern over every page of the session.
  static bool Fill(const Session& s, bool write) {
    uint8_t x = 3;
    for (const Block& b : s.blocks()) {
      for (const Page& p : b.pages) {
        auto* a = static_cast<uint8_t*>(p.addr);
        for (uint32_t i = 0; i < p.size_bytes; ++i) {
          x = uint8_t(x * 167 + 13);
          if (write) {
            a[i] = x;
          } else if (a[i] != x) {
            return false;
          }
        }
      }
    }
    return true;
  }

  std::string dir_;
  std::unique_ptr<Daemon> a_, b_, c_;
};

TEST_F(PeerLinkTest, AnIdleSessionMovesAtOnceAndItsNextSyncFollowsWithTheSameBytes) {
  auto client = Client::Connect(Socket("a"));
  ASSERT_TRUE(client.ok()) << client.status();
  auto s = Open(**client);
  ASSERT_NE(s, nullptr);
  const uint64_t before = s->info().session_id;
  ASSERT_TRUE(s->Idle().ok());
  // Idle: nothing but Sync until the next Sync.
  EXPECT_EQ(s->Reserve(16).status().code(), absl::StatusCode::kFailedPrecondition);
  auto admin = AdminClient::Connect(Socket("a"));
  ASSERT_TRUE(admin.ok()) << admin.status();
  // No worker will Sync during the move: a short wait is enough.
  auto moved = (*admin)->MoveSession(before, b_->peer_address(), /*wait_ms=*/200);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->tokens(), 40u);
  EXPECT_GT(moved->bytes(), 0u);
  auto changed = s->Sync();
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(s->moves(), 1u);
  EXPECT_EQ(s->info().session_id, moved->target_session_id());
  EXPECT_EQ(s->committed_tokens(), 40u);
  EXPECT_TRUE(Fill(*s, false)) << "the moved pages differ";
  // It lives on at b: more tokens there, nothing left at a.
  EXPECT_TRUE(s->Reserve(16).ok());
  EXPECT_TRUE(s->Commit(56).ok());
  auto at_a = (*admin)->ListSessions();
  ASSERT_TRUE(at_a.ok());
  EXPECT_EQ(at_a->sessions_size(), 0);
  auto admin_b = AdminClient::Connect(Socket("b"));
  ASSERT_TRUE(admin_b.ok());
  auto at_b = (*admin_b)->ListSessions();
  ASSERT_TRUE(at_b.ok());
  ASSERT_EQ(at_b->sessions_size(), 1);
  EXPECT_EQ(at_b->sessions(0).committed_tokens(), 56u);
  EXPECT_TRUE(s->Close().ok());
}

TEST_F(PeerLinkTest, AFailedMoveLeavesTheSessionWhereItWas) {
  auto client = Client::Connect(Socket("a"));
  ASSERT_TRUE(client.ok()) << client.status();
  auto s = Open(**client);
  ASSERT_NE(s, nullptr);
  const uint64_t id = s->info().session_id;
  auto admin = AdminClient::Connect(Socket("a"));
  ASSERT_TRUE(admin.ok());
  // Busy (not idle) and never at a step boundary: not moved.
  auto busy = (*admin)->MoveSession(id, b_->peer_address(), /*wait_ms=*/100);
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kDeadlineExceeded) << busy.status();
  // Idle, but the target's certificate is another CA's: refused, unparked.
  ASSERT_TRUE(s->Idle().ok());
  auto rogue = (*admin)->MoveSession(id, c_->peer_address(), /*wait_ms=*/100);
  EXPECT_EQ(rogue.status().code(), absl::StatusCode::kUnavailable) << rogue.status();
  EXPECT_NE(rogue.status().message().find("stays here"), std::string::npos) << rogue.status();
  // Nothing answers there at all.
  ASSERT_TRUE(s->Sync().ok());
  ASSERT_TRUE(s->Idle().ok());
  EXPECT_FALSE((*admin)->MoveSession(id, "127.0.0.1:1", 100).ok());
  auto changed = s->Sync();
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
  EXPECT_EQ(s->moves(), 0u);
  EXPECT_TRUE(Fill(*s, false));
  EXPECT_TRUE(s->Reserve(16).ok());
  for (const char* name : {"b", "c"}) {
    auto other = AdminClient::Connect(Socket(name));
    ASSERT_TRUE(other.ok());
    auto l = (*other)->ListSessions();
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(l->sessions_size(), 0) << name;
  }
  // A daemon without peer TLS cannot move sessions: the error names the
  // config keys.
  DaemonConfig plain;
  plain.socket = Socket("plain");
  plain.metrics_address = "off";
  plain.pool_bytes = 16ull << 20;
  plain.log_level = "warn";
  auto d = Daemon::Create(plain);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE((*d)->Start().ok());
  auto padmin = AdminClient::Connect(Socket("plain"));
  ASSERT_TRUE(padmin.ok());
  auto no_tls = (*padmin)->MoveSession(1, b_->peer_address(), 100);
  EXPECT_EQ(no_tls.status().code(), absl::StatusCode::kFailedPrecondition) << no_tls.status();
  EXPECT_NE(no_tls.status().message().find("peer.cert"), std::string::npos);
}

}  // namespace
}  // namespace polykv
