// CUDA IPC arena. Compiled with the CUDA runtime when the build has CUDA
// (POLYKV_HAVE_CUDA); otherwise the factory says so.
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/memory/arena.h"

#if POLYKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace polykv::daemon {

#if POLYKV_HAVE_CUDA
namespace {

absl::Status CudaError(absl::string_view what, cudaError_t err) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

class CudaIpcArena final : public Arena {
 public:
  CudaIpcArena(uint32_t id, uint64_t size, int device, void* ptr, cudaIpcMemHandle_t handle)
      : id_(id), size_(size), device_(device), ptr_(ptr), handle_(handle) {}
  ~CudaIpcArena() override {
    cudaSetDevice(device_);
    cudaFree(ptr_);
  }
  CudaIpcArena(const CudaIpcArena&) = delete;
  CudaIpcArena& operator=(const CudaIpcArena&) = delete;

  uint32_t id() const override { return id_; }
  ArenaKind kind() const override { return ArenaKind::kCudaIpc; }
  uint64_t size_bytes() const override { return size_; }
  void* host_base() const override { return nullptr; }
  int fd() const override { return -1; }
  ArenaExport Export() const override {
    ArenaExport e;
    e.arena_id = id_;
    e.kind = ArenaKind::kCudaIpc;
    e.size_bytes = size_;
    e.cuda_ipc_handle.assign(reinterpret_cast<const char*>(&handle_), sizeof(handle_));
    e.cuda_device = device_;
    return e;
  }
  absl::Status Zero(uint64_t offset, uint64_t len) override {
    if (offset > size_ || len > size_ - offset) {
      return absl::InvalidArgumentError(absl::StrCat("range ", offset, "+", len,
                                                     " outside arena ", id_));
    }
    cudaSetDevice(device_);
    if (cudaError_t err = cudaMemset(static_cast<char*>(ptr_) + offset, 0, len);
        err != cudaSuccess) {
      return CudaError("cudaMemset", err);
    }
    return absl::OkStatus();
  }
  // Imported IPC memory stays the exporter's allocation: it cannot be handed
  // back while a worker has it open, only cleared. ResidentBytes says so.
  absl::Status Discard() override { return Zero(0, size_); }
  uint64_t ResidentBytes() const override { return size_; }

 private:
  const uint32_t id_;
  const uint64_t size_;
  const int device_;
  void* const ptr_;
  const cudaIpcMemHandle_t handle_;
};

}  // namespace

bool CudaArenaCompiledIn() { return true; }

absl::StatusOr<std::unique_ptr<Arena>> CreateCudaIpcArena(const ArenaOptions& options) {
  if (options.size_bytes == 0) return absl::InvalidArgumentError("arena size must be > 0");
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        "tier 'cuda' needs a GPU, and none is visible; use --tier host");
  }
  if (options.cuda_device < 0 || options.cuda_device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_device ", options.cuda_device, " out of range (", count, " GPUs)"));
  }
  if (cudaError_t err = cudaSetDevice(options.cuda_device); err != cudaSuccess) {
    return CudaError("cudaSetDevice", err);
  }
  void* ptr = nullptr;
  if (cudaError_t err = cudaMalloc(&ptr, options.size_bytes); err != cudaSuccess) {
    return CudaError("cudaMalloc", err);
  }
  cudaIpcMemHandle_t handle;
  if (cudaError_t err = cudaIpcGetMemHandle(&handle, ptr); err != cudaSuccess) {
    cudaFree(ptr);
    return CudaError("cudaIpcGetMemHandle", err);
  }
  return std::unique_ptr<Arena>(
      new CudaIpcArena(options.id, options.size_bytes, options.cuda_device, ptr, handle));
}

#else

bool CudaArenaCompiledIn() { return false; }

absl::StatusOr<std::unique_ptr<Arena>> CreateCudaIpcArena(const ArenaOptions&) {
  return absl::UnimplementedError(
      "this polykvd was built without CUDA (POLYKV_CUDA=OFF or no nvcc); use --tier host");
}

#endif

}  // namespace polykv::daemon
