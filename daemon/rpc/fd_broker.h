// FdBroker: serves arena file descriptors over the fd socket
// (proto/polykv/v1/fd_socket.h) after checking peer credentials and the
// session token.
//
// One thread multiplexes every connection with poll(): a request is answered
// as soon as its 56 bytes are in, so a silent or slow peer delays nobody
// else (issue 14, finding 3: served one at a time with 1 s each, 15 silent
// connections made a worker's fetch miss its lease). Each connection has
// kRequestTimeout to send its request. At kMaxConnections the oldest
// connection of the uid holding most is dropped to admit a new one, so a
// flood of one uid only ever drops its own (issue 40: dropping the oldest of
// all, 83 of 1,472 legitimate fetches of others failed under a flood).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/rpc/uds_listener.h"
#include "daemon/sys/wake_fd.h"

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
  FdBroker(FdBrokerOptions options, int fd, WakeFd wake)
      : options_(std::move(options)), listen_fd_(fd), stop_(std::move(wake)) {}
  struct Conn;
  void Loop();
  // Answers one complete request on `c` (checked header, token, tenant).
  void Serve(const Conn& c);

  const FdBrokerOptions options_;
  const int listen_fd_;
  WakeFd stop_;  // Stop wakes the loop's poll
  std::thread thread_;
};

}  // namespace polykv::daemon
