#include "daemon/rpc/move_convert.h"

#include "absl/strings/str_cat.h"
#include "daemon/rpc/convert.h"

namespace polykv::daemon {
namespace {

using policies::ScoreStream;

v1::ScoreStream StreamToProto(ScoreStream s) {
  return static_cast<v1::ScoreStream>(policies::WireValue(s));
}

// One stream's values of a shape (slot or layer streams), [n] each; a
// stream the wire lacks stays as StreamValues' default (unreported).
template <bool kPerLayer>
absl::Status ScoresFromProto(const google::protobuf::RepeatedPtrField<v1::ScoreValues>& in,
                             size_t n, std::vector<policies::StreamValues<kPerLayer>>& out,
                             absl::string_view where) {
  out.assign(n, policies::StreamValues<kPerLayer>());
  for (const v1::ScoreValues& v : in) {
    const auto stream = policies::FromWireValue(v.stream());
    if (!stream || policies::RuleOf(*stream).per_layer != kPerLayer) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": stream ", v.stream(), " unknown or of the other shape"));
    }
    if (static_cast<size_t>(v.values_size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", v.values_size(), " ",
                                                     std::string(policies::ScoreStreamName(*stream)),
                                                     " values for ", n));
    }
    for (size_t i = 0; i < n; ++i) out[i][*stream] = v.values(static_cast<int>(i));
  }
  return absl::OkStatus();
}

template <bool kPerLayer>
void ScoresToProto(const std::vector<policies::StreamValues<kPerLayer>>& in,
                   google::protobuf::RepeatedPtrField<v1::ScoreValues>* out) {
  for (ScoreStream s : policies::AllScoreStreams()) {
    if (policies::RuleOf(s).per_layer != kPerLayer) continue;
    v1::ScoreValues* v = out->Add();
    v->set_stream(StreamToProto(s));
    v->set_per_layer(kPerLayer);
    v->mutable_values()->Reserve(static_cast<int>(in.size()));
    for (const auto& x : in) v->add_values(x[s]);
  }
}

absl::StatusOr<PageFormat> RequiredFormat(int value, absl::string_view field) {
  auto f = FormatFromProto(value, field);
  if (!f.ok()) return f.status();
  if (!f->has_value()) return absl::InvalidArgumentError(absl::StrCat(field, ": unspecified"));
  return **f;
}

}  // namespace

absl::StatusOr<MovedSession> FromProto(const v1::MovedSession& m) {
  MovedSession o;
  o.agent_id = m.agent_id();
  o.tenant = m.tenant();
  o.peer = {0, m.uid(), m.gid()};
  auto profile = FromProto(m.profile());
  if (!profile.ok()) return profile.status();
  o.profile = *profile;
  o.block_tokens = m.block_tokens();
  auto kf = RequiredFormat(m.key_format(), "key_format");
  if (!kf.ok()) return kf.status();
  auto vf = RequiredFormat(m.value_format(), "value_format");
  if (!vf.ok()) return vf.status();
  o.key_format = *kf;
  o.value_format = *vf;
  if (m.priority() < v1::PRIORITY_BEST_EFFORT || m.priority() > v1::PRIORITY_CRITICAL) {
    return absl::InvalidArgumentError(absl::StrCat("priority: unknown class ", m.priority()));
  }
  o.priority = static_cast<Priority>(m.priority());
  o.lease_ms = m.lease_ms();
  o.committed_tokens = m.committed_tokens();
  for (int b = 0; b < m.blocks_size(); ++b) {
    const v1::MovedBlock& in = m.blocks(b);
    MovedBlock& mb = o.blocks.emplace_back();
    auto bk = RequiredFormat(in.key_format(), absl::StrCat("blocks[", b, "].key_format"));
    if (!bk.ok()) return bk.status();
    auto bv = RequiredFormat(in.value_format(), absl::StrCat("blocks[", b, "].value_format"));
    if (!bv.ok()) return bv.status();
    mb.key_format = *bk;
    mb.value_format = *bv;
    mb.present.assign(in.present().begin(), in.present().end());
  }
  for (int l = 0; l < m.records_size(); ++l) {
    const v1::MovedRecords& in = m.records(l);
    const size_t n = static_cast<size_t>(in.positions_size());
    const std::string where = absl::StrCat("records[", l, "]");
    if (static_cast<size_t>(in.counts_size()) != n || static_cast<size_t>(in.meta_size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", n, " positions, ",
                                                     in.counts_size(), " counts, ",
                                                     in.meta_size(), " metas"));
    }
    std::vector<policies::SlotScores> scores;
    if (auto st = ScoresFromProto<false>(in.scores(), n, scores, where); !st.ok()) return st;
    auto& list = o.records.emplace_back(n);
    for (size_t i = 0; i < n; ++i) {
      auto meta = FromProto(in.meta(static_cast<int>(i)), absl::StrCat(where, "[", i, "]"));
      if (!meta.ok()) return meta.status();
      static_cast<policies::SlotMeta&>(list[i].meta) = *meta;
      list[i].meta.position = in.positions(static_cast<int>(i));
      list[i].count = in.counts(static_cast<int>(i));
      list[i].score = scores[i];
    }
  }
  if (m.layer_scores_size() > 0) {
    if (auto st = ScoresFromProto<true>(m.layer_scores(), o.profile.num_layers, o.layer_scores,
                                        "layer_scores");
        !st.ok()) {
      return st;
    }
  }
  o.log_count_bias = m.log_count_bias();
  o.next_position = m.next_position();
  o.attention_aged_at = m.attention_aged_at();
  if (m.current_turn() > uint32_t{INT32_MAX}) {
    return absl::InvalidArgumentError("current_turn out of range");
  }
  o.current_turn = static_cast<int32_t>(m.current_turn());
  o.importance_reported = m.importance_reported();
  o.reports = m.reports();
  o.epoch = m.epoch();
  return o;
}

void ToProto(const MovedSession& in, v1::MovedSession* out) {
  out->set_agent_id(in.agent_id);
  out->set_tenant(in.tenant);
  out->set_uid(in.peer.uid);
  out->set_gid(in.peer.gid);
  ToProto(in.profile, out->mutable_profile());
  out->set_block_tokens(in.block_tokens);
  out->set_key_format(FormatToProto(in.key_format));
  out->set_value_format(FormatToProto(in.value_format));
  out->set_priority(static_cast<v1::PriorityClass>(in.priority));
  out->set_lease_ms(in.lease_ms);
  out->set_committed_tokens(in.committed_tokens);
  for (const MovedBlock& b : in.blocks) {
    v1::MovedBlock* mb = out->add_blocks();
    mb->set_key_format(FormatToProto(b.key_format));
    mb->set_value_format(FormatToProto(b.value_format));
    for (bool p : b.present) mb->add_present(p);
  }
  for (const auto& list : in.records) {
    v1::MovedRecords* r = out->add_records();
    std::vector<policies::SlotScores> scores;
    scores.reserve(list.size());
    for (const policies::SlotRecord& x : list) {
      r->add_positions(x.meta.position);
      r->add_counts(x.count);
      ToProto(static_cast<const policies::SlotMeta&>(x.meta), r->add_meta());
      scores.push_back(x.score);
    }
    ScoresToProto<false>(scores, r->mutable_scores());
  }
  if (!in.layer_scores.empty()) ScoresToProto<true>(in.layer_scores, out->mutable_layer_scores());
  out->set_log_count_bias(in.log_count_bias);
  out->set_next_position(in.next_position);
  out->set_attention_aged_at(in.attention_aged_at);
  out->set_current_turn(static_cast<uint32_t>(in.current_turn));
  out->set_importance_reported(in.importance_reported);
  out->set_reports(in.reports);
  out->set_epoch(in.epoch);
}

}  // namespace polykv::daemon
