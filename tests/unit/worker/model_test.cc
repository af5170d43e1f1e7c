// The Llama forward pass against transformers' LlamaForCausalLM (fixtures from
// scripts/make-worker-fixtures.py), and the properties the KV cache must keep:
// chunked prefill == token-by-token decode, incremental multi-turn == full
// recompute, attention mass conservation.
#include "client/worker/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "client/worker/sampler.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/test_util.h"

namespace polykv::worker {
namespace {

using testing::Field;
using testing::IntArray;
using testing::NumArray;
using testing::ReadFixture;

std::unique_ptr<LocalKvStore> NewStore(const LlamaModel& m, bool mass = false,
                                       LocalAttention attention = LocalAttention::kKernels) {
  LocalKvStoreOptions o;
  o.shape = m.config().kv_shape();
  o.track_attention_mass = mass;
  o.attention = attention;
  auto s = LocalKvStore::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

std::vector<StepToken> Metas(const std::vector<int32_t>& ids, int32_t first_pos = 0) {
  std::vector<StepToken> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    out.push_back({ids[i], static_cast<int32_t>(first_pos + i), 0, Role::kUser});
  }
  return out;
}

// Prefills `ids` in chunks of `chunk`; returns the last token's logits.
std::vector<float> Prefill(const LlamaModel& m, KvStore* store, const std::vector<int32_t>& ids,
                           int chunk, int32_t first_pos = 0) {
  const auto metas = Metas(ids, first_pos);
  std::vector<float> logits;
  for (size_t i = 0; i < metas.size(); i += chunk) {
    const size_t n = std::min(metas.size() - i, static_cast<size_t>(chunk));
    absl::Status s = m.Forward(std::span(metas).subspan(i, n), store, &logits);
    EXPECT_TRUE(s.ok()) << s;
  }
  return logits;
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

TEST(ModelTest, LogitsMatchTransformers) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  const auto rows = ReadFixture("logits_cases.jsonl");
  ASSERT_GE(rows.size(), 20u);
  float worst = 0, smallest_margin = 1e9f;
  for (const JsonValue& row : rows) {
    const auto ids = IntArray(Field(row, "ids"));
    SCOPED_TRACE(JsonQuote(Field(row, "text").get_ref<const std::string&>()));
    // The fixture's ids are the reference tokenizer's; ours must agree.
    EXPECT_EQ(model->tokenizer->Encode(Field(row, "text").get_ref<const std::string&>(), true), ids);
    auto store = NewStore(m);
    const std::vector<float> logits = Prefill(m, store.get(), ids, 64);
    ASSERT_EQ(logits.size(), static_cast<size_t>(m.config().vocab_size));
    EXPECT_EQ(Argmax(logits), static_cast<int32_t>(Field(row, "argmax").get<double>()));
    float diff = 0;
    for (const char* which : {"top", "probe"}) {
      const auto want_ids = IntArray(Field(row, std::string(which) + "_ids"));
      const auto want = NumArray(Field(row, std::string(which) + "_logits"));
      for (size_t i = 0; i < want_ids.size(); ++i) {
        diff = std::max(diff, static_cast<float>(std::abs(logits[want_ids[i]] - want[i])));
      }
    }
    EXPECT_LT(diff, 2e-3f);
    worst = std::max(worst, diff);
    smallest_margin = std::min(smallest_margin, static_cast<float>(Field(row, "margin").get<double>()));
  }
  std::printf("logits: %zu prompts, max |ours - transformers| = %.3g (top-64 + 256 probes), "
              "smallest reference top-1 margin %.3g\n",
              rows.size(), worst, smallest_margin);
}

TEST(ModelTest, KernelAndBlasAttentionAgree) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  const auto rows = ReadFixture("logits_cases.jsonl");
  ASSERT_GE(rows.size(), 4u);
  for (size_t i = 0; i < rows.size(); i += 12) {
    const auto ids = IntArray(Field(rows[i], "ids"));
    auto a = NewStore(m, false, LocalAttention::kKernels);
    auto b = NewStore(m, false, LocalAttention::kBlas);
    EXPECT_LT(MaxAbsDiff(Prefill(m, a.get(), ids, 16), Prefill(m, b.get(), ids, 16)), 1e-3f);
  }
}

TEST(ModelTest, GreedyDecodeMatchesTransformers) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  const auto rows = ReadFixture("greedy_cases.jsonl");
  ASSERT_FALSE(rows.empty());
  for (const JsonValue& row : rows) {
    const auto ids = IntArray(Field(row, "ids"));
    const auto want = IntArray(Field(row, "greedy"));
    const auto margins = NumArray(Field(row, "margins"));
    auto store = NewStore(m);
    std::vector<float> logits = Prefill(m, store.get(), ids, 64);
    int32_t pos = static_cast<int32_t>(ids.size());
    for (size_t step = 0; step < want.size(); ++step) {
      // Past a near-tie the two implementations may legitimately diverge.
      if (margins[step] < 1e-2) break;
      const int32_t next = Argmax(logits);
      ASSERT_EQ(next, want[step]) << "step " << step << " of " << JsonQuote(Field(row, "text").get_ref<const std::string&>());
      const StepToken t{next, pos++, 0, Role::kAssistant};
      ASSERT_TRUE(m.Forward(std::span(&t, 1), store.get(), &logits).ok());
    }
  }
}

// The worker's default decode multiplies int8-quantized activations with the
// quantized weights (llama.cpp's numerics): teacher-forced on the exact
// model's greedy path, its logits stay within `bound` of the exact ones and
// it picks the same token wherever the exact margin exceeds twice that.
// The bounds are measured regression guards (the printed line gives today's).
void CheckFastDecode(const std::string& name, const std::vector<std::vector<int32_t>>& prompts,
                     float bound) {
  const LoadedModel* exact_m = testing::SharedModelFor(name, Activations::kF32);
  const LoadedModel* fast_m = testing::SharedModelFor(name, Activations::kInt8);
  if (exact_m == nullptr || fast_m == nullptr) {
    POLYKV_MISSING_INPUT() << name << " is absent: run scripts/fetch-model.sh " << name;
  }
  const LlamaModel& exact = *exact_m->model;
  const LlamaModel& fast = *fast_m->model;
  float worst = 0, sum = 0;
  int steps = 0, checked = 0, same = 0;
  for (const auto& ids : prompts) {
    auto a = NewStore(exact);
    auto b = NewStore(fast);
    std::vector<float> la = Prefill(exact, a.get(), ids, 64);
    std::vector<float> lb = Prefill(fast, b.get(), ids, 64);
    int32_t pos = static_cast<int32_t>(ids.size());
    for (int step = 0; step < 24; ++step) {
      const StepToken t{Argmax(la), pos++, 0, Role::kAssistant};
      ASSERT_TRUE(exact.Forward(std::span(&t, 1), a.get(), &la).ok());
      ASSERT_TRUE(fast.Forward(std::span(&t, 1), b.get(), &lb).ok());
      std::vector<float> sorted = la;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const float d = MaxAbsDiff(la, lb);
      worst = std::max(worst, d);
      sum += d;
      ++steps;
      same += Argmax(la) == Argmax(lb);
      if (sorted[0] - sorted[1] > 2 * bound) {
        EXPECT_EQ(Argmax(lb), Argmax(la)) << "step " << step;
        ++checked;
      }
    }
  }
  std::printf("%s int8 vs exact decode: %d steps, max |dlogit| %.4f, mean %.4f; same top-1 at "
              "%d; margin > %.1f (checked) at %d\n",
              name.c_str(), steps, worst, sum / steps, same, 2 * bound, checked);
  EXPECT_LT(worst, bound);
  EXPECT_GT(checked, 0);
}

TEST(ModelTest, FastDecodeStaysCloseToExactDecode) {
  std::vector<std::vector<int32_t>> prompts;
  for (const JsonValue& row : ReadFixture("greedy_cases.jsonl")) prompts.push_back(IntArray(Field(row, "ids")));
  CheckFastDecode(DefaultModelPath(), prompts, 1.5f);
}

TEST(ModelTest, FastDecodeStaysCloseToExactDecodeQwen) {
  std::vector<std::vector<int32_t>> prompts;
  for (const JsonValue& row : ReadFixture("qwen_logits_cases.jsonl")) {
    if (Field(row, "model").get_ref<const std::string&>() == "qwen2.5-coder-0.5b" && prompts.size() < 4) {
      prompts.push_back(IntArray(Field(row, "ids")));
    }
  }
  CheckFastDecode("qwen2.5-coder-0.5b", prompts, 1.5f);
}

TEST(ModelTest, ChunkedPrefillEqualsTokenByToken) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  const auto ids = model->tokenizer->Encode(
      "def f(x):\n    return x * 2  # chunk boundaries must not matter", true);
  ASSERT_GT(ids.size(), 16u);
  auto s1 = NewStore(m), s7 = NewStore(m), sall = NewStore(m);
  const auto one = Prefill(m, s1.get(), ids, 1);
  const auto seven = Prefill(m, s7.get(), ids, 7);
  const auto all = Prefill(m, sall.get(), ids, static_cast<int>(ids.size()));
  EXPECT_LT(MaxAbsDiff(one, all), 1e-3f);
  EXPECT_LT(MaxAbsDiff(seven, all), 1e-3f);
  EXPECT_EQ(s1->num_slots(), static_cast<int64_t>(ids.size()));
}

TEST(ModelTest, IncrementalTurnsEqualFullRecompute) {
  POLYKV_REQUIRE_MODEL();
  auto store = NewStore(*model->model);
  ConversationOptions o;
  o.prefill_chunk = 16;
  Conversation conv(model, store.get(), o);
  ASSERT_TRUE(conv.AddMessage(Role::kUser, "Name a color.").ok());
  auto r1 = conv.Generate(12);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(conv.AddMessage(Role::kToolOutput, "blue, green").ok());
  ASSERT_TRUE(conv.AddMessage(Role::kUser, "Pick one of those.").ok());
  std::vector<float> incremental;
  ASSERT_TRUE(conv.Flush(&incremental).ok());

  // Same conversation, rendered whole and prefilled in one go.
  const ChatTemplate& t = model->chat_template;
  std::string text = t.RenderMessage("user", "Name a color.", true) + t.GenerationPrompt(false);
  std::vector<int32_t> ids = model->tokenizer->Encode(text, true);
  ids.insert(ids.end(), r1->tokens.begin(), r1->tokens.end());
  if (r1->stop == "length") {
    // The last sampled token was fed with this turn; it is in r1->tokens.
  }
  const auto tail = model->tokenizer->Encode(
      "<|im_end|>\n" + t.RenderMessage("tool", "blue, green", false) +
          t.RenderMessage("user", "Pick one of those.", false), true);
  ids.insert(ids.end(), tail.begin(), tail.end());
  auto fresh = NewStore(*model->model);
  const auto full = Prefill(*model->model, fresh.get(), ids, 64);
  EXPECT_EQ(store->num_slots(), fresh->num_slots());
  EXPECT_EQ(store->metadata().size(), ids.size());
  for (size_t i = 0; i < ids.size() && i < store->metadata().size(); ++i) {
    ASSERT_EQ(store->metadata()[i].token_id, ids[i]) << "slot " << i;
    ASSERT_EQ(store->metadata()[i].position, static_cast<int32_t>(i));
  }
  EXPECT_LT(MaxAbsDiff(incremental, full), 1e-3f);
  EXPECT_EQ(Argmax(incremental), Argmax(full));
}

TEST(ModelTest, AttentionMassIsConserved) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  // Decode steps (chunk 1) report mass with either attention implementation.
  for (LocalAttention attention : {LocalAttention::kKernels, LocalAttention::kBlas}) {
  auto store = NewStore(m, /*mass=*/true, attention);
  const auto ids = model->tokenizer->Encode("The quick brown fox jumps over the lazy dog.", true);
  Prefill(m, store.get(), ids, 1);
  double total = 0;
  for (float x : store->attention_mass()) total += x;
  // Every query row's softmax sums to one: layers x heads x tokens.
  const double want = static_cast<double>(m.config().num_layers) * m.config().num_heads * ids.size();
  EXPECT_NEAR(total, want, want * 1e-4);
  // The first token (attention sink) draws the most.
  const auto& mass = store->attention_mass();
  EXPECT_EQ(std::max_element(mass.begin(), mass.end()) - mass.begin(), 0);
  }
}

}  // namespace
}  // namespace polykv::worker
