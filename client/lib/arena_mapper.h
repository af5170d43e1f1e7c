// ArenaMapper: maps the daemon's arenas into this process, once each.
//
// Host arenas arrive as memfds over the fd socket (proto/polykv/v1/fd_socket.h)
// and CUDA VMM arenas as POSIX fds the same way (imported and mapped on their
// device); legacy CUDA IPC arenas as handles in the announcement. A mapping
// lives until the mapper is destroyed (RAII), so page addresses handed out
// stay valid for the session's lifetime.
//
// Thread-safety: not thread-safe; owned by one Session.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "polykv/client.h"
#include "polykv/v1/common.pb.h"
#include "proto/polykv/v1/fd_socket.h"

namespace polykv::internal {

// Receives one FdReply on a connected fd socket and the descriptor attached
// to it (*fd = -1 when none is), reading on through signals. Returns
// sizeof(*reply) for a whole reply, fewer bytes when the daemon closed the
// connection first (0: nothing came), -1 with errno set on an error
// (EAGAIN: the socket's SO_RCVTIMEO ran out). Shared by FetchArenaFd and the
// fd broker's fuzz target (tests/fuzz/).
ssize_t RecvFdReply(int sock, v1::FdReply* reply, int* fd);

class ArenaMapper {
 public:
  ArenaMapper(std::string fd_socket_path, SessionRef ref)
      : fd_socket_path_(std::move(fd_socket_path)), ref_(std::move(ref)) {}
  ~ArenaMapper();
  ArenaMapper(const ArenaMapper&) = delete;
  ArenaMapper& operator=(const ArenaMapper&) = delete;

  // Maps the arena if not yet mapped. FAILED_PRECONDITION for a device arena
  // in a process without CUDA or a device.
  absl::Status Add(const v1::ArenaHandle& handle);
  // Address of `offset` in arena `arena_id` (a device address for device
  // arenas). INVALID_ARGUMENT when the range is outside the mapping.
  absl::StatusOr<void*> Address(uint32_t arena_id, uint64_t offset, uint64_t size) const;

 private:
  struct Mapping {
    void* base = nullptr;
    uint64_t size = 0;
    // Device arenas: the import, which unmaps itself; host arenas: null (base
    // is an mmap).
    std::unique_ptr<kernels::SharedDeviceMemory> device_memory;
  };
  const std::string fd_socket_path_;
  const SessionRef ref_;
  std::map<uint32_t, Mapping> mappings_;
};

}  // namespace polykv::internal
