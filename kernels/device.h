// Minimal device-memory helpers so that callers of Backend::kCuda (tests,
// benchmarks, the worker) need no CUDA headers. Without a CUDA build they
// report zero devices and FAILED_PRECONDITION.
#pragma once

#include <cstddef>

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
// Waits for all enqueued device work; reports asynchronous kernel errors.
absl::Status DeviceSynchronize();

}  // namespace polykv::kernels
