// KvPool::ReportSlots: the worker's score streams (attention, intent,
// observation, importance, per-layer importance) into the session's slot
// records, which its policy ranks by at the next compaction.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "daemon/pool/kv_pool.h"

namespace polykv::daemon {

absl::Status KvPool::ReportSlots(uint64_t session_id, absl::string_view token,
                                 const PeerCreds& peer, const ReportSlotsRequest& r) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer, /*mutation=*/true);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  if (r.epoch != s.tables.epoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slots were reported for epoch ", r.epoch, " but the session's tables are at epoch ",
        s.tables.epoch, "; Sync, then report slots of the new tables"));
  }
  const uint64_t committed = s.tables.committed_tokens;
  const uint64_t layers = s.profile.num_layers;
  if (r.layer_importance.size() % layers != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer_importance has ", r.layer_importance.size(), " values, not a multiple of the ",
        layers, " layers (layer-major, [layers x slots])"));
  }
  if (!r.layer_importance.empty() && !r.importance.empty()) {
    return absl::InvalidArgumentError(
        "report importance or layer_importance, not both in one request");
  }
  const uint64_t layer_n = r.layer_importance.size() / layers;
  const uint64_t n =
      std::max({r.slots.size(), r.attention.size(), r.intent.size(), r.importance.size(),
                r.observation.size(), layer_n});
  if (r.first_slot > committed || n > committed - r.first_slot) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slots [", r.first_slot, ", ", r.first_slot + n, ") are not all committed (",
        committed, " committed); commit before reporting"));
  }
  for (size_t i = 0; i < r.slots.size(); ++i) {
    const policies::SlotMeta& m = r.slots[i];
    const int role = static_cast<int>(m.role), kind = static_cast<int>(m.tag.kind);
    if (role >= policies::kNumRoles || kind >= policies::kNumBlockKinds || m.turn < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slot ", r.first_slot + i, ": role ", role, " (0..", policies::kNumRoles - 1,
          "), tag_kind ", kind, " (0..", policies::kNumBlockKinds - 1, ") or turn ",
          m.turn, " out of range"));
    }
  }
  for (size_t i = 0; i < r.attention.size(); ++i) {
    if (!std::isfinite(r.attention[i]) || r.attention[i] < 0.f) {
      return absl::InvalidArgumentError(absl::StrCat("attention[", i, "] = ", r.attention[i],
                                                     " is not a finite value >= 0"));
    }
  }
  for (size_t i = 0; i < r.intent.size(); ++i) {
    if (!std::isfinite(r.intent[i])) {
      return absl::InvalidArgumentError(absl::StrCat("intent[", i, "] = ", r.intent[i],
                                                     " is not finite"));
    }
  }
  for (const auto& [name, values] : {std::pair{"importance", &r.importance},
                                      std::pair{"observation", &r.observation},
                                      std::pair{"layer_importance", &r.layer_importance}}) {
    for (size_t i = 0; i < values->size(); ++i) {
      if (!std::isfinite((*values)[i]) || (*values)[i] < 0.f) {
        return absl::InvalidArgumentError(absl::StrCat(name, "[", i, "] = ", (*values)[i],
                                                       " is not a finite value >= 0"));
      }
    }
  }
  if (r.current_turn > static_cast<uint32_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("current_turn out of range");
  }
  // Valid: from here on nothing fails.
  if (!r.layer_importance.empty() && s.policy.wants_layer_importance) SplitLayerRecords(s);
  s.policy.importance_reported |= !r.importance.empty() || !r.layer_importance.empty();
  // The streams other than layer_importance are per slot index, the same for
  // every layer: where the layers were compacted apart, a select=layer policy
  // reads none of them but the metadata of new slots (the same token in
  // every layer).
  s.policy.ForEachLayer([&](std::vector<SlotRecord>& slots) {
    for (size_t i = 0; i < r.slots.size(); ++i) {
      // Assigns the SlotMeta part only: the position stays the daemon's.
      static_cast<policies::SlotMeta&>(slots[r.first_slot + i].meta) = r.slots[i];
    }
    for (size_t i = 0; i < r.attention.size(); ++i) slots[r.first_slot + i].attn += r.attention[i];
    for (size_t i = 0; i < r.intent.size(); ++i) slots[r.first_slot + i].intent = r.intent[i];
    for (size_t i = 0; i < r.observation.size(); ++i) {
      slots[r.first_slot + i].obs = r.observation[i];
    }
    for (size_t i = 0; i < r.importance.size(); ++i) {
      float& have = slots[r.first_slot + i].importance;
      have = MaxKnown(have, r.importance[i]);
    }
  });
  // Per layer where each layer has its records, else the most over layers.
  for (uint64_t l = 0; l < (layer_n > 0 ? layers : 0); ++l) {
    auto& slots = s.policy.upper_layers.empty() || l == 0 ? s.policy.slots
                                                          : s.policy.upper_layers[l - 1];
    const float* values = r.layer_importance.data() + l * layer_n;
    for (size_t i = 0; i < layer_n; ++i) {
      float& have = slots[r.first_slot + i].importance;
      have = MaxKnown(have, values[i]);
    }
  }
  if (r.current_turn > 0) s.policy.current_turn = static_cast<int32_t>(r.current_turn);
  ++s.policy.reports;
  return absl::OkStatus();
}

}  // namespace polykv::daemon
