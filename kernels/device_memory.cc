// DeviceBuffer and SharedDeviceMemory (kernels/device.h); the latter over the
// plain-C++ CUDA wrappers of kernels/cuda/shared_memory.h.
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/device.h"

#if POLYKV_KERNELS_WITH_CUDA
#include "kernels/cuda/shared_memory.h"
#endif

namespace polykv::kernels {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  auto p = DeviceAlloc(bytes == 0 ? 1 : bytes);
  if (!p.ok()) return p.status();
  return DeviceBuffer(*p, bytes);
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::CopyOf(const void* host, size_t bytes) {
  auto b = Allocate(bytes);
  if (!b.ok()) return b.status();
  if (bytes > 0) {
    if (auto st = CopyToDevice(b->get(), host, bytes); !st.ok()) return st;
  }
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) (void)DeviceFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) (void)DeviceFree(ptr_);
}

#if POLYKV_KERNELS_WITH_CUDA
namespace {

absl::Status FromShared(int err, const char* what) {
  if (err == 0) return absl::OkStatus();
  const std::string text = absl::StrCat(what, ": ", cuda::SharedErrorName(err));
  switch (cuda::ClassifySharedError(err)) {
    case cuda::SharedErrorKind::kNoDevice:
      return absl::FailedPreconditionError(text);
    case cuda::SharedErrorKind::kOutOfMemory:
      return absl::ResourceExhaustedError(text);
    default:
      break;
  }
  return absl::InternalError(text);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedDeviceMemory>> SharedDeviceMemory::Create(DeviceShare share,
                                                                               int device,
                                                                               size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("shared device memory of 0 bytes");
  if (share == DeviceShare::kIpc) {
    void* ptr = nullptr;
    cuda::IpcHandleBytes h{};
    if (auto st = FromShared(cuda::IpcExport(device, bytes, &ptr, &h), "cudaMalloc + IPC export");
        !st.ok()) {
      return st;
    }
    std::unique_ptr<SharedDeviceMemory> m(new SharedDeviceMemory(share, ptr, bytes, device, true));
    m->ipc_handle_.assign(h.bytes, sizeof(h.bytes));
    return m;
  }
  size_t granularity = 0;
  if (auto st = FromShared(cuda::SharedGranularity(device, &granularity),
                           "cuMemGetAllocationGranularity");
      !st.ok()) {
    return st;
  }
  const size_t rounded = (bytes + granularity - 1) / granularity * granularity;
  cuda::SharedRegion region;
  int fd = -1;
  if (auto st = FromShared(cuda::SharedCreate(device, rounded, &region, &fd),
                           "cuMemCreate + export as a POSIX fd");
      !st.ok()) {
    return st;
  }
  std::unique_ptr<SharedDeviceMemory> m(
      new SharedDeviceMemory(share, region.ptr, region.size, device, true));
  m->vmm_handle_ = region.handle;
  m->fd_ = fd;
  return m;
}

absl::StatusOr<std::unique_ptr<SharedDeviceMemory>> SharedDeviceMemory::ImportFd(int device, int fd,
                                                                                 size_t bytes) {
  if (fd < 0 || bytes == 0) return absl::InvalidArgumentError("no descriptor or no size to map");
  cuda::SharedRegion region;
  if (auto st = FromShared(cuda::SharedImport(device, fd, bytes, &region),
                           "cuMemImportFromShareableHandle + map");
      !st.ok()) {
    return st;
  }
  std::unique_ptr<SharedDeviceMemory> m(
      new SharedDeviceMemory(DeviceShare::kPosixFd, region.ptr, region.size, device, false));
  m->vmm_handle_ = region.handle;
  return m;
}

absl::StatusOr<std::unique_ptr<SharedDeviceMemory>> SharedDeviceMemory::ImportIpc(
    int device, const std::string& handle, size_t bytes) {
  cuda::IpcHandleBytes h{};
  if (handle.size() != sizeof(h.bytes) || bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("a CUDA IPC handle is ", sizeof(h.bytes),
                                                   " bytes (got ", handle.size(), ")"));
  }
  std::memcpy(h.bytes, handle.data(), sizeof(h.bytes));
  void* ptr = nullptr;
  if (auto st = FromShared(cuda::IpcOpen(device, h, &ptr), "cudaIpcOpenMemHandle"); !st.ok()) {
    return st;
  }
  return std::unique_ptr<SharedDeviceMemory>(
      new SharedDeviceMemory(DeviceShare::kIpc, ptr, bytes, device, false));
}

SharedDeviceMemory::~SharedDeviceMemory() {
  if (share_ == DeviceShare::kIpc) {
    cuda::IpcClose(device_, ptr_, owner_);
  } else {
    cuda::SharedRelease(cuda::SharedRegion{ptr_, size_, vmm_handle_, device_});
  }
  if (fd_ >= 0) close(fd_);
}

absl::Status SharedDeviceMemory::Zero(size_t offset, size_t bytes) const {
  return FromShared(cuda::Memset(device_, static_cast<char*>(ptr_) + offset, 0, bytes),
                    "cudaMemset");
}

#else  // !POLYKV_KERNELS_WITH_CUDA

namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "polykv_kernels built without CUDA: no device memory to share");
}
}  // namespace

absl::StatusOr<std::unique_ptr<SharedDeviceMemory>> SharedDeviceMemory::Create(DeviceShare, int,
                                                                               size_t) {
  return NoCuda();
}
absl::StatusOr<std::unique_ptr<SharedDeviceMemory>> SharedDeviceMemory::ImportFd(int, int,
                                                                                 size_t) {
  return NoCuda();
}
absl::StatusOr<std::unique_ptr<SharedDeviceMemory>> SharedDeviceMemory::ImportIpc(
    int, const std::string&, size_t) {
  return NoCuda();
}
SharedDeviceMemory::~SharedDeviceMemory() = default;
absl::Status SharedDeviceMemory::Zero(size_t, size_t) const { return NoCuda(); }

#endif

}  // namespace polykv::kernels
