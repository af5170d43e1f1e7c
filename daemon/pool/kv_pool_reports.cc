// KvPool::ReportSlots: slot metadata and the worker's score streams
// (policies/score_stream.h) into the session's slot records and per-layer
// values, which its policy ranks by at the next compaction. Every stream
// goes through the same checks and folds by its own rule.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "daemon/pool/kv_pool.h"

namespace polykv::daemon {

namespace {

using policies::ScoreStream;
using policies::ScoreValues;

// Slots `v` covers from the report's first slot: INVALID_ARGUMENT unless its
// size fits its stream's shape.
absl::StatusOr<uint64_t> SlotsCovered(const ScoreValues& v, uint64_t layers) {
  const auto& rule = policies::RuleOf(v.stream);
  const std::string name(rule.name);
  if (rule.per_layer) {
    if (v.values.size() != layers) {
      return absl::InvalidArgumentError(absl::StrCat(name, " has ", v.values.size(),
                                                     " values; it takes one per layer (",
                                                     layers, ")"));
    }
    return 0;
  }
  if (!v.per_layer) return v.values.size();
  if (v.values.size() % layers != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " per layer has ", v.values.size(), " values, not a multiple of the ", layers,
        " layers (layer-major, [layers x slots])"));
  }
  return v.values.size() / layers;
}

// Ages the attention mass every record holds to the session's next position: per
// token committed since it was last aged, x the policy's decay (H2O with
// decay), before a report's mass, itself aged by the worker, adds to it.
void AgeAttention(PolicyInputs& p) {
  const int64_t tokens = p.next_position - p.attention_aged_at;
  p.attention_aged_at = p.next_position;
  if (p.wants.attention_decay >= 1.f || tokens <= 0) return;
  const auto factor = static_cast<float>(std::pow(double{p.wants.attention_decay}, tokens));
  for (auto& list : p.records) {
    for (SlotRecord& r : list) r.score[ScoreStream::kAttention] *= factor;
  }
}

// Folds `values` ([n], of slots from `first`) into `records` by `stream`'s rule.
void Fold(ScoreStream stream, const float* values, uint64_t n, uint64_t first,
          std::vector<SlotRecord>& records) {
  for (uint64_t i = 0; i < n; ++i) {
    float& held = records[first + i].score[stream];
    held = policies::FoldReport(stream, held, values[i]);
  }
}

}  // namespace

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
  uint64_t n = r.slots.size();
  policies::StreamSet seen;
  for (const ScoreValues& v : r.scores) {
    if (static_cast<int>(v.stream) >= policies::kNumScoreStreams) {
      return absl::InvalidArgumentError(
          absl::StrCat("score stream ", static_cast<int>(v.stream), " unknown"));
    }
    const std::string name(policies::ScoreStreamName(v.stream));
    if (seen.has(v.stream)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " reported twice in one request (per slot or per layer, once)"));
    }
    seen.add(v.stream);
    auto covered = SlotsCovered(v, layers);
    if (!covered.ok()) return covered.status();
    n = std::max(n, *covered);
    for (size_t i = 0; i < v.values.size(); ++i) {
      if (!policies::ValidScore(v.stream, v.values[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, "[", i, "] = ", v.values[i],
            policies::RuleOf(v.stream).signed_values ? " is not finite"
                                                     : " is not a finite value >= 0"));
      }
    }
  }
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
  if (r.current_turn > static_cast<uint32_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("current_turn out of range");
  }
  // Valid: from here on nothing fails.
  const bool any_per_layer = std::any_of(r.scores.begin(), r.scores.end(), [](const auto& v) {
    return v.per_layer && !policies::RuleOf(v.stream).per_layer;
  });
  if (any_per_layer && s.policy.wants.per_layer) SplitLayerRecords(s);
  s.policy.importance_reported |= seen.has(ScoreStream::kImportance);
  if (seen.has(ScoreStream::kAttention)) AgeAttention(s.policy);
  for (auto& list : s.policy.records) {
    for (size_t i = 0; i < r.slots.size(); ++i) {
      // Assigns the SlotMeta part only: the position stays the daemon's.
      static_cast<policies::SlotMeta&>(list[r.first_slot + i].meta) = r.slots[i];
    }
  }
  for (const ScoreValues& v : r.scores) {
    if (policies::RuleOf(v.stream).per_layer) {
      s.policy.layer_scores.resize(layers);
      for (uint64_t l = 0; l < layers; ++l) {
        float& held = s.policy.layer_scores[l][v.stream];
        held = policies::FoldReport(v.stream, held, v.values[l]);
      }
      continue;
    }
    if (!v.per_layer) {
      // The same slot index in every layer (where the layers were compacted
      // apart, a select=layer policy reads no per-slot stream but its
      // per-layer one).
      for (auto& list : s.policy.records) {
        Fold(v.stream, v.values.data(), v.values.size(), r.first_slot, list);
      }
      continue;
    }
    const uint64_t per = v.values.size() / layers;
    if (s.policy.layers_apart()) {
      for (uint64_t l = 0; l < layers; ++l) {
        Fold(v.stream, v.values.data() + l * per, per, r.first_slot, s.policy.records[l]);
      }
      continue;
    }
    // One record list for all layers: the layers' values combined first, as
    // a merge combines its members (mass adds up, relevance is the most).
    std::vector<float> combined(v.values.begin(), v.values.begin() + per);
    for (uint64_t l = 1; l < layers; ++l) {
      for (uint64_t i = 0; i < per; ++i) {
        combined[i] = policies::Combine(policies::RuleOf(v.stream).on_combine, combined[i],
                                        v.values[l * per + i]);
      }
    }
    Fold(v.stream, combined.data(), per, r.first_slot, s.policy.records[0]);
  }
  if (r.current_turn > 0) s.policy.current_turn = static_cast<int32_t>(r.current_turn);
  ++s.policy.reports;
  return absl::OkStatus();
}

}  // namespace polykv::daemon
