// The C ABI (client/include/polykv/polykv_c.h) against a real polykvd.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <limits>
#include <memory>
#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "policies/score_stream.h"
#include "polykv/polykv_c.h"
#include "tests/integration/subprocess.h"

extern "C" int polykv_c_abi_reserve_one_block(pkv_session* session);

namespace polykv {
namespace {

using policies::ScoreStream;
static_assert(PKV_STREAM_ATTENTION == static_cast<int>(ScoreStream::kAttention));
static_assert(PKV_STREAM_INTENT == static_cast<int>(ScoreStream::kIntent));
static_assert(PKV_STREAM_IMPORTANCE == static_cast<int>(ScoreStream::kImportance));
static_assert(PKV_STREAM_OBSERVATION == static_cast<int>(ScoreStream::kObservation));
static_assert(PKV_STREAM_ENTROPY == static_cast<int>(ScoreStream::kEntropy));

using testing::BinDir;
using testing::Subprocess;

// A per-slot score stream of the C ABI: the flag OpenSession sets for the
// policies that read it, and the report whose values decide compaction.
struct StreamCase {
  const char* agent;
  const char* policy;
  uint32_t stream;  // PKV_STREAM_*
};

// A polykvd of its own per test, and the options of a small f32 session.
class CAbiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "polykv-cabi-", getpid());
    mkdir(dir_.c_str(), 0700);
    sock_ = dir_ + "/d.sock";
    daemon_ = std::make_unique<Subprocess>(std::vector<std::string>{
        BinDir() + "/polykvd", "--socket", sock_, "--metrics-address", "off", "--pool-bytes",
        "64MiB"});
    for (int i = 0; i < 500 && access(sock_.c_str(), F_OK) != 0; ++i) usleep(20000);
  }
  void TearDown() override {
    daemon_->Signal(SIGTERM);
    EXPECT_EQ(daemon_->Wait(), 0);
  }
  static pkv_session_options Options(const char* agent) {
    pkv_session_options o{};
    o.agent_id = agent;
    o.tenant = "c-tenant";
    o.num_layers = 2;
    o.num_kv_heads = 2;
    o.head_dim = 64;
    o.dtype = PKV_DTYPE_F32;
    // f32 pages of 16 tokens whatever the agent's QoS: the tests count them.
    o.key_format = o.value_format = PKV_FORMAT_F32;
    o.block_tokens = 16;
    return o;
  }
  void ExpectTheStreamDecidesCompaction(const StreamCase& stream);
  // `polykvctl qos set AGENT --policy POLICY --budget-tokens 32`, as an
  // operator would (no share of the context: the budget is 32 tokens).
  void SetQos(const std::string& agent, const std::string& policy) {
    auto [code, out] = testing::RunProgram({BinDir() + "/polykvctl", "--socket", sock_, "qos",
                                            "set", agent, "--policy", policy,
                                            "--budget-tokens", "32", "--budget-fraction", "0"});
    ASSERT_EQ(code, 0) << out;
  }
  // Connects and opens a session of Options(agent).
  void Open(const char* agent, pkv_client** client, pkv_session** session) {
    ASSERT_EQ(pkv_connect(sock_.c_str(), client), 0) << pkv_last_error();
    const pkv_session_options o = Options(agent);
    ASSERT_EQ(pkv_session_open(*client, &o, session), 0) << pkv_last_error();
  }

  std::string dir_, sock_;
  std::unique_ptr<Subprocess> daemon_;
};

TEST_F(CAbiTest, SessionLifecycleAndErrors) {
  pkv_client* client = nullptr;
  ASSERT_EQ(pkv_connect(sock_.c_str(), &client), 0) << pkv_last_error();
  const pkv_session_options o = Options("c-agent");
  pkv_session* session = nullptr;
  ASSERT_EQ(pkv_session_open(client, &o, &session), 0) << pkv_last_error();
  EXPECT_GT(pkv_session_id(session), 0u);
  EXPECT_EQ(pkv_block_tokens(session), 16u);

  ASSERT_EQ(pkv_reserve(session, 20), 0) << pkv_last_error();
  ASSERT_EQ(polykv_c_abi_reserve_one_block(session), 0) << pkv_last_error();
  ASSERT_EQ(pkv_num_blocks(session), 3u);
  pkv_page pages[4];
  size_t n = 0;
  ASSERT_EQ(pkv_block_pages(session, 2, pages, 4, &n), 0) << pkv_last_error();
  ASSERT_EQ(n, 4u);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(pages[i].layer, i / 2);
    EXPECT_EQ(pages[i].is_value, i % 2);
    EXPECT_EQ(pages[i].block_index, 2u);
    EXPECT_EQ(pages[i].format, uint32_t{PKV_FORMAT_F32});  // the dtype's format
    ASSERT_NE(pages[i].addr, nullptr);
    std::memset(pages[i].addr, 0x5a, pages[i].size_bytes);  // the mapping is writable
  }
  EXPECT_EQ(pkv_commit(session, 40), 0) << pkv_last_error();

  // Errors: a code and a message, and nothing changes.
  EXPECT_EQ(pkv_commit(session, 1000), 3);  // INVALID_ARGUMENT: beyond the reserve
  EXPECT_NE(std::string(pkv_last_error()).find("reserved"), std::string::npos) << pkv_last_error();
  EXPECT_EQ(pkv_block_pages(session, 7, pages, 4, &n), 11);  // OUT_OF_RANGE
  EXPECT_EQ(pkv_session_open(client, nullptr, &session), 3);
  pkv_session_options bad = o;
  bad.num_layers = 0;
  pkv_session* none = nullptr;
  EXPECT_EQ(pkv_session_open(client, &bad, &none), 3);
  EXPECT_NE(std::string(pkv_last_error()).find("num_layers"), std::string::npos);
  EXPECT_EQ(none, nullptr);
  bad = o;
  bad.dtype = 0x101;  // would wrap to f32 in the C++ type
  EXPECT_EQ(pkv_session_open(client, &bad, &none), 3);
  EXPECT_NE(std::string(pkv_last_error()).find("dtype"), std::string::npos);
  bad = o;
  bad.key_format = PKV_FORMAT_INT2 + 1;
  EXPECT_EQ(pkv_session_open(client, &bad, &none), 3);
  EXPECT_NE(std::string(pkv_last_error()).find("key_format"), std::string::npos);
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(pkv_num_blocks(session), 3u);

  // Idle: nothing but pkv_sync until pkv_sync (no move here: unchanged).
  ASSERT_EQ(pkv_idle(session), 0) << pkv_last_error();
  EXPECT_EQ(pkv_reserve(session, 16), 9);  // FAILED_PRECONDITION
  EXPECT_NE(std::string(pkv_last_error()).find("idle"), std::string::npos) << pkv_last_error();
  int changed = -1;
  ASSERT_EQ(pkv_sync(session, &changed), 0) << pkv_last_error();
  EXPECT_EQ(changed, 0);
  EXPECT_EQ(pkv_moves(session), 0u);
  EXPECT_EQ(pkv_idle(nullptr), 3);

  EXPECT_EQ(pkv_release(session, 16), 0) << pkv_last_error();
  EXPECT_EQ(pkv_num_blocks(session), 1u);
  EXPECT_EQ(pkv_session_close(session), 0) << pkv_last_error();
  EXPECT_EQ(pkv_session_close(nullptr), 0);
  pkv_client_free(client);

  pkv_client* nobody = nullptr;
  EXPECT_EQ(pkv_connect((dir_ + "/missing.sock").c_str(), &nobody), 14);  // UNAVAILABLE
  EXPECT_EQ(nobody, nullptr);
}

// The policy engine through the C ABI: reports reach the daemon, a compaction
// at the QoS budget follows, and pkv_sync / pkv_slot_info describe it.
TEST_F(CAbiTest, ReportsReachTheDaemonAndSyncAdoptsItsCompaction) {
  ASSERT_NO_FATAL_FAILURE(SetQos("c-h2o", "h2o"));
  pkv_client* client = nullptr;
  pkv_session* session = nullptr;
  ASSERT_NO_FATAL_FAILURE(Open("c-h2o", &client, &session));
  ASSERT_EQ(pkv_reserve(session, 64), 0) << pkv_last_error();
  ASSERT_EQ(pkv_commit(session, 64), 0) << pkv_last_error();
  int changed = -1;
  int64_t pos[64];
  EXPECT_EQ(pkv_slot_info(session, 0, 1, pos, nullptr), 11);  // OUT_OF_RANGE: no compaction yet

  // Bad metadata is refused before anything is sent.
  pkv_slot_meta meta[64] = {};
  meta[3].role = 99;
  EXPECT_EQ(pkv_report_slots(session, 0, 64, meta, 0), 3);
  EXPECT_NE(std::string(pkv_last_error()).find("meta[3]"), std::string::npos) << pkv_last_error();
  meta[3].role = PKV_ROLE_USER;
  // Slot 5 is a heavy hitter, slot 7 pinned: h2o keeps both.
  float attention[64];
  for (float& a : attention) a = 0.01f;
  attention[5] = 50.f;
  meta[7].pinned = 1;
  ASSERT_EQ(pkv_report_slots(session, 0, 64, meta, 1), 0) << pkv_last_error();
  ASSERT_EQ(pkv_report(session, PKV_STREAM_ATTENTION, 0, 0, attention, 64), 0)
      << pkv_last_error();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(pkv_report(session, PKV_STREAM_INTENT, 0, 0, &nan, 1), 3);  // values finite
  float relevance[64] = {};
  ASSERT_EQ(pkv_report(session, PKV_STREAM_INTENT, 0, 0, relevance, 64), 0) << pkv_last_error();

  ASSERT_EQ(pkv_sync(session, &changed), 0) << pkv_last_error();
  EXPECT_EQ(changed, 1);
  EXPECT_EQ(pkv_epoch(session), 1u);
  const uint64_t kept = pkv_committed_tokens(session);
  EXPECT_EQ(kept, 32u);
  uint32_t counts[64];
  ASSERT_EQ(pkv_slot_info(session, 0, kept, pos, counts), 0) << pkv_last_error();
  bool has5 = false, has7 = false;
  for (uint64_t i = 0; i < kept; ++i) {
    has5 |= pos[i] == 5;
    has7 |= pos[i] == 7;
    EXPECT_EQ(counts[i], 1u);
  }
  EXPECT_TRUE(has5);
  EXPECT_TRUE(has7);
  EXPECT_EQ(pkv_slot_info(session, kept, 1, pos, counts), 11);
  ASSERT_EQ(pkv_sync(session, &changed), 0) << pkv_last_error();
  EXPECT_EQ(changed, 0);
  EXPECT_EQ(pkv_session_close(session), 0) << pkv_last_error();
  pkv_client_free(client);
}

// An agent whose policy ranks by the stream is told so at open, and what it
// reports decides its compaction.
void CAbiTest::ExpectTheStreamDecidesCompaction(const StreamCase& stream) {
  ASSERT_NO_FATAL_FAILURE(SetQos(stream.agent, stream.policy));
  pkv_client* client = nullptr;
  pkv_session* session = nullptr;
  ASSERT_NO_FATAL_FAILURE(Open(stream.agent, &client, &session));
  EXPECT_EQ(pkv_wants(session, stream.stream), 1);
  EXPECT_EQ(pkv_wants(nullptr, stream.stream), 0);
  EXPECT_EQ(pkv_wants(session, 99), 0);
  ASSERT_EQ(pkv_reserve(session, 64), 0) << pkv_last_error();
  ASSERT_EQ(pkv_commit(session, 64), 0) << pkv_last_error();
  const float negative = -1.f;
  EXPECT_EQ(pkv_report(session, stream.stream, 0, 0, &negative, 1), 3);  // values >= 0
  EXPECT_EQ(pkv_report(session, stream.stream, 0, 0, nullptr, 1), 3);
  EXPECT_EQ(pkv_report(session, 99, 0, 0, &negative, 1), 3);  // no such stream
  float scores[64];
  for (float& x : scores) x = 0.01f;
  scores[20] = scores[21] = 9.f;
  ASSERT_EQ(pkv_report(session, stream.stream, 0, 0, scores, 64), 0) << pkv_last_error();
  int changed = -1;
  ASSERT_EQ(pkv_sync(session, &changed), 0) << pkv_last_error();
  EXPECT_EQ(changed, 1);
  const uint64_t kept = pkv_committed_tokens(session);
  ASSERT_GT(kept, 0u);
  ASSERT_LT(kept, 64u);
  int64_t pos[64];
  ASSERT_EQ(pkv_slot_info(session, 0, kept, pos, nullptr), 0) << pkv_last_error();
  bool has20 = false, has21 = false;
  for (uint64_t i = 0; i < kept; ++i) {
    has20 |= pos[i] == 20;
    has21 |= pos[i] == 21;
  }
  EXPECT_TRUE(has20 && has21);
  EXPECT_EQ(pkv_session_close(session), 0) << pkv_last_error();
  pkv_client_free(client);
}

// kvzip{select=layer}: the worker reports importance per layer, and each
// layer keeps the slots its own report ranked highest.
TEST_F(CAbiTest, PerLayerSelectionKeepsEachLayersReportedSlots) {
  ASSERT_NO_FATAL_FAILURE(SetQos("c-layer", "kvzip{select=layer,window.size=4}"));
  pkv_client* client = nullptr;
  pkv_session* session = nullptr;
  ASSERT_NO_FATAL_FAILURE(Open("c-layer", &client, &session));
  EXPECT_EQ(pkv_wants(session, PKV_STREAM_IMPORTANCE), 1);
  EXPECT_EQ(pkv_wants_per_layer(session), 1);
  EXPECT_EQ(pkv_wants_per_layer(nullptr), 0);
  ASSERT_EQ(pkv_reserve(session, 64), 0) << pkv_last_error();
  ASSERT_EQ(pkv_commit(session, 64), 0) << pkv_last_error();
  float scores[2 * 64];
  for (float& x : scores) x = 0.01f;
  // Old slots (ties among the rest go to the recent ones).
  scores[5] = scores[6] = 9.f;              // layer 0
  scores[64 + 10] = scores[64 + 11] = 9.f;  // layer 1
  EXPECT_EQ(pkv_report(session, PKV_STREAM_IMPORTANCE, 0, 1, scores, 3), 3);  // [2 x n]
  scores[64] = -1.f;
  EXPECT_EQ(pkv_report(session, PKV_STREAM_IMPORTANCE, 0, 1, scores, 128), 3);  // values >= 0
  scores[64] = 0.01f;
  ASSERT_EQ(pkv_report(session, PKV_STREAM_IMPORTANCE, 0, 1, scores, 128), 0)
      << pkv_last_error();
  int changed = -1;
  ASSERT_EQ(pkv_sync(session, &changed), 0) << pkv_last_error();
  ASSERT_EQ(changed, 1);
  const uint64_t kept = pkv_committed_tokens(session);
  ASSERT_GT(kept, 0u);
  ASSERT_LT(kept, 64u);
  for (uint32_t layer : {0u, 1u}) {
    int64_t pos[64];
    ASSERT_EQ(pkv_layer_slot_info(session, layer, 0, kept, pos), 0) << pkv_last_error();
    const std::set<int64_t> held(pos, pos + kept);
    const int64_t mine = layer == 0 ? 5 : 10, other = layer == 0 ? 10 : 5;
    EXPECT_TRUE(held.contains(mine) && held.contains(mine + 1)) << "layer " << layer;
    EXPECT_FALSE(held.contains(other)) << "layer " << layer;
  }
  int64_t pos0[64];
  ASSERT_EQ(pkv_slot_info(session, 0, kept, pos0, nullptr), 0) << pkv_last_error();
  EXPECT_TRUE(std::set<int64_t>(pos0, pos0 + kept).contains(5));  // layer 0's
  EXPECT_EQ(pkv_layer_slot_info(session, 2, 0, 1, pos0), 11);     // OUT_OF_RANGE
  EXPECT_EQ(pkv_session_close(session), 0) << pkv_last_error();
  pkv_client_free(client);
}

// A session that asks for nothing, on a polykvd started with no config, gets
// the built-in default QoS: int8 keys and int4 values on 64-token pages, and a
// kvzip policy that wants the worker's importance.
TEST_F(CAbiTest, ASessionAskingNothingGetsTheBuiltInDefault) {
  pkv_client* client = nullptr;
  ASSERT_EQ(pkv_connect(sock_.c_str(), &client), 0) << pkv_last_error();
  pkv_session_options o = Options("c-default");
  o.key_format = o.value_format = PKV_FORMAT_DEFAULT;
  o.block_tokens = 0;
  pkv_session* session = nullptr;
  ASSERT_EQ(pkv_session_open(client, &o, &session), 0) << pkv_last_error();
  EXPECT_EQ(pkv_block_tokens(session), 64u);
  EXPECT_EQ(pkv_wants(session, PKV_STREAM_IMPORTANCE), 1);
  ASSERT_EQ(pkv_reserve(session, 64), 0) << pkv_last_error();
  pkv_page pages[4];
  size_t n = 0;
  ASSERT_EQ(pkv_block_pages(session, 0, pages, 4, &n), 0) << pkv_last_error();
  ASSERT_EQ(n, 4u);  // K and V of both layers
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(pages[i].format, pages[i].is_value ? uint32_t{PKV_FORMAT_INT4}
                                                 : uint32_t{PKV_FORMAT_INT8});
  }
  EXPECT_EQ(pkv_session_close(session), 0);
  pkv_client_free(client);
}

// kvzip{select=layer,layers=importance}: the layer whose tokens matter more
// keeps more; the other holds none of the oldest block, whose entries for it
// are empty (size 0, no address) and whose slot positions are -1.
TEST_F(CAbiTest, ImportanceBudgetsLeaveALayerWithoutTheOldestBlock) {
  ASSERT_NO_FATAL_FAILURE(SetQos("c-budgets", "kvzip{select=layer,layers=importance,window.size=4}"));
  pkv_client* client = nullptr;
  pkv_session* session = nullptr;
  ASSERT_NO_FATAL_FAILURE(Open("c-budgets", &client, &session));
  ASSERT_EQ(pkv_block_tokens(session), 16u);
  ASSERT_EQ(pkv_reserve(session, 64), 0) << pkv_last_error();
  ASSERT_EQ(pkv_commit(session, 64), 0) << pkv_last_error();
  float scores[2 * 64];
  for (float& x : scores) x = 0.01f;
  scores[5] = scores[6] = 9.f;                         // layer 0: two slots matter
  for (int i = 0; i < 40; ++i) scores[64 + i] = 9.f;  // layer 1: forty
  ASSERT_EQ(pkv_report(session, PKV_STREAM_IMPORTANCE, 0, 1, scores, 128), 0)
      << pkv_last_error();
  int changed = -1;
  ASSERT_EQ(pkv_sync(session, &changed), 0) << pkv_last_error();
  ASSERT_EQ(changed, 1);
  // 64 of 128 kept: the 42 scored 9, then 22 of the 86 tied, by how many
  // each layer has (62 and 24): 16 and 6, so 18 and 46; layer 0's rounded
  // to differ by whole blocks: 30.
  ASSERT_EQ(pkv_committed_tokens(session), 46u);
  ASSERT_EQ(pkv_num_blocks(session), 3u);
  pkv_page pages[4];
  size_t n = 0;
  for (size_t b = 0; b < 3; ++b) {
    ASSERT_EQ(pkv_block_pages(session, b, pages, 4, &n), 0) << pkv_last_error();
    ASSERT_EQ(n, 4u);
    for (int i = 0; i < 4; ++i) {
      const bool absent = b == 0 && pages[i].layer == 0;
      EXPECT_EQ(pages[i].size_bytes == 0, absent) << "block " << b << " page " << i;
      EXPECT_EQ(pages[i].addr == nullptr, absent) << "block " << b << " page " << i;
    }
  }
  int64_t pos[46];
  ASSERT_EQ(pkv_layer_slot_info(session, 0, 0, 46, pos), 0) << pkv_last_error();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(pos[i], -1) << i;
  const std::set<int64_t> held0(pos + 16, pos + 46);
  EXPECT_TRUE(held0.contains(5) && held0.contains(6));
  ASSERT_EQ(pkv_layer_slot_info(session, 1, 0, 46, pos), 0) << pkv_last_error();
  EXPECT_EQ(std::count_if(pos, pos + 46, [](int64_t p) { return p >= 0 && p < 40; }), 40);
  EXPECT_EQ(pkv_release(session, 16), 9);  // FAILED_PRECONDITION: layer 0 would hold none
  EXPECT_EQ(pkv_committed_tokens(session), 46u);
  EXPECT_EQ(pkv_session_close(session), 0) << pkv_last_error();
  pkv_client_free(client);
}

// The operator switches the agent to kvzip mid-session: the worker learns
// at its next pkv_sync that the policy now reads importance.
TEST_F(CAbiTest, AQosChangeMidSessionReachesTheWorkerAtItsNextSync) {
  const std::string ctl = BinDir() + "/polykvctl";
  auto [code, out] =
      testing::RunProgram({ctl, "--socket", sock_, "qos", "set", "c-switch", "--policy", "h2o"});
  ASSERT_EQ(code, 0) << out;
  pkv_client* client = nullptr;
  ASSERT_EQ(pkv_connect(sock_.c_str(), &client), 0) << pkv_last_error();
  const pkv_session_options o = Options("c-switch");
  pkv_session* session = nullptr;
  ASSERT_EQ(pkv_session_open(client, &o, &session), 0) << pkv_last_error();
  EXPECT_EQ(pkv_wants(session, PKV_STREAM_IMPORTANCE), 0);
  std::tie(code, out) =
      testing::RunProgram({ctl, "--socket", sock_, "qos", "set", "c-switch", "--policy", "kvzip"});
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(pkv_wants(session, PKV_STREAM_IMPORTANCE), 0);  // not before it asks
  int changed = -1;
  ASSERT_EQ(pkv_sync(session, &changed), 0) << pkv_last_error();
  EXPECT_EQ(changed, 0);
  EXPECT_EQ(pkv_wants(session, PKV_STREAM_IMPORTANCE), 1);
  EXPECT_EQ(pkv_wants(session, PKV_STREAM_OBSERVATION), 0);
  EXPECT_EQ(pkv_session_close(session), 0) << pkv_last_error();
  pkv_client_free(client);
}

TEST_F(CAbiTest, KvzipAsksForImportanceAndKeepsWhatItReports) {
  ExpectTheStreamDecidesCompaction(
      {"c-kvzip", "kvzip{window.size=4}", PKV_STREAM_IMPORTANCE});
}

// h2o.decay crosses the wire (OpenSession's reply) to the worker, which ages
// the mass it has not reported by it; a policy without it sums.
TEST_F(CAbiTest, TheAttentionDecayOfTheAgentsPolicyReachesTheWorker) {
  for (auto [agent, policy, decay] : {std::tuple{"c-decay", "h2o{h2o.decay=0.95}", 0.95f},
                                      std::tuple{"c-sum", "h2o", 1.f}}) {
    ASSERT_NO_FATAL_FAILURE(SetQos(agent, policy));
    pkv_client* client = nullptr;
    pkv_session* session = nullptr;
    ASSERT_NO_FATAL_FAILURE(Open(agent, &client, &session));
    EXPECT_EQ(pkv_wants(session, PKV_STREAM_ATTENTION), 1) << policy;
    EXPECT_FLOAT_EQ(pkv_attention_decay(session), decay) << policy;
    EXPECT_EQ(pkv_session_close(session), 0) << pkv_last_error();
    pkv_client_free(client);
  }
  EXPECT_FLOAT_EQ(pkv_attention_decay(nullptr), 1.f);
}

TEST_F(CAbiTest, SnapkvAsksForItsObservationWindowAndKeepsWhatItReports) {
  ExpectTheStreamDecidesCompaction(
      {"c-snapkv", "snapkv{window.size=4,snapkv.kernel=1}", PKV_STREAM_OBSERVATION});
}

}  // namespace
}  // namespace polykv
