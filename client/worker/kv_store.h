// KvStore: where the worker's KV cache lives, behind one interface, so the
// forward pass does not know whether the cache is a dense in-process buffer
// (LocalKvStore, the `--local-cache` baseline) or pages of polykvd's pool
// (a pool-backed store over libpolykv_client sessions and the kernels' paged
// attention).
//
// Protocol, once per forward step (a prefill chunk or one decode token):
//   BeginStep(tokens)          // step boundary: a pool store adopts a new
//                              // block-table epoch here, then reserves room
//   for layer in 0..L-1:
//     Append(layer, k, v)      // the step's keys (post-RoPE) and values
//     Attend(layer, q, out)    // the step's queries over every cached slot
//   EndStep()                  // commit the tokens, report scores/metadata
// A step's queries see every slot cached before the step and, causally, the
// step's own tokens (query i sees new tokens 0..i).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policies/score_stream.h"
#include "policies/session_view.h"

namespace polykv::worker {

// A message's role is the policies' role of its tokens: a tool message's are
// kToolOutput.
using policies::Role;
using policies::ScoreStream;
using policies::WantedStreams;

// One token of a forward step: its id and what the worker reports of it
// with the commit (the daemon's policies::TokenMeta holds the last three).
struct StepToken {
  int32_t token_id = 0;
  int32_t position = 0;  // RoPE position (logical; survives eviction).
  int32_t turn = 0;      // Index of the conversation message the token belongs to.
  Role role = Role::kUser;
};

// What the store learns when a message starts (for intent-aware policies).
struct TurnInfo {
  int32_t turn = 0;
  Role role = Role::kUser;
  std::string intent;  // The agent's current plan step or tool call; may be empty.
};

// What a probe's attention is reported as.
enum class ProbeKind {
  // IntentKV relevance for the daemon's `intent` policies: the tokens are the
  // turn's intent text; the mass is summed over layers, heads and queries
  // and replaces the previous relevance.
  kIntent,
  // KVzip's query-agnostic importance for `kvzip` policies: the tokens are a
  // "repeat the context" prompt and the context just prefilled; each slot
  // gets the most attention any single query of any layer and head paid it,
  // and the daemon keeps the most any probe reported.
  kReconstruct,
  // SnapKV's observation window for `snapkv` policies: the tokens are the
  // last ones of the user or tool message just prefilled, again; the mass is
  // summed over layers, heads and queries and replaces the previous one.
  kObservation,
};
// The score stream a probe's mass is reported as.
inline policies::ScoreStream ProbeStream(ProbeKind kind) {
  switch (kind) {
    case ProbeKind::kIntent: return policies::ScoreStream::kIntent;
    case ProbeKind::kReconstruct: return policies::ScoreStream::kImportance;
    case ProbeKind::kObservation: return policies::ScoreStream::kObservation;
  }
  return policies::ScoreStream::kIntent;
}

struct KvShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// Not thread-safe: one store serves one sequence, driven by one thread.
class KvStore {
 public:
  virtual ~KvStore() = default;

  virtual const KvShape& shape() const = 0;
  // Slots visible to attention (after any eviction by the daemon).
  virtual int64_t num_slots() const = 0;
  // Bytes of KV memory this store holds (for summaries).
  virtual int64_t bytes() const = 0;
  // The most bytes() has been since the store was created. Default: bytes(),
  // right for a store that never shrinks.
  virtual int64_t peak_bytes() const { return bytes(); }
  // The epoch of the block table in use: polykvd opens a session at 0 and
  // publishes epoch + 1 at each compaction, so for a new session it counts
  // the compactions adopted. Default: 0, for a store nothing else rewrites.
  virtual uint64_t epoch() const { return 0; }
  // "local-f32", "pool", ...
  virtual std::string name() const = 0;
  // Slots per page of a paged store; 0 for a store without pages.
  virtual int block_tokens() const { return 0; }
  // How often a store over a page source syncs with it (a daemon compacts
  // only then): every `steps` forward steps or `tokens` tokens, whichever
  // comes first, and before the first step. Zeros: a store that never syncs.
  struct SyncCadence {
    int steps = 0;
    int tokens = 0;
  };
  virtual SyncCadence sync_cadence() const { return {}; }

  // Called when a new message starts. Default: nothing to report.
  virtual absl::Status BeginTurn(const TurnInfo& turn) { return absl::OkStatus(); }
  // A generated turn ended and the agent waits (for a tool, a user): the
  // store touches nothing until the next BeginTurn, so its pages may be
  // moved meanwhile (PageSource::Idle).
  virtual absl::Status Idle() { return absl::OkStatus(); }

  // Probes: a store that supports them runs the steps between BeginProbe and
  // EndProbe over its cache without keeping them, and reports the attention
  // they paid each slot, as what `kind` says. Default: unsupported.
  virtual bool SupportsProbe(ProbeKind kind) const { return false; }
  virtual absl::Status BeginProbe(ProbeKind kind) { return absl::UnimplementedError("probe"); }
  virtual absl::Status EndProbe() { return absl::UnimplementedError("probe"); }

  // Shared prefixes (docs/prefix-sharing.md). Before the first step: the
  // store takes KV another store of the same model shared for the leading
  // tokens of `tokens` (whole blocks), and returns how many; the caller runs
  // the model from there on. Default: 0, a store that shares nothing.
  virtual absl::StatusOr<int64_t> AttachPrefix(std::span<const StepToken> tokens) { return 0; }

  // REQUIRES: no step in progress; tokens non-empty.
  // RESOURCE_EXHAUSTED when the cache has no room for the tokens.
  virtual absl::Status BeginStep(std::span<const StepToken> tokens) = 0;
  // k, v: [n, num_kv_heads, head_dim] for the step's n tokens.
  // REQUIRES: inside a step; layers appended in order 0..L-1, each once.
  virtual absl::Status Append(int layer, const float* k, const float* v) = 0;
  // q: [n, num_heads, head_dim]; out: [n, num_heads, head_dim]. Query head h
  // reads KV head h / (num_heads / num_kv_heads). Scale 1/sqrt(head_dim).
  // REQUIRES: Append(layer, ...) was called in this step.
  virtual absl::Status Attend(int layer, int num_heads, const float* q, float* out) = 0;
  // REQUIRES: inside a step, every layer appended.
  virtual absl::Status EndStep() = 0;
};

// Dense f32 cache in process memory: per layer, one contiguous buffer for K
// and one for V, grown by doubling. With kKernels attention the buffer is
// tiled as back-to-back f32 pages of 16 tokens (kernels/page_layout.h), read
// by the kernels' paged attention, so a pool-backed store holding f32 pages
// computes bit-identical attention and greedy output matches token for token.
// kBlas keeps plain [slot][kv_head][head_dim] rows and attends with OpenBLAS
// sgemm: an independent implementation, kept as a cross-check.
enum class LocalAttention { kKernels, kBlas };

struct LocalKvStoreOptions {
  KvShape shape;
  int64_t max_slots = 8192;  // RESOURCE_EXHAUSTED beyond this.
  LocalAttention attention = LocalAttention::kKernels;
  int kernel_threads = 0;  // kKernels: CPU threads (0 = all).
  // Accumulate per-slot attention mass (summed over layers, heads and
  // queries) in attention_mass(). kBlas: every step; kKernels: decode steps.
  bool track_attention_mass = false;
};

class LocalKvStore : public KvStore {
 public:
  static absl::StatusOr<std::unique_ptr<LocalKvStore>> Create(
      const LocalKvStoreOptions& options);
  ~LocalKvStore() override;

  const KvShape& shape() const override { return options_.shape; }
  int64_t num_slots() const override { return num_slots_; }
  int64_t bytes() const override;
  std::string name() const override { return "local-f32"; }
  absl::Status BeginStep(std::span<const StepToken> tokens) override;
  absl::Status Append(int layer, const float* k, const float* v) override;
  absl::Status Attend(int layer, int num_heads, const float* q, float* out) override;
  absl::Status EndStep() override;

  // [num_slots] Attention mass each slot received, summed over steps.
  const std::vector<float>& attention_mass() const { return mass_; }
  const std::vector<StepToken>& metadata() const { return meta_; }

 private:
  explicit LocalKvStore(const LocalKvStoreOptions& options)
      : options_(options), row_(int64_t{options.shape.num_kv_heads} * options.shape.head_dim) {}
  absl::Status Grow(int64_t slots);
  absl::Status AttendBlas(int layer, int num_heads, const float* q, float* out);
  absl::Status AttendKernels(int layer, int num_heads, const float* q, float* out);

  // Constant after construction.
  const LocalKvStoreOptions options_;
  const int64_t row_;  // num_kv_heads * head_dim

  // [layer] -> capacity_ slots, 256-byte aligned: kBlas [slot][row_] f32;
  // kKernels f32 pages of kDenseBlockTokens slots, page_bytes_ apart.
  std::vector<uint8_t*> k_, v_;
  int64_t capacity_ = 0;       // Slots allocated per layer.
  size_t page_bytes_ = 0;      // kKernels: bytes of one f32 page.
  std::vector<StepToken> meta_;
  std::vector<float> mass_;
  std::vector<float> scores_;  // Scratch: [n, slots] or [kv_heads, slots].
  int64_t num_slots_ = 0;      // Committed slots.
  int step_tokens_ = 0;        // > 0 inside a step.
  int next_layer_ = 0;
};

}  // namespace polykv::worker
