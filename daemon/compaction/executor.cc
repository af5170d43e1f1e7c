#include "daemon/compaction/executor.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/ops.h"
#include "policies/lowering.h"

namespace polykv::daemon {

policies::SessionView BuildView(const std::vector<SlotRecord>& slots,
                                const kernels::PageShape& shape, const TableFormats& formats,
                                int32_t current_turn) {
  policies::SessionView v;
  v.shape = shape;
  v.current_turn = current_turn;
  v.tokens.resize(slots.size());
  v.layers.resize(1);
  auto& layer = v.layers[0];
  layer.slots.resize(slots.size());
  // Slots newer than the last intent probe have no relevance yet: they rank
  // with the most relevant, not below everything (they are the current turn).
  float most_relevant = 0.f;
  bool any_intent = false;
  for (const SlotRecord& r : slots) {
    if (std::isnan(r.intent)) continue;
    most_relevant = any_intent ? std::max(most_relevant, r.intent) : r.intent;
    any_intent = true;
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    const SlotRecord& r = slots[i];
    v.tokens[i] = r.meta;
    policies::Slot& s = layer.slots[i];
    s.token = static_cast<uint32_t>(i);
    s.count = std::max<uint32_t>(r.count, 1);
    s.attn = r.attn;
    s.intent = std::isnan(r.intent) ? most_relevant : r.intent;
    const size_t block = i / static_cast<size_t>(std::max(shape.block_tokens, 1));
    s.k_format = formats.key(block);
    s.v_format = formats.value(block);
  }
  return v;
}

absl::StatusOr<CompactionGroups> LowerPlan(const policies::SessionView& view,
                                           const std::vector<SlotRecord>& slots,
                                           const policies::Plan& plan) {
  if (plan.layers.size() != 1 || view.layers.size() != 1) {
    return absl::InternalError(absl::StrCat("daemon plans are one-layer; got ", plan.layers.size()));
  }
  auto lowered = policies::LowerLayer(plan.layers[0], view.layers[0], view.shape.block_tokens);
  if (!lowered.ok()) return absl::InternalError(lowered.status().message());
  CompactionGroups out;
  out.block_k_formats = std::move(lowered->block_k_formats);
  out.block_v_formats = std::move(lowered->block_v_formats);
  out.group_offsets = std::move(lowered->group_offsets);
  out.members = std::move(lowered->members);
  out.weights = std::move(lowered->weights);
  out.evicted_tokens = lowered->evicted_tokens;
  out.merged_tokens = lowered->merged_tokens;
  out.slots.reserve(lowered->num_out());
  for (size_t j = 0; j < lowered->num_out(); ++j) {
    SlotRecord rec = slots[lowered->sources[j]];
    rec.count = lowered->counts[j];
    if (out.group_offsets[j + 1] - out.group_offsets[j] > 1) {
      rec.attn = 0.f;
      for (int32_t m = out.group_offsets[j]; m < out.group_offsets[j + 1]; ++m) {
        const SlotRecord& member = slots[size_t(out.members[size_t(m)])];
        rec.attn += member.attn;
        rec.meta.pinned |= member.meta.pinned;
        // The most relevant member speaks for the group (unknown stays unknown).
        if (!std::isnan(member.intent)) {
          rec.intent = std::isnan(rec.intent) ? member.intent : std::max(rec.intent, member.intent);
        }
      }
    }
    out.slots.push_back(rec);
  }
  return out;
}

absl::Status ExecuteCompaction(const kernels::PageShape& shape, int num_src,
                               const std::vector<LayerTables>& layers,
                               const CompactionGroups& groups) {
  if (groups.num_out() == 0) return absl::OkStatus();
  kernels::CompactPlan plan;
  plan.num_out = groups.num_out();
  plan.group_offsets = groups.group_offsets.data();
  plan.members = groups.members.data();
  plan.weights = groups.weights.data();
  kernels::Exec exec;
  exec.backend = kernels::Backend::kCpu;
  exec.num_threads = 1;  // The daemon's cores serve RPCs; sessions are small per call.
  for (const LayerTables& l : layers) {
    kernels::PagedKvView src;
    src.shape = shape;
    src.base = nullptr;  // entries hold absolute addresses
    src.blocks = l.src.data();
    src.num_blocks = static_cast<int>(l.src.size());
    src.num_tokens = num_src;
    kernels::PagedKvMut dst;
    dst.shape = shape;
    dst.base = nullptr;
    dst.blocks = l.dst.data();
    dst.num_blocks = static_cast<int>(l.dst.size());
    dst.num_tokens = groups.num_out();
    if (auto s = kernels::CompactSlots(exec, src, plan, dst); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace polykv::daemon
