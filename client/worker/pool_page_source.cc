#include "client/worker/pool_page_source.h"

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/worker/slot_tagger.h"
#include "kernels/device.h"
#include "polykv/client.h"

namespace polykv::worker {
namespace {

using kernels::KvKind;
using kernels::PageFormat;

// Reports are advisory: a daemon without the RPC, or one whose epoch moved
// since (the next Sync adopts it), loses one report, not the session.
absl::Status Benign(const absl::Status& s) {
  if (absl::IsUnimplemented(s) || absl::IsFailedPrecondition(s)) return absl::OkStatus();
  return s;
}

class PoolPageSource : public PageSource {
 public:
  PoolPageSource(std::unique_ptr<Client> client, std::unique_ptr<Session> session,
                 const PoolPageSourceOptions& o)
      : client_(std::move(client)), session_(std::move(session)), o_(o) {
    if (o.token_text) tagger_.emplace(o.token_text);
  }

  int block_tokens() const override { return static_cast<int>(session_->info().block_tokens); }

  absl::StatusOr<std::vector<PagedBlock>> Reserve(int64_t total_tokens) override {
    const int64_t have = static_cast<int64_t>(session_->reserved_tokens());
    if (total_tokens <= have) return std::vector<PagedBlock>{};
    auto blocks = session_->Reserve(static_cast<uint64_t>(total_tokens - have));
    if (!blocks.ok()) return blocks.status();
    return ConvertAll(*blocks);
  }

  absl::Status Commit(int64_t total_tokens, std::span<const StepToken> new_tokens) override {
    if (absl::Status s = session_->Commit(static_cast<uint64_t>(total_tokens)); !s.ok()) return s;
    committed_ = total_tokens;
    if (new_tokens.empty()) return absl::OkStatus();
    // Per-token metadata for the daemon's policies, one batch per commit.
    const uint64_t first = static_cast<uint64_t>(total_tokens) - new_tokens.size();
    const auto turn = static_cast<uint32_t>(new_tokens.back().turn);
    if (tagger_) {
      const auto t0 = std::chrono::steady_clock::now();
      SlotTagger::Report r = tagger_->Commit(first, new_tokens);
      tag_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return Benign(session_->ReportSlots(r.first_slot, r.meta, {}, turn));
    }
    std::vector<SlotMeta> meta;
    meta.reserve(new_tokens.size());
    for (const StepToken& t : new_tokens) {
      SlotMeta m;
      m.turn = t.turn;
      m.role = t.role;
      meta.push_back(m);
    }
    return Benign(session_->ReportSlots(first, meta, {}, turn));
  }

  absl::Status Idle() override { return session_->Idle(); }

  WantedStreams wants() const override { return session_->info().wants; }
  double tag_seconds() const override { return tag_seconds_; }

  absl::Status Report(ScoreStream stream, std::span<const float> values,
                      bool per_layer) override {
    if (policies::RuleOf(stream).per_layer) {
      return Benign(session_->Report(stream, 0, {values.begin(), values.end()}));
    }
    // Slot values trimmed to the committed slots (each layer's row, per layer).
    const size_t layers = per_layer ? session_->info().num_layers : 1;
    const size_t per = layers > 0 ? values.size() / layers : 0;
    const size_t n = std::min(per, static_cast<size_t>(committed_));
    if (n == 0) return absl::OkStatus();
    std::vector<float> v;
    v.reserve(n * layers);
    for (size_t l = 0; l < layers; ++l) {
      const auto row = values.subspan(l * per, n);
      v.insert(v.end(), row.begin(), row.end());
    }
    return Benign(session_->Report(stream, 0, std::move(v), per_layer));
  }

  absl::StatusOr<std::optional<PagedTable>> Sync() override {
    const uint64_t moves = session_->moves();
    const uint64_t epoch = session_->epoch();
    auto changed = session_->Sync();
    if (!changed.ok()) return changed.status();
    if (!*changed) return std::nullopt;
    PagedTable t;
    // Moved to another polykvd with no new epoch there, or restored / moved
    // between arenas here: the same slots in new pages.
    t.same_slots =
        (session_->moves() != moves && session_->epoch() == epoch) || session_->same_slots();
    if (tagger_ && !t.same_slots) tagger_->SlotsMoved();
    auto blocks = ConvertAll(session_->blocks());
    if (!blocks.ok()) return blocks.status();
    t.blocks = *std::move(blocks);
    // After a compaction fewer slots hold tokens; the session says how many.
    committed_ = static_cast<int64_t>(session_->committed_tokens());
    t.num_tokens = std::min<int64_t>(committed_, static_cast<int64_t>(t.blocks.size()) *
                                                     block_tokens());
    t.epoch = session_->epoch();
    // How many tokens each slot stands for (merged slots > 1); the store
    // checks the size against num_tokens and biases attention by log(count).
    t.slot_counts = session_->slot_counts();
    return t;
  }

  absl::StatusOr<std::optional<PagedTable>> AttachPrefix(
      std::span<const StepToken> tokens) override {
    std::vector<int32_t> ids;
    ids.reserve(tokens.size());
    for (const StepToken& t : tokens) ids.push_back(t.token_id);
    auto attached = session_->AttachPrefix(ids);
    if (!attached.ok()) return attached.status();
    if (*attached == 0) return std::nullopt;
    // The tagger reads the attached tokens too: what follows them is tagged
    // in their context (their own tags came with the shared blocks).
    if (tagger_) (void)tagger_->Commit(0, tokens.first(*attached));
    PagedTable t;
    auto blocks = ConvertAll(session_->blocks());
    if (!blocks.ok()) return blocks.status();
    t.blocks = *std::move(blocks);
    committed_ = static_cast<int64_t>(*attached);
    t.num_tokens = committed_;
    t.epoch = session_->epoch();
    return t;
  }

  absl::StatusOr<int64_t> SharePrefix(std::span<const int32_t> token_ids) override {
    auto shared = session_->SharePrefix(token_ids);
    if (!shared.ok()) return shared.status();
    return static_cast<int64_t>(*shared);
  }

  // Summed per page: a requantized block is smaller than the session's
  // granted formats say.
  int64_t bytes() const override {
    int64_t n = 0;
    for (const Block& b : session_->blocks()) {
      for (const Page& p : b.pages) n += p.size_bytes;
    }
    return n;
  }
  std::string name() const override {
    const SessionInfo& i = session_->info();
    return absl::StrCat("pool-", std::string(kernels::FormatShortName(i.key_format)), "-",
                        std::string(kernels::FormatShortName(i.value_format)));
  }

 private:
  absl::StatusOr<std::vector<PagedBlock>> ConvertAll(const std::vector<Block>& blocks) const {
    std::vector<PagedBlock> out;
    out.reserve(blocks.size());
    for (const Block& b : blocks) {
      auto pb = Convert(b);
      if (!pb.ok()) return pb.status();
      out.push_back(*std::move(pb));
    }
    return out;
  }
  absl::StatusOr<PagedBlock> Convert(const Block& b) const {
    const size_t layers = static_cast<size_t>(o_.shape.num_layers);
    if (b.pages.size() != 2 * layers) {
      return absl::InternalError(absl::StrCat("block ", b.block_index, " has ", b.pages.size(),
                                              " pages, expected ", 2 * layers));
    }
    PagedBlock out;
    out.k_pages.resize(layers);
    out.v_pages.resize(layers);
    const kernels::PageShape shape{block_tokens(), o_.shape.num_kv_heads, o_.shape.head_dim};
    bool first = true;  // the first layer the block holds sets its formats
    for (size_t l = 0; l < layers; ++l) {
      const Page& k = b.pages[2 * l];
      const Page& v = b.pages[2 * l + 1];
      // A layer with a budget of its own holds none of one run of blocks
      // (the store checks that its pages then run to the last block).
      if (k.size_bytes == 0 && v.size_bytes == 0) continue;
      if (k.addr == nullptr || v.addr == nullptr) {
        return absl::InternalError("the client handed out a page with no address");
      }
      if (k.on_device != o_.pages_on_device || v.on_device != o_.pages_on_device) {
        return absl::InternalError("the daemon's pages are not where the session asked for them");
      }
      const PageFormat kf = k.format;
      const PageFormat vf = v.format;
      if (first) {
        out.k_format = kf;
        out.v_format = vf;
        first = false;
      } else if (kf != out.k_format || vf != out.v_format) {
        return absl::UnimplementedError("per-layer page formats within one block");
      }
      const size_t kb = kernels::PageBytes(kf, KvKind::kKey, shape);
      const size_t vb = kernels::PageBytes(vf, KvKind::kValue, shape);
      if (kb == 0 || vb == 0 || k.size_bytes < kb || v.size_bytes < vb) {
        return absl::InternalError(absl::StrCat(
            "daemon page of ", k.size_bytes, "/", v.size_bytes, " bytes cannot hold a ",
            std::string(kernels::FormatShortName(kf)), "/",
            std::string(kernels::FormatShortName(vf)), " page of ", kb, "/", vb, " bytes"));
      }
      out.k_pages[l] = k.addr;
      out.v_pages[l] = v.addr;
    }
    return out;
  }

  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
  const PoolPageSourceOptions o_;
  std::optional<SlotTagger> tagger_;  // when o_.token_text is set
  int64_t committed_ = 0;
  double tag_seconds_ = 0;  // In tagger_->Commit, summed.
};

}  // namespace

absl::StatusOr<std::unique_ptr<PageSource>> NewPoolPageSource(const PoolPageSourceOptions& o) {
  auto client = Client::Connect(o.socket);
  if (!client.ok()) return client.status();
  SessionOptions so;
  so.agent_id = o.agent_id;
  so.tenant = o.tenant;
  so.profile.num_layers = static_cast<uint32_t>(o.shape.num_layers);
  so.profile.num_kv_heads = static_cast<uint32_t>(o.shape.num_kv_heads);
  so.profile.head_dim = static_cast<uint32_t>(o.shape.head_dim);
  so.profile.dtype = DType::kF32;
  so.profile.model_id = o.model_id;
  so.key_format = o.key_format;
  so.value_format = o.value_format;
  so.block_tokens = static_cast<uint32_t>(o.block_tokens);
  so.page_memory = o.pages_on_device ? PageMemory::kDevice : PageMemory::kHost;
  auto session = (*client)->OpenSession(so);
  if (!session.ok()) return session.status();
  if ((*session)->info().block_tokens == 0) {
    return absl::InternalError("the daemon opened a session with block_tokens = 0");
  }
  // The store's kernels and copies then run on the pages' GPU (this thread
  // drives the store).
  if (o.pages_on_device) {
    if (auto st = kernels::SetDevice((*session)->info().cuda_device); !st.ok()) return st;
  }
  return std::unique_ptr<PageSource>(
      new PoolPageSource(std::move(*client), std::move(*session), o));
}

}  // namespace polykv::worker
