// Admission: QoS records, the sum of guarantees, and AdmitReserve's checks in
// order (ladder refusal, max_bytes, other agents' unused guarantees, the half
// low watermark kept for compactions), each refusal RESOURCE_EXHAUSTED and
// counted. Agents' bytes come from a real BlockPool.
#include "daemon/pool/admission.h"

#include <gtest/gtest.h>

#include "tests/unit/daemon/no_memory_arena.h"

namespace polykv::daemon {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kPool = 1024 * kKiB;
constexpr uint64_t kBlock = 16 * kKiB;  // 2 layers x (4 KiB K + 4 KiB V)

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionTest()
      : blocks_(BlockPoolOptions{kPool, kPool, 16 * kKiB,
                                 [](const ArenaOptions& o) -> absl::StatusOr<std::unique_ptr<Arena>> {
                                   return std::make_unique<NoMemoryArena>(o);
                                 }}) {}

  // Gives `agent` (a session of its own) `n` blocks.
  void Hold(const std::string& agent, uint64_t n) {
    auto& acc = accounts_[agent];
    if (acc.agent_id.empty()) {
      acc = {"t1", agent, 0};
      blocks_.AttachSession(acc);
    }
    auto got = blocks_.Allocate(acc, BlockShape{2, 4096, 4096, PageFormat::kF16, PageFormat::kF16}, n);
    ASSERT_TRUE(got.ok()) << got.status();
  }

  static QosRecord Qos(const std::string& agent, const std::string& policy, uint64_t guaranteed,
                       uint64_t max_bytes = 0) {
    QosRecord q;
    q.agent_id = agent;
    q.policy = policy;
    q.guaranteed_bytes = guaranteed;
    q.max_bytes = max_bytes;
    return q;
  }

  BlockPool blocks_;
  std::map<std::string, BlockAccount> accounts_;
};

void ExpectRefused(const absl::Status& s, absl::string_view says) {
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find(says), absl::string_view::npos) << s;
}

TEST_F(AdmissionTest, RecordsOrTheDefaultAndTheWatermarkDefault) {
  QosRecord def = Qos("", "window", 0);
  def.priority = Priority::kLow;
  Admission adm(def, kPool, 0);
  EXPECT_EQ(adm.low_watermark(), kPool / 10);
  EXPECT_FALSE(adm.HasRecord("a"));
  EXPECT_EQ(adm.For("a").policy, "window");
  EXPECT_EQ(adm.For("a").priority, Priority::kLow);
  EXPECT_EQ(adm.For("a").agent_id, "");
  ASSERT_TRUE(adm.Set(Qos("a", "h2o", 0)).ok());
  EXPECT_TRUE(adm.HasRecord("a"));
  EXPECT_EQ(adm.For("a").policy, "h2o");
  EXPECT_EQ(adm.For("a").agent_id, "a");
  EXPECT_EQ(adm.For("b").policy, "window");
  EXPECT_EQ(Admission(def, kPool, 4096).low_watermark(), 4096u);
  EXPECT_FALSE(adm.refusing());
  EXPECT_EQ(adm.refused(), 0u);
}

TEST_F(AdmissionTest, SetRefusesGuaranteesThatSumOverThePool) {
  Admission adm(QosRecord{}, kPool, 0);
  ASSERT_TRUE(adm.Set(Qos("a", "full", 600 * kKiB)).ok());
  auto over = adm.Set(Qos("b", "full", 500 * kKiB));
  ExpectRefused(over, "more than the pool");
  EXPECT_FALSE(adm.HasRecord("b"));  // nothing stored
  ASSERT_TRUE(adm.Set(Qos("b", "full", 424 * kKiB)).ok());  // exactly the pool
  // Replacing a record counts the new guarantee, not old + new.
  EXPECT_TRUE(absl::IsResourceExhausted(adm.Set(Qos("a", "full", 601 * kKiB))));
  EXPECT_EQ(adm.For("a").guaranteed_bytes, 600 * kKiB);
  ASSERT_TRUE(adm.Set(Qos("a", "full", 600 * kKiB)).ok());
  ASSERT_TRUE(adm.Set(Qos("a", "full", 100 * kKiB)).ok());
  ASSERT_TRUE(adm.Set(Qos("c", "full", 500 * kKiB)).ok());
  EXPECT_EQ(adm.refused(), 0u);  // Set's refusals are not reservation refusals
}

TEST_F(AdmissionTest, LadderRefusalComesFirstAndOnlyWhenBytesAreNeeded) {
  Admission adm(QosRecord{}, kPool, 0);
  ASSERT_TRUE(adm.Set(Qos("capped", "full", 0, kBlock)).ok());
  adm.Refuse(Priority::kLow);
  EXPECT_TRUE(adm.refusing());
  ExpectRefused(adm.AdmitReserve("a", Priority::kLow, kBlock, blocks_), "priority 'low'");
  ExpectRefused(adm.AdmitReserve("a", Priority::kBestEffort, kBlock, blocks_),
                "priority 'best_effort'");
  EXPECT_EQ(adm.refused(), 2u);
  EXPECT_TRUE(adm.AdmitReserve("a", Priority::kNormal, kBlock, blocks_).ok());
  EXPECT_TRUE(adm.AdmitReserve("a", Priority::kLow, 0, blocks_).ok());  // fits its blocks
  EXPECT_EQ(adm.refused(), 2u);
  // Over its max_bytes too, but the ladder's refusal is what it hears.
  ExpectRefused(adm.AdmitReserve("capped", Priority::kLow, 2 * kBlock, blocks_),
                "memory pressure");
  EXPECT_EQ(adm.refused(), 3u);
  adm.Resume();
  EXPECT_FALSE(adm.refusing());
  EXPECT_TRUE(adm.AdmitReserve("a", Priority::kLow, kBlock, blocks_).ok());
  ExpectRefused(adm.AdmitReserve("capped", Priority::kLow, 2 * kBlock, blocks_), "max_bytes");
  EXPECT_EQ(adm.refused(), 4u);
  adm.CountRefusal();
  EXPECT_EQ(adm.refused(), 5u);
}

TEST_F(AdmissionTest, MaxBytesCountsWhatTheAgentAlreadyHolds) {
  Admission adm(QosRecord{}, kPool, 0);
  ASSERT_TRUE(adm.Set(Qos("a", "full", 0, 3 * kBlock)).ok());
  Hold("a", 2);
  EXPECT_TRUE(adm.AdmitReserve("a", Priority::kNormal, kBlock, blocks_).ok());  // exactly the cap
  auto s = adm.AdmitReserve("a", Priority::kNormal, 2 * kBlock, blocks_);
  ExpectRefused(s, "over its max_bytes");
  EXPECT_NE(s.message().find("polykvctl qos set a --max-bytes"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("65536 bytes"), absl::string_view::npos) << s;  // 2 held + 2 asked
  // Another agent's bytes do not count against a's cap; b has no cap.
  Hold("b", 10);
  EXPECT_TRUE(adm.AdmitReserve("a", Priority::kNormal, kBlock, blocks_).ok());
  EXPECT_TRUE(adm.AdmitReserve("b", Priority::kNormal, 20 * kBlock, blocks_).ok());
  EXPECT_EQ(adm.refused(), 1u);
}

TEST_F(AdmissionTest, OtherAgentsUnusedGuaranteesAreNotAvailable) {
  Admission adm(QosRecord{}, kPool, 0);
  ASSERT_TRUE(adm.Set(Qos("b", "full", 512 * kKiB)).ok());
  ASSERT_TRUE(adm.Set(Qos("z", "full", 0)).ok());  // no guarantee: promises nothing
  Hold("a", 2);  // 32 KiB used
  // 32 + 480 + 512 = the pool: fits; 16 KiB more does not.
  EXPECT_TRUE(adm.AdmitReserve("a", Priority::kNormal, 480 * kKiB, blocks_).ok());
  ExpectRefused(adm.AdmitReserve("a", Priority::kNormal, 496 * kKiB, blocks_),
                "guaranteed to other agents");
  // An agent's own guarantee is its own: b may have all but a's 32 KiB.
  EXPECT_TRUE(adm.AdmitReserve("b", Priority::kNormal, 992 * kKiB, blocks_).ok());
  ExpectRefused(adm.AdmitReserve("b", Priority::kNormal, 1008 * kKiB, blocks_), "pool cannot fit");
  // What b uses of its guarantee is counted once, as used bytes.
  Hold("b", 16);  // 256 KiB: 256 KiB still promised
  EXPECT_TRUE(adm.AdmitReserve("a", Priority::kNormal, 480 * kKiB, blocks_).ok());
  ExpectRefused(adm.AdmitReserve("a", Priority::kNormal, 496 * kKiB, blocks_), "pool cannot fit");
  Hold("b", 20);  // 576 KiB: over its guarantee, nothing more promised
  EXPECT_TRUE(adm.AdmitReserve("a", Priority::kNormal, 416 * kKiB, blocks_).ok());
  ExpectRefused(adm.AdmitReserve("a", Priority::kNormal, 432 * kKiB, blocks_), "pool cannot fit");
  EXPECT_EQ(adm.refused(), 4u);
}

TEST_F(AdmissionTest, CompactingPoliciesLeaveHalfTheLowWatermarkForCompactions) {
  QosRecord def;  // default policy "full"
  Admission adm(def, kPool, 128 * kKiB);  // keep 64 KiB
  ASSERT_TRUE(adm.Set(Qos("w", "window", 0)).ok());
  ASSERT_TRUE(adm.Set(Qos("g", "full", 128 * kKiB)).ok());
  Hold("a", 2);  // 32 KiB used; g's 128 KiB promised
  // w: 32 + need + 128 must stay <= 1024 - 64.
  EXPECT_TRUE(adm.AdmitReserve("w", Priority::kNormal, 800 * kKiB, blocks_).ok());
  auto s = adm.AdmitReserve("w", Priority::kNormal, 816 * kKiB, blocks_);
  ExpectRefused(s, "free for compactions");
  EXPECT_NE(s.message().find("64 KiB"), absl::string_view::npos) << s;
  // A "full" agent may use that room (it never needs a compaction's pages).
  EXPECT_TRUE(adm.AdmitReserve("a", Priority::kNormal, 816 * kKiB, blocks_).ok());
  EXPECT_TRUE(adm.AdmitReserve("a", Priority::kNormal, 864 * kKiB, blocks_).ok());
  ExpectRefused(adm.AdmitReserve("a", Priority::kNormal, 880 * kKiB, blocks_),
                "guaranteed to other agents");
  // The default record applies to agents without one.
  Admission compacting(Qos("", "h2o", 0), kPool, 128 * kKiB);
  EXPECT_TRUE(compacting.AdmitReserve("x", Priority::kNormal, 928 * kKiB, blocks_).ok());
  ExpectRefused(compacting.AdmitReserve("x", Priority::kNormal, 944 * kKiB, blocks_),
                "free for compactions");
  EXPECT_EQ(adm.refused(), 2u);
  EXPECT_EQ(compacting.refused(), 1u);
}

TEST_F(AdmissionTest, WithinItsOwnGuaranteeAnAgentSkipsTheLadderAndTheCompactionRoom) {
  Admission adm(QosRecord{}, kPool, 128 * kKiB);  // keep 64 KiB
  ASSERT_TRUE(adm.Set(Qos("g", "window", 256 * kKiB)).ok());
  adm.Refuse(Priority::kHigh);
  EXPECT_TRUE(adm.AdmitReserve("g", Priority::kNormal, 256 * kKiB, blocks_).ok());
  ExpectRefused(adm.AdmitReserve("g", Priority::kNormal, 272 * kKiB, blocks_), "memory pressure");
  adm.Resume();
  Hold("x", 50);  // 800 KiB
  // 800 + 192 > 1024 - 64, but g stays within its 256 KiB guarantee.
  EXPECT_TRUE(adm.AdmitReserve("g", Priority::kNormal, 192 * kKiB, blocks_).ok());
  EXPECT_TRUE(adm.AdmitReserve("g", Priority::kNormal, 224 * kKiB, blocks_).ok());
  // The pool itself is still the limit.
  ExpectRefused(adm.AdmitReserve("g", Priority::kNormal, 240 * kKiB, blocks_), "pool cannot fit");
  EXPECT_EQ(adm.refused(), 2u);
  // The same agent without a guarantee is refused what g got above...
  Admission plain(QosRecord{}, kPool, 128 * kKiB);
  ASSERT_TRUE(plain.Set(Qos("g", "window", 0)).ok());
  ExpectRefused(plain.AdmitReserve("g", Priority::kNormal, 192 * kKiB, blocks_),
                "free for compactions");
  EXPECT_TRUE(plain.AdmitReserve("g", Priority::kNormal, 160 * kKiB, blocks_).ok());  // 960
  // ...and so is g once past its guarantee (it holds 64 KiB; 64 + 208 > 256).
  Hold("g", 4);
  ExpectRefused(adm.AdmitReserve("g", Priority::kNormal, 208 * kKiB, blocks_), "pool cannot fit");
  EXPECT_EQ(plain.refused(), 1u);
}

TEST(HumanBytesTest, PicksTheLargestUnit) {
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(2048), "2 KiB");
  EXPECT_EQ(HumanBytes(3ull << 19), "1.5 MiB");
  EXPECT_EQ(HumanBytes(1ull << 30), "1 GiB");
}

}  // namespace
}  // namespace polykv::daemon
