// Arenas: the large allocations KV pages live in, and how workers map them.
//
// An arena handle exposes the whole arena, so the pool gives each tenant its
// own arenas (see pool/kv_pool.h); an arena is never shared across tenants.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace polykv::daemon {

enum class ArenaKind {
  kHostShm,  // memfd; its fd goes to workers over the fd socket
  kCudaVmm,  // CUDA VMM allocation; its POSIX fd goes over the fd socket too
  kCudaIpc,  // cudaMalloc + legacy IPC handle (a configured fallback)
};

inline bool OnDevice(ArenaKind kind) { return kind != ArenaKind::kHostShm; }
// For messages: "host memory (memfd)", "CUDA device memory (VMM fd)", ...
absl::string_view ArenaKindName(ArenaKind kind);

// Everything a worker needs to map an arena (besides, for host arenas, the
// file descriptor it fetches over the fd socket).
struct ArenaExport {
  uint32_t arena_id = 0;
  ArenaKind kind = ArenaKind::kHostShm;
  uint64_t size_bytes = 0;
  std::string cuda_ipc_handle;  // kCudaIpc: raw cudaIpcMemHandle_t bytes.
  int cuda_device = -1;         // device arenas: the GPU's ordinal
};

// Thread-safety: the accessors are immutable after creation and safe from any
// thread; Zero and Discard write the memory, so the owner serializes them with
// every other use of the bytes they cover.
class Arena {
 public:
  virtual ~Arena() = default;
  virtual uint32_t id() const = 0;
  virtual ArenaKind kind() const = 0;
  virtual uint64_t size_bytes() const = 0;
  // Host-addressable base (host arenas); nullptr for device arenas.
  virtual void* host_base() const = 0;
  // Device address of the arena in this process (device arenas); nullptr for
  // host arenas.
  virtual void* device_base() const { return nullptr; }
  // The GPU a device arena is on; -1 for host arenas.
  virtual int device() const { return -1; }
  // File descriptor to hand to workers (host and VMM arenas), or -1. Owned
  // by the arena.
  virtual int fd() const = 0;
  virtual ArenaExport Export() const = 0;
  // Writes zeros over [offset, offset + len): a page changes owner only
  // scrubbed (issue 14, finding 6). INVALID_ARGUMENT outside the arena.
  virtual absl::Status Zero(uint64_t offset, uint64_t len) = 0;
  // Gives the whole arena's memory back to the system (it then reads as
  // zeros), even while workers still map it: an arena the pool retires must
  // stop costing memory whatever its old mappers keep (finding 10). Device
  // arenas cannot do this while imported; they are zeroed instead.
  virtual absl::Status Discard() = 0;
  // Memory the arena holds now: a host arena's resident pages (a discarded
  // arena grows again only if a mapper writes to it); a device arena's size.
  virtual uint64_t ResidentBytes() const = 0;
};

struct ArenaOptions {
  uint32_t id = 0;
  uint64_t size_bytes = 0;  // > 0; rounded up to the system page size.
  int cuda_device = 0;      // device arenas only
};

// memfd-backed host shared memory, mode 0600, no name in any namespace.
absl::StatusOr<std::unique_ptr<Arena>> CreateHostShmArena(const ArenaOptions& options);

// Device memory on options.cuda_device, zeroed, shared as `kind` says
// (kCudaVmm or kCudaIpc). UNIMPLEMENTED in builds without CUDA,
// FAILED_PRECONDITION when no GPU or driver is present.
absl::StatusOr<std::unique_ptr<Arena>> CreateCudaArena(ArenaKind kind,
                                                        const ArenaOptions& options);

// True when this build has the CUDA backend compiled in.
bool CudaArenaCompiledIn();

}  // namespace polykv::daemon
