// Model-free steps for PagedKvStore tests: random K/V rows and queries on a
// small shape, one step of them through BeginStep/Append/Attend/EndStep.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "client/worker/paged_kv_store.h"
#include "gtest/gtest.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace polykv::worker::testing {

inline constexpr int kLayers = 2, kKvHeads = 2, kHeadDim = 32, kQHeads = 4, kBlock = 16;
inline constexpr int kRow = kKvHeads * kHeadDim;

inline KvShape Shape() { return KvShape{kLayers, kKvHeads, kHeadDim}; }

// Per layer, the K and V rows of some tokens: [layer][tokens][kRow].
struct Rows {
  std::vector<std::vector<float>> k, v;
  int num_tokens() const { return static_cast<int>(k[0].size() / kRow); }
};

inline Rows RandomRows(int n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Rows r;
  r.k.assign(kLayers, std::vector<float>(static_cast<size_t>(n) * kRow));
  r.v = r.k;
  for (int l = 0; l < kLayers; ++l) {
    for (float& x : r.k[l]) x = dist(rng);
    for (float& x : r.v[l]) x = dist(rng);
  }
  return r;
}

// Rows `slots` of `from`, in that order.
inline Rows Pick(const Rows& from, const std::vector<int>& slots) {
  Rows r;
  r.k.assign(kLayers, {});
  r.v.assign(kLayers, {});
  for (int l = 0; l < kLayers; ++l) {
    for (int s : slots) {
      r.k[l].insert(r.k[l].end(), from.k[l].begin() + s * kRow, from.k[l].begin() + (s + 1) * kRow);
      r.v[l].insert(r.v[l].end(), from.v[l].begin() + s * kRow, from.v[l].begin() + (s + 1) * kRow);
    }
  }
  return r;
}

// One step writing `rows` (every layer) and attending with `q`
// ([layer][tokens][kQHeads][kHeadDim]); returns the outputs of every layer.
// Token ids: first_id, first_id + 1, ...; all of message `turn`.
inline std::vector<float> Step(PagedKvStore* store, const Rows& rows, const std::vector<float>& q,
                               int first_position, int first_id = 7, int turn = 0) {
  const int n = rows.num_tokens();
  std::vector<StepToken> meta;
  for (int i = 0; i < n; ++i) meta.push_back({first_id + i, first_position + i, turn, Role::kUser});
  EXPECT_TRUE(store->BeginStep(meta).ok());
  const size_t per_layer = static_cast<size_t>(n) * kQHeads * kHeadDim;
  std::vector<float> out(kLayers * per_layer);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(store->Append(l, rows.k[l].data(), rows.v[l].data()).ok());
    const absl::Status st =
        store->Attend(l, kQHeads, q.data() + l * per_layer, out.data() + l * per_layer);
    EXPECT_TRUE(st.ok()) << st;
  }
  EXPECT_TRUE(store->EndStep().ok());
  return out;
}

// Heap pages of the tests' shape in `format`.
inline std::unique_ptr<PageSource> HeapSource(
    kernels::PageFormat format = kernels::PageFormat::kF32) {
  HeapPageSourceOptions ho;
  ho.shape = Shape();
  ho.block_tokens = kBlock;
  ho.k_format = ho.v_format = format;
  auto src = NewHeapPageSource(ho);
  EXPECT_TRUE(src.ok()) << src.status();
  return src.ok() ? *std::move(src) : nullptr;
}

// Another source's pages behind a source that publishes, when asked, the
// table of everything reserved so far, as the daemon's Sync does after a
// compaction that merged slots (here no page moves: the counts, and which
// layers keep which blocks, are what change) or after a move.
class RepublishingSource : public PageSource {
 public:
  RepublishingSource(std::unique_ptr<PageSource> inner, WantedStreams wants)
      : inner_(std::move(inner)), wants_(wants) {}
  int block_tokens() const override { return inner_->block_tokens(); }
  absl::StatusOr<std::vector<PagedBlock>> Reserve(int64_t total) override {
    auto b = inner_->Reserve(total);
    if (b.ok()) blocks_.insert(blocks_.end(), b->begin(), b->end());
    return b;
  }
  absl::Status Commit(int64_t total, std::span<const StepToken>) override {
    committed_ = total;
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<PagedTable>> Sync() override {
    if (!publish_) return std::nullopt;
    publish_ = false;
    PagedTable t{blocks_, committed_, ++epoch_};
    t.slot_counts = counts_;
    for (size_t l = 0; l < holes_.size(); ++l) {
      const auto [from, to] = holes_[l];
      for (int b = from; b < to && b < static_cast<int>(t.blocks.size()); ++b) {
        t.blocks[b].k_pages[l] = t.blocks[b].v_pages[l] = nullptr;
      }
    }
    return t;
  }
  WantedStreams wants() const override { return wants_; }
  int64_t bytes() const override { return inner_->bytes(); }
  std::string name() const override { return "republishing-" + inner_->name(); }

  // Publishes `counts` at the next Sync; layer l without its pages in
  // blocks [holes[l].first, holes[l].second) (what a daemon that compacted
  // layers to different lengths would publish).
  void Publish(std::vector<uint32_t> counts = {}, std::vector<std::pair<int, int>> holes = {}) {
    counts_ = std::move(counts);
    holes_ = std::move(holes);
    publish_ = true;
  }
  // Every block reserved, in order; the slots committed.
  const std::vector<PagedBlock>& blocks() const { return blocks_; }
  int64_t committed() const { return committed_; }

 private:
  std::unique_ptr<PageSource> inner_;
  const WantedStreams wants_;
  std::vector<PagedBlock> blocks_;
  std::vector<uint32_t> counts_;
  std::vector<std::pair<int, int>> holes_;
  int64_t committed_ = 0;
  uint64_t epoch_ = 0;
  bool publish_ = false;
};

inline std::vector<float> RandomQ(int n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 2.0f);  // peaked, model-like attention
  std::vector<float> q(static_cast<size_t>(kLayers) * n * kQHeads * kHeadDim);
  for (float& x : q) x = dist(rng);
  return q;
}

using kernels::testing::RelL2;  // one definition for the kernel and store tests

}  // namespace polykv::worker::testing
