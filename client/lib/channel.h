// Shared helpers of the client library: one way to dial polykvd and one way
// to turn a gRPC status into absl::Status.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace polykv::internal {

// A channel to the daemon's Unix socket, connected within timeout_ms.
absl::StatusOr<std::shared_ptr<grpc::Channel>> Dial(const std::string& socket_path,
                                                    int timeout_ms);
absl::Status FromGrpc(const grpc::Status& s);
// Deadline for one unary call: generous, so a loaded 2-core box does not
// turn into spurious DEADLINE_EXCEEDED, but a hung daemon is noticed.
void SetDeadline(grpc::ClientContext* ctx, int ms = 30000);

}  // namespace polykv::internal
