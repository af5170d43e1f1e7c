// Batched decode (LlamaModel::ForwardBatch, Conversation::GenerateBatch):
// several sequences per step give each exactly what it gets alone.
#include <cstring>

#include "client/worker/conversation.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/test_util.h"

namespace polykv::worker {
namespace {

using testing::NewLocalStore;

const char* const kQuestions[] = {"Name a color.", "What is 2 + 2? Answer with a number.",
                                  "Write a haiku about the sea.", "Say hi."};

// Runs `check` under both decode numerics, exact and the worker's int8
// activations; false when no model is fetched (nothing ran).
bool UnderBothDecodes(void (*check)(const LoadedModel*)) {
  bool ran = false;
  for (const LoadedModel* m : {testing::SharedModel(), testing::SharedModelNamed("smollm2-135m")}) {
    if (m == nullptr) continue;
    SCOPED_TRACE(m == testing::SharedModel() ? "exact decode" : "int8 decode");
    check(m);
    ran = true;
  }
  return ran;
}

void ExpectForwardBatchRowsAreForwardOfEachSequence(const LoadedModel* model) {
  const LlamaModel& m = *model->model;
  const int vocab = m.config().vocab_size;
  // Three sequences of different lengths, prefilled alone, twice over.
  std::vector<std::unique_ptr<LocalKvStore>> alone, batched;
  std::vector<StepToken> next;
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> ids = model->tokenizer->Encode(kQuestions[i], true);
    std::vector<StepToken> metas;
    for (size_t j = 0; j < ids.size(); ++j) {
      metas.push_back({ids[j], static_cast<int32_t>(j), 0, Role::kUser});
    }
    std::vector<float> logits;
    for (auto* v : {&alone, &batched}) {
      v->push_back(NewLocalStore(m));
      ASSERT_TRUE(m.Forward(metas, v->back().get(), &logits).ok());
    }
    next.push_back({ids.back(), static_cast<int32_t>(ids.size()), 0, Role::kUser});
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<KvStore*> stores;
    for (auto& s : batched) stores.push_back(s.get());
    std::vector<float> rows;
    ASSERT_TRUE(m.ForwardBatch(next, stores, &rows).ok());
    ASSERT_EQ(rows.size(), next.size() * vocab);
    for (size_t i = 0; i < next.size(); ++i) {
      std::vector<float> one;
      ASSERT_TRUE(m.Forward(std::span(&next[i], 1), alone[i].get(), &one).ok());
      ASSERT_EQ(std::memcmp(one.data(), rows.data() + i * vocab, vocab * sizeof(float)), 0)
          << "sequence " << i << " step " << step;
      next[i].position++;
    }
  }
}

TEST(BatchDecodeTest, ForwardBatchRowsAreForwardOfEachSequenceBitForBit) {
  if (!UnderBothDecodes(ExpectForwardBatchRowsAreForwardOfEachSequence)) {
    POLYKV_MISSING_INPUT() << "run scripts/fetch-model.sh smollm2-135m";
  }
}

void ExpectGenerateBatchGivesEachItsOwnAnswer(const LoadedModel* model) {
  ConversationOptions o;
  std::vector<std::unique_ptr<LocalKvStore>> stores;
  std::vector<Conversation> alone, together;
  for (const char* q : kQuestions) {
    for (auto* v : {&alone, &together}) {
      stores.push_back(NewLocalStore(*model->model));
      v->emplace_back(model, stores.back().get(), o);
      ASSERT_TRUE(v->back().AddMessage(Role::kUser, q).ok());
    }
  }
  std::vector<Conversation*> ptrs;
  for (Conversation& c : together) ptrs.push_back(&c);
  // 12 tokens: some answers stop on their own, others at the length.
  const auto results = Conversation::GenerateBatch(ptrs, 12);
  ASSERT_EQ(results.size(), alone.size());
  int stopped = 0;
  for (size_t i = 0; i < alone.size(); ++i) {
    auto want = alone[i].Generate(12);
    ASSERT_TRUE(want.ok() && results[i].ok()) << want.status() << results[i].status();
    EXPECT_EQ(results[i]->tokens, want->tokens) << kQuestions[i];
    EXPECT_EQ(results[i]->stop, want->stop) << kQuestions[i];
    EXPECT_EQ(results[i]->text, want->text);
    EXPECT_EQ(results[i]->prompt_tokens, want->prompt_tokens);
    EXPECT_EQ(results[i]->cached_tokens, want->cached_tokens);
    stopped += want->stop == "eos";
  }
  // The next turn goes on identically.
  for (size_t i = 0; i < alone.size(); ++i) {
    std::vector<float> a, b;
    ASSERT_TRUE(alone[i].AddMessage(Role::kUser, "Thanks.").ok());
    ASSERT_TRUE(together[i].AddMessage(Role::kUser, "Thanks.").ok());
    ASSERT_TRUE(alone[i].Flush(&a).ok());
    ASSERT_TRUE(together[i].Flush(&b).ok());
    EXPECT_EQ(a, b) << kQuestions[i];
  }
  std::printf("%d of %zu answers stopped on their own\n", stopped, alone.size());
}

TEST(BatchDecodeTest, GenerateBatchGivesEachConversationItsOwnAnswer) {
  if (!UnderBothDecodes(ExpectGenerateBatchGivesEachItsOwnAnswer)) {
    POLYKV_MISSING_INPUT() << "run scripts/fetch-model.sh smollm2-135m";
  }
}

TEST(BatchDecodeTest, BadBatchesAreRefused) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  auto s = NewLocalStore(m);
  const StepToken t{1, 0, 0, Role::kUser};
  const StepToken two[] = {t, t};
  KvStore* same[] = {s.get(), s.get()};
  KvStore* one[] = {s.get()};
  std::vector<float> logits;
  EXPECT_FALSE(m.ForwardBatch(two, same, &logits).ok());
  EXPECT_FALSE(m.ForwardBatch(two, one, &logits).ok());
  EXPECT_EQ(s->num_slots(), 0);
  std::vector<Conversation*> none;
  EXPECT_TRUE(Conversation::GenerateBatch(none, 4).empty());
}

}  // namespace
}  // namespace polykv::worker
