// FdBroker: serves arena file descriptors over the fd socket
// (proto/polykv/v1/fd_socket.h) after checking peer credentials and the
// session token.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/rpc/uds_listener.h"

namespace polykv::daemon {

struct FdBrokerOptions {
  std::string path;
  mode_t mode = 0660;
  PeerPolicy policy;
  KvPool* pool = nullptr;  // Not owned; outlives the broker.
  std::function<void(const PeerCreds&)> on_reject;
};

class FdBroker {
 public:
  static absl::StatusOr<std::unique_ptr<FdBroker>> Create(FdBrokerOptions options);
  ~FdBroker();
  FdBroker(const FdBroker&) = delete;
  FdBroker& operator=(const FdBroker&) = delete;
  void Start();
  void Stop();

 private:
  FdBroker(FdBrokerOptions options, int fd) : options_(std::move(options)), listen_fd_(fd) {}
  void Loop();
  void Serve(int fd);

  const FdBrokerOptions options_;
  const int listen_fd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace polykv::daemon
