// PagedKvStore over in-process pages (HeapPageSource): with f32 pages it must
// give bit-identical logits and token-for-token identical greedy output to
// the dense --local-cache store; compressed formats must stay close; and the
// store must adopt a new block table published at a step boundary.
#include "client/worker/paged_kv_store.h"

#include <cmath>
#include <cstdio>

#include "client/worker/conversation.h"
#include "client/worker/sampler.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/test_util.h"

namespace polykv::worker {
namespace {

using kernels::PageFormat;

std::unique_ptr<PagedKvStore> NewPaged(const LlamaModel& m, PageFormat kf, PageFormat vf,
                                       int block_tokens = 16) {
  HeapPageSourceOptions ho;
  ho.shape = m.config().kv_shape();
  ho.block_tokens = block_tokens;
  ho.k_format = kf;
  ho.v_format = vf;
  auto src = NewHeapPageSource(ho);
  EXPECT_TRUE(src.ok()) << src.status();
  PagedKvStoreOptions po;
  po.shape = m.config().kv_shape();
  auto store = PagedKvStore::Create(po, std::move(*src));
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

std::unique_ptr<LocalKvStore> NewLocal(const LlamaModel& m) {
  LocalKvStoreOptions o;
  o.shape = m.config().kv_shape();
  auto s = LocalKvStore::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

// A multi-turn agent conversation; returns every generated token.
std::vector<int32_t> RunConversation(const LoadedModel* model, KvStore* store,
                                     std::vector<float>* final_logits) {
  ConversationOptions o;
  o.prefill_chunk = 24;  // Not a multiple of the block size: chunks straddle pages.
  Conversation c(model, store, o);
  std::vector<int32_t> all;
  auto gen = [&](int n) {
    auto r = c.Generate(n);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) all.insert(all.end(), r->tokens.begin(), r->tokens.end());
  };
  EXPECT_TRUE(c.AddMessage(Role::kSystem, "You are a coding agent. Be brief.").ok());
  EXPECT_TRUE(c.AddMessage(Role::kUser, "List the files, then open the README.", "plan").ok());
  gen(20);
  EXPECT_TRUE(c.AddMessage(Role::kToolOutput, "README.md\nsrc/\ntests/", "ls").ok());
  gen(20);
  EXPECT_TRUE(c.AddMessage(Role::kToolOutput, "# polykv\nA KV-cache daemon for LLM agents.", "cat README.md").ok());
  EXPECT_TRUE(c.AddMessage(Role::kUser, "What is the project about?").ok());
  gen(24);
  EXPECT_TRUE(c.AddMessage(Role::kUser, "Thanks.").ok());
  EXPECT_TRUE(c.Flush(final_logits).ok());
  return all;
}

TEST(PagedKvStoreTest, F32PagesMatchLocalCacheTokenForToken) {
  POLYKV_REQUIRE_MODEL();
  auto local = NewLocal(*model->model);
  auto paged = NewPaged(*model->model, PageFormat::kF32, PageFormat::kF32);
  std::vector<float> la, pa;
  const auto a = RunConversation(model, local.get(), &la);
  const auto b = RunConversation(model, paged.get(), &pa);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_EQ(local->num_slots(), paged->num_slots());
  ASSERT_EQ(la.size(), pa.size());
  int differ = 0;
  for (size_t i = 0; i < la.size(); ++i) differ += la[i] != pa[i];
  EXPECT_EQ(differ, 0) << "logits must be bit-identical with f32 pages";
  std::printf("%zu generated tokens identical over %lld cached slots\n", a.size(),
              static_cast<long long>(paged->num_slots()));
}

TEST(PagedKvStoreTest, CompressedPagesStayClose) {
  POLYKV_REQUIRE_MODEL();
  const auto ids = model->tokenizer->Encode(
      model->chat_template.RenderMessage("user", "Explain what a KV cache is, in two sentences.", true) +
          model->chat_template.GenerationPrompt(false), true);
  auto prefill = [&](KvStore* s) {
    std::vector<StepToken> metas;
    for (size_t i = 0; i < ids.size(); ++i) metas.push_back({ids[i], static_cast<int32_t>(i), 0, Role::kUser});
    std::vector<float> logits;
    for (size_t i = 0; i < metas.size(); i += 9) {
      const size_t n = std::min<size_t>(9, metas.size() - i);
      EXPECT_TRUE(model->model->Forward(std::span(metas).subspan(i, n), s, &logits).ok());
    }
    return logits;
  };
  auto local = NewLocal(*model->model);
  const auto want = prefill(local.get());
  struct Case { PageFormat k, v; float tol; } cases[] = {
      {PageFormat::kF16, PageFormat::kF16, 0.05f},
      {PageFormat::kBF16, PageFormat::kBF16, 0.5f},
      {PageFormat::kInt8, PageFormat::kInt8, 1.0f},
      {PageFormat::kInt8, PageFormat::kInt4, 3.0f},
  };
  for (const Case& c : cases) {
    auto paged = NewPaged(*model->model, c.k, c.v);
    const auto got = prefill(paged.get());
    float d = 0;
    for (size_t i = 0; i < got.size(); ++i) d = std::max(d, std::abs(got[i] - want[i]));
    std::printf("K %s / V %s pages: max |logit diff| %.4f, top-1 %s\n",
                std::string(kernels::FormatShortName(c.k)).c_str(),
                std::string(kernels::FormatShortName(c.v)).c_str(), d,
                Argmax(got) == Argmax(want) ? "same" : "differs");
    EXPECT_LT(d, c.tol) << kernels::FormatShortName(c.k) << "/" << kernels::FormatShortName(c.v);
  }
}

// A source that publishes a new table (the same pages, one epoch later) once,
// as the daemon does after a compaction; the store must adopt it at the next
// step boundary and keep producing the same logits.
class RepublishingSource : public PageSource {
 public:
  explicit RepublishingSource(std::unique_ptr<PageSource> inner) : inner_(std::move(inner)) {}
  int block_tokens() const override { return inner_->block_tokens(); }
  absl::StatusOr<std::vector<PagedBlock>> Reserve(int64_t total) override {
    auto b = inner_->Reserve(total);
    if (b.ok()) blocks_.insert(blocks_.end(), b->begin(), b->end());
    return b;
  }
  absl::Status Commit(int64_t total, std::span<const StepToken> t) override {
    EXPECT_EQ(total, committed_ + static_cast<int64_t>(t.size()));
    committed_ = total;
    ++commits_;
    return inner_->Commit(total, t);
  }
  absl::StatusOr<std::optional<PagedTable>> Sync() override {
    ++syncs_tried_;
    if (!publish_) return std::nullopt;
    publish_ = false;
    ++syncs_;
    return PagedTable{blocks_, committed_, 7};
  }
  // Attention and intent always (as a pool source whose policy reads them);
  // the others when a test sets its flag.
  WantedStreams wants() const override {
    WantedStreams w{{ScoreStream::kAttention, ScoreStream::kIntent}, wants_layer_importance_};
    if (wants_importance_) w.streams.add(ScoreStream::kImportance);
    if (wants_observation_) w.streams.add(ScoreStream::kObservation);
    if (wants_entropy_) w.streams.add(ScoreStream::kEntropy);
    return w;
  }
  absl::Status Report(ScoreStream stream, std::span<const float> v, bool per_layer) override {
    switch (stream) {
      case ScoreStream::kAttention:
        for (float m : v) reported_mass_ += m;
        break;
      case ScoreStream::kIntent: intent_.assign(v.begin(), v.end()); break;
      case ScoreStream::kImportance:
        (per_layer ? layer_importance_ : importance_).assign(v.begin(), v.end());
        importance_reports_ += !per_layer;
        importance_layers_ = per_layer && committed_ > 0 ? int(v.size() / committed_) : 0;
        break;
      case ScoreStream::kObservation:
        observation_.assign(v.begin(), v.end());
        ++observation_reports_;
        break;
      case ScoreStream::kEntropy: entropy_.assign(v.begin(), v.end()); break;
    }
    return absl::OkStatus();
  }
  bool wants_importance_ = false;
  bool wants_layer_importance_ = false;
  bool wants_observation_ = false;
  bool wants_entropy_ = false;
  std::vector<float> intent_;
  std::vector<float> layer_importance_;
  int importance_layers_ = 0;
  std::vector<float> importance_;
  int importance_reports_ = 0;
  std::vector<float> observation_;
  int observation_reports_ = 0;
  std::vector<float> entropy_;
  int64_t bytes() const override { return inner_->bytes(); }
  std::string name() const override { return "republishing"; }
  double reported_mass_ = 0;
  int syncs_tried_ = 0;
  bool publish_ = false;
  int syncs_ = 0;
  int commits_ = 0;

 private:
  std::unique_ptr<PageSource> inner_;
  std::vector<PagedBlock> blocks_;
  int64_t committed_ = 0;
};

// A store over heap pages behind a RepublishingSource (which it owns; `src`
// stays valid as long as `store`).
struct Recorded {
  RepublishingSource* src = nullptr;
  std::unique_ptr<PagedKvStore> store;
};
Recorded NewRecorded(const LlamaModel& m, PagedKvStoreOptions po,
                     PageFormat kf = PageFormat::kF32, PageFormat vf = PageFormat::kF32) {
  HeapPageSourceOptions ho;
  ho.shape = m.config().kv_shape();
  ho.k_format = kf;
  ho.v_format = vf;
  auto inner = NewHeapPageSource(ho);
  EXPECT_TRUE(inner.ok()) << inner.status();
  Recorded r;
  r.src = new RepublishingSource(std::move(*inner));
  po.shape = m.config().kv_shape();
  auto store = PagedKvStore::Create(po, std::unique_ptr<PageSource>(r.src));
  EXPECT_TRUE(store.ok()) << store.status();
  r.store = std::move(*store);
  return r;
}

TEST(PagedKvStoreTest, AdoptsANewEpochAtAStepBoundary) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  HeapPageSourceOptions ho;
  ho.shape = m.config().kv_shape();
  ho.block_tokens = 16;
  auto inner = NewHeapPageSource(ho);
  ASSERT_TRUE(inner.ok());
  auto* src = new RepublishingSource(std::move(*inner));
  PagedKvStoreOptions po;
  po.shape = m.config().kv_shape();
  po.sync_every_steps = 1;
  auto store = PagedKvStore::Create(po, std::unique_ptr<PageSource>(src));
  ASSERT_TRUE(store.ok());
  auto local = NewLocal(m);
  const auto ids = model->tokenizer->Encode("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty", true);
  ASSERT_GT(ids.size(), 18u);
  std::vector<float> a, b;
  for (size_t i = 0; i < ids.size(); ++i) {
    const StepToken t{ids[i], static_cast<int32_t>(i), 0, Role::kUser};
    if (i == 17) src->publish_ = true;  // Slot 17: mid-block: the residual is rebuilt from pages.
    ASSERT_TRUE(m.Forward(std::span(&t, 1), store->get(), &a).ok());
    ASSERT_TRUE(m.Forward(std::span(&t, 1), local.get(), &b).ok());
  }
  EXPECT_EQ(src->syncs_, 1);
  EXPECT_EQ((*store)->epoch(), 7u);
  EXPECT_EQ(a, b);
}

TEST(PagedKvStoreTest, CommitsAndSyncsInBatches) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  PagedKvStoreOptions po;
  po.sync_every_steps = 8;
  auto [src, store] = NewRecorded(m, po);
  std::vector<float> logits;
  for (int i = 0; i < 20; ++i) {  // 20 decode steps: commits before steps 8 and 16.
    const StepToken t{100 + i, i, 0, Role::kUser};
    ASSERT_TRUE(m.Forward(std::span(&t, 1), store.get(), &logits).ok());
  }
  EXPECT_EQ(src->commits_, 2);
  // A new message commits what is pending (the source checks the counts add up).
  ASSERT_TRUE(store->BeginTurn(TurnInfo{1, Role::kUser, "next"}).ok());
  EXPECT_EQ(src->commits_, 3);
  EXPECT_EQ(store->num_slots(), 20);
}

// A prefill chunk is one step of many tokens: the store syncs once
// sync_every_tokens were written, so the daemon sees (and can compact) a
// growing context before sync_every_steps chunks have gone by.
TEST(PagedKvStoreTest, PrefillChunksSyncByTokens) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  PagedKvStoreOptions po;
  po.sync_every_steps = 8;
  po.sync_every_tokens = 64;
  auto [src, store] = NewRecorded(m, po);
  std::vector<StepToken> chunk;
  for (int i = 0; i < 160; ++i) chunk.push_back({300 + i, i, 0, Role::kUser});
  std::vector<float> logits;
  for (int c = 0; c < 160; c += 32) {  // five chunks of 32: a sync before chunks 2 and 4
    ASSERT_TRUE(m.Forward(std::span(chunk).subspan(c, 32), store.get(), &logits).ok());
  }
  EXPECT_EQ(src->commits_, 2);
  EXPECT_EQ(src->syncs_tried_, 4);  // and Create's and the one before the first step
}

// Most of an agent's context is prefilled: its chunks must report attention
// mass like decode steps do (each query's softmax sums to 1 per query head and
// layer), or the daemon's H2O scores see only the answers.
TEST(PagedKvStoreTest, PrefillChunksReportTheirAttentionMass) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  const int layers = m.config().num_layers, heads = m.config().num_heads;
  for (bool prefill_mass : {true, false}) {
    SCOPED_TRACE(prefill_mass ? "prefill mass on" : "prefill mass off");
    PagedKvStoreOptions po;
    po.sync_every_steps = 1;
    po.report_every_steps = 1;
    po.prefill_attention_mass = prefill_mass;
    auto [src, store] = NewRecorded(m, po);
    std::vector<StepToken> chunk;
    for (int i = 0; i < 40; ++i) chunk.push_back({200 + i, i, 0, Role::kUser});
    std::vector<float> logits;
    for (int c = 0; c < 40; c += 8) {  // five prefill chunks of 8 tokens
      ASSERT_TRUE(m.Forward(std::span(chunk).subspan(c, 8), store.get(), &logits).ok());
    }
    ASSERT_TRUE(store->BeginTurn(TurnInfo{1, Role::kUser, ""}).ok());  // reports the last chunk
    const double want = prefill_mass ? double(layers) * heads * 40 : 0.0;
    EXPECT_NEAR(src->reported_mass_, want, 1e-3 * std::max(1.0, want));
  }
}

// After a probe: the next 8 tokens (from `position` on) give the probed
// store exactly the logits the unprobed one gets.
void ExpectSameNextTokens(const LlamaModel& m, KvStore* probed, KvStore* plain, int32_t position) {
  std::vector<float> a, b;
  for (int i = 0; i < 8; ++i) {
    const StepToken t{400 + i, position + i, 1, Role::kUser};
    ASSERT_TRUE(m.Forward(std::span(&t, 1), probed, &a).ok());
    ASSERT_TRUE(m.Forward(std::span(&t, 1), plain, &b).ok());
    ASSERT_EQ(a, b) << "token " << i << " after the probe";
  }
}

// The intent probe leaves no trace in the cache: a store that probed in the
// middle of a block (f16 and int4 pages: the block is re-encoded from its own
// rows) gives the same logits afterwards as one that never probed, and
// reports one relevance per committed slot, the probe tokens' attention.
TEST(PagedKvStoreTest, AnIntentProbeIsReportedAndLeavesTheCacheAsItWas) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  const int layers = m.config().num_layers, heads = m.config().num_heads;
  for (PageFormat vf : {PageFormat::kF16, PageFormat::kInt4}) {
    SCOPED_TRACE(std::string(kernels::FormatShortName(vf)));
    auto [probed_src, probed] = NewRecorded(m, {}, PageFormat::kF16, vf);
    auto [plain_src, plain] = NewRecorded(m, {}, PageFormat::kF16, vf);
    ASSERT_TRUE(probed->SupportsProbe(ProbeKind::kIntent));
    std::vector<StepToken> context;
    for (int i = 0; i < 27; ++i) context.push_back({300 + 7 * i, i, 0, Role::kUser});  // 1 block + 11
    std::vector<float> a, b;
    ASSERT_TRUE(m.Forward(context, probed.get(), &a).ok());
    ASSERT_TRUE(m.Forward(context, plain.get(), &b).ok());
    // Six probe tokens: they fill the partial block past its end into the next one.
    std::vector<StepToken> probe;
    for (int i = 0; i < 6; ++i) probe.push_back({900 + i, 27 + i, 1, Role::kAssistant});
    ASSERT_TRUE(probed->BeginProbe(ProbeKind::kIntent).ok());
    ASSERT_TRUE(m.Forward(probe, probed.get(), &a).ok());
    ASSERT_TRUE(probed->EndProbe().ok());
    EXPECT_EQ(probed->num_slots(), 27);
    ASSERT_EQ(probed_src->intent_.size(), 27u);
    double sum = 0;
    for (float r : probed_src->intent_) {
      EXPECT_GE(r, 0.0f);
      sum += r;
    }
    // Each probe token's softmax over the cache and the probe tokens before
    // it sums to 1 per head and layer; the 27 cached slots get most of it.
    EXPECT_LE(sum, double(layers) * heads * 6 + 1e-2);
    EXPECT_GT(sum, 0.5 * layers * heads * 6);
    EXPECT_TRUE(plain_src->intent_.empty());
    // The next tokens see exactly what the unprobed store has.
    ASSERT_NO_FATAL_FAILURE(ExpectSameNextTokens(m, probed.get(), plain.get(), 27));
  }
}

// A message's intent is probed when the message starts, over every slot
// cached before it, and the answer is the one a store that cannot probe gives
// (both prefill the queued tokens at the intent, so their chunks agree).
TEST(PagedKvStoreTest, AConversationProbesEachIntentOverWhatCameBefore) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  auto [src, store] = NewRecorded(m, {});
  auto plain = NewPaged(m, PageFormat::kF32, PageFormat::kF32);  // heap pages: no probe
  ASSERT_FALSE(plain->SupportsProbe(ProbeKind::kIntent));
  Conversation probing(model, store.get(), ConversationOptions{});
  Conversation not_probing(model, plain.get(), ConversationOptions{});
  for (Conversation* c : {&probing, &not_probing}) {
    ASSERT_TRUE(c->AddMessage(Role::kUser, "The build fails in parse_config: a KeyError on 'port'.",
                              "user: reports a failing build").ok());
  }
  EXPECT_TRUE(src->intent_.empty()) << "an empty cache has no slot to rank";
  auto a = probing.Generate(8, "plan: find the missing key");
  auto b = not_probing.Generate(8, "plan: find the missing key");
  ASSERT_TRUE(a.ok() && b.ok());
  // The generated turn's probe saw the user message (flushed for it), not the
  // generation prompt after it nor the answer; the turn's prompt_tokens
  // count both prefills.
  EXPECT_GT(src->intent_.size(), 0u);
  EXPECT_LT(static_cast<int>(src->intent_.size()), a->prompt_tokens);
  EXPECT_EQ(a->prompt_tokens + a->decode_steps, a->cached_tokens);
  double sum = 0;
  for (float x : src->intent_) sum += x;
  EXPECT_GT(sum, 0.0);
  EXPECT_EQ(a->tokens, b->tokens);
}

// A reconstruction probe reports, per slot, the most attention any single
// query of any layer and head paid it (KVzip's score), where an intent probe
// of the same tokens reports the sum over all of them; it too leaves the
// cache as it was. Only a source that asked for importance supports it.
TEST(PagedKvStoreTest, AReconstructionProbeReportsTheMostAnyQueryPaid) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  const int layers = m.config().num_layers, heads = m.config().num_heads;
  auto [rsrc, recon] = NewRecorded(m, {}, PageFormat::kF16, PageFormat::kInt4);
  auto [isrc, intent] = NewRecorded(m, {}, PageFormat::kF16, PageFormat::kInt4);
  auto [psrc, plain] = NewRecorded(m, {}, PageFormat::kF16, PageFormat::kInt4);
  EXPECT_FALSE(recon->SupportsProbe(ProbeKind::kReconstruct));
  rsrc->wants_importance_ = true;
  ASSERT_TRUE(recon->SupportsProbe(ProbeKind::kReconstruct));
  std::vector<StepToken> context;
  for (int i = 0; i < 27; ++i) context.push_back({300 + 7 * i, i, 0, Role::kUser});
  std::vector<float> a, b, c;
  ASSERT_TRUE(m.Forward(context, recon.get(), &a).ok());
  ASSERT_TRUE(m.Forward(context, intent.get(), &b).ok());
  ASSERT_TRUE(m.Forward(context, plain.get(), &c).ok());
  std::vector<StepToken> probe;
  for (int i = 0; i < 9; ++i) probe.push_back({300 + 7 * i, 27 + i, 1, Role::kAssistant});
  for (auto [store, kind] : {std::pair{recon.get(), ProbeKind::kReconstruct},
                             std::pair{intent.get(), ProbeKind::kIntent}}) {
    ASSERT_TRUE(store->BeginProbe(kind).ok());
    ASSERT_TRUE(m.Forward(probe, store, &a).ok());
    ASSERT_TRUE(store->EndProbe().ok());
  }
  ASSERT_EQ(rsrc->importance_.size(), 27u);
  ASSERT_EQ(isrc->intent_.size(), 27u);
  EXPECT_TRUE(rsrc->intent_.empty());
  EXPECT_EQ(isrc->importance_reports_, 0);
  // The sum runs over layers x query heads x probe tokens softmax values; the
  // most of them is one softmax value, and at least their mean.
  const double terms = double(layers) * heads * probe.size();
  bool some_below_sum = false;
  for (size_t i = 0; i < 27; ++i) {
    const double most = rsrc->importance_[i], sum = isrc->intent_[i];
    EXPECT_LE(most, sum + 1e-4) << "slot " << i;
    EXPECT_GE(most, sum / terms - 1e-6) << "slot " << i;
    EXPECT_LE(most, 1.0 + 1e-5) << "slot " << i;
    some_below_sum |= most < 0.9 * sum;
  }
  EXPECT_TRUE(some_below_sum) << "the probe summed instead of taking the most";
  ASSERT_NO_FATAL_FAILURE(ExpectSameNextTokens(m, recon.get(), plain.get(), 27));
}

// A source whose policy reads entropy gets each layer's mean decode attention
// entropy at the report cadence: one value per layer, each between 0 and
// log(slots attended); prefill chunks add none, nor do probes.
TEST(PagedKvStoreTest, DecodeReportsEachLayersAttentionEntropyWhenAsked) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  PagedKvStoreOptions po;
  po.sync_every_steps = po.report_every_steps = 1;  // a report at every step boundary
  auto [src, store] = NewRecorded(m, po);
  src->wants_entropy_ = true;
  std::vector<StepToken> context;
  for (int i = 0; i < 27; ++i) context.push_back({300 + 7 * i, i, 0, Role::kUser});
  std::vector<float> logits;
  ASSERT_TRUE(m.Forward(context, store.get(), &logits).ok());
  const StepToken t{500, 27, 0, Role::kUser};
  ASSERT_TRUE(m.Forward(std::span(&t, 1), store.get(), &logits).ok());
  EXPECT_TRUE(src->entropy_.empty()) << "prefill reported entropy";
  const StepToken u{501, 28, 0, Role::kUser};
  ASSERT_TRUE(m.Forward(std::span(&u, 1), store.get(), &logits).ok());  // reports t's step
  ASSERT_EQ(src->entropy_.size(), size_t(m.config().num_layers));
  bool differ = false;
  for (float e : src->entropy_) {
    EXPECT_GT(e, 0.f);
    EXPECT_LE(e, std::log(28.f) + 1e-4f);
    differ |= std::abs(e - src->entropy_[0]) > 1e-3f;
  }
  EXPECT_TRUE(differ) << "every layer reported the same entropy";
  // Without the stream, nothing.
  auto [plain_src, plain] = NewRecorded(m, po);
  ASSERT_TRUE(m.Forward(context, plain.get(), &logits).ok());
  for (const StepToken& d : {t, u}) {
    ASSERT_TRUE(m.Forward(std::span(&d, 1), plain.get(), &logits).ok());
  }
  EXPECT_TRUE(plain_src->entropy_.empty());
}

// A source that selects per layer gets the reconstruction probe's score per
// layer: each layer's most over its heads and queries, whose most over layers
// is what the session-wide report says.
TEST(PagedKvStoreTest, AReconstructionProbeReportsEachLayersMostWhenAsked) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  const int layers = m.config().num_layers;
  auto [lsrc, per_layer] = NewRecorded(m, {}, PageFormat::kF16, PageFormat::kInt4);
  auto [ssrc, session] = NewRecorded(m, {}, PageFormat::kF16, PageFormat::kInt4);
  lsrc->wants_importance_ = lsrc->wants_layer_importance_ = true;
  ssrc->wants_importance_ = true;
  std::vector<StepToken> context;
  for (int i = 0; i < 27; ++i) context.push_back({300 + 7 * i, i, 0, Role::kUser});
  std::vector<StepToken> probe;
  for (int i = 0; i < 9; ++i) probe.push_back({300 + 7 * i, 27 + i, 1, Role::kAssistant});
  std::vector<float> logits;
  for (PagedKvStore* store : {per_layer.get(), session.get()}) {
    ASSERT_TRUE(m.Forward(context, store, &logits).ok());
    ASSERT_TRUE(store->BeginProbe(ProbeKind::kReconstruct).ok());
    ASSERT_TRUE(m.Forward(probe, store, &logits).ok());
    ASSERT_TRUE(store->EndProbe().ok());
  }
  EXPECT_EQ(lsrc->importance_reports_, 0);
  ASSERT_EQ(lsrc->importance_layers_, layers);
  ASSERT_EQ(lsrc->layer_importance_.size(), size_t(layers) * 27);
  ASSERT_EQ(ssrc->importance_.size(), 27u);
  bool layers_differ = false;
  for (size_t i = 0; i < 27; ++i) {
    float most = 0;
    for (int l = 0; l < layers; ++l) {
      const float x = lsrc->layer_importance_[size_t(l) * 27 + i];
      most = std::max(most, x);
      layers_differ |= std::abs(x - lsrc->layer_importance_[i]) > 1e-3f;
    }
    EXPECT_EQ(most, ssrc->importance_[i]) << "slot " << i;
  }
  EXPECT_TRUE(layers_differ);
  ASSERT_NO_FATAL_FAILURE(ExpectSameNextTokens(m, per_layer.get(), session.get(), 27));
}

// When the daemon asks for importance, a conversation probes the cache after
// every prefill chunk, and (with nothing compacted) answers exactly as one
// that does not: the probes leave no trace.
TEST(PagedKvStoreTest, AConversationReconstructsEachPrefillChunk) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  auto [src, store] = NewRecorded(m, {});
  auto [off_src, off] = NewRecorded(m, {});
  src->wants_importance_ = true;
  off_src->wants_importance_ = true;
  ConversationOptions co;
  co.prefill_chunk = 8;
  co.intent_probe = false;
  Conversation reconstructing(model, store.get(), co);
  co.reconstruct = false;
  Conversation not_reconstructing(model, off.get(), co);
  for (Conversation* conv : {&reconstructing, &not_reconstructing}) {
    ASSERT_TRUE(conv->AddMessage(Role::kUser, "The build fails in parse_config: a KeyError on "
                                              "'port'. The deploy key is K-7731.", "")
                    .ok());
  }
  auto a = reconstructing.Generate(8, "");
  auto b = not_reconstructing.Generate(8, "");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(off_src->importance_reports_, 0);
  EXPECT_EQ(src->importance_reports_, (a->prompt_tokens + 7) / 8);  // one per chunk
  // The last chunk's probe scored every slot, its own chunk's included.
  ASSERT_EQ(static_cast<int>(src->importance_.size()), a->prompt_tokens);
  for (float x : src->importance_) EXPECT_GT(x, 0.0f);
}

// When the daemon asks for SnapKV's observation window, a conversation
// probes the last tokens of each user or tool message when the next message
// (or the generated turn) starts, over everything cached, and answers as a
// store that cannot probe (both prefill at every message: each has an intent).
TEST(PagedKvStoreTest, AConversationObservesTheEndOfEachUserOrToolMessage) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  const int layers = m.config().num_layers, heads = m.config().num_heads;
  auto [src, store] = NewRecorded(m, {});
  src->wants_observation_ = true;
  auto plain = NewPaged(m, PageFormat::kF32, PageFormat::kF32);  // heap pages: no probe
  ASSERT_FALSE(plain->SupportsProbe(ProbeKind::kObservation));
  ConversationOptions co;
  co.observation_window = 6;
  Conversation observing(model, store.get(), co);
  Conversation not_observing(model, plain.get(), co);
  int cached_before_answer = 0;
  for (Conversation* c : {&observing, &not_observing}) {
    ASSERT_TRUE(c->AddMessage(Role::kSystem, "You are a build assistant.", "system: set up").ok());
    ASSERT_TRUE(c->AddMessage(Role::kUser, "The build fails in parse_config: a KeyError on 'port'.",
                              "user: reports a failing build").ok());
    ASSERT_TRUE(c->AddMessage(Role::kToolOutput, "{\"file\": \"config.yaml\", \"keys\": [\"host\"]}",
                              "tool: the config's keys").ok());
  }
  // The user message was observed when the tool output started; the system
  // message was not.
  EXPECT_EQ(src->observation_reports_, 1);
  cached_before_answer = static_cast<int>(store->num_slots());
  EXPECT_EQ(static_cast<int>(src->observation_.size()), cached_before_answer);
  auto a = observing.Generate(8, "plan: find the missing key");
  auto b = not_observing.Generate(8, "plan: find the missing key");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(src->observation_reports_, 2) << "the tool output, when the answer started";
  EXPECT_GT(static_cast<int>(src->observation_.size()), cached_before_answer);
  // Six probe tokens' softmax over the cache and the probe rows before them
  // sums to 1 per layer and query head; the cached slots get most of it.
  double sum = 0;
  for (float x : src->observation_) {
    EXPECT_GE(x, 0.0f);
    sum += x;
  }
  EXPECT_LE(sum, double(layers) * heads * 6 + 1e-2);
  EXPECT_GT(sum, 0.5 * layers * heads * 6);
  EXPECT_EQ(a->tokens, b->tokens);
}

TEST(PagedKvStoreTest, ReservationFailureIsReported) {
  POLYKV_REQUIRE_MODEL();
  const LlamaModel& m = *model->model;
  HeapPageSourceOptions ho;
  ho.shape = m.config().kv_shape();
  ho.max_tokens = 32;
  auto src = NewHeapPageSource(ho);
  ASSERT_TRUE(src.ok());
  PagedKvStoreOptions po;
  po.shape = m.config().kv_shape();
  auto store = PagedKvStore::Create(po, std::move(*src));
  ASSERT_TRUE(store.ok());
  std::vector<StepToken> metas;
  for (int i = 0; i < 40; ++i) metas.push_back({100 + i, i, 0, Role::kUser});
  std::vector<float> logits;
  EXPECT_TRUE(m.Forward(std::span(metas).first(30), store->get(), &logits).ok());
  const absl::Status s = m.Forward(std::span(metas).subspan(30), store->get(), &logits);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_EQ((*store)->num_slots(), 30);
}

}  // namespace
}  // namespace polykv::worker
