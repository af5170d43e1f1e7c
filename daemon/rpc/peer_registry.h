// PeerRegistry: credentials of each accepted connection, looked up per RPC.
//
// polykvd accepts Unix-socket connections itself (rpc/uds_listener.h), reads
// SO_PEERCRED, and hands the fd to gRPC, whose peer string for such a
// connection is "fd:<n>". An entry is overwritten when the fd number is
// reused by a later accept, so a live connection always maps to its own peer.
//
// Thread-safety: thread-safe.
#pragma once

#include <optional>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "daemon/pool/types.h"

namespace polykv::daemon {

class PeerRegistry {
 public:
  void Set(int fd, const PeerCreds& creds) ABSL_LOCKS_EXCLUDED(mu_);
  // nullopt for a peer string that names no accepted connection.
  std::optional<PeerCreds> Lookup(absl::string_view grpc_peer) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, PeerCreds> by_fd_ ABSL_GUARDED_BY(mu_);
};

}  // namespace polykv::daemon
