// MetricsHttpServer: serves GET /metrics (Prometheus text format) on a TCP
// address, from one thread that multiplexes every connection with poll();
// with it the probes an orchestrator asks (Kubernetes' liveness and
// readiness): GET /healthz answers 200 while this loop runs, GET /readyz 200
// when `ready` says OK and 503 with its message otherwise.
//
// Why not prometheus-cpp's Exposer: it is civetweb with a thread per
// connection (two by default) and a 30 s request timeout, so two idle TCP
// connections blocked every scrape for ~30 s (issue 14, finding 8). Here an
// idle connection costs one pollfd: it cannot delay anybody's request, it is
// closed after `request_timeout`, and at `max_connections` the connection idle
// the longest without a complete request is dropped to admit the new one.
//
// Thread-safety: Start/Stop from one thread; `render` is called on the
// server's thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/sys/wake_fd.h"

namespace polykv::daemon {

struct MetricsHttpOptions {
  std::string address = "127.0.0.1:9464";  // host:port; port 0 picks a free one
  size_t max_connections = 64;
  absl::Duration request_timeout = absl::Seconds(5);  // to read a request and write the reply
  size_t max_request_bytes = 8192;
};

class MetricsHttpServer {
 public:
  // Binds and starts serving. `render` returns the /metrics page body;
  // `ready` says whether the daemon takes work (null: always).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const MetricsHttpOptions& options, std::function<std::string()> render,
      std::function<absl::Status()> ready = nullptr);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer(const MetricsHttpOptions& options, std::function<std::string()> render,
                    std::function<absl::Status()> ready, int listen_fd, WakeFd wake, int port);
  void Loop();

  const MetricsHttpOptions options_;
  const std::function<std::string()> render_;
  const std::function<absl::Status()> ready_;
  const int listen_fd_;
  WakeFd wake_;  // the destructor wakes the poll
  const int port_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace polykv::daemon
