// Device arenas: the pool's pages in GPU memory, shared with workers through
// kernels::SharedDeviceMemory (a CUDA VMM allocation exported as a POSIX fd,
// or, as a configured fallback, a legacy CUDA IPC handle).
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/memory/arena.h"
#include "kernels/device.h"

namespace polykv::daemon {
namespace {

class CudaArena final : public Arena {
 public:
  CudaArena(uint32_t id, ArenaKind kind, std::unique_ptr<kernels::SharedDeviceMemory> memory)
      : id_(id), kind_(kind), memory_(std::move(memory)) {}

  uint32_t id() const override { return id_; }
  ArenaKind kind() const override { return kind_; }
  uint64_t size_bytes() const override { return memory_->size(); }
  void* host_base() const override { return nullptr; }
  void* device_base() const override { return memory_->ptr(); }
  int device() const override { return memory_->device(); }
  // The fd socket hands out dups of this one after the same token, uid and
  // tenant checks as a memfd's (kCudaVmm); -1 for IPC arenas.
  int fd() const override { return memory_->fd(); }
  ArenaExport Export() const override {
    ArenaExport e;
    e.arena_id = id_;
    e.kind = kind_;
    e.size_bytes = memory_->size();
    e.cuda_ipc_handle = memory_->ipc_handle();
    e.cuda_device = memory_->device();
    return e;
  }
  absl::Status Zero(uint64_t offset, uint64_t len) override {
    if (offset > size_bytes() || len > size_bytes() - offset) {
      return absl::InvalidArgumentError(absl::StrCat("range ", offset, "+", len,
                                                     " outside arena ", id_));
    }
    return memory_->Zero(offset, len);
  }
  // Device memory a worker has imported stays allocated until every importer
  // lets go: it cannot be handed back while mapped, only cleared.
  // ResidentBytes says so.
  absl::Status Discard() override { return Zero(0, size_bytes()); }
  uint64_t ResidentBytes() const override { return size_bytes(); }

 private:
  const uint32_t id_;
  const ArenaKind kind_;
  const std::unique_ptr<kernels::SharedDeviceMemory> memory_;
};

}  // namespace

bool CudaArenaCompiledIn() { return kernels::CudaBuilt(); }

absl::StatusOr<std::unique_ptr<Arena>> CreateCudaArena(ArenaKind kind,
                                                        const ArenaOptions& options) {
  if (kind != ArenaKind::kCudaVmm && kind != ArenaKind::kCudaIpc) {
    return absl::InvalidArgumentError("CreateCudaArena makes device arenas only");
  }
  if (options.size_bytes == 0) return absl::InvalidArgumentError("arena size must be > 0");
  if (!kernels::CudaBuilt()) {
    return absl::UnimplementedError(
        "this polykvd was built without CUDA (POLYKV_CUDA=OFF or no nvcc); use --tier host");
  }
  const int count = kernels::CudaDeviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError(
        "tier 'cuda' needs a GPU, and none is visible; use --tier host");
  }
  if (options.cuda_device < 0 || options.cuda_device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_device ", options.cuda_device, " out of range (", count, " GPUs)"));
  }
  auto memory = kernels::SharedDeviceMemory::Create(
      kind == ArenaKind::kCudaVmm ? kernels::DeviceShare::kPosixFd : kernels::DeviceShare::kIpc,
      options.cuda_device, options.size_bytes);
  if (!memory.ok()) return memory.status();
  // The pool counts the size it asked for: a larger allocation would hold
  // device memory no budget sees.
  if ((*memory)->size() != options.size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an arena of ", options.size_bytes, " bytes is ", (*memory)->size(),
        " on this GPU (its allocation granularity): make superblock_bytes and arena_bytes "
        "multiples of it"));
  }
  // A page changes owner only scrubbed, and a new arena's pages are new owners.
  if (auto st = (*memory)->Zero(0, (*memory)->size()); !st.ok()) return st;
  return std::unique_ptr<Arena>(new CudaArena(options.id, kind, *std::move(memory)));
}

}  // namespace polykv::daemon
