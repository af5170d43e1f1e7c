#include "daemon/pool/compaction_run.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace polykv::daemon {
namespace {

// Host addresses of the block's layer-`layer` pages (0 for device arenas).
// The layer's pages of `block` at their addresses in this process; *device
// is the GPU they are on (-1: host memory).
kernels::BlockEntry EntryOf(const BlockPool& blocks, const Session& s, const Block& block,
                            uint32_t layer, int* device) {
  kernels::BlockEntry e;
  e.k_offset = blocks.PageAddress(s.tenant(), block.pages[2 * layer], device);
  e.v_offset = blocks.PageAddress(s.tenant(), block.pages[2 * layer + 1], device);
  e.k_format = block.shape.key_format;
  e.v_format = block.shape.value_format;
  return e;
}

size_t SourceBlocks(const Session& s) {
  return (s.tables.committed_tokens + s.block_tokens - 1) / s.block_tokens;
}

}  // namespace

absl::Status CompactionRun::Prepare(const Session& s, const QosRecord& qos,
                                    const BlockPool& blocks,
                                    std::vector<LayerHole> layer_holes) {
  in_.shape = s.page_shape();
  in_.formats.fill_k = s.shape.key_format;
  in_.formats.fill_v = s.shape.value_format;
  for (const Block& b : s.tables.blocks) {
    in_.formats.k.push_back(b.shape.key_format);
    in_.formats.v.push_back(b.shape.value_format);
  }
  in_.key_floor = qos.key_floor;
  in_.value_floor = qos.value_floor;
  in_.current_turn = s.policy.current_turn;
  in_.layer_scores = s.policy.layer_scores;
  in_.target_tokens = target_;
  in_.cold = cold_;
  in_.layer_holes = std::move(layer_holes);
  // Merging policies cluster by key: their pages are read in Decide (they
  // stay allocated: the session is busy).
  if (!policy_.ReadsKeys()) return absl::OkStatus();
  for (uint32_t l : KeySummaryLayers(s.profile.num_layers)) {
    auto& t = key_tables_.emplace_back();
    for (size_t b = 0; b < SourceBlocks(s); ++b) {
      t.push_back(EntryOf(blocks, s, s.tables.blocks[b], l, &device_));
    }
    for (const kernels::BlockEntry& e : t) {
      if (e.k_offset == 0) return absl::InternalError("a source page has no memory to read");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CompactionRun::Decide(const Session& s) {
  if (!key_tables_.empty()) {
    const int num_src = static_cast<int>(s.tables.committed_tokens);
    if (auto st = ReadKeySummaries(in_.shape, num_src, key_tables_, device_, in_.keys);
        !st.ok()) {
      return st;
    }
    in_.key_dim = static_cast<int>(key_tables_.size()) * in_.shape.head_dim;
  }
  // The slot records are read in place: nothing writes them while busy.
  auto plan = PlanCompaction(policy_, s.policy.records, in_);
  if (!plan.ok()) return plan.status();
  plan_ = *std::move(plan);
  return plan_->changes;
}

bool CompactionRun::Holds(const Session& s, size_t j, uint32_t l) const {
  const auto& h = plan_->layer_holes;
  return h[h.size() == 1 ? 0 : l].holds(j * s.block_tokens);
}

absl::StatusOr<std::vector<BlockShape>> CompactionRun::NewShapes(const Session& s) const {
  const uint32_t layers = s.profile.num_layers;
  std::vector<BlockShape> shapes;
  for (size_t j = 0; j < plan_->out_blocks(); ++j) {
    if (plan_->shared[j] >= 0) continue;
    std::vector<bool> present(layers);
    uint32_t count = 0;
    for (uint32_t l = 0; l < layers; ++l) count += present[l] = Holds(s, j, l);
    auto shape = MakeBlockShape(count, in_.shape, plan_->block_k_formats[j],
                                plan_->block_v_formats[j], superblock_bytes_);
    if (!shape.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("policy '", policy_text_, "' requantizes: ", shape.status().message()));
    }
    if (count < layers) shape->present = std::move(present);
    shapes.push_back(*std::move(shape));
  }
  return shapes;
}

absl::Status CompactionRun::Address(const Session& s, const BlockPool& blocks) {
  const CompactionPlan& plan = *plan_;
  copies_ = std::any_of(plan.copy.begin(), plan.copy.end(),
                        [](const CompactionGroups& g) { return g.num_out() > 0; });
  if (!copies_) return absl::OkStatus();
  const uint32_t layers = s.profile.num_layers;
  const int num_src = static_cast<int>(s.tables.committed_tokens);
  tables_.assign(layers, {});
  for (uint32_t l = 0; l < layers; ++l) {
    LayerTables& t = tables_[l];
    // The slots the layer holds, as its groups number them.
    const LayerHole hole = l < in_.layer_holes.size() ? in_.layer_holes[l] : LayerHole{};
    for (size_t b = 0; b < SourceBlocks(s); ++b) {
      if (hole.holds(b * s.block_tokens)) {
        t.src.push_back(EntryOf(blocks, s, s.tables.blocks[b], l, &device_));
      }
    }
    t.num_src = num_src - static_cast<int>(hole.length);
    for (size_t j = 0, next = 0; j < plan.out_blocks(); ++j) {
      if (plan.shared[j] >= 0) continue;
      if (Holds(s, j, l)) t.dst.push_back(EntryOf(blocks, s, s.tables.staged[next], l, &device_));
      ++next;
    }
    for (const auto* list : {&t.src, &t.dst}) {
      for (const kernels::BlockEntry& e : *list) {
        if (e.k_offset == 0 || e.v_offset == 0) {
          return absl::InternalError("a compaction page has no memory to copy");
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CompactionRun::Copy(const Session& s) const {
  if (!copies_) return absl::OkStatus();
  std::vector<const CompactionGroups*> groups;
  for (const CompactionGroups& g : plan_->copy) groups.push_back(&g);
  return ExecuteCompaction(s.page_shape(), tables_, groups, device_);
}

std::vector<Block> CompactionRun::Publish(Session& s) {
  CompactionPlan& plan = *plan_;
  BlockTables& t = s.tables;
  std::vector<Block> old = std::move(t.blocks);
  t.blocks.clear();
  for (size_t j = 0, next = 0; j < plan.out_blocks(); ++j) {
    if (plan.shared[j] >= 0) {
      t.blocks.push_back(std::move(old[size_t(plan.shared[j])]));
      old[size_t(plan.shared[j])].pages.clear();
    } else {
      t.blocks.push_back(std::move(t.staged[next++]));
    }
  }
  t.staged.clear();
  std::erase_if(old, [](const Block& b) { return b.empty(); });
  t.committed_tokens = plan.num_out;
  s.policy.records = std::move(plan.records);
  // Every list ran the plan of records[0] or its own of the same size: the
  // first one's counts speak for all.
  const CompactionGroups& first = plan.groups[0];
  s.policy.log_count_bias = first.log_count_bias;
  s.policy.want_tokens = 0;
  const uint64_t shared = plan.shared_blocks();
  published_ = {shared, plan.out_blocks() - shared, first.evicted_tokens, first.merged_tokens};
  return old;
}

}  // namespace polykv::daemon
