#include "daemon/compaction/executor.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kernels/ops.h"

namespace polykv::daemon {

policies::SessionView BuildView(const std::vector<SlotRecord>& slots,
                                const kernels::PageShape& shape, kernels::PageFormat kf,
                                kernels::PageFormat vf, int32_t current_turn) {
  policies::SessionView v;
  v.shape = shape;
  v.current_turn = current_turn;
  v.tokens.resize(slots.size());
  v.layers.resize(1);
  auto& layer = v.layers[0];
  layer.slots.resize(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const SlotRecord& r = slots[i];
    v.tokens[i] = r.meta;
    policies::Slot& s = layer.slots[i];
    s.token = static_cast<uint32_t>(i);
    s.count = std::max<uint32_t>(r.count, 1);
    s.attn = r.attn;
    s.k_format = kf;
    s.v_format = vf;
  }
  return v;
}

absl::StatusOr<CompactionGroups> LowerPlan(const std::vector<SlotRecord>& slots,
                                           const policies::Plan& plan) {
  if (plan.layers.size() != 1) {
    return absl::InternalError(absl::StrCat("daemon plans are one-layer; got ", plan.layers.size()));
  }
  const policies::LayerPlan& lp = plan.layers[0];
  absl::flat_hash_map<uint32_t, const policies::MergeGroup*> by_rep;
  for (const auto& g : lp.merges) by_rep[g.representative] = &g;
  CompactionGroups out;
  out.group_offsets.push_back(0);
  for (uint32_t src : policies::OutputOrder(lp)) {
    if (src >= slots.size()) return absl::InternalError("plan names a slot past the session");
    auto it = by_rep.find(src);
    if (it == by_rep.end()) {
      out.members.push_back(static_cast<int32_t>(src));
      out.weights.push_back(1.f);
      out.slots.push_back(slots[src]);
    } else {
      const policies::MergeGroup& g = *it->second;
      SlotRecord rec = slots[g.representative];
      rec.count = 0;
      rec.attn = 0.f;
      for (size_t i = 0; i < g.members.size(); ++i) {
        const SlotRecord& m = slots[g.members[i]];
        out.members.push_back(static_cast<int32_t>(g.members[i]));
        out.weights.push_back(i < g.weights.size() ? std::max(g.weights[i], 0.f) : 1.f);
        rec.count += std::max<uint32_t>(m.count, 1);
        rec.attn += m.attn;
        rec.meta.pinned |= m.meta.pinned;
        if (g.members[i] != g.representative) out.merged_tokens += std::max<uint32_t>(m.count, 1);
      }
      out.slots.push_back(rec);
    }
    out.group_offsets.push_back(static_cast<int32_t>(out.members.size()));
  }
  for (uint32_t e : lp.evict) {
    if (e >= slots.size()) return absl::InternalError("plan evicts a slot past the session");
    out.evicted_tokens += std::max<uint32_t>(slots[e].count, 1);
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
