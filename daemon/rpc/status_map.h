// The one place internal errors become gRPC statuses. absl and gRPC codes
// share numbering; messages pass through unchanged (they are written for the
// person reading the client's error).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace polykv::daemon {

grpc::Status ToGrpc(const absl::Status& status);

}  // namespace polykv::daemon
