// PagedKvStore::signal_cost(): the wall time of the policy signals (structure
// tags, attention mass and its reports, the intent probe) is counted, in the
// phase it belongs to, when the source asks for them, and is exactly zero for
// a source that asks for none. No timed assertions: only > 0 against == 0 and
// call counts. No model: K, V and queries are random.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "client/worker/paged_kv_store.h"
#include "client/worker/slot_tagger.h"
#include "gtest/gtest.h"

namespace polykv::worker {
namespace {

constexpr int kLayers = 2, kKvHeads = 2, kHeadDim = 32, kQHeads = 4;
constexpr int kRow = kKvHeads * kHeadDim;

KvShape Shape() { return KvShape{kLayers, kKvHeads, kHeadDim}; }

// Heap pages behind a source that, when `signals`, wants attention and tags
// every commit with a real SlotTagger (as the pool source does with
// token_text); else it asks for neither, like the heap source. `decay`: the
// attention decay its policy asks for.
class SignalSource : public PageSource {
 public:
  explicit SignalSource(bool signals, float decay = 1.f) : signals_(signals), decay_(decay) {
    HeapPageSourceOptions o;
    o.shape = Shape();
    auto inner = NewHeapPageSource(o);
    EXPECT_TRUE(inner.ok()) << inner.status();
    inner_ = std::move(*inner);
    if (signals) tagger_.emplace([](int32_t id) { return id % 2 ? "def f():\n" : "  x = 1\n"; });
  }
  int block_tokens() const override { return inner_->block_tokens(); }
  absl::StatusOr<std::vector<PagedBlock>> Reserve(int64_t total) override {
    return inner_->Reserve(total);
  }
  absl::Status Commit(int64_t total, std::span<const StepToken> tokens) override {
    ++commits_;
    if (!tagger_ || tokens.empty()) return absl::OkStatus();
    const auto t0 = std::chrono::steady_clock::now();
    SlotTagger::Report r = tagger_->Commit(static_cast<uint64_t>(total) - tokens.size(), tokens);
    tag_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tagged_ += static_cast<int64_t>(r.meta.size());
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<PagedTable>> Sync() override { return std::nullopt; }
  absl::Status Report(ScoreStream stream, std::span<const float>, bool) override {
    attention_reports_ += stream == ScoreStream::kAttention;
    intent_reports_ += stream == ScoreStream::kIntent;
    return absl::OkStatus();
  }
  WantedStreams wants() const override {
    if (!signals_) return {};
    return {{ScoreStream::kAttention, ScoreStream::kIntent}, false, decay_};
  }
  double tag_seconds() const override { return tag_seconds_; }
  int64_t bytes() const override { return inner_->bytes(); }
  std::string name() const override { return signals_ ? "signals" : "bare"; }

  int commits_ = 0, attention_reports_ = 0, intent_reports_ = 0;
  int64_t tagged_ = 0;

 private:
  const bool signals_;
  const float decay_;
  std::unique_ptr<PageSource> inner_;
  std::optional<SlotTagger> tagger_;
  double tag_seconds_ = 0;
};

struct Store {
  SignalSource* src = nullptr;  // owned by store
  std::unique_ptr<PagedKvStore> store;
};

Store NewStore(bool signals) {
  Store s;
  s.src = new SignalSource(signals);
  PagedKvStoreOptions o;
  o.shape = Shape();
  o.sync_every_steps = 4;
  o.report_every_steps = 4;
  o.exec.num_threads = 1;
  auto store = PagedKvStore::Create(o, std::unique_ptr<PageSource>(s.src));
  EXPECT_TRUE(store.ok()) << store.status();
  s.store = std::move(*store);
  return s;
}

// One step of `n` random tokens from `*position` on, every layer written and
// attended.
void Step(PagedKvStore* store, int n, int32_t* position, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<StepToken> meta;
  for (int i = 0; i < n; ++i) meta.push_back({i, (*position)++, 0, Role::kUser});
  ASSERT_TRUE(store->BeginStep(meta).ok());
  std::vector<float> k(static_cast<size_t>(n) * kRow), v(k.size());
  std::vector<float> q(static_cast<size_t>(n) * kQHeads * kHeadDim), out(q.size());
  for (int l = 0; l < kLayers; ++l) {
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    for (float& x : q) x = dist(rng);
    ASSERT_TRUE(store->Append(l, k.data(), v.data()).ok());
    ASSERT_TRUE(store->Attend(l, kQHeads, q.data(), out.data()).ok());
  }
  ASSERT_TRUE(store->EndStep().ok());
}

uint32_t Seed() {
  const uint32_t seed = 20261202;
  std::printf("[seed] %u\n", seed);
  return seed;
}

constexpr int kPrefillChunks = 3, kChunk = 24, kDecodeSteps = 20;

// Two prefill chunks, a message start with an intent probe, and decode steps.
void Drive(PagedKvStore* store, bool probe, std::mt19937& rng) {
  int32_t position = 0;
  for (int c = 0; c < kPrefillChunks; ++c) Step(store, kChunk, &position, rng);
  ASSERT_TRUE(store->BeginTurn(TurnInfo{1, Role::kAssistant, "find f"}).ok());
  if (probe) {
    ASSERT_TRUE(store->BeginProbe(ProbeKind::kIntent).ok());
    int32_t probe_position = position;
    Step(store, 1, &probe_position, rng);
    Step(store, 1, &probe_position, rng);
    ASSERT_TRUE(store->EndProbe().ok());
  }
  for (int i = 0; i < kDecodeSteps; ++i) Step(store, 1, &position, rng);
  ASSERT_TRUE(store->CommitPending().ok());
}

TEST(PagedStoreSignalsTest, SignalsOnAreCountedByPhaseAndPath) {
  std::mt19937 rng(Seed());
  Store s = NewStore(/*signals=*/true);
  Drive(s.store.get(), /*probe=*/true, rng);
  const SignalCost& c = s.store->signal_cost();
  EXPECT_GT(c.decode.tag_seconds, 0);
  EXPECT_GT(c.decode.mass_seconds, 0);
  EXPECT_GT(c.prefill.tag_seconds, 0);
  EXPECT_GT(c.prefill.mass_seconds, 0);
  EXPECT_GT(c.probe_seconds, 0);
  EXPECT_EQ(c.probes, 1);
  EXPECT_EQ(s.src->intent_reports_, 1);
  // Every layer of every non-probe step sums its mass once; every attention
  // report is timed; and each commit that carried tokens tagged them.
  const int64_t steps = kPrefillChunks + kDecodeSteps;
  const int64_t calls = c.decode.calls + c.prefill.calls;
  EXPECT_GT(s.src->attention_reports_, 0);
  EXPECT_GT(s.src->tagged_, 0);
  EXPECT_GE(calls, steps * kLayers + s.src->attention_reports_);
  EXPECT_LE(calls, steps * kLayers + s.src->attention_reports_ + s.src->commits_);
  EXPECT_GE(c.decode.calls, int64_t{kDecodeSteps} * kLayers);
  EXPECT_GT(c.decode.commit_seconds, 0);  // Decode commits (not a signal, an upper bound).
}

TEST(PagedStoreSignalsTest, WithoutPrefillMassThePrefillChunksCountNoMass) {
  std::mt19937 rng(Seed());
  auto* src = new SignalSource(/*signals=*/true);
  PagedKvStoreOptions o;
  o.shape = Shape();
  o.report_every_steps = 0;  // No reports: only the per-step sums remain.
  o.sync_every_steps = 1000;
  o.sync_every_tokens = 1 << 20;  // One commit, at the end.
  o.prefill_attention_mass = false;
  o.exec.num_threads = 1;
  auto store = PagedKvStore::Create(o, std::unique_ptr<PageSource>(src));
  ASSERT_TRUE(store.ok()) << store.status();
  int32_t position = 0;
  for (int c = 0; c < kPrefillChunks; ++c) Step(store->get(), kChunk, &position, rng);
  EXPECT_EQ((*store)->signal_cost().prefill.calls, 0);
  EXPECT_EQ((*store)->signal_cost().prefill.seconds(), 0);
  for (int i = 0; i < kDecodeSteps; ++i) Step(store->get(), 1, &position, rng);
  const SignalCost& c = (*store)->signal_cost();
  EXPECT_EQ(c.decode.calls, int64_t{kDecodeSteps} * kLayers);  // Decode still sums its mass.
  EXPECT_GT(c.decode.mass_seconds, 0);
  EXPECT_EQ(c.decode.tag_seconds, 0);  // Nothing committed since the first sync.
  EXPECT_EQ(c.prefill.calls, 0);
  EXPECT_EQ(c.prefill.seconds(), 0);
}

// A policy with h2o.decay: each step ages the mass not yet reported by
// decay^(its tokens) before adding its own, so after steps of n_1..n_k tokens
// with masses m_1..m_k the store holds sum_j m_j * decay^(n_{j+1} + ... + n_k)
// -- the m_j read off an undecayed store fed the same steps.
TEST(PagedStoreSignalsTest, PendingMassAgesByTheDecayPerTokenWritten) {
  constexpr float kDecay = 0.8f;
  std::vector<std::unique_ptr<PagedKvStore>> stores;
  for (float decay : {1.f, kDecay}) {
    PagedKvStoreOptions o;
    o.shape = Shape();
    o.report_every_steps = 0;  // Nothing reported: all of it stays pending.
    o.exec.num_threads = 1;
    auto store = PagedKvStore::Create(o, std::make_unique<SignalSource>(true, decay));
    ASSERT_TRUE(store.ok()) << store.status();
    stores.push_back(std::move(*store));
  }
  const std::vector<int> tokens = {kChunk, kChunk, 1, 1, 1, 5, 1};
  std::vector<std::vector<float>> step_mass;  // m_j, per slot
  std::vector<float> before;
  for (auto& store : stores) {
    std::mt19937 rng(Seed());
    int32_t position = 0;
    for (int n : tokens) {
      Step(store.get(), n, &position, rng);
      if (store != stores[0]) continue;
      std::vector<float> m = store->pending_attention_mass();
      for (size_t i = 0; i < before.size(); ++i) m[i] -= before[i];
      before = store->pending_attention_mass();
      step_mass.push_back(std::move(m));
    }
  }
  const std::vector<float>& got = stores[1]->pending_attention_mass();
  ASSERT_EQ(got.size(), before.size());
  for (size_t slot = 0; slot < got.size(); ++slot) {
    double want = 0, age = 1;
    for (size_t j = tokens.size(); j-- > 0;) {
      if (slot < step_mass[j].size()) want += step_mass[j][slot] * age;
      age *= std::pow(double{kDecay}, tokens[j]);
    }
    EXPECT_NEAR(got[slot], want, 1e-4 * (1 + want)) << "slot " << slot;
  }
  // Undecayed, the oldest slots would have gathered the most; aged, the
  // last steps' mass dominates.
  EXPECT_LT(got[0], 0.5f * before[0]);
}

TEST(PagedStoreSignalsTest, SignalsOffCountExactlyZero) {
  std::mt19937 rng(Seed());
  Store s = NewStore(/*signals=*/false);
  ASSERT_FALSE(s.store->SupportsProbe(ProbeKind::kIntent));
  Drive(s.store.get(), /*probe=*/false, rng);
  const SignalCost& c = s.store->signal_cost();
  EXPECT_EQ(c.decode.tag_seconds, 0);
  EXPECT_EQ(c.decode.mass_seconds, 0);
  EXPECT_EQ(c.prefill.tag_seconds, 0);
  EXPECT_EQ(c.prefill.mass_seconds, 0);
  EXPECT_EQ(c.probe_seconds, 0);
  EXPECT_EQ(c.decode.calls, 0);
  EXPECT_EQ(c.prefill.calls, 0);
  EXPECT_EQ(c.probes, 0);
  EXPECT_GT(s.src->commits_, 0);  // The store did commit; nothing was a signal.
  EXPECT_EQ(s.src->attention_reports_, 0);
  // Nor is mass gathered that would go nowhere.
  for (float m : s.store->pending_attention_mass()) ASSERT_EQ(m, 0.0f);
}

}  // namespace
}  // namespace polykv::worker
