// ConnectionTable: the gRPC connections the listener has accepted and not yet
// seen closed, counted per uid, so that one uid cannot take every connection
// (finding 4 of issue 14) and so that each connection's peer-registry entry
// goes when the connection goes (finding 11).
//
// gRPC owns an accepted fd and closes it when the connection ends; it does not
// tell us. A connection is recorded with the identity of its socket (st_dev,
// st_ino); it has ended once its fd number no longer names that socket
// (closed: EBADF; or closed and the number reused: another inode). No second
// fd is kept (a dup would double the fds each connection costs, and hold the
// socket open if gRPC ever closed without shutdown()).
//
// Thread-safety: thread-compatible; the listener thread is its only user.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "daemon/pool/types.h"

namespace polykv::daemon {

struct ConnectionLimits {
  uint32_t max_connections = 1024;       // All uids together; 0 = no cap.
  uint32_t max_connections_per_uid = 64; // 0 = no cap.
};

enum class ConnectionRefusal { kNone, kTotal, kPerUid };

// One accepted connection. `id` is unique for the life of the table, unlike
// fd numbers, which the kernel reuses.
struct Connection {
  int fd = -1;
  uint64_t id = 0;
  PeerCreds peer;
  dev_t dev = 0;
  ino_t ino = 0;
};

class ConnectionTable {
 public:
  explicit ConnectionTable(ConnectionLimits limits) : limits_(limits) {}
  ConnectionTable(const ConnectionTable&) = delete;
  ConnectionTable& operator=(const ConnectionTable&) = delete;

  // Whether one more connection of `uid` is within the limits.
  ConnectionRefusal Admits(uid_t uid) const;
  // Records the accepted, open fd. REQUIRES: fd is not in the table (the
  // listener Remove()s a number accept() hands out again first).
  absl::StatusOr<Connection> Add(int fd, const PeerCreds& peer);
  // The entry for fd number `fd`, removed; nullopt when there is none.
  std::optional<Connection> Remove(int fd);
  // Every connection whose fd no longer names its socket, removed.
  std::vector<Connection> RemoveClosed();

  size_t size() const { return by_fd_.size(); }
  uint32_t CountOf(uid_t uid) const;

 private:
  const ConnectionLimits limits_;
  uint64_t next_id_ = 1;
  absl::flat_hash_map<int, Connection> by_fd_;
  absl::flat_hash_map<uid_t, uint32_t> per_uid_;  // No zero entries.
};

}  // namespace polykv::daemon
