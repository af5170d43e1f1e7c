#include "daemon/pool/kv_pool.h"

#include <gtest/gtest.h>

#include <optional>

#include "daemon/pool/token.h"

namespace polykv::daemon {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000000);
  // When set, the second reading from then on (and every one after it) is
  // this much later: a call that reads the clock at its start and again at
  // its end took this long.
  std::optional<absl::Duration> then_jump;
  int readings_since_armed = 0;
  absl::Time Read() {
    if (then_jump && readings_since_armed++ == 1) now += *then_jump;
    return now;
  }
};

class KvPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { pool_ = MakePool(16 * kMiB); }

  // The options of every pool here: host arenas of 4 MiB, the fake clock.
  KvPoolOptions Options(uint64_t bytes) {
    KvPoolOptions o;
    o.pool_bytes = bytes;
    o.arena_bytes = 4 * kMiB;
    o.superblock_bytes = 256 * 1024;
    o.default_lease_ms = 1000;
    o.arena_factory = CreateHostShmArena;
    o.clock = [this] { return clock_.Read(); };
    return o;
  }
  std::unique_ptr<KvPool> MakePool(const KvPoolOptions& o) {
    auto p = KvPool::Create(o);
    EXPECT_TRUE(p.ok()) << p.status();
    return *std::move(p);
  }
  std::unique_ptr<KvPool> MakePool(uint64_t bytes) { return MakePool(Options(bytes)); }

  OpenRequest Req(const std::string& agent, const std::string& tenant = "t1") {
    OpenRequest r;
    r.agent_id = agent;
    r.tenant = tenant;
    r.profile = {4, 2, 64, DType::kF32, "tiny"};
    r.peer = peer_;
    return r;
  }

  void Check() {
    auto s = pool_->CheckInvariants();
    ASSERT_TRUE(s.ok()) << s;
  }

  FakeClock clock_;
  PeerCreds peer_{1234, 1000, 1000};
  std::unique_ptr<KvPool> pool_;
};

TEST_F(KvPoolTest, ReserveGivesWholeBlocksOfEveryLayerAndAccountsExactly) {
  auto s = pool_->Open(Req("a"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->token.size(), kTokenBytes);
  EXPECT_EQ(s->block_tokens, 16u);
  EXPECT_EQ(s->key_format, PageFormat::kF32);
  // 16 tokens x 2 heads x 64 dims x 4 bytes.
  EXPECT_EQ(s->key_page_bytes, 8192u);
  auto r = pool_->Reserve(s->session_id, s->token, peer_, 40);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->blocks.size(), 3u);
  EXPECT_EQ(r->reserved_tokens, 48u);
  for (const auto& b : r->blocks) {
    ASSERT_EQ(b.pages.size(), 8u);
    for (size_t i = 0; i < 8; ++i) {
      EXPECT_EQ(b.pages[i].layer, i / 2);
      EXPECT_EQ(b.pages[i].is_value, i % 2 == 1);
    }
  }
  EXPECT_EQ(r->session_bytes, 3u * 8 * 8192);
  EXPECT_EQ(pool_->used_bytes(), r->session_bytes);
  EXPECT_EQ(r->new_arenas.size(), 1u);
  // N more tokens beyond the reserve: 48 + 8 needs one more block.
  auto r2 = pool_->Reserve(s->session_id, s->token, peer_, 8);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->blocks.size(), 1u);
  EXPECT_EQ(r2->blocks[0].block_index, 3u);
  EXPECT_EQ(r2->reserved_tokens, 64u);
  EXPECT_TRUE(r2->new_arenas.empty());
  Check();
  ASSERT_TRUE(pool_->Close(s->session_id, s->token, peer_).ok());
  EXPECT_EQ(pool_->used_bytes(), 0u);
  Check();
}

TEST_F(KvPoolTest, WrongTokenWrongUserAndUnknownSessionChangeNothing) {
  auto s = pool_->Open(Req("a"));
  ASSERT_TRUE(s.ok());
  std::string forged = s->token;
  forged[0] ^= 1;
  EXPECT_TRUE(absl::IsPermissionDenied(pool_->Reserve(s->session_id, forged, peer_, 16).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(pool_->Reserve(s->session_id, "", peer_, 16).status()));
  PeerCreds other = peer_;
  other.uid = 2000;
  EXPECT_TRUE(absl::IsPermissionDenied(pool_->Reserve(s->session_id, s->token, other, 16).status()));
  EXPECT_TRUE(absl::IsNotFound(pool_->Reserve(s->session_id + 99, s->token, peer_, 16).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(pool_->Close(s->session_id, forged, peer_).status()));
  EXPECT_EQ(pool_->used_bytes(), 0u);
  EXPECT_EQ(pool_->num_sessions(), 1u);
  Check();
}

TEST_F(KvPoolTest, MalformedRequestsAreInvalidArgumentsWithReadableMessages) {
  auto bad = Req("a");
  bad.agent_id = "";
  EXPECT_TRUE(absl::IsInvalidArgument(pool_->Open(bad).status()));
  bad = Req("bad agent!");
  auto st = pool_->Open(bad).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(st.message().find("agent_id"), absl::string_view::npos) << st;
  bad = Req("a");
  bad.profile.num_layers = 0;
  st = pool_->Open(bad).status();
  EXPECT_NE(st.message().find("num_layers"), absl::string_view::npos) << st;
  bad = Req("a");
  bad.block_tokens = 12;
  EXPECT_TRUE(absl::IsInvalidArgument(pool_->Open(bad).status()));
  bad = Req("a");
  bad.profile.head_dim = 1024;
  bad.profile.num_kv_heads = 64;  // one f32 page would be 4 MiB > superblock
  EXPECT_TRUE(absl::IsInvalidArgument(pool_->Open(bad).status()));
  EXPECT_EQ(pool_->num_sessions(), 0u);

  auto s = pool_->Open(Req("a"));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(pool_->Reserve(s->session_id, s->token, peer_, 0).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(pool_->Reserve(s->session_id, s->token, peer_, 65537).status()));
  ASSERT_TRUE(pool_->Reserve(s->session_id, s->token, peer_, 16).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(pool_->Commit(s->session_id, s->token, peer_, 17).status()));
  ASSERT_TRUE(pool_->Commit(s->session_id, s->token, peer_, 10).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(pool_->Commit(s->session_id, s->token, peer_, 9).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(pool_->Release(s->session_id, s->token, peer_, 17).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(pool_->Sync(s->session_id, s->token, peer_, 5).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(pool_->Ack(s->session_id, s->token, peer_, 5)));
  Check();
}

TEST_F(KvPoolTest, MaxBytesIsEnforcedPerAgentAcrossSessions) {
  QosRecord q;
  q.agent_id = "capped";
  q.max_bytes = 3 * 8 * 8192;  // three blocks of the tiny profile
  ASSERT_TRUE(pool_->SetQos(q).ok());
  auto a = pool_->Open(Req("capped"));
  auto b = pool_->Open(Req("capped"));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(pool_->Reserve(a->session_id, a->token, peer_, 32).ok());
  ASSERT_TRUE(pool_->Reserve(b->session_id, b->token, peer_, 16).ok());
  const uint64_t used = pool_->used_bytes();
  auto over = pool_->Reserve(b->session_id, b->token, peer_, 1);
  EXPECT_TRUE(absl::IsResourceExhausted(over.status()));
  EXPECT_NE(over.status().message().find("max_bytes"), absl::string_view::npos) << over.status();
  EXPECT_EQ(pool_->used_bytes(), used);
  EXPECT_EQ(pool_->Stats().refused_reservations, 1u);
  Check();
}

TEST_F(KvPoolTest, GuaranteesOfOtherAgentsAreNotHandedOut) {
  auto pool = MakePool(2 * kMiB);
  QosRecord q;
  q.agent_id = "vip";
  q.guaranteed_bytes = 1536 * 1024;
  ASSERT_TRUE(pool->SetQos(q).ok());
  OpenRequest r = Req("other");
  auto s = pool->Open(r);
  ASSERT_TRUE(s.ok());
  // 8 blocks = 512 KiB fits beside the 1.5 MiB promise; one more block does not.
  ASSERT_TRUE(pool->Reserve(s->session_id, s->token, peer_, 8 * 16).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(pool->Reserve(s->session_id, s->token, peer_, 16).status()));
  auto v = pool->Open(Req("vip"));
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(pool->Reserve(v->session_id, v->token, peer_, 16 * 16).ok());
  ASSERT_TRUE(pool->CheckInvariants().ok());
}

TEST_F(KvPoolTest, PoolFullRollsBackPartialReservationsAndArenas) {
  auto pool = MakePool(1 * kMiB);
  auto s = pool->Open(Req("a"));
  ASSERT_TRUE(s.ok());
  // 1 MiB holds 16 blocks of 64 KiB; ask for 20.
  auto r = pool->Reserve(s->session_id, s->token, peer_, 20 * 16);
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_EQ(pool->used_bytes(), 0u);
  EXPECT_EQ(pool->Stats().num_arenas, 0u);
  ASSERT_TRUE(pool->CheckInvariants().ok());
  EXPECT_TRUE(pool->Reserve(s->session_id, s->token, peer_, 16 * 16).ok());
  EXPECT_EQ(pool->used_bytes(), 1 * kMiB);
}

TEST_F(KvPoolTest, TenantsGetDisjointArenasAndCannotFetchEachOthers) {
  auto a = pool_->Open(Req("a", "tenant-a"));
  auto b = pool_->Open(Req("b", "tenant-b"));
  ASSERT_TRUE(a.ok() && b.ok());
  auto ra = pool_->Reserve(a->session_id, a->token, peer_, 16);
  auto rb = pool_->Reserve(b->session_id, b->token, peer_, 16);
  ASSERT_TRUE(ra.ok() && rb.ok());
  ASSERT_EQ(ra->new_arenas.size(), 1u);
  ASSERT_EQ(rb->new_arenas.size(), 1u);
  const uint32_t arena_a = ra->new_arenas[0].arena_id, arena_b = rb->new_arenas[0].arena_id;
  EXPECT_NE(arena_a, arena_b);
  for (const auto& p : rb->blocks[0].pages) EXPECT_EQ(p.arena_id, arena_b);
  EXPECT_TRUE(absl::IsPermissionDenied(pool_->DupArenaFd(b->session_id, b->token, peer_, arena_a).status()));
  auto fd = pool_->DupArenaFd(a->session_id, a->token, peer_, arena_a);
  ASSERT_TRUE(fd.ok());
  close(fd->fd);
  // A second session of tenant A is told about A's arena when it opens.
  auto a2 = pool_->Open(Req("a2", "tenant-a"));
  ASSERT_TRUE(a2.ok());
  ASSERT_EQ(a2->arenas.size(), 1u);
  EXPECT_EQ(a2->arenas[0].arena_id, arena_a);
  Check();
}

TEST_F(KvPoolTest, ExpiredLeasesAreReclaimedCompletelyAndHeartbeatsRenew) {
  auto a = pool_->Open(Req("a"));
  auto b = pool_->Open(Req("b"));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(pool_->Reserve(a->session_id, a->token, peer_, 64).ok());
  ASSERT_TRUE(pool_->Reserve(b->session_id, b->token, peer_, 64).ok());
  clock_.now += absl::Milliseconds(800);
  ASSERT_TRUE(pool_->Heartbeat(b->session_id, b->token, peer_).ok());
  clock_.now += absl::Milliseconds(300);  // a: 1100 ms silent; b: 300 ms
  auto reclaimed = pool_->ReclaimExpired();
  ASSERT_EQ(reclaimed.size(), 1u);
  EXPECT_EQ(reclaimed[0].session_id, a->session_id);
  EXPECT_STREQ(reclaimed[0].reason, "lease");
  EXPECT_EQ(pool_->Stats().lease_expiries, 1u);
  EXPECT_TRUE(absl::IsNotFound(pool_->Reserve(a->session_id, a->token, peer_, 1).status()));
  Check();
  clock_.now += absl::Seconds(2);
  pool_->ReclaimExpired();
  EXPECT_EQ(pool_->used_bytes(), 0u);
  EXPECT_EQ(pool_->num_sessions(), 0u);
  EXPECT_EQ(pool_->Stats().num_arenas, 0u);  // tenant has no sessions: arenas returned
  Check();
}

TEST_F(KvPoolTest, ReleaseShrinksToWholeBlocksAndSyncReturnsTables) {
  auto s = pool_->Open(Req("a"));
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(pool_->Reserve(s->session_id, s->token, peer_, 64).ok());
  ASSERT_TRUE(pool_->Commit(s->session_id, s->token, peer_, 60).ok());
  auto r = pool_->Release(s->session_id, s->token, peer_, 20);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reserved_tokens, 32u);
  EXPECT_EQ(r->committed_tokens, 20u);
  auto same = pool_->Sync(s->session_id, s->token, peer_, 0);
  ASSERT_TRUE(same.ok());
  EXPECT_FALSE(same->changed);
  Check();
}

TEST_F(KvPoolTest, DrainRefusesNewWorkAndEvictsAfterTheDeadline) {
  auto s = pool_->Open(Req("a"));
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(pool_->Reserve(s->session_id, s->token, peer_, 16).ok());
  auto events = pool_->Watch(s->session_id, s->token, peer_);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(pool_->Drain(absl::Milliseconds(500)), 1u);
  EXPECT_TRUE(absl::IsUnavailable(pool_->Open(Req("b")).status()));
  EXPECT_TRUE(absl::IsUnavailable(pool_->Reserve(s->session_id, s->token, peer_, 16).status()));
  auto e = (*events)->Next(absl::ZeroDuration());
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, SessionEventMsg::Type::kDrain);
  ASSERT_TRUE(pool_->Heartbeat(s->session_id, s->token, peer_)->draining);
  clock_.now += absl::Milliseconds(600);  // past the drain's deadline, not the lease
  const auto reclaimed = pool_->ReclaimExpired();
  ASSERT_EQ(reclaimed.size(), 1u);
  EXPECT_STREQ(reclaimed[0].reason, "drain") << "a drain eviction is no lease expiry";
  EXPECT_EQ(pool_->Stats().lease_expiries, 0u);
  EXPECT_EQ(pool_->used_bytes(), 0u);
  e = (*events)->Next(absl::ZeroDuration());
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, SessionEventMsg::Type::kEvicted);
  EXPECT_TRUE((*events)->Closed());
  Check();
}

// The agent's QoS formats and page size apply when the worker asks for none;
// a worker that asks gets its own; the floors apply to both.
TEST_F(KvPoolTest, QosFormatsAndPagesApplyWhenTheWorkerAsksForNone) {
  QosRecord q;
  q.agent_id = "packed";
  q.key_format = PageFormat::kInt4;
  q.value_format = PageFormat::kInt2;
  q.block_tokens = 64;
  ASSERT_TRUE(pool_->SetQos(q).ok());
  auto s = pool_->Open(Req("packed"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->key_format, PageFormat::kInt4);
  EXPECT_EQ(s->value_format, PageFormat::kInt2);
  EXPECT_EQ(s->block_tokens, 64u);
  auto asks = Req("packed");
  asks.key_format = PageFormat::kF16;
  asks.block_tokens = 16;
  auto a = pool_->Open(asks);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->key_format, PageFormat::kF16);
  EXPECT_EQ(a->value_format, PageFormat::kInt2);
  EXPECT_EQ(a->block_tokens, 16u);
  q.value_floor = PageFormat::kInt8;
  ASSERT_TRUE(pool_->SetQos(q).ok());
  auto floored = pool_->Open(Req("packed"));
  ASSERT_TRUE(floored.ok()) << floored.status();
  EXPECT_EQ(floored->value_format, PageFormat::kInt8);
  auto plain = pool_->Open(Req("other"));  // no record: the dtype and the default pages
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->key_format, PageFormat::kF32);  // the profile's dtype
  EXPECT_NE(plain->block_tokens, 64u);
  q.block_tokens = 48;
  auto bad = pool_->SetQos(q);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("qos.block_tokens"), absl::string_view::npos) << bad.status();
  EXPECT_EQ(pool_->GetQos("packed").block_tokens, 64u);  // unchanged
  Check();
}

TEST_F(KvPoolTest, PrecisionFloorsRaiseRequestedFormats) {
  QosRecord q;
  q.agent_id = "careful";
  q.key_floor = PageFormat::kF16;
  ASSERT_TRUE(pool_->SetQos(q).ok());
  auto r = Req("careful");
  r.key_format = PageFormat::kInt4;
  r.value_format = PageFormat::kInt8;
  auto s = pool_->Open(r);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->key_format, PageFormat::kF16);
  EXPECT_EQ(s->value_format, PageFormat::kInt8);
  EXPECT_LT(s->value_page_bytes, s->key_page_bytes);
}

// A Sync whose compaction outlasts the lease returns with the lease renewed:
// the worker was in a call all along, and must not lose its session to the
// next reaper sweep.
TEST_F(KvPoolTest, ASyncThatCompactsLongerThanTheLeaseRenewsIt) {
  QosRecord q;
  q.agent_id = "slow";
  q.policy = "window";
  q.budget_tokens = 32;
  ASSERT_TRUE(pool_->SetQos(q).ok());
  auto s = pool_->Open(Req("slow"));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(pool_->Reserve(s->session_id, s->token, peer_, 128).ok());
  ASSERT_TRUE(pool_->Commit(s->session_id, s->token, peer_, 128).ok());
  clock_.then_jump = absl::Seconds(5);  // the lease is 1 s
  auto synced = pool_->Sync(s->session_id, s->token, peer_, 0);
  ASSERT_TRUE(synced.ok()) << synced.status();
  ASSERT_GT(synced->epoch, 0u) << "the Sync compacted";
  EXPECT_TRUE(pool_->ReclaimExpired().empty());
  EXPECT_TRUE(pool_->Heartbeat(s->session_id, s->token, peer_).ok());
  Check();
}

// A QoS record follows identities, not names: it applies to sessions of the
// uids it names (none: the operator's). Another uid naming a session like the
// agent gets the default QoS under "<agent>@uid<N>", and neither uses nor
// eats into the agent's cap.
TEST_F(KvPoolTest, QosRecordsApplyOnlyToTheUidsTheyName) {
  KvPoolOptions o = Options(16 * kMiB);
  o.operator_uids = {0};
  auto pool = MakePool(o);
  QosRecord coder;
  coder.agent_id = "coder";
  coder.priority = Priority::kHigh;
  coder.max_bytes = 128 * 1024;  // two 16-token blocks of the tiny profile (64 KiB each)
  ASSERT_TRUE(pool->SetQos(coder).ok());
  const PeerCreds op{10, 0, 0}, other{11, 1001, 1001};
  OpenRequest r = Req("coder");
  r.peer = other;
  auto impostor = pool->Open(r);
  ASSERT_TRUE(impostor.ok()) << impostor.status();
  EXPECT_EQ(impostor->qos.agent_id, "coder@uid1001");
  EXPECT_EQ(impostor->qos.max_bytes, 0u) << "the default QoS";
  EXPECT_EQ(impostor->qos.priority, Priority::kNormal);
  ASSERT_TRUE(pool->Reserve(impostor->session_id, impostor->token, other, 64).ok())
      << "the agent's cap is not the impostor's";
  r.peer = op;
  auto real = pool->Open(r);
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_EQ(real->qos.agent_id, "coder");
  EXPECT_EQ(real->qos.max_bytes, 128u * 1024);
  ASSERT_TRUE(pool->Reserve(real->session_id, real->token, op, 32).ok())
      << "the impostor's pages do not count against the agent's cap";
  const auto over = pool->Reserve(real->session_id, real->token, op, 16);
  EXPECT_TRUE(absl::IsResourceExhausted(over.status()))
      << (over.ok() ? absl::StrCat("reserved, session bytes ", over->session_bytes)
                    : over.status().ToString());
  // A record that names uids applies to those, and no longer to the operator.
  QosRecord named = coder;
  named.agent_id = "shared";
  named.uids = {1001};
  ASSERT_TRUE(pool->SetQos(named).ok());
  r.agent_id = "shared";
  r.peer = other;
  EXPECT_EQ(pool->Open(r)->qos.agent_id, "shared");
  r.peer = op;
  EXPECT_EQ(pool->Open(r)->qos.agent_id, "shared@uid0");
  ASSERT_TRUE(pool->CheckInvariants().ok());
}

// One uid cannot strand the pool's arenas by spreading sessions over many
// tenants of its own: past max_tenants_per_uid a new tenant is refused,
// naming the limit, while its existing tenants and other uids go on.
TEST_F(KvPoolTest, OneUidCannotHoldMoreTenantsThanItsLimit) {
  KvPoolOptions o = Options(16 * kMiB);
  o.max_tenants_per_uid = 2;
  auto pool = MakePool(o);
  for (const char* t : {"t1", "t2", "t1"}) ASSERT_TRUE(pool->Open(Req("a", t)).ok()) << t;
  auto third = pool->Open(Req("a", "t3"));
  ASSERT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_NE(third.status().message().find("max_tenants_per_uid"), std::string::npos);
  OpenRequest other = Req("b", "t3");
  other.peer = {99, 1001, 1001};
  EXPECT_TRUE(pool->Open(other).ok()) << "another uid's tenants are its own";
  ASSERT_TRUE(pool->CheckInvariants().ok());
}

// A guarantee holds across tenants: a filler of another tenant stops short of
// the guaranteed agent's unused bytes in its pages and in its arenas, so the
// agent later gets all of its guarantee in arenas of its own tenant.
TEST_F(KvPoolTest, AGuaranteeHoldsAgainstAFillerOfAnotherTenant) {
  auto pool = MakePool(16 * kMiB);
  QosRecord g;
  g.agent_id = "guaranteed";
  g.guaranteed_bytes = 4 * kMiB;
  ASSERT_TRUE(pool->SetQos(g).ok());
  auto filler = pool->Open(Req("filler", "ta"));
  ASSERT_TRUE(filler.ok()) << filler.status();
  absl::Status last;
  for (int i = 0; i < 1000 && last.ok(); ++i) {
    last = pool->Reserve(filler->session_id, filler->token, peer_, 16).status();
  }
  ASSERT_TRUE(absl::IsResourceExhausted(last)) << last;
  auto owner = pool->Open(Req("guaranteed", "tb"));
  ASSERT_TRUE(owner.ok()) << owner.status();
  // 4 MiB: 64 blocks of 64 KiB (16 tokens of the tiny profile).
  auto r = pool->Reserve(owner->session_id, owner->token, peer_, 64 * 16);
  EXPECT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(pool->CheckInvariants().ok());
}

// A worker cannot make the daemon's heap outgrow pool_bytes by claiming a
// profile whose tokens cost a few bytes of pages but a slot record each: such
// a session is refused, naming the limit, and opens nothing.
TEST_F(KvPoolTest, AProfileWhoseSlotRecordsOutweighItsPagesIsRefused) {
  OpenRequest tiny = Req("tiny");
  tiny.profile = {1, 1, 1, DType::kF16, "tiny"};  // 4 bytes of pages per token
  tiny.block_tokens = 256;
  auto refused = pool_->Open(tiny);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("slot records"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("pool_bytes"), std::string::npos);
  EXPECT_EQ(pool_->num_sessions(), 0u);
  Check();
  // Real models' shapes at the lowest precision polykv stores them in pass,
  // one KV head of 64 dims with int4 keys and int2 values (MQA) included.
  for (const ModelProfile& p : {ModelProfile{24, 2, 64, DType::kF16, "qwen2.5-coder-0.5b"},
                                ModelProfile{32, 1, 64, DType::kF16, "mqa"}}) {
    OpenRequest r = Req(p.model_id);
    r.profile = p;
    r.key_format = PageFormat::kInt4;
    r.value_format = PageFormat::kInt2;
    auto s = pool_->Open(r);
    EXPECT_TRUE(s.ok()) << p.model_id << ": " << s.status();
  }
  Check();
}

}  // namespace
}  // namespace polykv::daemon
