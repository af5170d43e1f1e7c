// SessionTable: room at max_sessions, ids, authorization (token, then uid),
// lease renewal, refusal of mutations while busy, and which sessions
// have expired.
#include "daemon/pool/session_table.h"

#include <gtest/gtest.h>

namespace polykv::daemon {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000000);
constexpr uint32_t kInstance = 7;
constexpr uint64_t kBase = uint64_t{kInstance} << 32;  // ids are [instance:32][counter:32]

Session Make(const std::string& agent, const std::string& token, uid_t uid, uint32_t lease_ms,
             absl::Time now) {
  Session s;
  s.token = token;
  s.account = {"t1", agent, 0};
  s.lease.peer = {100, uid, 100};
  s.lease.lease_ms = lease_ms;
  s.lease.Renew(now);
  return s;
}

std::string Tok(char c) { return std::string(32, c); }

TEST(SessionTableTest, CheckRoomRefusesAtMaxSessions) {
  SessionTable t(2, 2, kInstance);
  EXPECT_TRUE(t.CheckRoom(1).ok());
  t.Insert(Make("a", Tok('a'), 1, 1000, kT0));
  EXPECT_TRUE(t.CheckRoom(1).ok());
  const uint64_t id = t.Insert(Make("b", Tok('b'), 1, 1000, kT0)).id;
  const absl::Status full = t.CheckRoom(1);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("2 sessions"), absl::string_view::npos) << full;
  t.Erase(id);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_TRUE(t.CheckRoom(1).ok());
  SessionTable none(0, 0, kInstance);
  EXPECT_EQ(none.CheckRoom(1).code(), absl::StatusCode::kResourceExhausted);
}

// Finding 5 of issue 14: one client could open all 4,096 session slots.
TEST(SessionTableTest, OneUidCannotTakeEverySessionSlot) {  // finding 5
  SessionTable t(10, 3, kInstance);
  std::vector<uint64_t> mine;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(t.CheckRoom(7).ok());
    mine.push_back(t.Insert(Make("a", Tok('a'), 7, 1000, kT0)).id);
  }
  const absl::Status limit = t.CheckRoom(7);
  EXPECT_EQ(limit.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(limit.message().find("uid 7 holds 3 sessions"), absl::string_view::npos) << limit;
  EXPECT_TRUE(t.CheckRoom(8).ok());  // another uid still gets in
  t.Erase(mine[0]);
  EXPECT_TRUE(t.CheckRoom(7).ok());
}

TEST(SessionTableTest, InsertAssignsIncreasingIdsThatAreNeverReused) {
  SessionTable t(10, 10, kInstance);
  Session s = Make("a", Tok('a'), 1, 1000, kT0);
  s.id = 77;  // ignored: the table assigns
  Session& first = t.Insert(std::move(s));
  EXPECT_EQ(first.id, kBase + 1);
  EXPECT_EQ(first.agent_id(), "a");
  EXPECT_EQ(t.Insert(Make("b", Tok('b'), 1, 1000, kT0)).id, kBase + 2);
  EXPECT_EQ(t.Insert(Make("c", Tok('c'), 1, 1000, kT0)).id, kBase + 3);
  t.Erase(kBase + 3);
  t.Erase(kBase + 1);
  EXPECT_EQ(t.Find(kBase + 1), nullptr);
  ASSERT_NE(t.Find(kBase + 2), nullptr);
  EXPECT_EQ(t.Find(kBase + 2)->agent_id(), "b");
  EXPECT_EQ(t.Insert(Make("d", Tok('d'), 1, 1000, kT0)).id, kBase + 4);
  std::vector<uint64_t> ids;
  for (const auto& [id, s2] : t) ids.push_back(id);
  EXPECT_EQ(ids, (std::vector<uint64_t>{kBase + 2, kBase + 4}));
  t.Erase(kBase + 99);  // unknown: no-op
  EXPECT_EQ(t.size(), 2u);
  // Another instance numbers its own sessions.
  SessionTable other(10, 10, 8);
  EXPECT_EQ(other.Insert(Make("a", Tok('a'), 1, 1000, kT0)).id, (uint64_t{8} << 32) + 1);
}

TEST(SessionTableTest, AuthorizeChecksTokenThenUidAndRenewsTheLease) {
  SessionTable t(10, 10, kInstance);
  const uint64_t id = t.Insert(Make("a", Tok('a'), 1000, 250, kT0)).id;
  const PeerCreds me{4321, 1000, 5};  // pid and gid are not checked
  const absl::Time later = kT0 + absl::Seconds(3);

  auto nf = t.Authorize(id + 1, Tok('a'), me, later);
  EXPECT_EQ(nf.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(nf.status().message().find("closed, evicted, or its lease expired"),
            absl::string_view::npos) << nf.status();
  // An id of another daemon instance (before a restart) says so.
  auto old = t.Authorize((uint64_t{kInstance + 1} << 32) + 1, Tok('a'), me, later);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(old.status().message().find("earlier polykvd"), absl::string_view::npos)
      << old.status();

  std::string forged = Tok('a');
  forged[31] = 'b';
  EXPECT_EQ(t.Authorize(id, forged, me, later).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(t.Authorize(id, "", me, later).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(t.Authorize(id, Tok('a') + "x", me, later).status().code(),
            absl::StatusCode::kPermissionDenied);
  const PeerCreds stranger{4321, 1001, 5};
  auto other_uid = t.Authorize(id, Tok('a'), stranger, later);
  EXPECT_EQ(other_uid.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(other_uid.status().message().find("uid 1000"), absl::string_view::npos);
  // Refused calls do not renew the lease.
  EXPECT_EQ(t.Find(id)->lease.deadline, kT0 + absl::Milliseconds(250));
  EXPECT_EQ(t.Find(id)->lease.last_seen, kT0);

  auto ok = t.Authorize(id, Tok('a'), me, later);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, t.Find(id));
  EXPECT_EQ((*ok)->lease.deadline, later + absl::Milliseconds(250));
  EXPECT_EQ((*ok)->lease.last_seen, later);
}

TEST(SessionTableTest, MutationsAreRefusedWhileCompacting) {
  SessionTable t(10, 10, kInstance);
  const uint64_t id = t.Insert(Make("a", Tok('a'), 7, 1000, kT0)).id;
  const PeerCreds me{1, 7, 1};
  ASSERT_TRUE(t.AuthorizeMutation(id, Tok('a'), me, kT0).ok());
  t.Find(id)->busy = true;
  const absl::Time later = kT0 + absl::Seconds(1);
  auto busy = t.AuthorizeMutation(id, Tok('a'), me, later);
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.status().message().find("is busy"), absl::string_view::npos);
  // Authorization comes first: the caller was authentic, so its lease is renewed.
  EXPECT_EQ(t.Find(id)->lease.deadline, later + absl::Seconds(1));
  // A wrong token is still PERMISSION_DENIED, an unknown id NOT_FOUND.
  EXPECT_EQ(t.AuthorizeMutation(id, Tok('z'), me, later).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(t.AuthorizeMutation(id + 5, Tok('a'), me, later).status().code(),
            absl::StatusCode::kNotFound);
  // Non-mutating calls (Sync, Close) still get through.
  EXPECT_TRUE(t.Authorize(id, Tok('a'), me, later).ok());
  t.Find(id)->busy = false;
  EXPECT_TRUE(t.AuthorizeMutation(id, Tok('a'), me, later).ok());
}

TEST(SessionTableTest, ExpiredSkipsCompactingSessionsAndHonoursAll) {
  SessionTable t(10, 10, kInstance);
  const uint64_t a = t.Insert(Make("a", Tok('a'), 1, 1000, kT0)).id;  // deadline T0+1s
  const uint64_t b = t.Insert(Make("b", Tok('b'), 1, 3000, kT0)).id;  // T0+3s
  const uint64_t c = t.Insert(Make("c", Tok('c'), 1, 1000, kT0)).id;  // T0+1s, compacting
  t.Find(c)->busy = true;
  EXPECT_TRUE(t.Expired(kT0, false).empty());
  EXPECT_TRUE(t.Expired(kT0 + absl::Milliseconds(999), false).empty());
  // The deadline itself is expired.
  EXPECT_EQ(t.Expired(kT0 + absl::Seconds(1), false), std::vector<uint64_t>{a});
  EXPECT_EQ(t.Expired(kT0 + absl::Seconds(3), false), (std::vector<uint64_t>{a, b}));
  EXPECT_EQ(t.Expired(kT0 + absl::Hours(1), false), (std::vector<uint64_t>{a, b}));
  // `all` (the end of a drain) ignores deadlines, but never takes a compacting session.
  EXPECT_EQ(t.Expired(kT0, true), (std::vector<uint64_t>{a, b}));
  t.Find(c)->busy = false;
  EXPECT_EQ(t.Expired(kT0 + absl::Seconds(1), false), (std::vector<uint64_t>{a, c}));
  EXPECT_EQ(t.Expired(kT0, true), (std::vector<uint64_t>{a, b, c}));
  // A renewal moves the deadline.
  ASSERT_TRUE(t.Authorize(a, Tok('a'), {1, 1, 1}, kT0 + absl::Seconds(1)).ok());
  EXPECT_EQ(t.Expired(kT0 + absl::Seconds(1), false), std::vector<uint64_t>{c});
}

TEST(SessionTableTest, HasOtherOfLooksAtOtherSessionsOfTheAgent) {
  SessionTable t(10, 10, kInstance);
  const uint64_t a1 = t.Insert(Make("a", Tok('a'), 1, 1000, kT0)).id;
  const uint64_t b1 = t.Insert(Make("b", Tok('b'), 1, 1000, kT0)).id;
  EXPECT_FALSE(t.HasOtherOf("a", a1));
  EXPECT_TRUE(t.HasOtherOf("a", b1));
  EXPECT_FALSE(t.HasOtherOf("nobody", 0));
  const uint64_t a2 = t.Insert(Make("a", Tok('c'), 1, 1000, kT0)).id;
  EXPECT_TRUE(t.HasOtherOf("a", a1));
  EXPECT_TRUE(t.HasOtherOf("a", a2));
  t.Erase(a2);
  EXPECT_FALSE(t.HasOtherOf("a", a1));
}

}  // namespace
}  // namespace polykv::daemon
