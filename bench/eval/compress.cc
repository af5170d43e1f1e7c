#include "bench/eval/compress.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "policies/lowering.h"
#include "policies/tagger.h"

namespace polykv::eval {

absl::StatusOr<policies::SessionView> BuildContextView(const EvalKvStore& store,
                                                       const std::vector<std::string>& texts,
                                                       int32_t current_turn, int block_tokens) {
  const auto& tokens = store.tokens();
  if (texts.size() != tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("BuildContextView: ", texts.size(), " texts for ", tokens.size(), " tokens"));
  }
  policies::SessionView v;
  const KvShape& shape = store.shape();
  v.shape = kernels::PageShape{block_tokens, shape.num_kv_heads, shape.head_dim};
  v.current_turn = current_turn;
  v.key_dim = shape.head_dim;
  v.tokens.resize(tokens.size());
  policies::StructureTagger tagger;
  int32_t turn = -1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    policies::TokenMeta& m = v.tokens[i];
    m.position = tokens[i].position;
    m.turn = tokens[i].turn;
    m.role = tokens[i].role;
    if (m.turn != turn && turn >= 0) tagger.EndMessage();
    turn = m.turn;
    tagger.Feed(texts[i], m.role);
  }
  tagger.EndMessage();
  for (size_t i = 0; i < tokens.size(); ++i) v.tokens[i].tag = tagger.tags()[i];

  const std::vector<LayerScores> scores = store.Scores();
  v.layers.resize(shape.num_layers);
  for (int l = 0; l < shape.num_layers; ++l) {
    policies::LayerView& lv = v.layers[l];
    const auto& slot_tokens = store.slot_tokens(l);
    lv.slots.resize(slot_tokens.size());
    for (size_t s = 0; s < slot_tokens.size(); ++s) {
      policies::Slot& slot = lv.slots[s];
      slot.token = slot_tokens[s];
      slot.attn = scores[l].attn[s];
      slot.obs = scores[l].obs[s];
      slot.intent = scores[l].intent[s];
      slot.k_format = slot.v_format = kernels::PageFormat::kF16;
    }
    lv.keys = store.KeySummaries(l);
    lv.entropy = scores[l].entropy;
  }
  if (absl::Status s = policies::ValidateView(v); !s.ok()) return s;
  return v;
}

std::vector<LayerSelection> KeepAll(const EvalKvStore& store) {
  std::vector<LayerSelection> out(store.shape().num_layers);
  for (int l = 0; l < store.shape().num_layers; ++l) {
    const int64_t n = store.slots(l);
    LayerSelection& s = out[l];
    s.offsets.resize(n + 1);
    s.members.resize(n);
    s.weights.assign(n, 1.f);
    s.counts.assign(n, 1);
    for (int64_t i = 0; i <= n; ++i) s.offsets[i] = static_cast<uint32_t>(i);
    for (int64_t i = 0; i < n; ++i) s.members[i] = static_cast<uint32_t>(i);
  }
  return out;
}

absl::StatusOr<Selection> Select(const policies::Policy& policy, const policies::SessionView& view,
                                 double budget_fraction) {
  const size_t bt = static_cast<size_t>(view.shape.block_tokens);
  const int num_layers = view.num_layers();
  int64_t per_layer = 0;
  for (const auto& l : view.layers) per_layer = std::max<int64_t>(per_layer, l.slots.size());
  const int64_t tokens = std::max<int64_t>(1, std::llround(budget_fraction * per_layer));
  auto plan = policy.Decide(view, policies::Budget::TotalTokens(tokens * num_layers));
  if (!plan.ok()) return plan.status();
  // The daemon's compaction runs the same lowering (policies/lowering.h).
  auto lowered = policies::Lower(*plan, view);
  if (!lowered.ok()) return lowered.status();
  Selection out;
  out.layers.resize(num_layers);
  int64_t kept = 0;
  for (int l = 0; l < num_layers; ++l) {
    policies::LoweredLayer& low = lowered->layers[l];
    LayerSelection& sel = out.layers[l];
    sel.offsets.assign(low.group_offsets.begin(), low.group_offsets.end());
    sel.members.assign(low.members.begin(), low.members.end());
    sel.weights = std::move(low.weights);
    sel.counts.resize(low.num_out());
    for (size_t j = 0; j < low.num_out(); ++j) {
      // Without the log-count bias a merged slot weighs as one token.
      sel.counts[j] = low.merged(j) && !lowered->log_count_bias ? 1 : low.counts[j];
      out.merged_groups += low.merged(j);
    }
    if (!low.requant.empty()) {
      // Each requantized block at its block format (the lowering checked
      // that every requantization of a block names it); the rest unlimited.
      const size_t full = low.num_out() / bt;
      sel.requant_k.assign(full, kernels::PageFormat::kF32);
      sel.requant_v.assign(full, kernels::PageFormat::kF32);
      size_t last = full;
      for (const policies::RequantOp& op : low.requant) {
        const size_t b = op.out_slot / bt;
        const bool key = op.kind == kernels::KvKind::kKey;
        (key ? sel.requant_k : sel.requant_v)[b] =
            key ? low.block_k_formats[b] : low.block_v_formats[b];
        out.requant_blocks += b != last;
        last = b;
      }
    }
    kept += static_cast<int64_t>(sel.counts.size());
  }
  out.kept_slots_mean = static_cast<double>(kept) / num_layers;
  return out;
}

}  // namespace polykv::eval
