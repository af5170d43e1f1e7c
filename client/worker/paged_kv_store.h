// PagedKvStore: the KV cache as pages (kernels/page_layout.h) that come from
// a PageSource — polykvd's pool through libpolykv_client in production, or
// process memory (HeapPageSource) in tests and benchmarks — with attention
// computed by the kernels' paged attention directly over the pages, in each
// page's own format (f32, f16, bf16, fp8, int8, int4, int2; K and V may
// differ).
//
// Writing: the worker is the only writer of its new tokens. The rows of the
// block being filled are kept in f32 (the "residual") and the block's K and V
// pages are re-encoded from it after each step, so scaled formats always have
// parameters over exactly the rows they hold; once a block is full its pages
// are never touched again (the daemon may then requantize or compact them
// into NEW pages and publish a new block table).
//
// Epochs and commits: BeginStep is the step boundary. Every
// `sync_every_steps` steps or `sync_every_tokens` tokens, whichever comes
// first (and when a new message starts), the store commits
// the tokens written since the last commit, then asks the source for a newer
// block table (Sync) and adopts it before reserving room for the step, so the
// per-token path makes no RPC on most steps.
//
// Merged slots: a table may say that a slot stands for several tokens
// (PagedTable::slot_counts). Decode and prefill attention then add log(count)
// to that slot's score (kernels::AttentionParams::slot_bias), so the merged
// slot weighs like the tokens it replaced; the attention mass reported for it
// is that of the biased softmax. Tokens written after the table count 1.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/worker/device_kernels.h"
#include "client/worker/kv_store.h"
#include "kernels/ops.h"
#include "kernels/page_format.h"

namespace polykv::worker {

// One block of `block_tokens` slots: a K and a V page per layer.
struct PagedBlock {
  std::vector<void*> k_pages;  // [num_layers], kPageAlignment-aligned
  std::vector<void*> v_pages;  // [num_layers]
  kernels::PageFormat k_format = kernels::PageFormat::kF32;
  kernels::PageFormat v_format = kernels::PageFormat::kF32;
};

// A block table the source publishes (e.g. after the daemon compacted the
// session): every block in slot order and how many slots hold tokens. A
// layer may lack its pages (nullptr) in the table's first blocks: it then
// holds only the newest slots, from its first block with pages on, and has
// every page from there to the last block.
struct PagedTable {
  std::vector<PagedBlock> blocks;
  int64_t num_tokens = 0;
  uint64_t epoch = 0;
  // [num_tokens] how many tokens each slot stands for (> 1 after a merge;
  // the daemon's Sync slot_counts), or empty: every slot is one token. Each
  // count must be >= 1. Attention adds log(count) to a merged slot's score,
  // so it weighs like the `count` tokens it replaced.
  std::vector<uint32_t> slot_counts;
  // The table holds the same slots as the store's, with the same bytes, in
  // other pages (the session moved to another polykvd, or was restored after
  // an offload, or left an arena polykvd empties): the store keeps
  // what it holds of them (the f32 rows of the block being filled, pending
  // attention mass) and only reads the new pages from now on.
  bool same_slots = false;
};

// Where pages come from. Not thread-safe; driven by the store's thread.
class PageSource {
 public:
  virtual ~PageSource() = default;
  virtual int block_tokens() const = 0;
  // Blocks so that at least `total_tokens` slots are reserved; returns only
  // the NEW blocks (appended after the existing ones, in order).
  // RESOURCE_EXHAUSTED when the pool refuses.
  virtual absl::StatusOr<std::vector<PagedBlock>> Reserve(int64_t total_tokens) = 0;
  // The first `total_tokens` slots hold tokens; `new_tokens` are the metadata
  // of the ones added since the last commit (position, turn, role).
  virtual absl::Status Commit(int64_t total_tokens, std::span<const StepToken> new_tokens) = 0;
  // At a step boundary: the new table if the source's epoch moved, else
  // nullopt. Adopting it acknowledges the epoch.
  virtual absl::StatusOr<std::optional<PagedTable>> Sync() = 0;
  // The store touches no page until its next Sync (Session::Idle). Default:
  // nothing to say.
  virtual absl::Status Idle() { return absl::OkStatus(); }
  // What the daemon's policy for this session reads (OpenSession, then each
  // Sync): the store measures those streams and no others (attention mass in
  // decode and prefill, entropy in decode, the probes that report intent,
  // importance and observation). Default: nothing.
  virtual WantedStreams wants() const { return {}; }
  // One score stream's values (policies/score_stream.h), of the slots in the
  // current epoch's order: a slot stream's [num_slots], or [num_layers x
  // num_slots] layer-major when per_layer; a per-layer stream's
  // [num_layers]. Default: dropped.
  virtual absl::Status Report(ScoreStream stream, std::span<const float> values,
                              bool per_layer) {
    return absl::OkStatus();
  }
  // Wall seconds spent so far computing the structure tags reported with
  // commits (SlotTagger and the report it builds), for the store's
  // SignalCost. Default: 0, a source that tags nothing.
  virtual double tag_seconds() const { return 0; }
  // Shared prefixes (KvStore::AttachPrefix). Before the first Reserve: the
  // table of the shared blocks holding the leading full blocks of `tokens`
  // (epoch unchanged), or nullopt when nothing matched or the source shares
  // nothing (the default). SharePrefix: the committed leading blocks holding
  // `token_ids`, offered; returns the tokens shared (default 0).
  virtual absl::StatusOr<std::optional<PagedTable>> AttachPrefix(
      std::span<const StepToken> tokens) {
    return std::nullopt;
  }
  virtual absl::StatusOr<int64_t> SharePrefix(std::span<const int32_t> token_ids) { return 0; }
  // Bytes of pages held.
  virtual int64_t bytes() const = 0;
  virtual std::string name() const = 0;
};

// Wall time a PagedKvStore spends on the policy signals it reports to the
// daemon (issue 12), from steady_clock around each signal code path, so that
// their cost is measured as a share of the same run's decode and prefill
// time rather than by an A/B of two noisy runs:
//   tags:  the source's structure tagging at each commit
//          (PageSource::tag_seconds). The ReportSlots RPC that carries each
//          commit's turn and role is not counted: a source without tags sends
//          it too.
//   mass:  summing the kernel's per-KV-head attention mass into the pending
//          per-slot mass (Attend), and its report (CommitAndSync).
//   probe: each probe (intent, reconstruction, observation), from after
//          BeginProbe's commit to the end of EndProbe: its forward pass, the
//          cache restore and the report.
// Not counted: what computing the slot mass costs inside the attention
// kernels themselves (only a whole-run A/B sees that), and the timer itself
// (two steady_clock reads per timed section). All zero for a source that
// neither tags nor wants attention, but for commit_seconds, which is not a
// signal: the whole PageSource::Commit (tagging, the Commit and ReportSlots
// RPCs), an upper bound of what the tags add to the report's RPC.
struct SignalCost {
  struct Phase {
    double tag_seconds = 0;   // tagging
    double mass_seconds = 0;  // attention mass and its reports
    int64_t calls = 0;        // timed sections
    double commit_seconds = 0;  // not a signal: every PageSource::Commit, whole
    double seconds() const { return tag_seconds + mass_seconds; }
  };
  Phase decode;   // one-token steps (and the commits they begin with)
  Phase prefill;  // prefill chunks and message starts
  double probe_seconds = 0;  // probes (intent and reconstruction), whole
  int64_t probes = 0;        // probes counted in probe_seconds
};

struct HeapPageSourceOptions {
  KvShape shape;
  int block_tokens = 16;
  kernels::PageFormat k_format = kernels::PageFormat::kF32;
  kernels::PageFormat v_format = kernels::PageFormat::kF32;
  int64_t max_tokens = 1 << 20;  // RESOURCE_EXHAUSTED beyond this.
};

// Pages in process memory (aligned heap allocations), never compacted.
absl::StatusOr<std::unique_ptr<PageSource>> NewHeapPageSource(const HeapPageSourceOptions& o);

struct PagedKvStoreOptions {
  KvShape shape;
  // Tokens reserved ahead of need, so Reserve is not on every step: an
  // eighth of the session's slots, at most this many, so that a short or
  // freshly compacted session does not hold pages it may never fill (the
  // pool counts them against the session). None with pages of at least this
  // many tokens: the pool grants whole pages, so decode steps reach a new
  // Reserve only once a page anyway, and the extra page would only raise the
  // session's peak, most at small budgets.
  int reserve_ahead = 64;
  // A refused Reserve (RESOURCE_EXHAUSTED: the pool is under pressure) is
  // retried, with a Sync before each retry, every 200 ms for this long
  // (0: fail at once).
  int reserve_retry_ms = 0;
  // Commit + Sync with the source every this many steps (1: every step), or
  // once this many tokens were written since the last sync: a prefill chunk
  // is one step of many tokens, and the daemon compacts a session only when
  // it syncs, so steps alone let a prefill overshoot its budget by up to
  // sync_every_steps chunks.
  int sync_every_steps = 8;
  int sync_every_tokens = 64;
  // Reports attention mass to the source at the first commit after this many
  // steps (0: never).
  int report_every_steps = 16;
  // Prefill chunks add their attention mass too (the kernel's by-product
  // from a second pass over the chunk's scores), when the source wants it.
  // Most of an agent's context is prefilled, not decoded: without it the
  // daemon's H2O-style scores see only the answers' attention.
  bool prefill_attention_mass = true;
  // The recent window kept in f16 (KIVI's residual): attention reads the
  // newest blocks -- the one being filled and enough full ones before it to
  // hold at least this many tokens, i.e. ceil(recent_f16_tokens / T) + 1
  // blocks -- from f16 copies of their rows that this store keeps itself,
  // while the pool's pages hold the session's formats as always (the daemon
  // reads and compacts those). 0: none. Worth it only for quantized formats:
  // the caller decides.
  // Counted in bytes(). After the store adopts a compacted table the window
  // restarts at the block being filled: rows it held are not kept across a
  // compaction.
  int recent_f16_tokens = 0;
  // Shared prefixes (docs/prefix-sharing.md): at each commit the store
  // offers the full blocks it has written of the conversation's first
  // `share_prefix_messages` messages (StepToken::turn below it: 1 = the
  // system prompt, which every agent of a group starts with) to later
  // sessions of its tenant and model (PageSource::SharePrefix), unless its
  // table changed first (a compaction moved slots). 0: nothing shared.
  int share_prefix_messages = 0;
  // Kernels backend and threads (CPU by default). kCuda: the source's pages
  // are in GPU memory (a cuda-tier polykvd; PoolPageSourceOptions::
  // pages_on_device), and encodes, decodes and attention run on the device
  // (DeviceKernels); no recent f16 window then.
  kernels::Exec exec;
};

class PagedKvStore : public KvStore {
 public:
  // Takes ownership of `source`.
  static absl::StatusOr<std::unique_ptr<PagedKvStore>> Create(
      const PagedKvStoreOptions& options, std::unique_ptr<PageSource> source);

  const KvShape& shape() const override { return options_.shape; }
  int64_t num_slots() const override { return num_slots_; }
  // The source's pages and the recent window's f16 copies.
  int64_t bytes() const override { return source_->bytes() + recent_bytes_; }
  // Taken whenever the block table grows or is replaced: a compacted
  // session's peak is just before the compaction.
  int64_t peak_bytes() const override { return std::max(peak_bytes_, bytes()); }
  // Reservations the pool refused and this store retried (reserve_retry_ms).
  int64_t reserve_retries() const { return reserve_retries_; }
  std::string name() const override { return source_->name(); }
  int block_tokens() const override { return page_shape_.block_tokens; }
  SyncCadence sync_cadence() const override {
    return {options_.sync_every_steps, options_.sync_every_tokens};
  }
  absl::Status BeginStep(std::span<const StepToken> tokens) override;
  absl::Status Append(int layer, const float* k, const float* v) override;
  absl::Status Attend(int layer, int num_heads, const float* q, float* out) override;
  absl::Status EndStep() override;
  // A new message: commit what is pending and sync before its tokens.
  absl::Status BeginTurn(const TurnInfo& turn) override;
  // A step boundary (commit, reports, Sync), then tells the source it is
  // idle until the next BeginTurn (whose Sync follows the session wherever
  // it went).
  absl::Status Idle() override;
  // Probes: between BeginProbe and EndProbe, steps attend over the cache
  // (and each other) as usual but are never committed; EndProbe drops them,
  // restores the block being filled and reports the mass they gave each slot
  // (ProbeKind): as its intent relevance, importance or observation
  // (ProbeStream; PageSource::Report).
  bool SupportsProbe(ProbeKind kind) const override {
    return source_->wants().has(ProbeStream(kind));
  }
  absl::Status BeginProbe(ProbeKind kind) override;
  absl::Status EndProbe() override;
  absl::StatusOr<int64_t> AttachPrefix(std::span<const StepToken> tokens) override;
  // Commits the tokens written since the last commit (if any).
  absl::Status CommitPending();

  // [num_slots] attention mass (summed over layers, query heads and the
  // step's queries) not yet reported, when the source wants attention:
  // decode steps, and prefill chunks when options.prefill_attention_mass.
  const std::vector<float>& pending_attention_mass() const { return mass_; }
  // The signals' cost since the store was created (see SignalCost).
  const SignalCost& signal_cost() const { return signal_cost_; }
  uint64_t epoch() const override { return epoch_; }
  PageSource* source() const { return source_.get(); }

 private:
  PagedKvStore(const PagedKvStoreOptions& options, std::unique_ptr<PageSource> source);
  void AddBlocks(const std::vector<PagedBlock>& blocks);
  // The table's slot counts as the attention bias (slot_bias_), checked.
  absl::Status AdoptSlotCounts(const PagedTable& table);
  absl::Status AdoptTable(const PagedTable& table);
  absl::Status EncodeBlock(int layer, int64_t block, int rows);
  // The first `rows` rows of `layer`'s block `block` decoded into its f32
  // residual.
  absl::Status DecodeBlock(int layer, int64_t block, int rows);
  // Paged attention (num_new == 1: decode) through options_.exec, or through
  // device_ when the pages are in GPU memory.
  absl::Status RunAttention(const kernels::PagedKvView& view,
                            const kernels::AttentionParams& params, int num_new, const float* q,
                            float* out, float* slot_mass);
  // The recent window (PagedKvStoreOptions::recent_f16_tokens): the f16 K
  // and V page of `block` in layer `layer` (a ring of recent_blocks_ slots).
  void InitRecentWindow();
  uint8_t* RecentPage(int layer, int64_t block, kernels::KvKind kind);
  absl::Status WriteRecentRows(int layer, int64_t block, int first_row, int rows);
  // tables_[layer] for attention over `num_blocks`, without the layer's
  // hole: the window's blocks point at their f16 copies.
  const kernels::BlockEntry* AttendTable(int layer, int64_t num_blocks);
  // slot_bias_ of the held slots of a layer that holds `before` slots, then
  // none of the next `skipped`; null without a bias.
  const float* HeldBias(int64_t before, int64_t skipped);
  absl::Status CommitAndSync();
  // Adds `seconds` of tagging (`tags`) or attention-mass work to the current
  // phase; nothing inside a probe, which is timed whole.
  void CountSignal(double seconds, bool tags);

  // Constant after construction.
  const PagedKvStoreOptions options_;
  const std::unique_ptr<PageSource> source_;
  const kernels::PageShape page_shape_;
  const int64_t row_;  // num_kv_heads * head_dim

  std::vector<std::vector<kernels::BlockEntry>> tables_;  // [layer][block]
  // [layer] the run of blocks the layer has no pages in (none but where the
  // daemon compacted layers to different lengths: the blocks after a shared
  // prefix and before the layer's newer slots); its entries there are empty.
  struct Hole {
    int64_t start = 0, blocks = 0;
  };
  std::vector<Hole> holes_;
  std::vector<float> held_bias_;  // Scratch of Attend: slot_bias_ without a hole.
  // f32 rows of the block being filled: [layer] -> [block_tokens][row].
  std::vector<std::vector<float>> k_residual_, v_residual_;
  int64_t residual_block_ = 0;  // Block index the residual rows belong to.
  // The recent window: recent_blocks_ ring slots per layer, each a K and a V
  // f16 page (recent_page_bytes_ apart, K first), in one aligned buffer.
  // Blocks from recent_from_ on have their rows there.
  int recent_blocks_ = 0;
  size_t recent_page_bytes_ = 0;
  int64_t recent_bytes_ = 0;  // What the buffer counts in bytes().
  std::vector<uint8_t> recent_buf_;
  uint8_t* recent_ = nullptr;  // recent_buf_'s first kPageAlignment-aligned byte
  int64_t recent_from_ = 0;
  std::vector<kernels::BlockEntry> attend_table_;  // Scratch of AttendTable.
  // options_.exec is the CUDA backend: the pages are device memory, and the
  // kernel calls go through this (device_kernels.h).
  std::unique_ptr<DeviceKernels> device_;
  static constexpr int kReserveRetryPauseMs = 200;  // polykvd's "retry in about 200 ms"
  int64_t num_slots_ = 0;
  int64_t reserve_retries_ = 0;
  int64_t reserved_ = 0;
  uint64_t epoch_ = 0;
  int64_t peak_bytes_ = 0;  // The largest bytes() after AddBlocks.
  std::vector<StepToken> step_meta_;
  std::vector<StepToken> uncommitted_;  // Written, not yet committed to the source.
  // share_prefix_messages: the ids of the committed slots of those messages
  // as written, while the table has not changed, and how many are shared.
  bool sharing_ = false;
  std::vector<int32_t> written_ids_;
  int64_t shared_tokens_ = 0;
  // Shares the full blocks committed since the last share (sharing_).
  absl::Status ShareWritten();
  int steps_since_sync_ = -1;           // -1: sync before the first step.
  int64_t tokens_since_sync_ = 0;
  int next_layer_ = 0;
  int steps_since_report_ = 0;
  std::vector<float> mass_;       // [num_slots]
  // [num_slots + this step's tokens] log(count) per slot, 0 for unmerged
  // slots; empty while no slot of the adopted table is merged (attention then
  // gets no bias at all, the unmerged path).
  std::vector<float> slot_bias_;
  std::vector<float> head_mass_;  // Scratch: [num_kv_heads][slots].
  // A step of `tokens` begins: the mass not yet reported ages by the
  // policy's decay per token (WantedStreams::attention_decay), so what the
  // daemon folds in is the decayed H2O sum since the last report.
  void AgePendingMass(size_t tokens);
  // Adds the entropy of the decode step's attention in head_mass_ (held
  // slots per KV head, `group` query heads each) to `layer`'s sum.
  void AddEntropy(int layer, int num_kv_heads, int64_t held, int group);
  // [num_layers] decode attention entropy summed over steps (each step's
  // mean over KV heads) since the last report, and the steps summed.
  std::vector<double> entropy_sum_;
  int entropy_steps_ = 0;
  // Probe state (BeginProbe..EndProbe).
  bool probing_ = false;
  ProbeKind probe_kind_ = ProbeKind::kIntent;
  int64_t probe_base_ = 0;  // num_slots_ when the probe began
  int64_t probe_residual_block_ = 0;
  std::vector<std::vector<float>> probe_k_residual_, probe_v_residual_;
  std::vector<uint8_t> probe_recent_;  // The recent window as the probe found it.
  // [probe_base_], or [num_layers][probe_base_] for a reconstruction probe
  // whose source wants slot streams per layer (probe_per_layer_).
  std::vector<float> probe_mass_;
  bool probe_per_layer_ = false;
  double probe_start_ = 0;         // steady_clock seconds, after BeginProbe's commit
  // Signal cost, and the phase it goes to: the current step has one token.
  SignalCost signal_cost_;
  bool decode_phase_ = false;
};

}  // namespace polykv::worker
