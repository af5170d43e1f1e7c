// Top-k log-probabilities and the teacher-forced KL / top-1 measure
// (client/worker/logprobs.h) against brute-force sums over the vocabulary.
#include "client/worker/logprobs.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace polykv::worker {
namespace {

std::vector<float> RandomLogits(int vocab, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> out(vocab);
  for (float& x : out) x = d(rng);
  return out;
}

std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  double top = logits[0];
  for (float l : logits) top = std::max<double>(top, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(l - top);
  std::vector<double> out;
  for (float l : logits) out.push_back(l - top - std::log(sum));
  return out;
}

double ExactKl(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  const auto lp = LogSoftmax(p_logits), lq = LogSoftmax(q_logits);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return kl;
}

TEST(LogprobsTest, TopKIsTheMostLikelyTokensWithNormalizedLogprobs) {
  const auto logits = RandomLogits(500, 1);
  const auto lp = LogSoftmax(logits);
  const TopLogprobs top = TopK(logits, 8);
  ASSERT_EQ(top.ids.size(), 8u);
  for (size_t i = 0; i < top.ids.size(); ++i) {
    EXPECT_NEAR(top.logprobs[i], lp[top.ids[i]], 1e-5);
    if (i > 0) {
      EXPECT_GE(top.logprobs[i - 1], top.logprobs[i]);
    }
  }
  // Nothing outside the top 8 beats its last.
  int better = 0;
  for (double x : lp) better += x > top.logprobs.back() + 1e-6;
  EXPECT_EQ(better, 7);
  EXPECT_EQ(TopK(logits, 9999).ids.size(), 500u);
}

TEST(LogprobsTest, KlIsExactWithTheWholeVocabularyAndALowerBoundWithLess) {
  const auto p = RandomLogits(300, 2), q = RandomLogits(300, 3);
  const double exact = ExactKl(p, q);
  ASSERT_GT(exact, 0.1);
  const ForcedStep all = ScoreStep(TopK(p, 300), 0, q);
  EXPECT_NEAR(all.kl, exact, 1e-4 * exact);
  for (int k : {1, 4, 32, 128}) {
    const ForcedStep part = ScoreStep(TopK(p, k), 0, q);
    EXPECT_LE(part.kl, exact + 1e-6) << "k=" << k;
    EXPECT_GT(part.kl, 0) << "k=" << k;
  }
  // The bound tightens as k grows.
  EXPECT_LE(ScoreStep(TopK(p, 4), 0, q).kl, ScoreStep(TopK(p, 128), 0, q).kl + 1e-9);
}

TEST(LogprobsTest, TheSameDistributionScoresZeroAndTop1) {
  const auto p = RandomLogits(1000, 4);
  const TopLogprobs top = TopK(p, 16);
  const ForcedStep s = ScoreStep(top, top.ids[0], p);
  EXPECT_NEAR(s.kl, 0, 1e-6);
  EXPECT_TRUE(s.top1);
  EXPECT_NEAR(s.target_logprob, top.logprobs[0], 1e-5);
  // Another target: its log-probability; top-1 is against the reference's top.
  const ForcedStep other = ScoreStep(top, top.ids[3], p);
  EXPECT_TRUE(other.top1);
  EXPECT_NEAR(other.target_logprob, top.logprobs[3], 1e-5);
  std::vector<float> q = p;
  q[top.ids[3]] += 100.0f;  // another argmax
  EXPECT_FALSE(ScoreStep(top, top.ids[0], q).top1);
}

TEST(LogprobsTest, SummaryAverages) {
  ForcedSummary sum;
  sum.Add({0.5, true, -1.0});
  sum.Add({1.5, false, -3.0});
  EXPECT_EQ(sum.positions, 2);
  EXPECT_DOUBLE_EQ(sum.kl_mean(), 1.0);
  EXPECT_DOUBLE_EQ(sum.kl_max, 1.5);
  EXPECT_DOUBLE_EQ(sum.top1_agreement(), 0.5);
  EXPECT_DOUBLE_EQ(sum.target_logprob_mean(), -2.0);
  EXPECT_EQ(ForcedSummary{}.kl_mean(), 0);
}

TEST(LogprobsTest, ReferenceTurnRoundTripsAndBadLinesAreRefused) {
  ReferenceTurn t{"q1", {5, 7, 2}, {}};
  for (int i = 0; i < 3; ++i) t.top.push_back(TopK(RandomLogits(50, 10 + i), 4));
  auto back = ParseReferenceTurn(ReferenceTurnJson(t));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->id, "q1");
  EXPECT_EQ(back->targets, t.targets);
  ASSERT_EQ(back->top.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(back->top[i].ids, t.top[i].ids);
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(back->top[i].logprobs[j], t.top[i].logprobs[j], 1e-6);
  }
  for (const char* bad : {
           "[1,2]",
           R"({"targets":[1,2],"top_ids":[[1]],"top_logprobs":[[-0.1]]})",
           R"({"targets":[1],"top_ids":[[1,2]],"top_logprobs":[[-0.1]]})",
           R"({"targets":[],"top_ids":[],"top_logprobs":[]})",
           R"({"targets":["a"],"top_ids":[[1]],"top_logprobs":[[-0.1]]})",
           R"({"top_ids":[[1]],"top_logprobs":[[-0.1]]})",
           "not json",
       }) {
    EXPECT_FALSE(ParseReferenceTurn(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace polykv::worker
