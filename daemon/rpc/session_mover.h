// The source side of moving a session to another polykvd
// (Admin.MoveSession): park the worker, stream the session to the target's
// Peer service over mutual TLS, then either end the session here with a
// forward for its worker or, on any failure, let it go on here untouched.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/rpc/peer_tls.h"

namespace polykv::daemon {

struct MoveStats {
  uint64_t target_session_id = 0;
  uint64_t bytes = 0;   // page bytes streamed
  uint64_t tokens = 0;  // committed tokens moved
  double park_seconds = 0;
  double copy_seconds = 0;
  double pause_seconds = 0;  // parked until the forward was published
};

class SessionMover {
 public:
  SessionMover(KvPool* pool, PeerTls tls) : pool_(pool), tls_(std::move(tls)) {}
  // `target`: host:port of the target's peer listener; its certificate must
  // name that host. `wait`: how long the worker may take to park.
  absl::StatusOr<MoveStats> Move(uint64_t session_id, const std::string& target,
                                 absl::Duration wait);

 private:
  KvPool* const pool_;
  const PeerTls tls_;
};

}  // namespace polykv::daemon
