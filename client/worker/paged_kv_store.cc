#include "client/worker/paged_kv_store.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/worker/clock.h"

namespace polykv::worker {
namespace {

using kernels::KvKind;
using kernels::PageFormat;

#define RETURN_IF_ERROR_(expr)                              \
  do {                                                      \
    if (absl::Status s_ = (expr); !s_.ok()) return s_;      \
  } while (0)

class HeapPageSource : public PageSource {
 public:
  explicit HeapPageSource(const HeapPageSourceOptions& o)
      : o_(o),
        k_bytes_(kernels::PageBytes(o.k_format, KvKind::kKey,
                                    {o.block_tokens, o.shape.num_kv_heads, o.shape.head_dim})),
        v_bytes_(kernels::PageBytes(o.v_format, KvKind::kValue,
                                    {o.block_tokens, o.shape.num_kv_heads, o.shape.head_dim})) {}
  ~HeapPageSource() override {
    for (void* p : pages_) std::free(p);
  }
  bool ok() const { return k_bytes_ != 0 && v_bytes_ != 0; }

  int block_tokens() const override { return o_.block_tokens; }
  absl::StatusOr<std::vector<PagedBlock>> Reserve(int64_t total_tokens) override {
    if (total_tokens > o_.max_tokens) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "heap page source: ", total_tokens, " tokens > max ", o_.max_tokens));
    }
    std::vector<PagedBlock> out;
    while (num_blocks_ * o_.block_tokens < total_tokens) {
      PagedBlock b;
      b.k_format = o_.k_format;
      b.v_format = o_.v_format;
      for (int l = 0; l < o_.shape.num_layers; ++l) {
        b.k_pages.push_back(Alloc(k_bytes_));
        b.v_pages.push_back(Alloc(v_bytes_));
        if (b.k_pages.back() == nullptr || b.v_pages.back() == nullptr) {
          return absl::ResourceExhaustedError("heap page source: out of memory");
        }
      }
      out.push_back(std::move(b));
      ++num_blocks_;
    }
    return out;
  }
  absl::Status Commit(int64_t, std::span<const StepToken>) override { return absl::OkStatus(); }
  absl::StatusOr<std::optional<PagedTable>> Sync() override { return std::nullopt; }
  int64_t bytes() const override {
    return num_blocks_ * o_.shape.num_layers * static_cast<int64_t>(k_bytes_ + v_bytes_);
  }
  std::string name() const override {
    return absl::StrCat("heap-", std::string(kernels::FormatShortName(o_.k_format)), "-",
                        std::string(kernels::FormatShortName(o_.v_format)));
  }

 private:
  void* Alloc(size_t bytes) {
    void* p = std::aligned_alloc(kernels::kPageAlignment, bytes);
    if (p != nullptr) {
      std::memset(p, 0, bytes);
      pages_.push_back(p);
    }
    return p;
  }

  const HeapPageSourceOptions o_;
  const size_t k_bytes_, v_bytes_;
  int64_t num_blocks_ = 0;
  std::vector<void*> pages_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PageSource>> NewHeapPageSource(const HeapPageSourceOptions& o) {
  auto s = std::make_unique<HeapPageSource>(o);
  if (o.shape.num_layers <= 0 || !s->ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heap page source: shape (", o.shape.num_layers, " layers, ", o.shape.num_kv_heads,
        " kv heads, head dim ", o.shape.head_dim, ", block ", o.block_tokens,
        ") cannot be stored as ", std::string(kernels::FormatShortName(o.k_format)), "/",
        std::string(kernels::FormatShortName(o.v_format))));
  }
  return std::unique_ptr<PageSource>(std::move(s));
}

PagedKvStore::PagedKvStore(const PagedKvStoreOptions& options, std::unique_ptr<PageSource> source)
    : options_(options),
      source_(std::move(source)),
      page_shape_{source_->block_tokens(), options.shape.num_kv_heads, options.shape.head_dim},
      row_(int64_t{options.shape.num_kv_heads} * options.shape.head_dim) {
  tables_.resize(options.shape.num_layers);
  holes_.assign(options.shape.num_layers, Hole{});
  k_residual_.assign(options.shape.num_layers,
                     std::vector<float>(static_cast<size_t>(page_shape_.block_tokens * row_)));
  v_residual_ = k_residual_;
  sharing_ = options.share_prefix_messages > 0;
}

void PagedKvStore::InitRecentWindow() {
  const int bt = page_shape_.block_tokens;
  if (options_.recent_f16_tokens <= 0) return;
  recent_blocks_ = (options_.recent_f16_tokens + bt - 1) / bt + 1;
  recent_page_bytes_ = kernels::PageBytes(PageFormat::kF16, KvKind::kKey, page_shape_);
  const size_t total = recent_page_bytes_ * 2 * recent_blocks_ * options_.shape.num_layers;
  recent_buf_.assign(total + kernels::kPageAlignment, 0);
  recent_ = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(recent_buf_.data()) + kernels::kPageAlignment - 1) &
      ~(uintptr_t{kernels::kPageAlignment} - 1));
  recent_bytes_ = static_cast<int64_t>(total);
}

uint8_t* PagedKvStore::RecentPage(int layer, int64_t block, KvKind kind) {
  const size_t slot = static_cast<size_t>(layer) * recent_blocks_ + block % recent_blocks_;
  return recent_ + (slot * 2 + (kind == KvKind::kValue ? 1 : 0)) * recent_page_bytes_;
}

absl::Status PagedKvStore::WriteRecentRows(int layer, int64_t block, int first_row, int rows) {
  if (recent_blocks_ == 0 || rows == 0) return absl::OkStatus();
  const size_t at = static_cast<size_t>(first_row) * row_;
  RETURN_IF_ERROR_(kernels::WritePageRows(page_shape_, PageFormat::kF16,
                                          k_residual_[layer].data() + at, first_row, rows,
                                          RecentPage(layer, block, KvKind::kKey)));
  return kernels::WritePageRows(page_shape_, PageFormat::kF16, v_residual_[layer].data() + at,
                                first_row, rows, RecentPage(layer, block, KvKind::kValue));
}

const kernels::BlockEntry* PagedKvStore::AttendTable(int layer, int64_t num_blocks) {
  const std::vector<kernels::BlockEntry>& table = tables_[layer];
  const Hole hole = holes_[layer];
  const int64_t first = std::max(recent_from_, num_blocks - recent_blocks_);
  const bool recent = recent_blocks_ > 0 && first < num_blocks;
  if (!recent && hole.start == 0) return table.data() + hole.blocks;
  attend_table_.assign(table.begin(), table.begin() + hole.start);
  attend_table_.insert(attend_table_.end(), table.begin() + hole.start + hole.blocks,
                       table.begin() + num_blocks);
  for (int64_t b = recent ? first : num_blocks; b < num_blocks; ++b) {
    if (b < hole.start + hole.blocks) continue;  // the window is the newest blocks
    kernels::BlockEntry& e = attend_table_[b - hole.blocks];
    e.k_offset = reinterpret_cast<uintptr_t>(RecentPage(layer, b, KvKind::kKey));
    e.v_offset = reinterpret_cast<uintptr_t>(RecentPage(layer, b, KvKind::kValue));
    e.k_format = e.v_format = PageFormat::kF16;
  }
  return attend_table_.data();
}

absl::StatusOr<std::unique_ptr<PagedKvStore>> PagedKvStore::Create(
    const PagedKvStoreOptions& options, std::unique_ptr<PageSource> source) {
  if (source == nullptr) return absl::InvalidArgumentError("PagedKvStore: no page source");
  const KvShape& s = options.shape;
  if (s.num_layers <= 0 || s.num_kv_heads <= 0 || s.head_dim <= 0 ||
      source->block_tokens() <= 0 || options.recent_f16_tokens < 0) {
    return absl::InvalidArgumentError("PagedKvStore: bad shape");
  }
  const bool on_device = options.exec.backend == kernels::Backend::kCuda;
  if (on_device && options.recent_f16_tokens > 0) {
    return absl::InvalidArgumentError(
        "PagedKvStore: the recent f16 window is host memory; pages on the device take none");
  }
  std::unique_ptr<PagedKvStore> store(new PagedKvStore(options, std::move(source)));
  if (on_device) store->device_ = std::make_unique<DeviceKernels>();
  store->InitRecentWindow();
  // Adopt whatever the source already holds (e.g. a resumed session).
  auto t = store->source_->Sync();
  if (!t.ok()) return t.status();
  if (t->has_value()) RETURN_IF_ERROR_(store->AdoptTable(**t));
  return store;
}

void PagedKvStore::AddBlocks(const std::vector<PagedBlock>& blocks) {
  for (const PagedBlock& b : blocks) {
    for (int l = 0; l < options_.shape.num_layers; ++l) {
      kernels::BlockEntry e;
      e.k_offset = reinterpret_cast<uintptr_t>(b.k_pages[l]);
      e.v_offset = reinterpret_cast<uintptr_t>(b.v_pages[l]);
      e.k_format = b.k_format;
      e.v_format = b.v_format;
      tables_[l].push_back(e);
    }
  }
  reserved_ = static_cast<int64_t>(tables_[0].size()) * page_shape_.block_tokens;
  peak_bytes_ = std::max(peak_bytes_, bytes());
}

absl::Status PagedKvStore::AdoptSlotCounts(const PagedTable& table) {
  const std::vector<uint32_t>& counts = table.slot_counts;
  if (!counts.empty() && static_cast<int64_t>(counts.size()) != table.num_tokens) {
    return absl::InternalError(absl::StrCat("page source published ", counts.size(),
                                            " slot counts for ", table.num_tokens, " slots"));
  }
  bool merged = false;
  for (size_t s = 0; s < counts.size(); ++s) {
    if (counts[s] == 0) {
      return absl::InternalError(
          absl::StrCat("page source published slot ", s, " with count 0 (counts are >= 1)"));
    }
    merged |= counts[s] > 1;
  }
  slot_bias_.clear();  // All ones (or none): attention takes the unbiased path.
  if (merged) {
    slot_bias_.resize(counts.size());
    for (size_t s = 0; s < counts.size(); ++s) {
      slot_bias_[s] = std::log(static_cast<float>(counts[s]));
    }
  }
  return absl::OkStatus();
}

absl::Status PagedKvStore::AdoptTable(const PagedTable& table) {
  const int layers = options_.shape.num_layers;
  for (const PagedBlock& b : table.blocks) {
    if (static_cast<int>(b.k_pages.size()) != layers ||
        static_cast<int>(b.v_pages.size()) != layers) {
      return absl::InternalError("page source published a block without a page slot per layer");
    }
  }
  const int bt = page_shape_.block_tokens;
  if (table.num_tokens > static_cast<int64_t>(table.blocks.size()) * bt) {
    return absl::InternalError("page source published more tokens than its blocks hold");
  }
  // A layer may hold none of a run of blocks (its hole, after the blocks of
  // a shared prefix): its other slots are the newest ones. After its hole it
  // has every page, the last block (the one being filled) included.
  const int64_t nb = static_cast<int64_t>(table.blocks.size());
  const int64_t tail = table.num_tokens > 0 ? (table.num_tokens - 1) / bt : 0;
  std::vector<Hole> holes(static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    auto present = [&](int64_t b) { return table.blocks[b].k_pages[l] != nullptr; };
    int64_t start = 0;
    while (start < nb && present(start)) ++start;
    int64_t end = start;
    while (end < nb && !present(end)) ++end;
    for (int64_t b = 0; b < nb; ++b) {
      const bool held = b < start || b >= end;
      if ((table.blocks[b].k_pages[l] != nullptr) != held ||
          (table.blocks[b].v_pages[l] != nullptr) != held) {
        return absl::InternalError(absl::StrCat("page source published layer ", l,
                                                " without its pages in block ", b,
                                                " (a layer holds none of one run of blocks)"));
      }
    }
    if (start == 0 && end == nb && nb > 0) {
      return absl::InternalError(absl::StrCat("page source published no pages of layer ", l));
    }
    if (end > start && end > tail) {
      return absl::InternalError(
          absl::StrCat("page source published layer ", l, " without blocks ", start, " to ",
                       end - 1, " of ", table.num_tokens,
                       " slots: every layer holds the block being filled"));
    }
    if (end > start) holes[static_cast<size_t>(l)] = Hole{start, end - start};
  }
  // The same slots: its committed ones, and the pages hold the rest the
  // store wrote since (a move copies whole pages).
  if (table.same_slots && table.num_tokens > num_slots_) {
    return absl::InternalError(absl::StrCat("page source published the same slots as ",
                                            table.num_tokens, " slots; the store holds ",
                                            num_slots_));
  }
  if (!table.same_slots) RETURN_IF_ERROR_(AdoptSlotCounts(table));
  // Slots as written no more (or pages of another daemon): nothing to share.
  sharing_ = false;
  written_ids_ = {};
  for (auto& t : tables_) t.clear();
  holes_ = std::move(holes);
  AddBlocks(table.blocks);
  epoch_ = table.epoch;
  // New pages only: what the store holds of the slots (their f32 rows,
  // counts, pending mass, recent window) stays.
  if (table.same_slots) return absl::OkStatus();
  num_slots_ = table.num_tokens;
  mass_.assign(num_slots_, 0.0f);  // Slots moved: pending scores no longer apply.
  // Rebuild the f32 rows of a partly filled last block from its pages. The
  // recent window restarts there: its other rows moved or are gone.
  residual_block_ = num_slots_ > 0 ? (num_slots_ - 1) / bt : 0;
  const int rows = static_cast<int>(num_slots_ - residual_block_ * bt);
  recent_from_ = num_slots_ / bt;
  if (num_slots_ > 0 && rows < bt) {
    recent_from_ = residual_block_;
    for (int l = 0; l < options_.shape.num_layers; ++l) {
      RETURN_IF_ERROR_(DecodeBlock(l, residual_block_, rows));
      RETURN_IF_ERROR_(WriteRecentRows(l, residual_block_, 0, rows));
    }
  }
  return absl::OkStatus();
}

void PagedKvStore::CountSignal(double seconds, bool tags) {
  if (probing_) return;
  SignalCost::Phase& p = decode_phase_ ? signal_cost_.decode : signal_cost_.prefill;
  (tags ? p.tag_seconds : p.mass_seconds) += seconds;
  ++p.calls;
}

absl::StatusOr<int64_t> PagedKvStore::AttachPrefix(std::span<const StepToken> tokens) {
  if (num_slots_ != 0 || reserved_ != 0 || probing_) {
    return absl::FailedPreconditionError("a prefix is attached to a fresh store only");
  }
  auto table = source_->AttachPrefix(tokens);
  if (!table.ok()) return table.status();
  if (!table->has_value()) return 0;
  RETURN_IF_ERROR_(AdoptTable(**table));
  sharing_ = options_.share_prefix_messages > 0;  // AdoptTable stopped it
  for (const StepToken& t : tokens.first(num_slots_)) written_ids_.push_back(t.token_id);
  shared_tokens_ = num_slots_;
  return num_slots_;
}

absl::Status PagedKvStore::ShareWritten() {
  const int64_t bt = page_shape_.block_tokens;
  if (!sharing_ || static_cast<int64_t>(written_ids_.size()) / bt * bt <= shared_tokens_) {
    return absl::OkStatus();
  }
  auto shared = source_->SharePrefix(written_ids_);
  // Compacted meanwhile (the daemon's tables moved on): nothing more to share.
  if (absl::IsFailedPrecondition(shared.status())) {
    sharing_ = false;
    return absl::OkStatus();
  }
  if (!shared.ok()) return shared.status();
  shared_tokens_ = *shared;
  return absl::OkStatus();
}

absl::Status PagedKvStore::CommitPending() {
  if (uncommitted_.empty()) return absl::OkStatus();
  const double tagged = source_->tag_seconds();
  const double t0 = SteadySeconds();
  // The daemon may read the committed pages as soon as it is told (a
  // compaction): the device's queued writes must have landed.
  if (device_) RETURN_IF_ERROR_(kernels::DeviceSynchronize());
  RETURN_IF_ERROR_(source_->Commit(num_slots_, uncommitted_));
  (decode_phase_ ? signal_cost_.decode : signal_cost_.prefill).commit_seconds +=
      SteadySeconds() - t0;
  if (const double t = source_->tag_seconds() - tagged; t > 0) {
    CountSignal(t, /*tags=*/true);
  }
  bool past = false;  // a token of a later message is committed: the shared ones are whole
  if (sharing_) {
    for (const StepToken& t : uncommitted_) {
      if (t.turn >= options_.share_prefix_messages) {
        past = true;
        break;
      }
      written_ids_.push_back(t.token_id);
    }
  }
  uncommitted_.clear();
  RETURN_IF_ERROR_(ShareWritten());
  if (past) sharing_ = false;
  return absl::OkStatus();
}

absl::Status PagedKvStore::CommitAndSync() {
  // Commit first: a table published by the daemon covers committed tokens only.
  RETURN_IF_ERROR_(CommitPending());
  steps_since_sync_ = 0;
  tokens_since_sync_ = 0;
  // Attention mass of committed slots, in the current epoch's slot order.
  if (options_.report_every_steps > 0 && steps_since_report_ >= options_.report_every_steps) {
    steps_since_report_ = 0;
    const WantedStreams wants = source_->wants();
    const bool entropy = wants.has(ScoreStream::kEntropy) && entropy_steps_ > 0;
    const double t0 = SteadySeconds();
    if (wants.has(ScoreStream::kAttention)) {
      RETURN_IF_ERROR_(source_->Report(ScoreStream::kAttention,
                                       std::span(mass_).first(num_slots_), false));
      std::fill(mass_.begin(), mass_.end(), 0.0f);
    }
    if (entropy) {
      std::vector<float> mean(entropy_sum_.size());
      for (size_t l = 0; l < mean.size(); ++l) {
        mean[l] = static_cast<float>(entropy_sum_[l] / entropy_steps_);
      }
      RETURN_IF_ERROR_(source_->Report(ScoreStream::kEntropy, mean, false));
      std::fill(entropy_sum_.begin(), entropy_sum_.end(), 0.0);
      entropy_steps_ = 0;
    }
    if (wants.has(ScoreStream::kAttention) || entropy) {
      CountSignal(SteadySeconds() - t0, /*tags=*/false);
    }
  }
  auto t = source_->Sync();
  if (!t.ok()) return t.status();
  if (t->has_value()) RETURN_IF_ERROR_(AdoptTable(**t));
  return absl::OkStatus();
}

absl::Status PagedKvStore::Idle() {
  if (!step_meta_.empty() || probing_) return absl::FailedPreconditionError("Idle inside a step");
  // A step boundary first (commit, the pending reports, the daemon's
  // tables): nothing may call the source between Idle and the next Sync.
  RETURN_IF_ERROR_(CommitAndSync());
  return source_->Idle();
}

absl::Status PagedKvStore::BeginTurn(const TurnInfo& turn) {
  if (!step_meta_.empty()) return absl::FailedPreconditionError("BeginTurn inside a step");
  decode_phase_ = false;  // A message start is prefill-side.
  return CommitAndSync();
}

absl::Status PagedKvStore::BeginStep(std::span<const StepToken> tokens) {
  if (!step_meta_.empty()) return absl::FailedPreconditionError("BeginStep inside a step");
  if (tokens.empty()) return absl::InvalidArgumentError("BeginStep with no tokens");
  decode_phase_ = tokens.size() == 1;  // The commit below counts with this step.
  // Step boundary: every few steps, commit and adopt the daemon's newer table
  // (not inside a probe: its tokens are never committed).
  if (!probing_ &&
      (steps_since_sync_ < 0 || steps_since_sync_ >= std::max(1, options_.sync_every_steps) ||
       tokens_since_sync_ >= std::max(1, options_.sync_every_tokens))) {
    RETURN_IF_ERROR_(CommitAndSync());
  }
  // Under memory pressure polykvd refuses reservations of low-priority
  // sessions while it compacts them (RESOURCE_EXHAUSTED, "Sync, then retry"):
  // sync to adopt the compacted tables, which also makes room, and retry
  // until reserve_retry_ms have passed.
  const absl::Time give_up = absl::Now() + absl::Milliseconds(options_.reserve_retry_ms);
  for (int attempt = 0;; ++attempt) {
    const int64_t need = num_slots_ + static_cast<int64_t>(tokens.size());
    if (need <= reserved_) break;
    const int64_t ahead = page_shape_.block_tokens >= options_.reserve_ahead
                              ? 0
                              : std::min<int64_t>(options_.reserve_ahead, need / 8);
    auto blocks = source_->Reserve(need + ahead);
    // The pool may refuse the extra.
    if (!blocks.ok() && ahead > 0) blocks = source_->Reserve(need);
    if (blocks.ok()) {
      AddBlocks(*blocks);
      if (need > reserved_) {
        return absl::InternalError(absl::StrCat("page source reserved ", reserved_,
                                                " slots after a request for ", need));
      }
      break;
    }
    if (!absl::IsResourceExhausted(blocks.status()) || absl::Now() >= give_up) {
      if (attempt == 0) return blocks.status();
      return absl::Status(blocks.status().code(),
                          absl::StrCat(blocks.status().message(), " (still refused after ",
                                       attempt, " retries over ", options_.reserve_retry_ms,
                                       " ms)"));
    }
    ++reserve_retries_;
    absl::SleepFor(absl::Milliseconds(kReserveRetryPauseMs));
    if (!probing_) RETURN_IF_ERROR_(CommitAndSync());
  }
  const int64_t need = num_slots_ + static_cast<int64_t>(tokens.size());
  if (!probing_) AgePendingMass(tokens.size());
  step_meta_.assign(tokens.begin(), tokens.end());
  next_layer_ = 0;
  mass_.resize(need, 0.0f);
  if (!slot_bias_.empty()) slot_bias_.resize(need, 0.0f);  // New tokens count 1.
  return absl::OkStatus();
}

void PagedKvStore::AgePendingMass(size_t tokens) {
  const WantedStreams wants = source_->wants();
  if (!wants.has(ScoreStream::kAttention) || wants.attention_decay >= 1.f) return;
  const double t0 = SteadySeconds();
  const auto factor =
      static_cast<float>(std::pow(double{wants.attention_decay}, static_cast<double>(tokens)));
  for (int64_t s = 0; s < num_slots_; ++s) mass_[static_cast<size_t>(s)] *= factor;
  CountSignal(SteadySeconds() - t0, /*tags=*/false);
}

absl::Status PagedKvStore::EncodeBlock(int layer, int64_t block, int rows) {
  const kernels::BlockEntry& e = tables_[layer][block];
  for (auto [kind, format, offset, residual] :
       {std::tuple{KvKind::kKey, e.k_format, e.k_offset, k_residual_[layer].data()},
        std::tuple{KvKind::kValue, e.v_format, e.v_offset, v_residual_[layer].data()}}) {
    void* page = reinterpret_cast<void*>(static_cast<uintptr_t>(offset));
    RETURN_IF_ERROR_(device_ ? device_->QuantizePage(page_shape_, kind, format, residual, rows,
                                                     page)
                             : kernels::QuantizePage(options_.exec, page_shape_, kind, format,
                                                     residual, kernels::SourceType::kF32, rows,
                                                     page));
  }
  return absl::OkStatus();
}

absl::Status PagedKvStore::DecodeBlock(int layer, int64_t block, int rows) {
  const kernels::BlockEntry& e = tables_[layer][block];
  for (auto [kind, format, offset, residual] :
       {std::tuple{KvKind::kKey, e.k_format, e.k_offset, k_residual_[layer].data()},
        std::tuple{KvKind::kValue, e.v_format, e.v_offset, v_residual_[layer].data()}}) {
    const void* page = reinterpret_cast<const void*>(static_cast<uintptr_t>(offset));
    RETURN_IF_ERROR_(device_ ? device_->DequantizePage(page_shape_, kind, format, page, rows,
                                                       residual)
                             : kernels::DequantizePage(options_.exec, page_shape_, kind, format,
                                                       page, rows, residual));
  }
  return absl::OkStatus();
}

absl::Status PagedKvStore::RunAttention(const kernels::PagedKvView& view,
                                        const kernels::AttentionParams& params, int num_new,
                                        const float* q, float* out, float* slot_mass) {
  if (device_) return device_->Attention(view, params, num_new, q, out, slot_mass);
  if (num_new == 1) {
    return kernels::PagedDecodeAttention(options_.exec, view, params, q, out, nullptr, slot_mass);
  }
  return kernels::PagedPrefillAttention(options_.exec, view, params, num_new, q, out, nullptr,
                                        slot_mass);
}

absl::Status PagedKvStore::Append(int layer, const float* k, const float* v) {
  if (step_meta_.empty()) return absl::FailedPreconditionError("Append outside a step");
  if (layer != next_layer_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Append(layer ", layer, ") out of order; expected ", next_layer_));
  }
  const int bt = page_shape_.block_tokens;
  const int64_t n = static_cast<int64_t>(step_meta_.size());
  int64_t block = num_slots_ / bt;
  if (block != residual_block_) {  // The previous block is full and final.
    std::fill(k_residual_[layer].begin(), k_residual_[layer].end(), 0.0f);
    std::fill(v_residual_[layer].begin(), v_residual_[layer].end(), 0.0f);
  }
  int first_new = static_cast<int>(num_slots_ % bt);  // of `block`'s rows, this step's first
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = num_slots_ + i;
    if (slot / bt != block) {  // Crossed into a new block: the old one is full.
      RETURN_IF_ERROR_(EncodeBlock(layer, block, bt));
      RETURN_IF_ERROR_(WriteRecentRows(layer, block, first_new, bt - first_new));
      block = slot / bt;
      first_new = 0;
    }
    const int64_t r = slot % bt;
    std::memcpy(&k_residual_[layer][r * row_], k + i * row_, sizeof(float) * row_);
    std::memcpy(&v_residual_[layer][r * row_], v + i * row_, sizeof(float) * row_);
  }
  const int rows = static_cast<int>((num_slots_ + n - 1) % bt + 1);
  RETURN_IF_ERROR_(EncodeBlock(layer, block, rows));
  RETURN_IF_ERROR_(WriteRecentRows(layer, block, first_new, rows - first_new));
  ++next_layer_;
  return absl::OkStatus();
}

absl::Status PagedKvStore::Attend(int layer, int num_heads, const float* q, float* out) {
  if (step_meta_.empty() || layer >= next_layer_) {
    return absl::FailedPreconditionError("Attend before Append in this step");
  }
  const int n = static_cast<int>(step_meta_.size());
  const int64_t total = num_slots_ + n;
  const int bt = page_shape_.block_tokens;
  kernels::PagedKvView view;
  view.shape = page_shape_;
  view.base = nullptr;  // Entries hold absolute addresses.
  // A layer whose hole was compacted away attends to the blocks around it.
  const Hole hole = holes_[layer];
  const int64_t skipped = hole.blocks * bt, before = hole.start * bt;
  const int64_t held = total - skipped;
  const int num_blocks = static_cast<int>((total + bt - 1) / bt);
  view.num_blocks = static_cast<int>(num_blocks - hole.blocks);
  view.blocks = AttendTable(layer, num_blocks);
  view.num_tokens = static_cast<int>(held);
  kernels::AttentionParams params;
  params.num_q_heads = num_heads;
  // [total] when set
  params.slot_bias = HeldBias(before, skipped);
  // KVzip's score: the most any single reconstruction query paid a slot, so
  // that slots every query glances at (delimiters, sink-like tokens) do not
  // outrank the ones a query copies from.
  const bool most = probing_ && probe_kind_ == ProbeKind::kReconstruct;
  if (most) params.mass_reduce = kernels::MassReduce::kMax;
  // Mass is computed only for what is reported: the attention stream (and
  // decode entropy), and every probe.
  const WantedStreams wants = source_->wants();
  const bool attention = wants.has(ScoreStream::kAttention) && !probing_;
  const bool entropy = wants.has(ScoreStream::kEntropy) && !probing_ && n == 1;
  if (!probing_ && !entropy &&
      (!attention || (n > 1 && !options_.prefill_attention_mass))) {
    return RunAttention(view, params, n, q, out, nullptr);
  }
  const int kvh = options_.shape.num_kv_heads;
  head_mass_.resize(static_cast<size_t>(kvh) * held);
  RETURN_IF_ERROR_(RunAttention(view, params, n, q, out, head_mass_.data()));
  const double t0 = SteadySeconds();
  if (entropy) AddEntropy(layer, kvh, held, num_heads / kvh);
  if (!probing_ && !attention) {
    CountSignal(SteadySeconds() - t0, /*tags=*/false);
    return absl::OkStatus();
  }
  // A probe's attention scores the slots it began with.
  float* acc = !probing_          ? mass_.data()
               : probe_per_layer_ ? probe_mass_.data() + static_cast<size_t>(layer) * probe_base_
                                  : probe_mass_.data();
  const int64_t upto = (probing_ ? probe_base_ : total) - skipped;  // held slots
  for (int g = 0; g < kvh; ++g) {
    const float* hm = head_mass_.data() + static_cast<size_t>(g) * held;
    // The held slots before the hole, then those after it.
    for (auto [from, to, at] : {std::tuple{int64_t{0}, std::min(before, upto), int64_t{0}},
                                std::tuple{before, upto, skipped}}) {
      float* a = acc + at;
      if (most) {
        for (int64_t s = from; s < to; ++s) a[s] = std::max(a[s], hm[s]);
      } else {
        for (int64_t s = from; s < to; ++s) a[s] += hm[s];
      }
    }
  }
  CountSignal(SteadySeconds() - t0, /*tags=*/false);
  return absl::OkStatus();
}

const float* PagedKvStore::HeldBias(int64_t before, int64_t skipped) {
  if (slot_bias_.empty()) return nullptr;
  if (before == 0 || skipped == 0) return slot_bias_.data() + skipped;
  held_bias_.assign(slot_bias_.begin(), slot_bias_.begin() + before);
  held_bias_.insert(held_bias_.end(), slot_bias_.begin() + before + skipped, slot_bias_.end());
  return held_bias_.data();
}

void PagedKvStore::AddEntropy(int layer, int num_kv_heads, int64_t held, int group) {
  // head_mass_[g] sums the group's query heads' attention (each sums to 1):
  // divided by the group, the group's mean distribution.
  if (entropy_sum_.empty()) entropy_sum_.assign(size_t(options_.shape.num_layers), 0.0);
  const double inv = 1.0 / std::max(group, 1);
  double h = 0;
  for (int g = 0; g < num_kv_heads; ++g) {
    const float* hm = head_mass_.data() + static_cast<size_t>(g) * held;
    for (int64_t s = 0; s < held; ++s) {
      const double p = hm[s] * inv;
      if (p > 0) h -= p * std::log(p);
    }
  }
  entropy_sum_[size_t(layer)] += h / std::max(num_kv_heads, 1);
  // A step counts once, at its last layer.
  if (layer == options_.shape.num_layers - 1) ++entropy_steps_;
}

absl::Status PagedKvStore::EndStep() {
  if (step_meta_.empty()) return absl::FailedPreconditionError("EndStep outside a step");
  if (next_layer_ != options_.shape.num_layers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "EndStep after ", next_layer_, " of ", options_.shape.num_layers, " layers"));
  }
  const int64_t total = num_slots_ + static_cast<int64_t>(step_meta_.size());
  if (!probing_) {
    uncommitted_.insert(uncommitted_.end(), step_meta_.begin(), step_meta_.end());
    ++steps_since_sync_;
    tokens_since_sync_ += static_cast<int64_t>(step_meta_.size());
    ++steps_since_report_;
  }
  num_slots_ = total;
  residual_block_ = (num_slots_ - 1) / page_shape_.block_tokens;
  step_meta_.clear();
  return absl::OkStatus();
}

absl::Status PagedKvStore::BeginProbe(ProbeKind kind) {
  if (probing_ || !step_meta_.empty()) {
    return absl::FailedPreconditionError("BeginProbe inside a step or a probe");
  }
  // Everything written so far is committed, so the relevance covers it all
  // and the probe's rows are the only uncommitted ones.
  decode_phase_ = false;
  RETURN_IF_ERROR_(CommitAndSync());
  probe_start_ = SteadySeconds();
  probing_ = true;
  probe_kind_ = kind;
  probe_base_ = num_slots_;
  probe_residual_block_ = residual_block_;
  probe_k_residual_ = k_residual_;
  probe_v_residual_ = v_residual_;
  probe_recent_ = recent_buf_;  // The probe's rows may take ring slots of window blocks.
  probe_per_layer_ = kind == ProbeKind::kReconstruct && source_->wants().per_layer;
  probe_mass_.assign(static_cast<size_t>(num_slots_) *
                         (probe_per_layer_ ? options_.shape.num_layers : 1),
                     0.0f);
  return absl::OkStatus();
}

absl::Status PagedKvStore::EndProbe() {
  if (!probing_ || !step_meta_.empty()) {
    return absl::FailedPreconditionError("EndProbe outside a probe or inside a step");
  }
  probing_ = false;
  num_slots_ = probe_base_;
  residual_block_ = probe_residual_block_;
  k_residual_ = std::move(probe_k_residual_);
  v_residual_ = std::move(probe_v_residual_);
  // Into the same buffer: recent_ points into it.
  std::copy(probe_recent_.begin(), probe_recent_.end(), recent_buf_.begin());
  mass_.resize(static_cast<size_t>(num_slots_));
  if (!slot_bias_.empty()) slot_bias_.resize(static_cast<size_t>(num_slots_));
  // The probe wrote its rows after the committed ones; a partly filled block
  // is encoded again from its own rows (scaled formats: parameters over
  // exactly those rows). Later blocks only ever held probe rows.
  const int bt = page_shape_.block_tokens;
  const int rows = static_cast<int>(num_slots_ - residual_block_ * bt);
  if (num_slots_ > 0 && rows < bt) {
    for (int l = 0; l < options_.shape.num_layers; ++l) {
      RETURN_IF_ERROR_(EncodeBlock(l, residual_block_, rows));
    }
  }
  std::vector<float> mass = std::move(probe_mass_);
  probe_mass_.clear();
  RETURN_IF_ERROR_(source_->Report(ProbeStream(probe_kind_), mass, probe_per_layer_));
  signal_cost_.probe_seconds += SteadySeconds() - probe_start_;
  ++signal_cost_.probes;
  return absl::OkStatus();
}

}  // namespace polykv::worker
