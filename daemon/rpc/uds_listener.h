// UdsListener: a Unix stream socket polykvd accepts on itself, so it can
// check each peer's credentials (SO_PEERCRED) before any byte reaches gRPC.
//
// The socket file is created with `mode` (default 0660). A connection from a
// uid/gid not in the allowed sets, or past the connection limits (finding 4
// of issue 14: idle connections of one uid must not lock out the others), is
// closed at once and reported. The listener notices when the consumer (gRPC)
// has closed an accepted fd (rpc/connection_table.h) and reports that too, so
// counts and peer-registry entries go down with the connections.
//
// Out of fds (EMFILE/ENFILE), accept() fails while the connection waits in the
// backlog, and poll() says readable at once: the loop backs off instead of
// spinning, and the connection is accepted once fds are free again.
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
#include "daemon/rpc/connection_table.h"
#include "daemon/sys/wake_fd.h"

namespace polykv::daemon {

struct PeerPolicy {
  std::set<uid_t> allowed_uids;
  std::set<gid_t> allowed_gids;
  // Allowed when the uid or the primary gid is listed.
  bool Allows(const PeerCreds& c) const {
    return allowed_uids.contains(c.uid) || allowed_gids.contains(c.gid);
  }
};

enum class RejectReason {
  kNotAllowed,   // uid/gid not in the policy, or no credentials.
  kTotalCap,     // limits.max_connections reached.
  kPerUidCap,    // limits.max_connections_per_uid reached for this uid.
};
// "not_allowed", "max_connections", "max_connections_per_uid": metric labels.
const char* RejectReasonName(RejectReason r);

// All callbacks run on the listener thread, one at a time.
struct UdsListenerOptions {
  std::string path;
  mode_t mode = 0660;
  PeerPolicy policy;
  ConnectionLimits limits;
  // An accepted, allowed connection. Takes ownership of c.fd: the consumer
  // closes it when the connection ends.
  std::function<void(const Connection& c)> on_accept;
  // A connection given to on_accept whose fd has since been closed. Always
  // called before on_accept for a later connection with the same fd number.
  std::function<void(const Connection& c)> on_close;
  // Each refused peer (for logs and metrics); the fd is already closed.
  std::function<void(const PeerCreds& peer, RejectReason why)> on_reject;
  // accept() failed for lack of fds or memory (errno); the loop backs off.
  std::function<void(int error)> on_accept_error;
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

  // Connections handed out and not yet seen closed. Any thread.
  size_t num_connections() const { return num_connections_.load(); }
  // accept() back-offs for lack of fds or memory so far. Any thread.
  uint64_t num_accept_backoffs() const { return num_accept_backoffs_.load(); }

 private:
  UdsListener(UdsListenerOptions options, int fd, WakeFd wake);
  void Loop();
  void AcceptOne();
  void Admit(int fd);
  void SweepClosed();
  void Closed(const Connection& c);

  const UdsListenerOptions options_;
  const int listen_fd_;
  WakeFd stop_;  // Stop wakes the loop's poll
  std::thread thread_;
  ConnectionTable table_;  // Listener thread only.
  // Atomics: written by the listener thread, read by tests and metrics.
  std::atomic<size_t> num_connections_{0};
  std::atomic<uint64_t> num_accept_backoffs_{0};
};

// Binds a listening Unix socket at `path` with `mode`. Shared by UdsListener
// and the fd broker.
absl::StatusOr<int> BindUnixSocket(const std::string& path, mode_t mode);
// SO_PEERCRED of a connected Unix socket.
absl::StatusOr<PeerCreds> PeerCredsOf(int fd);

}  // namespace polykv::daemon
