// An arena with no memory, like a device arena seen from the host: no base,
// no fd. Cheap, so the pool's unit tests can make many.
#pragma once

#include "daemon/memory/arena.h"

namespace polykv::daemon {

class NoMemoryArena : public Arena {
 public:
  explicit NoMemoryArena(const ArenaOptions& o) : id_(o.id), size_(o.size_bytes) {}
  uint32_t id() const override { return id_; }
  ArenaKind kind() const override { return ArenaKind::kCudaIpc; }
  uint64_t size_bytes() const override { return size_; }
  void* host_base() const override { return nullptr; }
  int fd() const override { return -1; }
  ArenaExport Export() const override { return {id_, ArenaKind::kCudaIpc, size_, "", 0}; }
  absl::Status Zero(uint64_t, uint64_t) override { return absl::OkStatus(); }
  absl::Status Discard() override { return absl::OkStatus(); }
  uint64_t ResidentBytes() const override { return size_; }

 private:
  uint32_t id_;
  uint64_t size_;
};

}  // namespace polykv::daemon
