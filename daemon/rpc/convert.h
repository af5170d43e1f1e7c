// Proto <-> internal translation, in one place. Parsing functions validate
// enum values and return INVALID_ARGUMENT naming the field.
#pragma once

#include <span>

#include "absl/status/statusor.h"
#include "daemon/pool/types.h"
#include "polykv/v1/admin.pb.h"
#include "polykv/v1/prefix.pb.h"
#include "polykv/v1/session.pb.h"

namespace polykv::daemon {

absl::StatusOr<OpenRequest> FromProto(const v1::OpenSessionRequest& r, const PeerCreds& peer);
absl::StatusOr<ModelProfile> FromProto(const v1::ModelProfile& p);
// A request's token ids, as the pool takes them (no copy).
inline std::span<const int32_t> TokenIds(const google::protobuf::RepeatedField<int32_t>& ids) {
  return {ids.data(), static_cast<size_t>(ids.size())};
}
absl::StatusOr<PrefixSpaceRequest> FromProto(const v1::PrefixSpace& s, const PeerCreds& peer);
// `where` names the slot in the error.
absl::StatusOr<policies::SlotMeta> FromProto(const v1::SlotMeta& m, absl::string_view where);
void ToProto(const policies::SlotMeta& in, v1::SlotMeta* out);
absl::StatusOr<QosRecord> FromProto(const v1::QosRecord& q);
// The session in r.session() is the caller's to check.
absl::StatusOr<ReportSlotsRequest> FromProto(const v1::ReportSlotsRequest& r);
// nullopt for UNSPECIFIED.
absl::StatusOr<std::optional<PageFormat>> FormatFromProto(int value, absl::string_view field);

void ToProto(const OpenResult& in, v1::OpenSessionResponse* out);
void ToProto(const QosRecord& in, v1::QosRecord* out);
v1::ArenaHandle::Kind ToProto(ArenaKind kind);
void ToProto(const ArenaExport& in, v1::ArenaHandle* out);
void ToProto(const BlockDesc& in, v1::Block* out);
void ToProto(const SessionSummary& in, v1::SessionInfo* out);
void ToProto(const PoolSummary& in, v1::Stats* out);
void ToProto(const ModelProfile& in, v1::ModelProfile* out);
// OpenSessionResponse's and SyncResponse's wanted_streams and wants_per_layer.
template <typename Response>
void SetWanted(const policies::WantedStreams& in, Response* out) {
  for (policies::ScoreStream s : policies::AllScoreStreams()) {
    if (in.has(s)) out->add_wanted_streams(static_cast<v1::ScoreStream>(policies::WireValue(s)));
  }
  out->set_wants_per_layer(in.per_layer);
  out->set_attention_decay(in.attention_decay);
}
v1::PageFormat FormatToProto(PageFormat f);
// nullopt: PAGE_FORMAT_UNSPECIFIED.
v1::PageFormat FormatToProto(const std::optional<PageFormat>& f);

}  // namespace polykv::daemon
