// UdsListener: a Unix stream socket polykvd accepts on itself, so it can
// check each peer's credentials (SO_PEERCRED) before any byte reaches gRPC.
//
// The socket file is created with `mode` (default 0660). A connection from a
// uid/gid not in the allowed sets is closed at once and counted.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/pool/types.h"

namespace polykv::daemon {

struct PeerPolicy {
  std::set<uid_t> allowed_uids;
  std::set<gid_t> allowed_gids;
  // Allowed when the uid or the primary gid is listed.
  bool Allows(const PeerCreds& c) const {
    return allowed_uids.contains(c.uid) || allowed_gids.contains(c.gid);
  }
};

struct UdsListenerOptions {
  std::string path;
  mode_t mode = 0660;
  PeerPolicy policy;
  // Called on the listener thread with an accepted, allowed connection. Takes
  // ownership of fd.
  std::function<void(int fd, const PeerCreds& peer)> on_accept;
  // Called for each refused peer (for logs and metrics).
  std::function<void(const PeerCreds& peer)> on_reject;
};

class UdsListener {
 public:
  // Binds and listens. A stale socket file (no one answering) is replaced; a
  // live one is an error (another daemon runs there).
  static absl::StatusOr<std::unique_ptr<UdsListener>> Create(UdsListenerOptions options);
  ~UdsListener();  // Stops, closes and unlinks.
  UdsListener(const UdsListener&) = delete;
  UdsListener& operator=(const UdsListener&) = delete;

  void Start();
  void Stop();

 private:
  UdsListener(UdsListenerOptions options, int fd);
  void Loop();

  const UdsListenerOptions options_;
  const int listen_fd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Binds a listening Unix socket at `path` with `mode`. Shared by UdsListener
// and the fd broker.
absl::StatusOr<int> BindUnixSocket(const std::string& path, mode_t mode);
// SO_PEERCRED of a connected Unix socket.
absl::StatusOr<PeerCreds> PeerCredsOf(int fd);

}  // namespace polykv::daemon
