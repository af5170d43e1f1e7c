// Qwen2.5-Coder (architecture qwen2) against an independent implementation:
// scripts/qwen_reference.py, a numpy forward on gguf-py's dequantization
// (fixtures qwen_logits_cases.jsonl, qwen_dequant_cases.jsonl). Both model
// files; each test skips, naming the command, when its file is absent.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/worker/conversation.h"
#include "client/worker/gguf.h"
#include "client/worker/kv_store.h"
#include "client/worker/model.h"
#include "client/worker/sampler.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/model_files.h"
#include "tests/unit/worker/test_util.h"

namespace polykv::worker {
namespace {

using testing::Field;
using testing::IntArray;
using testing::NumArray;
using testing::OpenModelFile;
using testing::ReadFixture;

constexpr const char* kModels[] = {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"};

uint32_t TypeByName(const std::string& s) {
  for (uint32_t t = 0; t < 40; ++t) {
    std::string n = GgmlTypeName(t);
    for (char& c : n) c = static_cast<char>(std::toupper(c));
    if (n == s) return t;
  }
  return 999;
}

std::vector<uint8_t> FromHex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = std::stoi(hex.substr(2 * i, 2), nullptr, 16);
  return out;
}

// Dequantize == gguf-py's dequantize, bit for bit, on real tensors (rows and
// whole-tensor sums) and on synthesized blocks of the types the files lack.
TEST(QwenDequantTest, EqualsGgufPy) {
  const auto rows = ReadFixture("qwen_dequant_cases.jsonl");
  ASSERT_GE(rows.size(), 20u);
  int real = 0, synthetic = 0;
  for (const JsonValue& row : rows) {
    const uint32_t type = TypeByName(Field(row, "type").get_ref<const std::string&>());
    ASSERT_NE(type, 999u) << Field(row, "type").get_ref<const std::string&>();
    if (Field(row, "case").get_ref<const std::string&>() == "synthetic") {
      SCOPED_TRACE("synthetic " + Field(row, "type").get_ref<const std::string&>());
      const auto bytes = FromHex(Field(row, "hex").get_ref<const std::string&>());
      const auto want = NumArray(Field(row, "values"));
      std::vector<float> got(want.size());
      ASSERT_TRUE(Dequantize(type, bytes.data(), static_cast<int64_t>(got.size()), got.data()).ok());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], static_cast<float>(want[i])) << "element " << i;
      }
      ++synthetic;
      continue;
    }
    const std::string model = Field(row, "model").get_ref<const std::string&>();
    auto file = OpenModelFile(model);
    if (file == nullptr) continue;  // Counted below.
    const std::string name = Field(row, "tensor").get_ref<const std::string&>();
    SCOPED_TRACE(model + " " + name);
    auto t = file->Tensor(name);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ((*t)->type, type);
    std::vector<float> all((*t)->num_elements);
    ASSERT_TRUE(Dequantize(type, (*t)->data, (*t)->num_elements, all.data()).ok());
    const int64_t row_len = static_cast<int64_t>(Field(row, "row_len").get<double>());
    for (const auto& [r, values] : Field(row, "rows").items()) {
      const auto want = NumArray(values);
      const int64_t base = std::stoll(r) * row_len;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(all[base + i], static_cast<float>(want[i])) << "row " << r << " element " << i;
      }
    }
    double sum = 0, sum_sq = 0;
    for (float v : all) sum += v, sum_sq += static_cast<double>(v) * v;
    EXPECT_NEAR(sum, Field(row, "sum").get<double>(), 1e-9 * sum_sq + 1e-9);
    EXPECT_NEAR(sum_sq, Field(row, "sum_sq").get<double>(), 1e-9 * sum_sq);
    ++real;
  }
  std::printf("dequantization equal to gguf-py: %d real tensors, %d synthetic cases\n", real,
              synthetic);
  EXPECT_GE(synthetic, 5);
  if (real == 0) POLYKV_MISSING_INPUT() << "no Qwen file present: run scripts/fetch-model.sh qwen2.5-coder-0.5b";
}

TEST(QwenModelTest, ConfigFromQwen2Keys) {
  POLYKV_REQUIRE_MODEL_FILE(file, kModels[0]);
  auto m = LlamaModel::Load(file);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_EQ(c.num_layers, 24);
  EXPECT_EQ(c.hidden, 896);
  EXPECT_EQ(c.num_heads, 14);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.ffn_hidden, 4864);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_FLOAT_EQ(c.rope_base, 1e6f);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.permuted_qk_rows);
  EXPECT_FALSE(c.tied_embeddings);
  // Weights are used in place: what a forward reads is about the file's size,
  // not the 4x of an f32 copy.
  EXPECT_LT((*m)->weight_bytes(), 600ll << 20);
}

// Teacher-forced logits at every position of every prompt against the numpy
// reference: the same greedy token everywhere (a reference margin below 1e-3
// is a tie within float noise and may go either way; counted and printed).
void CheckLogits(const std::string& name) {
  POLYKV_REQUIRE_MODEL_FILE(file, name);
  auto loaded = LlamaModel::Load(file);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const LlamaModel& m = **loaded;
  int cases = 0, positions = 0, ties = 0;
  float worst = 0;
  for (const JsonValue& row : ReadFixture("qwen_logits_cases.jsonl")) {
    if (Field(row, "model").get_ref<const std::string&>() != name) continue;
    ++cases;
    SCOPED_TRACE(JsonQuote(Field(row, "text").get_ref<const std::string&>()));
    const auto ids = IntArray(Field(row, "ids"));
    LocalKvStoreOptions o;
    o.shape = m.config().kv_shape();
    auto store = LocalKvStore::Create(o);
    ASSERT_TRUE(store.ok());
    std::vector<StepToken> metas;
    for (size_t i = 0; i < ids.size(); ++i) {
      metas.push_back({ids[i], static_cast<int32_t>(i), 0, Role::kUser});
    }
    std::vector<float> last, all;
    ASSERT_TRUE(m.Forward(metas, store->get(), &last, &all).ok());
    const size_t vocab = m.config().vocab_size;
    ASSERT_EQ(all.size(), ids.size() * vocab);
    const auto argmax = IntArray(Field(row, "argmax"));
    const auto margin = NumArray(Field(row, "margin"));
    const auto& top_ids = Field(row, "top_ids");
    const auto& top_logits = Field(row, "top_logits");
    for (size_t p = 0; p < ids.size(); ++p) {
      const std::vector<float> logits(all.begin() + p * vocab, all.begin() + (p + 1) * vocab);
      const int32_t got = Argmax(logits);
      if (margin[p] < 1e-3) {
        ++ties;
      } else {
        EXPECT_EQ(got, argmax[p]) << "position " << p << " margin " << margin[p];
      }
      const auto tid = IntArray(top_ids[p]);
      const auto tl = NumArray(top_logits[p]);
      for (size_t i = 0; i < tid.size(); ++i) {
        worst = std::max(worst, std::fabs(logits[tid[i]] - static_cast<float>(tl[i])));
      }
      ++positions;
    }
    for (const char* which : {"last_top", "probe"}) {
      const auto want_ids = IntArray(Field(row, std::string(which) + "_ids"));
      const auto want = NumArray(Field(row, std::string(which) + "_logits"));
      for (size_t i = 0; i < want_ids.size(); ++i) {
        worst = std::max(worst, std::fabs(last[want_ids[i]] - static_cast<float>(want[i])));
      }
    }
  }
  std::printf("%s: %d prompts, %d positions, same greedy token at all but %d ties; "
              "max |dlogit| %.5f\n", name.c_str(), cases, positions, ties, worst);
  EXPECT_GE(cases, 16);
  EXPECT_LT(worst, 0.05f);
}

TEST(QwenModelTest, LogitsMatchNumpyReference05B) { CheckLogits(kModels[0]); }
TEST(QwenModelTest, LogitsMatchNumpyReference15B) { CheckLogits(kModels[1]); }

}  // namespace
}  // namespace polykv::worker
