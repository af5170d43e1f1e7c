#include "policies/lowering.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace polykv::policies {

size_t LoweredPlan::requant_ops() const {
  size_t n = 0;
  for (const LoweredLayer& l : layers) n += l.requant.size();
  return n;
}

kernels::PageFormat FinerFormat(kernels::PageFormat a, kernels::PageFormat b) {
  const int ba = kernels::FormatBits(a), bb = kernels::FormatBits(b);
  if (ba != bb) return ba > bb ? a : b;
  return static_cast<uint8_t>(a) <= static_cast<uint8_t>(b) ? a : b;
}

namespace {

// Sets out.block_{k,v}_formats from each output slot's format after the plan,
// and refuses requantizations a block-granular store cannot honour.
absl::Status LayOutBlocks(const LayerView& src, int block_tokens, LoweredLayer& out) {
  const size_t num_out = out.num_out();
  std::vector<kernels::PageFormat> k(num_out), v(num_out);
  for (size_t j = 0; j < num_out; ++j) {
    const Slot& s = src.slots[out.sources[j]];
    k[j] = s.k_format;
    v[j] = s.v_format;
  }
  for (const RequantOp& op : out.requant) {
    (op.kind == kernels::KvKind::kKey ? k : v)[op.out_slot] = op.format;
  }
  const size_t bt = static_cast<size_t>(block_tokens);
  const size_t num_blocks = (num_out + bt - 1) / bt;
  out.block_tokens = block_tokens;
  out.block_k_formats.resize(num_blocks);
  out.block_v_formats.resize(num_blocks);
  for (size_t b = 0; b < num_blocks; ++b) {
    const size_t end = std::min(num_out, (b + 1) * bt);
    kernels::PageFormat kb = k[b * bt], vb = v[b * bt];
    for (size_t j = b * bt + 1; j < end; ++j) {
      kb = FinerFormat(kb, k[j]);
      vb = FinerFormat(vb, v[j]);
    }
    out.block_k_formats[b] = kb;
    out.block_v_formats[b] = vb;
  }
  for (const RequantOp& op : out.requant) {
    const size_t b = op.out_slot / bt;
    if ((b + 1) * bt > num_out) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan requantizes output slot ", op.out_slot, ", in the trailing partial block (",
          num_out - b * bt, " of ", bt, " slots), which is still being filled"));
    }
    const bool key = op.kind == kernels::KvKind::kKey;
    const kernels::PageFormat stored = key ? out.block_k_formats[b] : out.block_v_formats[b];
    if (stored != op.format) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan requantizes the ", key ? "keys" : "values", " of output slot ", op.out_slot, " to ",
          std::string(kernels::FormatShortName(op.format)), " but its block holds slots at ",
          std::string(kernels::FormatShortName(stored)), "; requantization is per block of ", bt, " slots"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoweredLayer> LowerLayer(const LayerPlan& plan, const LayerView& src,
                                        int block_tokens) {
  if (block_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("block_tokens ", block_tokens));
  }
  const size_t n = src.slots.size();
  auto count_of = [&](uint32_t s) { return std::max<uint32_t>(src.slots[s].count, 1); };
  std::vector<int32_t> group_at(n, -1);  // representative -> index into plan.merges
  for (size_t i = 0; i < plan.merges.size(); ++i) {
    const uint32_t rep = plan.merges[i].representative;
    if (rep >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge group represented by slot ", rep, " of a layer of ", n, " slots"));
    }
    group_at[rep] = static_cast<int32_t>(i);
  }
  LoweredLayer out;
  std::vector<int32_t> out_of(n, -1);  // kept slot or representative -> output slot
  for (uint32_t src : OutputOrder(plan)) {
    if (src >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan names slot ", src, " of a layer of ", n, " slots"));
    }
    out_of[src] = static_cast<int32_t>(out.num_out());
    if (group_at[src] < 0) {
      out.members.push_back(static_cast<int32_t>(src));
      out.weights.push_back(1.f);
      out.counts.push_back(count_of(src));
    } else {
      const MergeGroup& g = plan.merges[size_t(group_at[src])];
      double sum = 0;
      uint32_t tokens = 0;
      for (size_t i = 0; i < g.members.size(); ++i) {
        if (g.members[i] >= n) {
          return absl::InvalidArgumentError(
              absl::StrCat("merge group names slot ", g.members[i], " of ", n));
        }
        sum += std::max(i < g.weights.size() ? g.weights[i] : 0.f, 0.f);
        tokens += count_of(g.members[i]);
        if (g.members[i] != g.representative) out.merged_tokens += count_of(g.members[i]);
      }
      if (g.count != 0 && g.count != tokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            "merge group at slot ", src, " claims ", g.count, " tokens; its members hold ", tokens));
      }
      for (size_t i = 0; i < g.members.size(); ++i) {
        const float w = std::max(i < g.weights.size() ? g.weights[i] : 0.f, 0.f);
        out.members.push_back(static_cast<int32_t>(g.members[i]));
        out.weights.push_back(sum > 0 ? static_cast<float>(w / sum)
                                      : 1.f / static_cast<float>(g.members.size()));
      }
      out.counts.push_back(tokens);
    }
    out.sources.push_back(src);
    out.group_offsets.push_back(static_cast<int32_t>(out.members.size()));
  }
  for (uint32_t e : plan.evict) {
    if (e >= n) return absl::InvalidArgumentError(absl::StrCat("plan evicts slot ", e, " of ", n));
    out.evicted_tokens += count_of(e);
  }
  for (const RequantTarget& t : plan.requant) {
    if (t.slot >= n || out_of[t.slot] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan requantizes slot ", t.slot, ", which it does not keep"));
    }
    out.requant.push_back({static_cast<uint32_t>(out_of[t.slot]), t.kind, t.format});
  }
  std::sort(out.requant.begin(), out.requant.end(), [](const RequantOp& a, const RequantOp& b) {
    return a.out_slot != b.out_slot ? a.out_slot < b.out_slot : a.kind < b.kind;
  });
  if (auto s = LayOutBlocks(src, block_tokens, out); !s.ok()) return s;
  return out;
}

absl::StatusOr<LoweredPlan> Lower(const Plan& plan, const SessionView& view) {
  if (view.layers.size() != plan.layers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan has ", plan.layers.size(),
                                                   " layers; the view has ", view.layers.size()));
  }
  LoweredPlan out;
  out.log_count_bias = plan.log_count_bias;
  out.layers.reserve(plan.layers.size());
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    auto layer = LowerLayer(plan.layers[l], view.layers[l], view.shape.block_tokens);
    if (!layer.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, ": ", std::string(layer.status().message())));
    }
    out.layers.push_back(*std::move(layer));
  }
  return out;
}

}  // namespace polykv::policies
