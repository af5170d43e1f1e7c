// Trace round trip, parse errors, re-tagging, and the polykv-replay binary.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/replay/trace.h"
#include "policies/synthetic.h"

namespace polykv::policies::replay {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

TEST(TraceTest, RoundTrip) {
  SyntheticOptions o;
  o.seed = 5;
  o.num_tokens = 300;
  o.num_layers = 3;
  o.key_dim = 4;
  o.pinned_fraction = 0.05;
  const SessionView v = MakeSyntheticView(o);
  auto t = ParseTrace(WriteTrace(v));
  ASSERT_TRUE(t.ok()) << t.status();
  const SessionView& w = t->view;
  ASSERT_EQ(w.tokens.size(), v.tokens.size());
  ASSERT_EQ(w.num_layers(), 3);
  EXPECT_EQ(w.current_turn, v.current_turn);
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    EXPECT_EQ(w.tokens[i].position, v.tokens[i].position);
    EXPECT_EQ(w.tokens[i].role, v.tokens[i].role);
    EXPECT_EQ(w.tokens[i].tag.kind, v.tokens[i].tag.kind);
    EXPECT_EQ(w.tokens[i].tag.block_id, v.tokens[i].tag.block_id);
    EXPECT_EQ(w.tokens[i].pinned, v.tokens[i].pinned);
  }
  for (int l = 0; l < 3; ++l) {
    ASSERT_EQ(w.layers[l].slots.size(), v.layers[l].slots.size());
    for (size_t i = 0; i < v.layers[l].slots.size(); ++i) {
      const SlotScores& got = w.layers[l].slots[i].score;
      const SlotScores& want = v.layers[l].slots[i].score;
      EXPECT_NEAR(got[ScoreStream::kAttention], want[ScoreStream::kAttention],
                  1e-5 * std::abs(want[ScoreStream::kAttention]) + 1e-12);
      EXPECT_NEAR(got[ScoreStream::kIntent], want[ScoreStream::kIntent], 1e-5);
    }
    EXPECT_NEAR(w.layers[l].keys[7], v.layers[l].keys[7], 1e-5);
    EXPECT_NEAR(w.layers[l].score[ScoreStream::kEntropy], v.layers[l].score[ScoreStream::kEntropy],
                1e-5);
  }
}

TEST(TraceTest, PartialLayersAndCounts) {
  const std::string jsonl =
      "{\"type\":\"header\",\"num_layers\":2}\n"
      "{\"type\":\"token\",\"pos\":0,\"role\":\"system\",\"attn\":0.5}\n"
      "{\"type\":\"token\",\"pos\":1,\"role\":\"user\",\"attn\":[1,2],\"present\":[1,0]}\n"
      "{\"type\":\"token\",\"pos\":2,\"role\":\"assistant\",\"count\":[3,1]}\n";
  auto t = ParseTrace(jsonl);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->view.layers[0].slots.size(), 3u);
  EXPECT_EQ(t->view.layers[1].slots.size(), 2u);
  EXPECT_EQ(t->view.layers[0].slots[2].count, 3u);
  EXPECT_FLOAT_EQ(t->view.layers[0].slots[1].score[ScoreStream::kAttention], 1.f);
  EXPECT_FLOAT_EQ(t->view.layers[1].slots[0].score[ScoreStream::kAttention], 0.5f);
}

TEST(TraceTest, ErrorsNameTheLine) {
  auto bad =
      ParseTrace("{\"type\":\"header\",\"num_layers\":2}\n{\"type\":\"token\",\"attn\":[1]}\n");
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 2"));
  EXPECT_FALSE(ParseTrace("{\"type\":\"token\"}\n").ok());
  EXPECT_FALSE(ParseTrace("{\"type\":\"header\",\"num_layers\":1}\n{oops\n").ok());
  EXPECT_FALSE(ParseTrace("{\"type\":\"header\",\"num_layers\":1}\n"
                          "{\"type\":\"token\",\"pos\":5}\n{\"type\":\"token\",\"pos\":3}\n")
                   .ok());
}

TEST(TraceTest, RetagFromText) {
  std::string jsonl = "{\"type\":\"header\",\"num_layers\":1}\n";
  const char* pieces[] = {"def", " f", "(x", "):", "\n", "    return", " x", "\n"};
  for (const char* p : pieces) {
    jsonl += Json{{"type", "token"}, {"role", "tool_output"}, {"turn", 1}, {"text", p}}.dump() + "\n";
  }
  auto t = ParseTrace(jsonl);
  ASSERT_TRUE(t.ok()) << t.status();
  Retag(&*t);
  EXPECT_EQ(t->view.tokens[0].tag.kind, BlockKind::kSignature);
  EXPECT_EQ(t->view.tokens[5].tag.kind, BlockKind::kBody);
}

std::string RunReplay(const std::string& args, int* rc) {
  const char* dir = std::getenv("POLYKV_BIN_DIR");
  const std::string cmd = std::string(dir ? dir : "build/bin") + "/polykv-replay " + args;
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t k;
  while ((k = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, k);
  *rc = pclose(f);
  return out;
}

TEST(ReplayToolTest, OnlineReplayKeepsSinksAndReportsJson) {
  int rc = 0;
  const std::string out = RunReplay(
      "--synthetic tokens=3000,layers=2,seed=9,key_dim=8 --policy hybrid "
      "--param window.size=256,pool=64 --budget-tokens 600",
      &rc);
  ASSERT_EQ(rc, 0) << out;
  const Json j = Json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["mode"], "online");
  EXPECT_GT(j["compactions"], 3);
  ASSERT_TRUE(j["protected"].contains("sink4"));
  const Json& sinks = j["protected"]["sink4"];
  EXPECT_EQ(sinks["evicted"], 0);
  EXPECT_EQ(sinks["kept"], 8);  // 4 sinks x 2 layers
  EXPECT_EQ(j["protected"]["system"]["evicted"], 0);  // anchors fit the pool
  for (const Json& l : j["per_layer"]) EXPECT_LE(l["slots"].get<int>(), 660);
}

TEST(ReplayToolTest, OnceWithMergeReportsGroups) {
  int rc = 0;
  const std::string out = RunReplay(
      "--synthetic tokens=2000,layers=2,seed=3,key_dim=8 --policy merge --once "
      "--budget-ratio 0.3",
      &rc);
  ASSERT_EQ(rc, 0) << out;
  const Json j = Json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["compactions"], 1);
  EXPECT_GT(j["merge_groups"], 0);
  for (const Json& l : j["per_layer"]) EXPECT_LE(l["slots"].get<int>(), 600);
}

TEST(ReplayToolTest, BadPolicyFails) {
  int rc = 0;
  RunReplay("--synthetic tokens=100 --policy nope 2>/dev/null", &rc);
  EXPECT_NE(rc, 0);
}

}  // namespace
}  // namespace polykv::policies::replay
