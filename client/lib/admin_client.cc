#include "polykv/admin.h"

#include "client/lib/channel.h"

namespace polykv {

using internal::FromGrpc;
using internal::SetDeadline;

absl::StatusOr<std::unique_ptr<AdminClient>> AdminClient::Connect(const std::string& socket_path,
                                                                  int timeout_ms) {
  auto channel = internal::Dial(socket_path, timeout_ms);
  if (!channel.ok()) return channel.status();
  return std::make_unique<AdminClient>(v1::Admin::NewStub(*channel));
}

absl::StatusOr<v1::Stats> AdminClient::GetStats() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::Stats out;
  if (auto s = FromGrpc(stub_->GetStats(&ctx, v1::GetStatsRequest(), &out)); !s.ok()) return s;
  return out;
}

absl::StatusOr<v1::ListSessionsResponse> AdminClient::ListSessions(const std::string& tenant,
                                                                   const std::string& agent_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ListSessionsRequest req;
  req.set_tenant(tenant);
  req.set_agent_id(agent_id);
  v1::ListSessionsResponse out;
  if (auto s = FromGrpc(stub_->ListSessions(&ctx, req, &out)); !s.ok()) return s;
  return out;
}

absl::StatusOr<v1::QosRecord> AdminClient::GetQos(const std::string& agent_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetQosRequest req;
  req.set_agent_id(agent_id);
  v1::QosRecord out;
  if (auto s = FromGrpc(stub_->GetQos(&ctx, req, &out)); !s.ok()) return s;
  return out;
}

absl::StatusOr<v1::QosRecord> AdminClient::SetQos(const v1::QosRecord& qos) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::SetQosRequest req;
  *req.mutable_qos() = qos;
  v1::QosRecord out;
  if (auto s = FromGrpc(stub_->SetQos(&ctx, req, &out)); !s.ok()) return s;
  return out;
}

absl::StatusOr<uint64_t> AdminClient::EvictSession(uint64_t session_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::EvictSessionRequest req;
  req.set_session_id(session_id);
  v1::EvictSessionResponse out;
  if (auto s = FromGrpc(stub_->EvictSession(&ctx, req, &out)); !s.ok()) return s;
  return out.freed_bytes();
}

absl::StatusOr<v1::OffloadSessionResponse> AdminClient::OffloadSession(uint64_t session_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::OffloadSessionRequest req;
  req.set_session_id(session_id);
  v1::OffloadSessionResponse out;
  if (auto s = FromGrpc(stub_->OffloadSession(&ctx, req, &out)); !s.ok()) return s;
  return out;
}

absl::StatusOr<uint32_t> AdminClient::Drain(uint32_t evict_after_ms) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::DrainRequest req;
  req.set_evict_after_ms(evict_after_ms);
  v1::DrainResponse out;
  if (auto s = FromGrpc(stub_->Drain(&ctx, req, &out)); !s.ok()) return s;
  return out.num_sessions();
}

absl::StatusOr<v1::MoveSessionResponse> AdminClient::MoveSession(uint64_t session_id,
                                                                 const std::string& target,
                                                                 uint32_t wait_ms) {
  grpc::ClientContext ctx;
  // The worker's park, then the copy (the daemon bounds both).
  SetDeadline(&ctx, static_cast<int>((wait_ms ? wait_ms : 30000) + 600000));
  v1::MoveSessionRequest req;
  req.set_session_id(session_id);
  req.set_target(target);
  req.set_wait_ms(wait_ms);
  v1::MoveSessionResponse out;
  if (auto s = FromGrpc(stub_->MoveSession(&ctx, req, &out)); !s.ok()) return s;
  return out;
}

}  // namespace polykv
