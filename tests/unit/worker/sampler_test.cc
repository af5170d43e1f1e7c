#include "client/worker/sampler.h"

#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace polykv::worker {
namespace {

TEST(SamplerTest, GreedyTakesTheFirstMaximum) {
  Sampler s({.temperature = 0.0f});
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 3.0f, -1.0f, 3.0f}), 1);
}

TEST(SamplerTest, SameSeedSameSequence) {
  const std::vector<float> logits{1.0f, 1.1f, 0.9f, 1.05f, 0.2f};
  for (uint64_t seed : {1ull, 2ull, 12345ull}) {
    SCOPED_TRACE(seed);
    Sampler a({.temperature = 1.0f, .top_p = 1.0f, .seed = seed});
    Sampler b({.temperature = 1.0f, .top_p = 1.0f, .seed = seed});
    for (int i = 0; i < 50; ++i) EXPECT_EQ(a.Sample(logits), b.Sample(logits));
  }
}

TEST(SamplerTest, TopPKeepsOnlyTheNucleus) {
  // Probabilities ~ 0.64, 0.24, 0.09, 0.03: top_p 0.8 keeps ids 0 and 1.
  const std::vector<float> logits{3.0f, 2.0f, 1.0f, 0.0f};
  const uint64_t seed = 7;
  Sampler s({.temperature = 1.0f, .top_p = 0.8f, .seed = seed});
  std::map<int, int> counts;
  for (int i = 0; i < 2000; ++i) ++counts[s.Sample(logits)];
  EXPECT_EQ(counts.count(2), 0u) << "seed " << seed;
  EXPECT_EQ(counts.count(3), 0u) << "seed " << seed;
  EXPECT_GT(counts[0], counts[1]);
  EXPECT_GT(counts[1], 0);
}

}  // namespace
}  // namespace polykv::worker
