// AdminClient: the Admin service for operators and tools (polykvctl).
// Returns the proto messages themselves; they are documented in
// proto/polykv/v1/admin.proto.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "polykv/v1/admin.grpc.pb.h"

namespace polykv {

class AdminClient {
 public:
  static absl::StatusOr<std::unique_ptr<AdminClient>> Connect(const std::string& socket_path,
                                                              int timeout_ms = 5000);
  explicit AdminClient(std::unique_ptr<v1::Admin::Stub> stub) : stub_(std::move(stub)) {}

  absl::StatusOr<v1::Stats> GetStats();
  absl::StatusOr<v1::ListSessionsResponse> ListSessions(const std::string& tenant = "",
                                                        const std::string& agent_id = "");
  absl::StatusOr<v1::QosRecord> GetQos(const std::string& agent_id);
  absl::StatusOr<v1::QosRecord> SetQos(const v1::QosRecord& qos);
  absl::StatusOr<uint64_t> EvictSession(uint64_t session_id);
  // Moves an idle session's pages to the offload tiers (Admin.OffloadSession).
  absl::StatusOr<v1::OffloadSessionResponse> OffloadSession(uint64_t session_id);
  absl::StatusOr<uint32_t> Drain(uint32_t evict_after_ms);
  // Moves the session to the polykvd whose peer listener is `target`
  // (host:port); waits for the worker to park up to wait_ms (0: 30 s).
  absl::StatusOr<v1::MoveSessionResponse> MoveSession(uint64_t session_id,
                                                      const std::string& target,
                                                      uint32_t wait_ms = 0);

 private:
  std::unique_ptr<v1::Admin::Stub> stub_;
};

}  // namespace polykv
