// The evaluation harness's cache and plumbing: EvalKvStore attends exactly as
// the worker's dense cache does, compaction and formats change what they
// should and nothing else, captured scores add up, and a whole task run over
// the full f32 cache answers exactly as the worker's own conversation does.
#include <cmath>
#include <cstdio>
#include <random>

#include "bench/eval/cache_config.h"
#include "bench/eval/compress.h"
#include "bench/eval/eval_kv_store.h"
#include "bench/eval/runner.h"
#include "bench/eval/task.h"
#include "client/worker/json.h"
#include "client/worker/kv_store.h"
#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "kernels/page_format.h"
#include "tests/unit/worker/test_util.h"

namespace polykv::eval {
namespace {

constexpr worker::KvShape kShape{2, 2, 32};
constexpr int kHeads = 4;
constexpr int64_t kRow = 2 * 32;

struct Step {
  std::vector<worker::StepToken> meta;
  std::vector<float> k, v, q;  // per layer, concatenated
};

Step RandomStep(std::mt19937& rng, int n, int first_pos) {
  std::normal_distribution<float> d(0.f, 1.f);
  Step s;
  for (int i = 0; i < n; ++i) s.meta.push_back({i, first_pos + i, 0, worker::Role::kUser});
  s.k.resize(kShape.num_layers * n * kRow);
  s.v.resize(s.k.size());
  s.q.resize(kShape.num_layers * n * kHeads * kShape.head_dim);
  for (auto* vec : {&s.k, &s.v, &s.q}) {
    for (float& x : *vec) x = d(rng);
  }
  return s;
}

// Runs one step; returns the attention outputs of every layer.
std::vector<float> RunStep(worker::KvStore& store, const Step& s) {
  const int n = static_cast<int>(s.meta.size());
  const int64_t qsz = int64_t{n} * kHeads * kShape.head_dim;
  std::vector<float> out(kShape.num_layers * qsz);
  EXPECT_TRUE(store.BeginStep(s.meta).ok());
  for (int l = 0; l < kShape.num_layers; ++l) {
    EXPECT_TRUE(store.Append(l, s.k.data() + l * n * kRow, s.v.data() + l * n * kRow).ok());
    EXPECT_TRUE(store.Attend(l, kHeads, s.q.data() + l * qsz, out.data() + l * qsz).ok());
  }
  EXPECT_TRUE(store.EndStep().ok());
  return out;
}

std::unique_ptr<EvalKvStore> NewStore(bool capture, kernels::PageFormat append = kernels::PageFormat::kF32) {
  EvalKvStoreOptions o;
  o.shape = kShape;
  o.capture_scores = capture;
  o.obs_window = 8;
  o.append_format = append;
  auto s = EvalKvStore::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

void ExpectNear(const std::vector<float>& a, const std::vector<float>& b, float tol) {
  ASSERT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  EXPECT_LE(worst, tol);
}

TEST(EvalKvStore, AttendsLikeTheWorkersDenseCache) {
  worker::LocalKvStoreOptions lo;
  lo.shape = kShape;
  lo.attention = worker::LocalAttention::kBlas;
  auto local = worker::LocalKvStore::Create(lo);
  ASSERT_TRUE(local.ok());
  auto eval = NewStore(true);
  std::mt19937 rng(7);
  int pos = 0;
  for (int n : {5, 17, 1, 1, 9}) {
    const Step s = RandomStep(rng, n, pos);
    pos += n;
    ExpectNear(RunStep(**local, s), RunStep(*eval, s), 1e-5f);
  }
  EXPECT_EQ(eval->num_slots(), pos);
  EXPECT_EQ(eval->tokens().size(), static_cast<size_t>(pos));
}

TEST(EvalKvStore, CapturedMassAddsUpToOnePerQueryAndHead) {
  auto store = NewStore(true);
  std::mt19937 rng(3);
  int pos = 0;
  for (int n : {12, 12, 1}) {
    RunStep(*store, RandomStep(rng, n, pos));
    pos += n;
  }
  const auto scores = store->Scores();
  ASSERT_EQ(scores.size(), 2u);
  for (const LayerScores& s : scores) {
    double attn = 0, obs = 0;
    for (float x : s.attn) attn += x;
    for (float x : s.obs) obs += x;
    EXPECT_NEAR(attn, static_cast<double>(pos) * kHeads, 1e-3);  // every query of every head
    EXPECT_NEAR(obs, 8.0 * kHeads, 1e-3);            // the 8 window queries
    EXPECT_GT(s.entropy, 0.f);
    EXPECT_LT(s.entropy, std::log(static_cast<float>(pos)) + 1e-4f);
  }
}

TEST(EvalKvStore, ProbeScoresWithoutCaching) {
  auto store = NewStore(true);
  std::mt19937 rng(5);
  RunStep(*store, RandomStep(rng, 20, 0));
  const Step next = RandomStep(rng, 1, 24);
  auto twin = EvalKvStore::Compact(*store, KeepAll(*store), kernels::PageFormat::kF32,
                                   kernels::PageFormat::kF32, 0, {kShape, kernels::PageFormat::kF32});
  ASSERT_TRUE(twin.ok());
  store->set_probe(true);
  RunStep(*store, RandomStep(rng, 4, 20));
  store->set_probe(false);
  EXPECT_EQ(store->num_slots(), 20);
  double intent = 0;
  const std::vector<LayerScores> scores = store->Scores();
  for (float x : scores[0].intent) intent += x;
  EXPECT_GT(intent, 0.0);
  EXPECT_LE(intent, 4.0 * kHeads + 1e-3);  // the probe's own rows take the rest
  ExpectNear(RunStep(*store, next), RunStep(**twin, next), 1e-6f);
}

TEST(EvalKvStore, MergingIdenticalSlotsWithCountBiasKeepsAttention) {
  auto store = NewStore(false);
  std::mt19937 rng(11);
  Step s = RandomStep(rng, 6, 0);
  // Slots 2 and 3 identical in every layer.
  for (int l = 0; l < kShape.num_layers; ++l) {
    for (int64_t i = 0; i < kRow; ++i) {
      s.k[(l * 6 + 3) * kRow + i] = s.k[(l * 6 + 2) * kRow + i];
      s.v[(l * 6 + 3) * kRow + i] = s.v[(l * 6 + 2) * kRow + i];
    }
  }
  RunStep(*store, s);
  std::vector<LayerSelection> sel(kShape.num_layers);
  for (auto& l : sel) {
    l.offsets = {0, 1, 2, 4, 5, 6};
    l.members = {0, 1, 2, 3, 4, 5};
    l.weights = {1, 1, 0.5f, 0.5f, 1, 1};
    l.counts = {1, 1, 2, 1, 1};
  }
  auto merged = EvalKvStore::Compact(*store, sel, kernels::PageFormat::kF32,
                                     kernels::PageFormat::kF32, 0, {kShape, kernels::PageFormat::kF32});
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ((*merged)->num_slots(), 5);
  const Step q = RandomStep(rng, 1, 6);
  ExpectNear(RunStep(*store, q), RunStep(**merged, q), 1e-5f);
  // Without the bias the merged slot weighs as one token: attention changes.
  for (auto& l : sel) l.counts = {1, 1, 1, 1, 1};
  auto unbiased = EvalKvStore::Compact(*store, sel, kernels::PageFormat::kF32,
                                       kernels::PageFormat::kF32, 0, {kShape, kernels::PageFormat::kF32});
  ASSERT_TRUE(unbiased.ok());
  const Step q2 = RandomStep(rng, 1, 7);
  auto a = RunStep(**merged, q2), b = RunStep(**unbiased, q2);
  float diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  EXPECT_GT(diff, 1e-4f);
}

TEST(EvalKvStore, FormatsCostTheirPagesAndKeepTheResidualExact) {
  auto store = NewStore(false);
  std::mt19937 rng(2);
  RunStep(*store, RandomStep(rng, 40, 0));  // 2 full pages + 8 slots
  const kernels::PageShape ps{kDefaultBlockTokens, kShape.num_kv_heads, kShape.head_dim};
  const auto page = [&](kernels::PageFormat f, kernels::KvKind k) {
    return static_cast<int64_t>(kernels::PageBytes(f, k, ps));
  };
  const auto f16 = kernels::PageFormat::kF16, i4 = kernels::PageFormat::kInt4;
  const int64_t f16_pair = page(f16, kernels::KvKind::kKey) + page(f16, kernels::KvKind::kValue);
  const int64_t i4_pair = page(i4, kernels::KvKind::kKey) + page(i4, kernels::KvKind::kValue);

  auto full16 = EvalKvStore::Compact(*store, KeepAll(*store), f16, f16, 0, {kShape, f16});
  ASSERT_TRUE(full16.ok());
  EXPECT_EQ((*full16)->bytes(), kShape.num_layers * 3 * f16_pair);
  auto k4v4 = EvalKvStore::Compact(*store, KeepAll(*store), i4, i4, 0, {kShape, f16});
  ASSERT_TRUE(k4v4.ok());
  EXPECT_EQ((*k4v4)->bytes(), kShape.num_layers * (2 * i4_pair + f16_pair));
  // A residual of 20 slots: only the first page is int4.
  auto tail = EvalKvStore::Compact(*store, KeepAll(*store), i4, i4, 20, {kShape, f16});
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ((*tail)->bytes(), kShape.num_layers * (i4_pair + 2 * f16_pair));
  // int4 pages change attention more than f16 rounding does.
  const Step q = RandomStep(rng, 1, 40);
  const auto exact = RunStep(*store, q);
  const auto err = [&](worker::KvStore& s) {
    const auto o = RunStep(s, q);
    double e = 0;
    for (size_t i = 0; i < o.size(); ++i) e = std::max(e, double{std::abs(o[i] - exact[i])});
    return e;
  };
  const double e16 = err(**full16), e4 = err(**k4v4);
  EXPECT_GT(e16, 0.0);
  EXPECT_LT(e16, 1e-2);
  EXPECT_GT(e4, e16);
  // Appends go through the append format.
  EXPECT_EQ((*full16)->slots(0), 41);
  EXPECT_EQ((*full16)->slots(1), 41);
}

// Longer pages: the same rows in 32-slot pages encode one full page (the rest
// is residual) and cost the pages of that shape, whose key params are shared
// by twice the tokens.
TEST(EvalKvStore, LongerPagesCostTheirShapesPages) {
  auto store = NewStore(false);
  std::mt19937 rng(5);
  RunStep(*store, RandomStep(rng, 40, 0));  // 1 full 32-slot page + 8 slots
  const auto f16 = kernels::PageFormat::kF16, i4 = kernels::PageFormat::kInt4;
  const auto pair = [&](int bt, kernels::PageFormat f) {
    const kernels::PageShape ps{bt, kShape.num_kv_heads, kShape.head_dim};
    return static_cast<int64_t>(kernels::PageBytes(f, kernels::KvKind::kKey, ps) +
                                kernels::PageBytes(f, kernels::KvKind::kValue, ps));
  };
  EvalKvStoreOptions o{kShape, f16};
  o.block_tokens = 32;
  auto k4v4 = EvalKvStore::Compact(*store, KeepAll(*store), i4, i4, 0, o);
  ASSERT_TRUE(k4v4.ok()) << k4v4.status();
  EXPECT_EQ((*k4v4)->bytes(), kShape.num_layers * (pair(32, i4) + pair(32, f16)));
  EXPECT_LT(pair(32, i4), 2 * pair(16, i4));  // key params amortized
  EXPECT_EQ(pair(32, f16), 2 * pair(16, f16));
  // A selection's requantized blocks are counted in the store's pages.
  std::vector<LayerSelection> sel = KeepAll(*store);
  for (LayerSelection& l : sel) l.requant_k = {i4, i4};  // two 16-slot blocks: not this shape's
  EXPECT_FALSE(EvalKvStore::Compact(*store, sel, f16, f16, 0, o).ok());
  o.block_tokens = 0;
  EXPECT_FALSE(EvalKvStore::Compact(*store, KeepAll(*store), i4, i4, 0, o).ok());
}

// A block the plan requantized holds what a daemon page of that format holds:
// its rows through the page codec (QuantizePage over all 16 rows, then
// DequantizePage), costs that page's bytes, and keeps attention close to the
// f32 reference.
TEST(EvalKvStore, RequantizedBlocksHoldThePageCodecsValues) {
  auto store = NewStore(false);
  std::mt19937 rng(23);  // seed 23
  const Step ctx = RandomStep(rng, 40, 0);  // 2 full pages + 8 slots
  RunStep(*store, ctx);
  const auto f32 = kernels::PageFormat::kF32, i4 = kernels::PageFormat::kInt4;
  std::vector<LayerSelection> sel = KeepAll(*store);
  for (LayerSelection& l : sel) {
    l.requant_k = {f32, i4};  // block 1 of each layer
    l.requant_v = {f32, i4};
  }
  auto cold = EvalKvStore::Compact(*store, sel, f32, f32, 0, {kShape, f32});
  ASSERT_TRUE(cold.ok()) << cold.status();
  auto plain = EvalKvStore::Compact(*store, KeepAll(*store), f32, f32, 0, {kShape, f32});
  ASSERT_TRUE(plain.ok());

  // Keys of block 1 are exactly the codec's round trip of the source rows.
  const kernels::PageShape ps{kDefaultBlockTokens, kShape.num_kv_heads, kShape.head_dim};
  const size_t page_bytes = kernels::PageBytes(i4, kernels::KvKind::kKey, ps);
  std::vector<uint8_t> buf(page_bytes + kernels::kPageAlignment);
  void* page = reinterpret_cast<void*>(
      (reinterpret_cast<uintptr_t>(buf.data()) + kernels::kPageAlignment - 1) &
      ~(uintptr_t{kernels::kPageAlignment} - 1));
  const kernels::Exec exec{kernels::Backend::kCpu, 1, nullptr};
  const int d = kShape.head_dim;
  double v_err = 0;  // largest error the codec puts in a value of block 1
  for (int l = 0; l < kShape.num_layers; ++l) {
    std::vector<float> vrows(ctx.v.begin() + (l * 40 + 16) * kRow, ctx.v.begin() + (l * 40 + 32) * kRow);
    std::vector<float> vdec(vrows.size());
    ASSERT_TRUE(kernels::QuantizePage(exec, ps, kernels::KvKind::kValue, i4, vrows.data(),
                                      kernels::SourceType::kF32, kDefaultBlockTokens, page).ok());
    ASSERT_TRUE(kernels::DequantizePage(exec, ps, kernels::KvKind::kValue, i4, page,
                                        kDefaultBlockTokens, vdec.data()).ok());
    for (size_t i = 0; i < vrows.size(); ++i) v_err = std::max(v_err, double{std::abs(vrows[i] - vdec[i])});
    std::vector<float> rows(ctx.k.begin() + (l * 40 + 16) * kRow, ctx.k.begin() + (l * 40 + 32) * kRow);
    ASSERT_TRUE(kernels::QuantizePage(exec, ps, kernels::KvKind::kKey, i4, rows.data(),
                                      kernels::SourceType::kF32, kDefaultBlockTokens, page).ok());
    ASSERT_TRUE(kernels::DequantizePage(exec, ps, kernels::KvKind::kKey, i4, page,
                                        kDefaultBlockTokens, rows.data()).ok());
    const std::vector<float> got = (*cold)->KeySummaries(l), src = (*plain)->KeySummaries(l);
    for (int s = 0; s < 40; ++s) {
      for (int i = 0; i < d; ++i) {
        float want = 0;
        if (s >= 16 && s < 32) {
          for (int g = 0; g < kShape.num_kv_heads; ++g) {
            want += (1.0f / kShape.num_kv_heads) * rows[(s - 16) * kRow + g * d + i];
          }
        } else {
          want = src[s * d + i];  // other blocks untouched
        }
        ASSERT_EQ(got[s * d + i], want) << "layer " << l << " slot " << s << " dim " << i;
      }
    }
  }
  // One int4 page pair instead of an f32 one, per layer.
  const auto pair = [&](kernels::PageFormat f) {
    return static_cast<int64_t>(kernels::PageBytes(f, kernels::KvKind::kKey, ps) +
                                kernels::PageBytes(f, kernels::KvKind::kValue, ps));
  };
  EXPECT_EQ((*cold)->bytes(), (*plain)->bytes() - kShape.num_layers * (pair(f32) - pair(i4)));

  // Attention fidelity against the f32 reference: nonzero, bounded, and below
  // the whole cache at int4. Values only: keys stay exact.
  for (LayerSelection& l : sel) l.requant_k.clear();
  auto cold_v = EvalKvStore::Compact(*store, sel, f32, f32, 0, {kShape, f32});
  ASSERT_TRUE(cold_v.ok()) << cold_v.status();
  EXPECT_EQ((*cold_v)->bytes(), (*plain)->bytes() - kShape.num_layers *
                                    static_cast<int64_t>(kernels::PageBytes(f32, kernels::KvKind::kValue, ps) -
                                                         kernels::PageBytes(i4, kernels::KvKind::kValue, ps)));
  auto all4 = EvalKvStore::Compact(*store, KeepAll(*store), i4, i4, 0, {kShape, f32});
  ASSERT_TRUE(all4.ok());
  double e_cold = 0, e_cold_v = 0, e_all = 0;
  for (int trial = 0; trial < 8; ++trial) {
    const Step q = RandomStep(rng, 1, 40 + trial);
    const auto exact = RunStep(**plain, q);
    const auto err = [&](worker::KvStore& s) {
      const auto o = RunStep(s, q);
      double e = 0;
      for (size_t i = 0; i < o.size(); ++i) e = std::max(e, double{std::abs(o[i] - exact[i])});
      return e;
    };
    e_cold = std::max(e_cold, err(**cold));
    e_cold_v = std::max(e_cold_v, err(**cold_v));
    e_all = std::max(e_all, err(**all4));
  }
  // Attention weights sum to 1, so an output moves by at most the largest
  // error in a requantized value.
  EXPECT_GT(e_cold_v, 0.0);
  EXPECT_LE(e_cold_v, v_err + 1e-5);
  EXPECT_LT(e_cold, e_all);
  std::printf("max attention error: block 1 values int4 %.4g (codec's value error %.4g), "
              "K and V %.4g, all pages int4 %.4g\n", e_cold_v, v_err, e_cold, e_all);
}

TEST(EvalKvStore, CompactRefusesBadSelections) {
  auto store = NewStore(false);
  std::mt19937 rng(1);
  RunStep(*store, RandomStep(rng, 4, 0));
  std::vector<LayerSelection> one(1);
  EXPECT_FALSE(EvalKvStore::Compact(*store, one, kernels::PageFormat::kF16, kernels::PageFormat::kF16,
                                    0, {kShape, kernels::PageFormat::kF16}).ok());
  auto sel = KeepAll(*store);
  sel[1].members[3] = 9;  // past the layer
  EXPECT_FALSE(EvalKvStore::Compact(*store, sel, kernels::PageFormat::kF16, kernels::PageFormat::kF16,
                                    0, {kShape, kernels::PageFormat::kF16}).ok());
  sel = KeepAll(*store);
  sel[0].requant_v = {kernels::PageFormat::kInt4};  // 4 slots: no full block to requantize
  EXPECT_FALSE(EvalKvStore::Compact(*store, sel, kernels::PageFormat::kF16, kernels::PageFormat::kF16,
                                    0, {kShape, kernels::PageFormat::kF16}).ok());
}

TEST(CacheConfig, ParsesAndNamesTheBadPart) {
  auto c = ParseCacheConfig("sinks+structural+intent@0.10/K2V2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->text, "sinks+structural+intent@0.1/K2V2");
  EXPECT_EQ(c->k_format, kernels::PageFormat::kInt2);
  EXPECT_EQ(c->f16_tail, 128);
  auto f = ParseCacheConfig("full@0.3/f32");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->text, "full@1/f32");
  EXPECT_EQ(ParseCacheConfig("h2o@0.25/K8V4")->f16_tail, 0);
  auto braced = ParseCacheConfig("h2o{cold.format=int4,cold.fraction=0.5}@0.25/K8V8");
  ASSERT_TRUE(braced.ok()) << braced.status();
  EXPECT_EQ(braced->policy, "h2o{cold.format=int4,cold.fraction=0.5}");
  EXPECT_EQ(f->block_tokens, kDefaultBlockTokens);
  auto t64 = ParseCacheConfig("full@1/K4V2/T64");
  ASSERT_TRUE(t64.ok()) << t64.status();
  EXPECT_EQ(t64->block_tokens, 64);
  EXPECT_EQ(t64->formats, "K4V2");
  EXPECT_EQ(t64->text, "full@1/K4V2/T64");
  EXPECT_EQ(ParseCacheConfig("h2o@0.5/K8V4/T16")->text, "h2o@0.5/K8V4");  // the default, unnamed
  // R<n>: the f16 recent window; int2 formats default to 128, others to 0.
  auto r = ParseCacheConfig("full@1/K4V4/R128/T64");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->block_tokens, 64);
  EXPECT_EQ(r->f16_tail, 128);
  EXPECT_EQ(r->text, "full@1/K4V4/T64/R128");
  EXPECT_EQ(ParseCacheConfig("full@1/K4V2/R128")->text, "full@1/K4V2");
  auto none = ParseCacheConfig("full@1/K2V2/R0");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->f16_tail, 0);
  EXPECT_EQ(none->text, "full@1/K2V2/R0");
  EXPECT_TRUE(ParseCacheConfig("full@1/f16/R0").ok());
  for (const char* bad : {"h2o", "h2o@0/f16", "h2o@1.5/f16", "h2o@x/f16", "h2o@0.5/K3V4", "@0.5/f16",
                          "full@1/K4V4/T48", "full@1/K4V4/T512", "full@1/K4V4/T", "full@1/T64",
                          "full@1/K4V4/T64/T64", "full@1/f16/R128", "full@1/K4V4/R-1",
                          "full@1/K4V4/R128/R64", "full@1/K4V4/Rx"}) {
    auto r = ParseCacheConfig(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status();
  }
}

TEST(Task, SplitsContextQuestionAndTurnUnderTest) {
  const std::string text =
      R"({"role":"system","content":"s"})" "\n"
      R"({"role":"user","content":"fact"})" "\n"
      R"({"role":"assistant"})" "\n"
      R"({"role":"user","content":"q?"})" "\n"
      R"({"role":"assistant","id":"t1","max_new_tokens":7,"intent":"reply","answer_prefix":"It is","eval":{"family":"recall","answers":["x"]}})" "\n";
  auto t = ParseTask("/x/f.jsonl", text, 64);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->id, "t1");
  EXPECT_EQ(t->family, "recall");
  ASSERT_EQ(t->context.size(), 3u);
  EXPECT_TRUE(t->context[2].generate);  // an earlier generated turn stays context
  EXPECT_TRUE(t->has_question);
  EXPECT_EQ(t->question.content, "q?");
  EXPECT_EQ(t->generation.max_new_tokens, 7);
  EXPECT_EQ(t->generation.intent, "reply");
  EXPECT_EQ(t->generation.answer_prefix, "It is");
  auto eval = worker::ParseJson(t->eval_json);
  ASSERT_TRUE(eval.ok()) << t->eval_json;
  EXPECT_TRUE(eval->is_object());

  auto bad = ParseTask("f.jsonl", R"({"role":"user","content":"a"})" "\n" R"({"role":"user"})", 64);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f.jsonl:2"), std::string::npos) << bad.status();
  EXPECT_FALSE(ParseTask("f.jsonl", R"({"role":"user","content":"a"})", 64).ok());
}

TEST(RunTask, FullF32CacheAnswersAsTheWorkerDoes) {
  POLYKV_REQUIRE_MODEL();
  const std::string text =
      R"({"role":"system","content":"You are a support agent. Answer briefly."})" "\n"
      R"({"role":"user","content":"My name is Alice and my order number is ORD-48213."})" "\n"
      R"({"role":"assistant","content":"Noted, Alice: order ORD-48213."})" "\n"
      R"({"role":"tool","content":"shipping status: delayed at the hub, new date Tuesday"})" "\n"
      R"({"role":"user","content":"What is my order number?"})" "\n"
      R"({"role":"assistant","id":"t","max_new_tokens":12,"intent":"reply: the order number","answer_prefix":"Your order number is"})" "\n";
  auto task = ParseTask("t.jsonl", text, 64);
  ASSERT_TRUE(task.ok());

  // The worker's own path: a dense f32 cache, the same messages.
  worker::LocalKvStoreOptions lo;
  lo.shape = model->model->config().kv_shape();
  lo.attention = worker::LocalAttention::kBlas;
  auto local = worker::LocalKvStore::Create(lo);
  ASSERT_TRUE(local.ok());
  worker::ConversationOptions co;
  co.prefill_chunk = 128;
  worker::Conversation conv(model, local->get(), co);
  for (const TaskMessage& m : task->context) ASSERT_TRUE(conv.AddMessage(m.role, m.content, m.intent).ok());
  ASSERT_TRUE(conv.AddMessage(task->question.role, task->question.content).ok());
  auto want = conv.Generate(12, "", {}, "Your order number is");
  ASSERT_TRUE(want.ok());

  std::vector<CacheConfig> configs;
  for (const char* c : {"full@1/f32", "window@0.5/f16", "hybrid@0.25/K4V4"}) configs.push_back(*ParseCacheConfig(c));
  RunnerOptions ro;
  ro.threads = 2;
  auto records = RunTask(*model, *task, configs, ro);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 4u);  // the reference first
  std::vector<worker::JsonValue> rec;
  for (const auto& r : *records) {
    auto v = worker::ParseJson(r);
    ASSERT_TRUE(v.ok()) << r;
    rec.push_back(*v);
  }
  const auto field = [](const worker::JsonValue& v, const char* k) { return v.at(k); };
  EXPECT_EQ(field(rec[0], "config").get_ref<const std::string&>(), "full@1/f16");
  EXPECT_EQ(field(rec[0], "token_agreement").get<double>(), 1.0);
  EXPECT_EQ(field(rec[0], "bytes_fraction").get<double>(), 1.0);
  EXPECT_EQ(field(rec[1], "config").get_ref<const std::string&>(), "full@1/f32");
  EXPECT_EQ(field(rec[1], "output").get_ref<const std::string&>(), "Your order number is" + want->text);
  EXPECT_NEAR(field(rec[1], "bytes_fraction").get<double>(), 2.0, 1e-9);
  // Compressed configurations hold less.
  EXPECT_LT(field(rec[2], "bytes_fraction").get<double>(), 0.75);
  EXPECT_LT(field(rec[3], "bytes_fraction").get<double>(), field(rec[2], "bytes_fraction").get<double>());
  EXPECT_GT(field(rec[0], "context_tokens").get<double>(), 40);
}

// Batched decode and one thread per config give the same records (timings
// aside), a config that cannot fit its budget staying an error in its place;
// every config is teacher-forced, the reference at the rounding floor.
TEST(RunTask, BatchedDecodeGivesEachConfigItsOwnRecord) {
  POLYKV_REQUIRE_MODEL();
  const std::string text =
      R"({"role":"system","content":"You are a support agent. Answer briefly."})" "\n"
      R"({"role":"user","content":"My name is Alice and my order number is ORD-48213."})" "\n"
      R"({"role":"tool","content":"shipping status: delayed at the hub, new date Tuesday"})" "\n"
      R"({"role":"user","content":"When does my order arrive, and what is its number?"})" "\n"
      R"({"role":"assistant","id":"t","max_new_tokens":16})" "\n";
  auto task = ParseTask("t.jsonl", text, 64);
  ASSERT_TRUE(task.ok());
  std::vector<CacheConfig> configs;
  for (const char* c : {"window@0.5/f16", "full@1/K4V4", "h2o{pool=100000}@0.1/f16",
                        "streaming@0.3/K8V4"}) {
    configs.push_back(*ParseCacheConfig(c));
  }
  std::vector<std::vector<worker::JsonValue>> runs;
  for (bool batch : {true, false}) {
    RunnerOptions ro;
    ro.threads = 2;
    ro.batch_decode = batch;
    auto records = RunTask(*model, *task, configs, ro);
    ASSERT_TRUE(records.ok()) << records.status();
    ASSERT_EQ(records->size(), 5u);
    runs.emplace_back();
    for (const auto& r : *records) runs.back().push_back(*worker::ParseJson(r));
  }
  for (size_t i = 0; i < runs[0].size(); ++i) {
    worker::JsonValue a = runs[0][i], b = runs[1][i];
    for (const char* timing : {"decode_tokens_per_s", "compaction_ms", "prefill_tokens_per_s"}) {
      a.erase(timing);
      b.erase(timing);
    }
    EXPECT_EQ(a, b) << worker::DumpJson(a) << "\n" << worker::DumpJson(b);
  }
  const auto& ref = runs[0][0];
  EXPECT_LT(ref.at("kl_mean").get<double>(), 0.01);
  const size_t forced = ref.at("output_tokens").size() + (ref.at("stop") == "eos" ? 1 : 0);
  for (const auto& r : runs[0]) {
    if (r.contains("error")) continue;
    EXPECT_EQ(r.at("forced_positions").get<size_t>(), forced) << worker::DumpJson(r);
  }
}

// A cold step (cold.format) runs through the harness: whole blocks are
// requantized, reported, and the cache holds less than the same config
// without it.
TEST(RunTask, ColdRequantizationRunsAndHoldsLess) {
  POLYKV_REQUIRE_MODEL();
  std::string log;
  for (int i = 0; i < 12; ++i) {
    log += "step " + std::to_string(i) + ": compiled module_" + std::to_string(i) +
           ".cc with 0 errors and " + std::to_string(i % 3) + " warnings; ";
  }
  const std::string text =
      R"({"role":"system","content":"You are a build assistant. Answer briefly."})" "\n"
      R"({"role":"user","content":"The release tag is REL-7731. Run the build."})" "\n"
      R"({"role":"tool","content":")" + log + R"("})" "\n"
      R"({"role":"user","content":"What is the release tag?"})" "\n"
      R"({"role":"assistant","id":"t","max_new_tokens":6,"answer_prefix":"The release tag is"})" "\n";
  auto task = ParseTask("t.jsonl", text, 64);
  ASSERT_TRUE(task.ok()) << task.status();
  std::vector<CacheConfig> configs;
  for (const char* c : {"h2o@0.5/K8V8", "h2o{cold.format=int4,cold.fraction=0.5,cold.kind=kv}@0.5/K8V8",
                        "h2o{cold.format=int4,cold.fraction=0.5}@0.5/K8V8"}) {
    auto parsed = ParseCacheConfig(c);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    configs.push_back(*parsed);
  }
  RunnerOptions ro;
  ro.threads = 2;
  auto records = RunTask(*model, *task, configs, ro);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 4u);
  std::vector<worker::JsonValue> rec;
  for (const auto& r : *records) {
    auto v = worker::ParseJson(r);
    ASSERT_TRUE(v.ok()) << r;
    ASSERT_FALSE(v->contains("error")) << r;
    rec.push_back(*v);
  }
  EXPECT_GT(rec[0].at("context_tokens").get<double>(), 150);
  const auto num = [](const worker::JsonValue& v, const char* k) { return v.at(k).get<double>(); };
  EXPECT_EQ(num(rec[1], "requant_blocks"), 0);
  EXPECT_GT(num(rec[2], "requant_blocks"), 0);
  EXPECT_EQ(num(rec[2], "requant_blocks"), num(rec[3], "requant_blocks"));
  EXPECT_EQ(num(rec[2], "kept_slots_mean"), num(rec[1], "kept_slots_mean"));
  // int4 keys and values < int4 values < int8 pages.
  EXPECT_LT(num(rec[3], "bytes_context"), num(rec[1], "bytes_context"));
  EXPECT_LT(num(rec[2], "bytes_context"), num(rec[3], "bytes_context"));
  EXPECT_LT(num(rec[2], "bytes_fraction"), num(rec[1], "bytes_fraction"));
}

}  // namespace
}  // namespace polykv::eval
