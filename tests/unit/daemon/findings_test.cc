// Regression tests for the findings of the adversarial run in issue 14
// ([harden]), named after them. Each failed before its fix.
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

#include "daemon/pool/kv_pool.h"

namespace polykv::daemon {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

class FindingsTest : public ::testing::Test {
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

// Finding 7a: the ladder's refusal was checked before guarantees, so an agent
// whose guarantee was unused was refused under pressure like any other.
TEST_F(FindingsTest, Finding7_UnusedGuaranteeIsNotRefusedUnderPressure) {
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
TEST_F(FindingsTest, Finding7_GuaranteeSumsDoNotWrapAround) {
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
TEST_F(FindingsTest, Finding9_SessionIdsFromBeforeARestartAreNotFound) {
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

}  // namespace
}  // namespace polykv::daemon
