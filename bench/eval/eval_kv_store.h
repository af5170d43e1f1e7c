// EvalKvStore: the KV cache the evaluation harness runs every cache
// configuration on. It is a KvStore (so the worker's model and conversation
// drive it unchanged) with what the pool's stores do not offer in one place:
//
//   * per-layer slot lists — a policy may keep different tokens in different
//     layers (pyramid / entropy budgets), and merged slots carry a count whose
//     log is added to their attention logit (Plan::log_count_bias);
//   * the page formats' exact numerics — rows are stored as f32 values that
//     went through the format's encoder and decoder (kernels QuantizePage /
//     DequantizePage, per page of block_tokens slots), so attention sees exactly the
//     values a paged kernel would read, and bytes() counts the pages the pool
//     would allocate in those formats;
//   * score capture for the policies — attention mass per slot per layer
//     (H2O), the queries of the last observation-window tokens (SnapKV, and
//     attention entropy for entropy layer budgets), and a probe mode that runs
//     intent tokens as queries without caching them (IntentKV relevance).
//
// Attention is dense sgemm over the decoded rows (as LocalKvStore's kBlas
// path): the harness measures what compression does to answers, not kernel
// speed (bench/kernels_bench.cc does that). Not thread-safe: one thread per store.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/eval/cache_config.h"
#include "client/worker/kv_store.h"
#include "kernels/page_format.h"

namespace polykv::eval {

using worker::KvShape;
using worker::StepToken;

struct EvalKvStoreOptions {
  KvShape shape;
  // Format new rows are stored in (the residual page of recent tokens).
  kernels::PageFormat append_format = kernels::PageFormat::kF32;
  // Slots per page: the unit of encoding (key params per channel per page)
  // and of bytes().
  int block_tokens = kDefaultBlockTokens;
  // Capture attention mass per slot and the last `obs_window` queries of
  // every layer (only the shared context prefill needs this).
  bool capture_scores = false;
  int obs_window = 32;
};

// One layer's slots after a compaction: for each output slot the source slot
// indices and weights (one member with weight 1 = kept as is).
struct LayerSelection {
  std::vector<uint32_t> offsets;  // [out + 1] into members / weights
  std::vector<uint32_t> members;
  std::vector<float> weights;
  std::vector<uint32_t> counts;  // [out] tokens each output slot stands for
  // [out / block_tokens] (full output blocks) or empty: the format the
  // plan requantized each block's keys (values) to, kF32 where it did not
  // (policies::LoweredLayer::block_{k,v}_formats). A block is stored in the
  // coarser of this and the store's own format for it.
  std::vector<kernels::PageFormat> requant_k, requant_v;
};

// Per-layer observations the policies score with.
struct LayerScores {
  std::vector<float> attn;    // [slots] attention mass received (all queries, all heads)
  std::vector<float> obs;     // [slots] mass from the observation-window queries
  std::vector<float> intent;  // [slots] mass from the intent probe
  float entropy = -1.f;       // mean entropy (nats) of the window queries' attention
};

class EvalKvStore : public worker::KvStore {
 public:
  static absl::StatusOr<std::unique_ptr<EvalKvStore>> Create(const EvalKvStoreOptions& options);

  // A new store holding `layers[l]` gathered from `src`'s layer l, then every
  // full page of the first (slots - f16_tail) slots encoded as k_format /
  // v_format and decoded back; the rest (partial last page and the most recent
  // `f16_tail` slots, the residual) go through `options.append_format`. A
  // full page the selection requantizes (LayerSelection::requant_k/v) is
  // encoded instead in the coarser of that format and its own, over all its
  // rows, as daemon compaction writes a new page of that format.
  static absl::StatusOr<std::unique_ptr<EvalKvStore>> Compact(
      const EvalKvStore& src, const std::vector<LayerSelection>& layers,
      kernels::PageFormat k_format, kernels::PageFormat v_format, int f16_tail,
      const EvalKvStoreOptions& options);

  const KvShape& shape() const override { return options_.shape; }
  // Slots of layer 0 (layers may differ after a compaction: see slots()).
  int64_t num_slots() const override { return layers_.empty() ? 0 : layers_[0].n; }
  int64_t slots(int layer) const { return layers_[layer].n; }
  // Pool bytes of the pages this cache occupies: per layer, the encoded pages
  // in their formats plus the residual slots in append_format pages.
  int64_t bytes() const override;
  std::string name() const override { return "eval"; }

  absl::Status BeginStep(std::span<const StepToken> tokens) override;
  absl::Status Append(int layer, const float* k, const float* v) override;
  absl::Status Attend(int layer, int num_heads, const float* q, float* out) override;
  absl::Status EndStep() override;

  // In probe mode a step's tokens attend (and add their mass to the intent
  // scores) but are dropped at EndStep.
  void set_probe(bool probe) { probe_ = probe; }

  // Token metadata of every token written (index = token id in the session).
  const std::vector<StepToken>& tokens() const { return tokens_; }
  // Source token of each slot of a layer.
  const std::vector<uint32_t>& slot_tokens(int layer) const { return layers_[layer].token; }
  // Per layer: captured scores; obs and entropy computed here from the
  // window queries (causal: a window query sees the slots up to itself).
  std::vector<LayerScores> Scores() const;
  // [slots * head_dim] keys averaged over KV heads (merge policies' summaries).
  std::vector<float> KeySummaries(int layer) const;

 private:
  struct Layer {
    int64_t n = 0;                 // committed slots
    std::vector<float> k, v;       // [capacity][row] decoded values
    std::vector<float> bias;       // [slots] log(count); empty when all counts are 1
    std::vector<uint32_t> token;   // [slots] source token index
    // [full pages written by Compact] K and V format of each (encoded pages,
    // residual pages in append_format, requantized pages); later slots are
    // in append_format.
    std::vector<kernels::PageFormat> page_k, page_v;
    std::vector<float> mass;       // capture: [slots]
    std::vector<float> intent;     // capture: [slots]
    std::vector<float> window_q;   // capture: [obs_window][num_heads * head_dim] ring
    std::vector<int64_t> window_slot;  // [obs_window] slot of each ring query (-1 empty)
    int64_t window_next = 0;
  };
  explicit EvalKvStore(const EvalKvStoreOptions& options);
  void RoundTrip(kernels::PageFormat format, kernels::KvKind kind, float* rows, int n) const;

  const EvalKvStoreOptions options_;
  const int64_t row_;
  int num_heads_ = 0;  // learned at the first Attend (for the window ring)
  std::vector<Layer> layers_;
  std::vector<StepToken> tokens_;
  std::vector<StepToken> step_;
  std::vector<float> scores_;  // scratch [n, t]
  int next_layer_ = 0;
  bool probe_ = false;
};

}  // namespace polykv::eval
