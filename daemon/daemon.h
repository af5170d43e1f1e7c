// Daemon: wires the rooms together — pool, arenas, sockets, gRPC services,
// metrics server, lease reaper — and owns their lifetimes.
//
//   auto d = Daemon::Create(config);   // validates, binds nothing yet
//   d->Start();                        // sockets, gRPC, metrics, reaper
//   d->Drain(timeout);                 // stop admitting, wait, evict the rest
//   d->Shutdown();                     // idempotent; the destructor calls it
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "daemon/config/config.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/rpc/uds_listener.h"

namespace grpc {
class Server;
}
namespace prometheus {
class Registry;
}

namespace polykv::daemon {

class Metrics;
class MetricsHttpServer;
class PoolCollector;
class PeerRegistry;
class ErrorLog;
class LogThrottle;
class WatchQuota;
class ParseErrorInterceptorFactory;
class FdBroker;
class PrefixService;
class SessionService;
class AdminService;
class PeerService;
class SessionMover;

class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(const DaemonConfig& config);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  absl::Status Start();
  // Stops admitting sessions and reservations, waits up to `timeout` for
  // sessions to close, then evicts what is left.
  void Drain(absl::Duration timeout);
  void Shutdown();

  KvPool* pool() { return pool_.get(); }
  // host:port the metrics server is bound to ("" when disabled).
  const std::string& metrics_address() const { return metrics_address_; }
  const std::string& fd_socket_path() const { return fd_socket_path_; }
  // host:port the peer listener is bound to ("" when it has none).
  const std::string& peer_address() const { return peer_address_; }
  // Open gRPC connections, and entries of the peer registry (tests of
  // findings 4 and 11). REQUIRES: Start() succeeded.
  size_t num_connections() const;
  size_t num_registered_peers() const;

 private:
  explicit Daemon(const DaemonConfig& config);
  void ReaperLoop();
  void LadderLoop();
  // Raises RLIMIT_NOFILE's soft limit so max_connections fit; warns if the
  // hard limit is lower.
  void RaiseFdLimit();
  // The listener's callbacks (listener thread).
  void OnAccept(const Connection& c);
  void OnClose(const Connection& c);
  void OnReject(const PeerCreds& p, RejectReason why);
  void OnAcceptError(int error);

  const DaemonConfig config_;
  const std::string fd_socket_path_;
  std::string metrics_address_;
  std::string peer_address_;
  std::unique_ptr<KvPool> pool_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Metrics> metrics_;
  std::shared_ptr<PoolCollector> collector_;
  std::unique_ptr<MetricsHttpServer> metrics_server_;
  std::unique_ptr<PeerRegistry> peers_;
  std::unique_ptr<ErrorLog> errors_;  // Unexpected RPC errors, logged once each.
  std::unique_ptr<LogThrottle> listener_log_;  // Refusals and accept errors.
  std::unique_ptr<LogThrottle> session_log_;   // Session opens, closes, refusals, reclaims.
  std::unique_ptr<WatchQuota> watches_;         // Watch streams per uid.
  std::unique_ptr<SessionService> session_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<PrefixService> prefix_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<SessionMover> mover_;
  std::unique_ptr<PeerService> peer_service_;
  std::unique_ptr<grpc::Server> peer_server_;  // TCP, mutual TLS (config peer.address)
  std::unique_ptr<UdsListener> listener_;
  std::unique_ptr<FdBroker> fd_broker_;
  absl::Notification stop_reaper_;
  std::thread reaper_;
  std::thread ladder_;
  std::atomic<bool> shut_down_{false};
  std::atomic<bool> serving_{false};  // Start finished: /readyz may say ready
};

}  // namespace polykv::daemon
