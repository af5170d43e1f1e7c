// MovedSession (daemon/pool/session_move.h) <-> its wire form
// (proto/polykv/v1/peer.proto). Parsing checks enum values and sizes the
// wire can get wrong; KvPool::BeginImport checks the rest.
#pragma once

#include "absl/status/statusor.h"
#include "daemon/pool/session_move.h"
#include "polykv/v1/peer.pb.h"

namespace polykv::daemon {

absl::StatusOr<MovedSession> FromProto(const v1::MovedSession& m);
void ToProto(const MovedSession& in, v1::MovedSession* out);

}  // namespace polykv::daemon
