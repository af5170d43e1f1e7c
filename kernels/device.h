// Minimal device-memory helpers so that callers of Backend::kCuda (tests,
// benchmarks, the worker) need no CUDA headers. Without a CUDA build they
// report zero devices and FAILED_PRECONDITION.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace polykv::kernels {

// Whether this library was compiled with the CUDA kernels.
bool CudaBuilt();
// Number of usable CUDA devices; 0 without a CUDA build, driver or device.
int CudaDeviceCount();

absl::StatusOr<void*> DeviceAlloc(size_t bytes);
absl::Status DeviceFree(void* ptr);
absl::Status CopyToDevice(void* dst, const void* src, size_t bytes);
absl::Status CopyToHost(void* dst, const void* src, size_t bytes);
absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes);
// Waits for all enqueued device work; reports asynchronous kernel errors.
absl::Status DeviceSynchronize();
// Makes `device` this thread's current device: the copies and kernels this
// thread enqueues next run there (the CUDA runtime's device is per thread).
absl::Status SetDevice(int device);

// Device memory with one owner (RAII): freed when the buffer goes.
// Thread-safety: as a unique_ptr.
class DeviceBuffer {
 public:
  // FAILED_PRECONDITION without a CUDA build or device.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  // A device copy of [host, host + bytes).
  static absl::StatusOr<DeviceBuffer> CopyOf(const void* host, size_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return size_; }

 private:
  DeviceBuffer(void* ptr, size_t size) : ptr_(ptr), size_(size) {}
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// How device memory is shared with other processes.
enum class DeviceShare {
  // CUDA VMM (cuMemCreate) exported as a POSIX file descriptor, passed over a
  // Unix socket like a memfd. The default.
  kPosixFd,
  // Legacy cudaIpcGetMemHandle bytes: a fallback for drivers that cannot
  // export VMM memory as fds.
  kIpc,
};

// Device memory mapped into this process, shared with others: allocated and
// exported here (Create), or mapped from another process's export (Import).
// RAII: destruction unmaps (after the device's queued work) and drops this
// process's reference; the memory is freed when the last process lets go.
// Thread-safety: immutable after creation.
class SharedDeviceMemory {
 public:
  // Allocates at least `bytes` on `device` (rounded up to the VMM
  // granularity for kPosixFd). FAILED_PRECONDITION without a CUDA build,
  // driver or device; RESOURCE_EXHAUSTED when the device is full.
  static absl::StatusOr<std::unique_ptr<SharedDeviceMemory>> Create(DeviceShare share,
                                                                     int device, size_t bytes);
  // Maps another process's kPosixFd export: `fd` is read, not kept (close it
  // after). `bytes` must be the allocation's size.
  static absl::StatusOr<std::unique_ptr<SharedDeviceMemory>> ImportFd(int device, int fd,
                                                                       size_t bytes);
  // Maps another process's kIpc export (`handle`: its 64 bytes).
  static absl::StatusOr<std::unique_ptr<SharedDeviceMemory>> ImportIpc(int device,
                                                                        const std::string& handle,
                                                                        size_t bytes);
  ~SharedDeviceMemory();
  SharedDeviceMemory(const SharedDeviceMemory&) = delete;
  SharedDeviceMemory& operator=(const SharedDeviceMemory&) = delete;

  DeviceShare share() const { return share_; }
  void* ptr() const { return ptr_; }  // device address
  size_t size() const { return size_; }
  int device() const { return device_; }
  // kPosixFd, created here: the exported descriptor (owned; dup it to hand
  // it out); else -1.
  int fd() const { return fd_; }
  // kIpc: the handle's bytes; else empty.
  const std::string& ipc_handle() const { return ipc_handle_; }
  // Writes zeros over [offset, offset + bytes) and waits for it.
  // REQUIRES: the range lies inside.
  absl::Status Zero(size_t offset, size_t bytes) const;

 private:
  SharedDeviceMemory(DeviceShare share, void* ptr, size_t size, int device, bool owner)
      : share_(share), ptr_(ptr), size_(size), device_(device), owner_(owner) {}

  const DeviceShare share_;
  void* const ptr_;
  const size_t size_;
  const int device_;
  const bool owner_;      // allocated by this process
  uint64_t vmm_handle_ = 0;  // kPosixFd: CUmemGenericAllocationHandle
  int fd_ = -1;
  std::string ipc_handle_;
};

}  // namespace polykv::kernels
