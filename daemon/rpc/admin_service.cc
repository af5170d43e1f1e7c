#include "daemon/rpc/admin_service.h"

#include "absl/strings/str_cat.h"
#include "daemon/log.h"
#include "daemon/rpc/convert.h"
#include "daemon/rpc/session_mover.h"
#include "kernels/page_format.h"

namespace polykv::daemon {

namespace {

// A QoS format the worker may leave to the model's dtype.
std::string FormatOrDefault(const std::optional<PageFormat>& f) {
  return f ? std::string(kernels::FormatShortName(*f)) : "default";
}

}  // namespace

template <typename Fn>
grpc::Status AdminService::AdminHandle(grpc::ServerContext* c, const std::string& rpc, Fn&& fn) {
  return Handle(ctx_, c, rpc, [&](const PeerCreds& peer) -> absl::Status {
    if (!ctx_.admin_uids.contains(peer.uid)) {
      return absl::PermissionDeniedError(
          absl::StrCat("uid ", peer.uid, " may not use the Admin service (see admin_uids)"));
    }
    return fn();
  });
}

grpc::Status AdminService::GetStats(grpc::ServerContext* c, const v1::GetStatsRequest*,
                                    v1::Stats* resp) {
  return AdminHandle(c, "GetStats", [&]() {
    ToProto(ctx_.pool->Stats(), resp);
    resp->set_metrics_address(ctx_.metrics_address);
    resp->set_version(POLYKV_VERSION);
    resp->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - ctx_.start_time));
    return absl::OkStatus();
  });
}

grpc::Status AdminService::ListSessions(grpc::ServerContext* c,
                                        const v1::ListSessionsRequest* req,
                                        v1::ListSessionsResponse* resp) {
  return AdminHandle(c, "ListSessions", [&]() {
    for (const auto& s : ctx_.pool->ListSessions(req->tenant(), req->agent_id())) {
      ToProto(s, resp->add_sessions());
    }
    return absl::OkStatus();
  });
}

grpc::Status AdminService::GetQos(grpc::ServerContext* c, const v1::GetQosRequest* req,
                                  v1::QosRecord* resp) {
  return AdminHandle(c, "GetQos", [&]() -> absl::Status {
    if (req->agent_id().empty()) return absl::InvalidArgumentError("agent_id is required");
    ToProto(ctx_.pool->GetQos(req->agent_id()), resp);
    return absl::OkStatus();
  });
}

grpc::Status AdminService::SetQos(grpc::ServerContext* c, const v1::SetQosRequest* req,
                                  v1::QosRecord* resp) {
  return AdminHandle(c, "SetQos", [&]() -> absl::Status {
    auto q = FromProto(req->qos());
    if (!q.ok()) return q.status();
    auto out = ctx_.pool->SetQos(*q);
    if (!out.ok()) return out.status();
    DaemonLogger()->info(
        "qos of agent {} set: priority {}, max_bytes {}, guaranteed_bytes {}, policy {}, "
        "budget_tokens {}, budget_fraction {}, formats {}/{}, block_tokens {}",
        out->agent_id, std::string(PriorityName(out->priority)), out->max_bytes,
        out->guaranteed_bytes, out->policy, out->budget_tokens, out->budget_fraction,
        FormatOrDefault(out->key_format), FormatOrDefault(out->value_format), out->block_tokens);
    ToProto(*out, resp);
    if (!resp->policy_note().empty()) {
      DaemonLogger()->warn("qos of agent {}: policy {}: {}", out->agent_id, out->policy,
                           resp->policy_note());
    }
    return absl::OkStatus();
  });
}

grpc::Status AdminService::EvictSession(grpc::ServerContext* c,
                                        const v1::EvictSessionRequest* req,
                                        v1::EvictSessionResponse* resp) {
  return AdminHandle(c, "EvictSession", [&]() -> absl::Status {
    auto out = ctx_.pool->Evict(req->session_id(), "by operator");
    if (!out.ok()) return out.status();
    if (ctx_.metrics) ctx_.metrics->SessionReclaimed("operator");
    DaemonLogger()->info("session {} evicted by operator, {} bytes freed", req->session_id(), *out);
    resp->set_freed_bytes(*out);
    return absl::OkStatus();
  });
}

grpc::Status AdminService::OffloadSession(grpc::ServerContext* c,
                                          const v1::OffloadSessionRequest* req,
                                          v1::OffloadSessionResponse* resp) {
  return AdminHandle(c, "OffloadSession", [&]() -> absl::Status {
    auto bytes = ctx_.pool->Offload(req->session_id());
    if (!bytes.ok()) return bytes.status();
    resp->set_bytes(*bytes);
    for (const SessionSummary& s : ctx_.pool->ListSessions("", "")) {
      if (s.session_id == req->session_id()) resp->set_tier(s.offloaded_to);
    }
    DaemonLogger()->info("session {} offloaded by operator: {} bytes to {}", req->session_id(),
                         *bytes, resp->tier());
    return absl::OkStatus();
  });
}

grpc::Status AdminService::Drain(grpc::ServerContext* c, const v1::DrainRequest* req,
                                 v1::DrainResponse* resp) {
  return AdminHandle(c, "Drain", [&]() {
    resp->set_num_sessions(ctx_.pool->Drain(absl::Milliseconds(req->evict_after_ms())));
    DaemonLogger()->info("drain requested by operator; {} sessions open", resp->num_sessions());
    return absl::OkStatus();
  });
}

grpc::Status AdminService::MoveSession(grpc::ServerContext* c, const v1::MoveSessionRequest* req,
                                       v1::MoveSessionResponse* resp) {
  return AdminHandle(c, "MoveSession", [&]() -> absl::Status {
    if (ctx_.mover == nullptr) {
      return absl::FailedPreconditionError(
          "this polykvd has no peer TLS (peer.cert, peer.key, peer.ca in its config): it "
          "cannot move sessions");
    }
    const uint32_t wait_ms = req->wait_ms() ? req->wait_ms() : 30000;
    auto out = ctx_.mover->Move(req->session_id(), req->target(), absl::Milliseconds(wait_ms));
    if (!out.ok()) {
      DaemonLogger()->warn("session {}: move to {} failed: {}", req->session_id(), req->target(),
                           std::string(out.status().message()));
      return out.status();
    }
    DaemonLogger()->info("session {} moved to {} (session {} there): {} tokens, {} bytes, "
                         "worker paused {:.1f} ms",
                         req->session_id(), req->target(), out->target_session_id, out->tokens,
                         out->bytes, out->pause_seconds * 1e3);
    resp->set_target_session_id(out->target_session_id);
    resp->set_bytes(out->bytes);
    resp->set_tokens(out->tokens);
    resp->set_park_seconds(out->park_seconds);
    resp->set_copy_seconds(out->copy_seconds);
    resp->set_pause_seconds(out->pause_seconds);
    return absl::OkStatus();
  });
}

}  // namespace polykv::daemon
