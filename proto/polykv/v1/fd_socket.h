// Wire format of the fd socket (OpenSessionResponse.fd_socket_path).
//
// gRPC cannot carry file descriptors, so host-memory arenas (memfds, which
// have no name to open) are handed to workers over this small Unix socket
// with SCM_RIGHTS. One request per connection:
//   worker -> daemon: FdRequest
//   daemon -> worker: FdReply, with the arena fd attached when status == 0.
// The daemon checks the peer's SO_PEERCRED and the session token exactly as
// for gRPC calls; the arena must belong to the session's tenant.
#pragma once

#include <cstdint>

namespace polykv::v1 {

inline constexpr uint32_t kFdMagic = 0x504b5646;  // "PKVF"
inline constexpr uint32_t kFdVersion = 1;

struct FdRequest {
  uint32_t magic = kFdMagic;
  uint32_t version = kFdVersion;
  uint64_t session_id = 0;
  uint8_t token[32] = {};
  uint32_t arena_id = 0;
  uint32_t reserved = 0;
};

struct FdReply {
  int32_t status = 0;      // A gRPC status code; 0 = OK and an fd is attached.
  uint32_t reserved = 0;
  uint64_t size_bytes = 0; // Arena size, to map.
  char message[240] = {};  // NUL-terminated error text.
};

static_assert(sizeof(FdRequest) == 56);
static_assert(sizeof(FdReply) == 256);

}  // namespace polykv::v1
