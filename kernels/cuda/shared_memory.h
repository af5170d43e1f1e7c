// Device memory that other processes map: the pool's device arenas.
//
// Two ways to share, as kernels/device.h's SharedDeviceMemory offers them:
// - the CUDA VMM API: cuMemCreate with a POSIX file descriptor as its
//   shareable handle, which travels over a Unix socket like a memfd (the
//   default; VMM memory cannot be exported with legacy IPC handles);
// - legacy IPC: cudaMalloc + cudaIpcGetMemHandle, 64 opaque bytes (a
//   configured fallback for drivers without VMM fd export).
// Plain C++: no CUDA header. Every function returns 0 on success, else a
// CUresult from the driver (< kRuntimeBase), kRuntimeBase + a cudaError_t
// from the runtime, or kNoDriver; SharedErrorName names each.
#pragma once

#include <cstddef>
#include <cstdint>

namespace polykv::kernels::cuda {

inline constexpr int kRuntimeBase = 1 << 20;
inline constexpr int kNoDriver = 1 << 21;

// One VMM allocation mapped into this process.
struct SharedRegion {
  void* ptr = nullptr;        // device address of the mapping
  size_t size = 0;            // bytes; a multiple of SharedGranularity
  uint64_t handle = 0;        // CUmemGenericAllocationHandle
  int device = 0;
};

struct IpcHandleBytes {
  char bytes[64];  // a cudaIpcMemHandle_t
};

// The size every VMM allocation on `device` is a multiple of.
int SharedGranularity(int device, size_t* granularity);
// Allocates `bytes` (a multiple of the granularity) on `device`, maps it here
// and exports it: *fd is a new descriptor the caller owns and closes.
int SharedCreate(int device, size_t bytes, SharedRegion* out, int* fd);
// Maps the allocation another process exported as `fd` (not taken over: the
// caller closes it once this returns). `bytes` must be its whole size.
int SharedImport(int device, int fd, size_t bytes, SharedRegion* out);
// Unmaps and drops this process's reference (after the device's queued work).
int SharedRelease(const SharedRegion& region);

// Legacy IPC: allocate and export; open another process's; close either
// (owner: this process allocated it).
int IpcExport(int device, size_t bytes, void** ptr, IpcHandleBytes* handle);
int IpcOpen(int device, const IpcHandleBytes& handle, void** ptr);
int IpcClose(int device, void* ptr, bool owner);

// Writes `value` over memory of `device` and waits for it.
int Memset(int device, void* ptr, int value, size_t bytes);

const char* SharedErrorName(int error);
// What a caller can act on: no usable driver or device here, a full device,
// or anything else (a bug, a bad handle).
enum class SharedErrorKind { kNoDevice, kOutOfMemory, kOther };
SharedErrorKind ClassifySharedError(int error);

}  // namespace polykv::kernels::cuda
