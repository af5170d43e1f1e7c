// What every RPC handler needs: the pool, the peer registry, metrics, and a
// wrapper that resolves the caller's credentials, times the call, translates
// the status and records it.
#pragma once

#include <grpcpp/server_context.h>

#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "daemon/metrics/metrics.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/rpc/peer_registry.h"
#include "daemon/rpc/status_map.h"

namespace polykv::daemon {

class LogThrottle;
class SessionMover;
class WatchQuota;

struct ServiceContext {
  KvPool* pool = nullptr;              // Not owned.
  const PeerRegistry* peers = nullptr; // Not owned.
  Metrics* metrics = nullptr;          // Not owned; may be null in tests.
  ErrorLog* errors = nullptr;          // Not owned; may be null in tests.
  WatchQuota* watches = nullptr;       // Not owned; null: no per-uid limit.
  LogThrottle* session_log = nullptr;  // Not owned; null: every session line.
  SessionMover* mover = nullptr;       // Not owned; null: no peer TLS, no moves.
  std::set<uid_t> admin_uids;          // Who may call the Admin service.
  std::string fd_socket_path;
  std::string metrics_address;         // Bound metrics server address, for Stats.
  absl::Time start_time = absl::Now();
};

// The end of every handler: records the RPC's code and time (started at
// `start`) and returns `status` translated to gRPC.
inline grpc::Status FinishRpc(const ServiceContext& ctx, const std::string& rpc, absl::Time start,
                              const absl::Status& status) {
  if (ctx.metrics) {
    ctx.metrics->ObserveRpc(rpc, GrpcCodeName(static_cast<int>(status.code())),
                            absl::ToDoubleSeconds(absl::Now() - start));
  }
  return ToGrpc(status, rpc, ctx.errors);
}

// Runs fn(peer) for the RPC `rpc` (a caller of the Unix socket, by its
// credentials) and returns its status translated to gRPC.
template <typename Fn>
grpc::Status Handle(const ServiceContext& ctx, grpc::ServerContext* server_ctx,
                    const std::string& rpc, Fn&& fn) {
  const absl::Time start = absl::Now();
  absl::Status status;
  auto peer = ctx.peers->Lookup(server_ctx->peer());
  if (!peer) {
    status = absl::PermissionDeniedError("connection has no verified peer credentials");
  } else {
    status = fn(*peer);
  }
  return FinishRpc(ctx, rpc, start, status);
}

}  // namespace polykv::daemon
