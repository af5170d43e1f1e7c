// Conversation::ForceTurn (teacher forcing): forcing a cache's own greedy
// answer reproduces it, the conversation goes on as if generated, and a
// different context is measured as different.
#include <cmath>

#include "client/worker/conversation.h"
#include "client/worker/logprobs.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/test_util.h"

namespace polykv::worker {
namespace {

using testing::NewLocalStore;

struct Recorded {
  TurnResult turn;
  ReferenceTurn reference;
};

Recorded GenerateRecorded(const LoadedModel* model, Conversation* conv, int max_new) {
  Recorded out;
  auto r = conv->Generate(max_new, "", {}, "", [&](int, std::span<const float> logits) {
    out.reference.top.push_back(TopK(logits, 64));
  });
  EXPECT_TRUE(r.ok()) << r.status();
  out.turn = *r;
  out.reference.targets = r->tokens;
  if (r->stop == "eos") out.reference.targets.push_back(r->stop_token);
  return out;
}

ForcedSummary Force(Conversation* conv, const ReferenceTurn& ref, TurnResult* turn = nullptr) {
  ForcedSummary sum;
  auto r = conv->ForceTurn(ref.targets, "", "", [&](int step, std::span<const float> logits) {
    sum.Add(ScoreStep(ref.top[step], ref.targets[step], logits));
  });
  EXPECT_TRUE(r.ok()) << r.status();
  if (turn != nullptr && r.ok()) *turn = *r;
  return sum;
}

TEST(ForcedTurnTest, ForcingTheGreedyAnswerOnTheSameCacheReproducesIt) {
  POLYKV_REQUIRE_MODEL();
  for (int max_new : {40, 6}) {  // one that stops on its own, one cut at the length
    auto sa = NewLocalStore(*model->model), sb = NewLocalStore(*model->model);
    ConversationOptions o;
    o.prefill_chunk = 16;  // the forced tokens span several chunks
    Conversation a(model, sa.get(), o), b(model, sb.get(), o);
    for (Conversation* c : {&a, &b}) {
      ASSERT_TRUE(c->AddMessage(Role::kUser, "List three fruits, one per line.").ok());
    }
    const Recorded ref = GenerateRecorded(model, &a, max_new);
    ASSERT_EQ(ref.reference.targets.size(), ref.reference.top.size());
    TurnResult forced_turn;
    const ForcedSummary sum = Force(&b, ref.reference, &forced_turn);
    EXPECT_EQ(sum.positions, static_cast<int>(ref.reference.targets.size()));
    EXPECT_EQ(sum.top1_agreement(), 1.0) << "max_new " << max_new;
    // Chunked prefill against one token per step: float rounding only.
    EXPECT_LT(sum.kl_max, 1e-4) << "max_new " << max_new;
    EXPECT_EQ(forced_turn.tokens, ref.turn.tokens);
    EXPECT_EQ(forced_turn.stop, ref.turn.stop);
    EXPECT_EQ(forced_turn.text, ref.turn.text);

    // Both conversations continue the same way.
    std::vector<float> la, lb;
    for (Conversation* c : {&a, &b}) ASSERT_TRUE(c->AddMessage(Role::kUser, "And a fourth?").ok());
    ASSERT_TRUE(a.Flush(&la).ok());
    ASSERT_TRUE(b.Flush(&lb).ok());
    EXPECT_EQ(sa->num_slots(), sb->num_slots());
    float diff = 0;
    for (size_t i = 0; i < la.size(); ++i) diff = std::max(diff, std::abs(la[i] - lb[i]));
    EXPECT_LT(diff, 1e-3f);
  }
}

TEST(ForcedTurnTest, AnotherContextIsMeasuredAsDifferent) {
  POLYKV_REQUIRE_MODEL();
  auto sa = NewLocalStore(*model->model), sb = NewLocalStore(*model->model);
  ConversationOptions o;
  Conversation a(model, sa.get(), o), b(model, sb.get(), o);
  ASSERT_TRUE(a.AddMessage(Role::kUser, "The code word is PELICAN. What is the code word?").ok());
  ASSERT_TRUE(b.AddMessage(Role::kUser, "The code word is WALRUS. What is the code word?").ok());
  const Recorded ref = GenerateRecorded(model, &a, 24);
  const ForcedSummary sum = Force(&b, ref.reference);
  EXPECT_GT(sum.kl_max, 0.5);
  EXPECT_GT(sum.kl_mean(), 1e-3);
}

TEST(ForcedTurnTest, BadTargetsAreRefusedBeforeAnythingRuns) {
  POLYKV_REQUIRE_MODEL();
  auto s = NewLocalStore(*model->model);
  Conversation c(model, s.get(), ConversationOptions{});
  ASSERT_TRUE(c.AddMessage(Role::kUser, "Hi").ok());
  const int32_t eot = model->tokenizer->TokenId(model->chat_template.end_of_turn());
  const int vocab = model->model->config().vocab_size;
  const auto none = [](int, std::span<const float>) {};
  EXPECT_FALSE(c.ForceTurn({}, "", "", none).ok());
  EXPECT_FALSE(c.ForceTurn({1, vocab}, "", "", none).ok());
  EXPECT_FALSE(c.ForceTurn({1, -2}, "", "", none).ok());
  EXPECT_FALSE(c.ForceTurn({1, eot, 2}, "", "", none).ok());
  EXPECT_EQ(s->num_slots(), 0);
  EXPECT_EQ(c.turns(), 1);
}

}  // namespace
}  // namespace polykv::worker
