#include "daemon/compaction/executor.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "policies/lowering.h"

namespace polykv::daemon {

namespace {

// Layer `l` of `v` from `slots`, whose tokens start at v.tokens[first_token].
void FillLayer(std::span<const SlotRecord> slots, size_t first_token,
               const kernels::PageShape& shape, const TableFormats& formats,
               policies::SessionView& v, size_t l) {
  auto& layer = v.layers[l];
  layer.slots.resize(slots.size());
  const policies::SlotScores absent = policies::AbsentValues(slots);
  for (size_t i = 0; i < slots.size(); ++i) {
    const SlotRecord& r = slots[i];
    v.tokens[first_token + i] = r.meta;
    policies::Slot& s = layer.slots[i];
    s.token = static_cast<uint32_t>(first_token + i);
    s.count = std::max<uint32_t>(r.count, 1);
    s.score = policies::Resolved(r.score, absent);
    const size_t block = i / static_cast<size_t>(std::max(shape.block_tokens, 1));
    s.k_format = formats.key(block);
    s.v_format = formats.value(block);
  }
}

// Output slot j's record: its source's, with its count; a merge group's
// scores by the merge rule (policies/slot_record.h).
SlotRecord OutputRecord(const policies::LoweredLayer& g, size_t j,
                        std::span<const SlotRecord> slots) {
  SlotRecord rec = slots[g.sources[j]];
  rec.count = g.counts[j];
  if (g.merged(j)) {
    policies::GroupScores group;
    for (int32_t m = g.group_offsets[j]; m < g.group_offsets[j + 1]; ++m) {
      const SlotRecord& member = slots[size_t(g.members[size_t(m)])];
      group.Add(member.score, member.meta.pinned);
    }
    rec.score = group.score;
    rec.meta.pinned = group.pinned;
  }
  return rec;
}

}  // namespace

policies::SessionView BuildView(const std::vector<SlotRecord>& slots,
                                const kernels::PageShape& shape, const TableFormats& formats,
                                int32_t current_turn) {
  return BuildLayerView({std::span<const SlotRecord>(slots)}, shape, formats, current_turn);
}

policies::SessionView BuildLayerView(const std::vector<std::span<const SlotRecord>>& layers,
                                     const kernels::PageShape& shape, const TableFormats& formats,
                                     int32_t current_turn) {
  policies::SessionView v;
  v.shape = shape;
  v.current_turn = current_turn;
  size_t tokens = 0;
  for (const auto& l : layers) tokens += l.size();
  v.tokens.resize(tokens);
  v.layers.resize(layers.size());
  for (size_t l = 0, first = 0; l < layers.size(); first += layers[l].size(), ++l) {
    FillLayer(layers[l], first, shape, formats, v, l);
  }
  return v;
}

absl::StatusOr<CompactionGroups> LowerPlan(const policies::SessionView& view,
                                           const std::vector<SlotRecord>& slots,
                                           const policies::Plan& plan) {
  if (plan.layers.size() != 1 || view.layers.size() != 1) {
    return absl::InternalError(absl::StrCat("daemon plans are one-layer; got ", plan.layers.size()));
  }
  return LowerPlanLayer(view, 0, slots, plan);
}

absl::StatusOr<CompactionGroups> LowerPlanLayer(const policies::SessionView& view, int layer,
                                                std::span<const SlotRecord> slots,
                                                const policies::Plan& plan) {
  const size_t l = static_cast<size_t>(layer);
  if (layer < 0 || l >= plan.layers.size() || l >= view.layers.size() ||
      view.layers[l].slots.size() != slots.size()) {
    return absl::InternalError(absl::StrCat("no layer ", layer, " of ", plan.layers.size(),
                                            " to lower over ", slots.size(), " records"));
  }
  auto lowered = policies::LowerLayer(plan.layers[l], view.layers[l], view.shape.block_tokens);
  if (!lowered.ok()) return absl::InternalError(lowered.status().message());
  CompactionGroups out;
  static_cast<policies::LoweredLayer&>(out) = *std::move(lowered);
  out.log_count_bias = plan.log_count_bias;
  out.slots.reserve(out.num_out());
  for (size_t j = 0; j < out.num_out(); ++j) out.slots.push_back(OutputRecord(out, j, slots));
  return out;
}

std::vector<SlotRecord> OutputRecords(const CompactionGroups& groups,
                                      const std::vector<SlotRecord>& slots) {
  std::vector<SlotRecord> out;
  out.reserve(groups.num_out());
  for (size_t j = 0; j < groups.num_out(); ++j) out.push_back(OutputRecord(groups, j, slots));
  return out;
}

std::vector<uint32_t> KeySummaryLayers(uint32_t num_layers) {
  constexpr uint32_t kKeyLayers = 4;
  std::vector<uint32_t> out;
  const uint32_t n = std::min(kKeyLayers, num_layers);
  for (uint32_t i = 0; i < n; ++i) out.push_back((2 * i + 1) * num_layers / (2 * n));
  return out;
}

absl::Status ReadKeySummaries(const kernels::PageShape& shape, int num_slots,
                              const std::vector<std::vector<kernels::BlockEntry>>& tables,
                              int device, std::vector<float>& keys) {
  const int bt = shape.block_tokens, heads = shape.num_kv_heads, d = shape.head_dim;
  const size_t key_dim = tables.size() * static_cast<size_t>(d);
  keys.assign(static_cast<size_t>(num_slots) * key_dim, 0.f);
  std::vector<float> rows(static_cast<size_t>(bt) * heads * d);
  std::vector<uint8_t> staged;  // a device page's bytes, decoded here
  kernels::Exec exec;
  exec.backend = kernels::Backend::kCpu;
  exec.num_threads = 1;
  for (size_t i = 0; i < tables.size(); ++i) {
    for (int first = 0, b = 0; first < num_slots; first += bt, ++b) {
      if (static_cast<size_t>(b) >= tables[i].size()) {
        return absl::InternalError(absl::StrCat("no block for slot ", first));
      }
      const kernels::BlockEntry& e = tables[i][static_cast<size_t>(b)];
      const int n = std::min(bt, num_slots - first);
      const void* page = reinterpret_cast<const void*>(e.k_offset);
      if (device >= 0) {
        // Summaries are a few floats per slot: the page comes to the host
        // rather than the decoder to the device.
        staged.resize(kernels::PageBytes(e.k_format, kernels::KvKind::kKey, shape));
        if (auto st = kernels::CopyToHost(staged.data(), page, staged.size()); !st.ok()) return st;
        page = staged.data();
      }
      if (auto st = kernels::DequantizePage(exec, shape, kernels::KvKind::kKey, e.k_format, page,
                                            n, rows.data());
          !st.ok()) {
        return st;
      }
      for (int t = 0; t < n; ++t) {
        float* out = keys.data() + static_cast<size_t>(first + t) * key_dim + i * d;
        for (int h = 0; h < heads; ++h) {
          const float* k = rows.data() + (static_cast<size_t>(t) * heads + h) * d;
          for (int j = 0; j < d; ++j) out[j] += k[j];
        }
        double norm = 0;
        for (int j = 0; j < d; ++j) norm += double(out[j]) * out[j];
        const float inv = norm > 0 ? static_cast<float>(1.0 / std::sqrt(norm)) : 0.f;
        for (int j = 0; j < d; ++j) out[j] *= inv;
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// A layer's tables and plan where the CUDA kernels read them: device copies,
// freed with this. The plan is checked on the host first (the device kernel
// trusts it).
class DeviceLayer {
 public:
  absl::Status Stage(const LayerTables& l, kernels::CompactPlan& plan) {
    if (auto st = kernels::CompactMetadata(plan, l.num_src, nullptr, nullptr, nullptr, nullptr);
        !st.ok()) {
      return st;
    }
    const auto copy = [](kernels::DeviceBuffer& to, const auto& v) {
      auto b = kernels::DeviceBuffer::CopyOf(v.data(), v.size() * sizeof(v[0]));
      if (!b.ok()) return b.status();
      to = *std::move(b);
      return absl::OkStatus();
    };
    for (auto [to, from] : {std::pair{&src_, &l.src}, std::pair{&dst_, &l.dst}}) {
      if (auto st = copy(*to, *from); !st.ok()) return st;
    }
    const int32_t num_members =
        plan.group_offsets ? plan.group_offsets[plan.num_out] : plan.num_out;
    const std::span<const int32_t> members(plan.members, size_t(num_members));
    if (auto st = copy(members_, members); !st.ok()) return st;
    plan.members = members_.as<const int32_t>();
    if (plan.group_offsets) {
      const std::span<const int32_t> offsets(plan.group_offsets, size_t(plan.num_out) + 1);
      if (auto st = copy(offsets_, offsets); !st.ok()) return st;
      plan.group_offsets = offsets_.as<const int32_t>();
    }
    if (plan.weights) {
      const std::span<const float> weights(plan.weights, size_t(num_members));
      if (auto st = copy(weights_, weights); !st.ok()) return st;
      plan.weights = weights_.as<const float>();
    }
    return absl::OkStatus();
  }
  const kernels::BlockEntry* src() const { return src_.as<const kernels::BlockEntry>(); }
  const kernels::BlockEntry* dst() const { return dst_.as<const kernels::BlockEntry>(); }

 private:
  kernels::DeviceBuffer src_, dst_, members_, offsets_, weights_;
};

}  // namespace

absl::Status ExecuteCompaction(const kernels::PageShape& shape,
                               const std::vector<LayerTables>& layers,
                               const std::vector<const CompactionGroups*>& groups,
                               int device) {
  if (groups.size() != 1 && groups.size() != layers.size()) {
    return absl::InternalError(absl::StrCat("groups for ", groups.size(), " of ",
                                            layers.size(), " layers"));
  }
  kernels::Exec exec;
  const bool on_device = device >= 0;
  exec.backend = on_device ? kernels::Backend::kCuda : kernels::Backend::kCpu;
  exec.num_threads = 1;  // The daemon's cores serve RPCs; sessions are small per call.
  // Device work is queued on the default stream and waited for at the end:
  // the caller publishes the new tables only after this returns.
  if (on_device) {
    if (auto st = kernels::SetDevice(device); !st.ok()) return st;
  }
  std::vector<DeviceLayer> staged(on_device ? layers.size() : 0);
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerTables& l = layers[i];
    const CompactionGroups& g = *groups[groups.size() == 1 ? 0 : i];
    if (g.num_out() == 0) continue;
    kernels::CompactPlan plan;
    plan.num_out = static_cast<int>(g.num_out());
    plan.group_offsets = g.group_offsets.data();
    plan.members = g.members.data();
    plan.weights = g.weights.data();
    kernels::PagedKvView src;
    src.shape = shape;
    src.base = nullptr;  // entries hold absolute addresses
    src.blocks = l.src.data();
    src.num_blocks = static_cast<int>(l.src.size());
    src.num_tokens = l.num_src;
    kernels::PagedKvMut dst;
    dst.shape = shape;
    dst.base = nullptr;
    dst.blocks = l.dst.data();
    dst.num_blocks = static_cast<int>(l.dst.size());
    dst.num_tokens = plan.num_out;
    if (on_device) {
      if (auto st = staged[i].Stage(l, plan); !st.ok()) {
        return absl::Status(st.code(), absl::StrCat("layer ", i, ": ", st.message()));
      }
      src.blocks = staged[i].src();
      dst.blocks = staged[i].dst();
    }
    if (auto s = kernels::CompactSlots(exec, src, plan, dst); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("layer ", i, ": ", s.message()));
    }
  }
  if (on_device) return kernels::DeviceSynchronize();
  return absl::OkStatus();
}

}  // namespace polykv::daemon
