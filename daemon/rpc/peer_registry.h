// PeerRegistry: credentials of each accepted connection, looked up per RPC.
//
// polykvd accepts Unix-socket connections itself (rpc/uds_listener.h), reads
// SO_PEERCRED, and hands the fd to gRPC, whose peer string for such a
// connection is "fd:<n>". The listener adds an entry when it hands fd n to
// gRPC and removes it when it sees gRPC has closed n (finding 11 of issue 14:
// entries used to stay forever).
//
// Why a handler never sees another connection's credentials, although fd
// numbers are reused:
//  - gRPC keeps fd n open until the connection's transport is destroyed, and
//    every call (stream) on it holds a reference to the transport (chttp2's
//    ~grpc_chttp2_transport destroys the endpoint, and asserts no streams
//    are left). A handler runs inside a call, so while it runs, n is open and
//    names its own connection; the kernel cannot give n to another accept().
//  - Only the listener thread writes here: it Add()s n when accept() returns
//    n (so after the previous holder of n was closed), always after it has
//    Remove()d the previous connection with that number, and Remove() takes
//    the connection id, so a late removal can never erase a newer entry.
//
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "daemon/pool/types.h"

namespace polykv::daemon {

class PeerRegistry {
 public:
  // Records the connection `connection_id` on fd number `fd`, replacing an
  // entry for that number.
  void Add(int fd, uint64_t connection_id, const PeerCreds& creds) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes fd's entry if it is still the one of `connection_id`.
  void Remove(int fd, uint64_t connection_id) ABSL_LOCKS_EXCLUDED(mu_);
  // nullopt for a peer string that names no accepted connection.
  std::optional<PeerCreds> Lookup(absl::string_view grpc_peer) const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    uint64_t connection_id = 0;
    PeerCreds creds;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Entry> by_fd_ ABSL_GUARDED_BY(mu_);
};

}  // namespace polykv::daemon
