// Device memory shared between processes (kernels/cuda/shared_memory.h).
//
// The driver's VMM entry points are looked up through the runtime
// (cudaGetDriverEntryPointByVersion) rather than linked: binaries then need
// no libcuda.so at link or load time and still start on CPU-only hosts, where
// the lookup fails and the caller is told there is no device.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <unistd.h>

#include <cstdint>

#include "kernels/cuda/shared_memory.h"

namespace polykv::kernels::cuda {
namespace {

struct Driver {
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuGetErrorName_v6000 error_name = nullptr;
  bool ok = false;
};

template <typename Fn>
bool Lookup(const char* symbol, unsigned version, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();  // a missing driver leaves a sticky runtime error
    return false;
  }
  *fn = reinterpret_cast<Fn>(p);
  return true;
}

// Looked up once; the table is immutable afterwards (C++ static init is
// thread-safe).
const Driver& GetDriver() {
  static const Driver driver = [] {
    Driver d;
    d.ok = Lookup("cuMemCreate", 10020, &d.create) && Lookup("cuMemRelease", 10020, &d.release) &&
           Lookup("cuMemExportToShareableHandle", 10020, &d.export_handle) &&
           Lookup("cuMemImportFromShareableHandle", 10020, &d.import_handle) &&
           Lookup("cuMemGetAllocationGranularity", 10020, &d.granularity) &&
           Lookup("cuMemAddressReserve", 10020, &d.reserve) &&
           Lookup("cuMemAddressFree", 10020, &d.address_free) &&
           Lookup("cuMemMap", 10020, &d.map) && Lookup("cuMemUnmap", 10020, &d.unmap) &&
           Lookup("cuMemSetAccess", 10020, &d.set_access) &&
           Lookup("cuGetErrorName", 6000, &d.error_name);
    return d;
  }();
  return driver;
}

// Makes `device` current and its primary context live: the VMM calls act on
// the current context and need the driver initialized.
int UseDevice(int device) {
  if (!GetDriver().ok) return kNoDriver;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    cudaGetLastError();
    return e == cudaErrorInvalidDevice ? int(CUDA_ERROR_INVALID_DEVICE)
                                       : int(CUDA_ERROR_NOT_INITIALIZED);
  }
  if (cudaFree(nullptr) != cudaSuccess) {
    cudaGetLastError();
    return int(CUDA_ERROR_NOT_INITIALIZED);
  }
  return 0;
}

CUmemAllocationProp Prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Reserves an address range for `handle`, maps it and lets `device` read and
// write it. On failure nothing stays reserved or mapped (the handle is the
// caller's).
int MapHandle(int device, CUmemGenericAllocationHandle handle, size_t bytes, void** ptr) {
  const Driver& d = GetDriver();
  CUdeviceptr va = 0;
  if (CUresult r = d.reserve(&va, bytes, 0, 0, 0); r != CUDA_SUCCESS) return int(r);
  if (CUresult r = d.map(va, bytes, 0, handle, 0); r != CUDA_SUCCESS) {
    d.address_free(va, bytes);
    return int(r);
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = d.set_access(va, bytes, &access, 1); r != CUDA_SUCCESS) {
    d.unmap(va, bytes);
    d.address_free(va, bytes);
    return int(r);
  }
  *ptr = reinterpret_cast<void*>(va);
  return 0;
}

}  // namespace

int SharedGranularity(int device, size_t* granularity) {
  if (int e = UseDevice(device); e != 0) return e;
  const CUmemAllocationProp prop = Prop(device);
  return int(GetDriver().granularity(granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
}

int SharedCreate(int device, size_t bytes, SharedRegion* out, int* fd) {
  *out = SharedRegion{};
  *fd = -1;
  if (int e = UseDevice(device); e != 0) return e;
  const Driver& d = GetDriver();
  const CUmemAllocationProp prop = Prop(device);
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult r = d.create(&handle, bytes, &prop, 0); r != CUDA_SUCCESS) return int(r);
  int exported = -1;
  if (CUresult r = d.export_handle(&exported, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r != CUDA_SUCCESS) {
    d.release(handle);
    return int(r);
  }
  void* ptr = nullptr;
  if (int e = MapHandle(device, handle, bytes, &ptr); e != 0) {
    close(exported);
    d.release(handle);
    return e;
  }
  *out = SharedRegion{ptr, bytes, handle, device};
  *fd = exported;
  return 0;
}

int SharedImport(int device, int fd, size_t bytes, SharedRegion* out) {
  *out = SharedRegion{};
  if (int e = UseDevice(device); e != 0) return e;
  const Driver& d = GetDriver();
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult r = d.import_handle(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != CUDA_SUCCESS) {
    return int(r);
  }
  void* ptr = nullptr;
  if (int e = MapHandle(device, handle, bytes, &ptr); e != 0) {
    d.release(handle);
    return e;
  }
  *out = SharedRegion{ptr, bytes, handle, device};
  return 0;
}

int SharedRelease(const SharedRegion& region) {
  if (region.ptr == nullptr) return 0;
  const Driver& d = GetDriver();
  if (!d.ok) return kNoDriver;
  const auto va = reinterpret_cast<CUdeviceptr>(region.ptr);
  // Work still queued on this memory must finish before its mapping goes.
  cudaSetDevice(region.device);
  cudaDeviceSynchronize();
  CUresult first = d.unmap(va, region.size);
  if (CUresult r = d.address_free(va, region.size); first == CUDA_SUCCESS) first = r;
  if (CUresult r = d.release(region.handle); first == CUDA_SUCCESS) first = r;
  return int(first);
}

int IpcExport(int device, size_t bytes, void** ptr, IpcHandleBytes* handle) {
  *ptr = nullptr;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return int(e) + kRuntimeBase;
  if (cudaError_t e = cudaMalloc(ptr, bytes); e != cudaSuccess) return int(e) + kRuntimeBase;
  cudaIpcMemHandle_t h;
  if (cudaError_t e = cudaIpcGetMemHandle(&h, *ptr); e != cudaSuccess) {
    cudaFree(*ptr);
    *ptr = nullptr;
    return int(e) + kRuntimeBase;
  }
  static_assert(sizeof(h) == sizeof(handle->bytes));
  __builtin_memcpy(handle->bytes, &h, sizeof(h));
  return 0;
}

int IpcOpen(int device, const IpcHandleBytes& handle, void** ptr) {
  *ptr = nullptr;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return int(e) + kRuntimeBase;
  cudaIpcMemHandle_t h;
  __builtin_memcpy(&h, handle.bytes, sizeof(h));
  if (cudaError_t e = cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    return int(e) + kRuntimeBase;
  }
  return 0;
}

int IpcClose(int device, void* ptr, bool owner) {
  cudaSetDevice(device);
  cudaDeviceSynchronize();
  const cudaError_t e = owner ? cudaFree(ptr) : cudaIpcCloseMemHandle(ptr);
  return e == cudaSuccess ? 0 : int(e) + kRuntimeBase;
}

int Memset(int device, void* ptr, int value, size_t bytes) {
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return int(e) + kRuntimeBase;
  const cudaError_t e = cudaMemset(ptr, value, bytes);
  if (e != cudaSuccess) return int(e) + kRuntimeBase;
  const cudaError_t s = cudaDeviceSynchronize();
  return s == cudaSuccess ? 0 : int(s) + kRuntimeBase;
}

const char* SharedErrorName(int error) {
  if (error == 0) return "success";
  if (error == kNoDriver) return "no CUDA driver (libcuda.so.1 not found or too old)";
  if (error >= kRuntimeBase) return cudaGetErrorName(cudaError_t(error - kRuntimeBase));
  const char* name = nullptr;
  const Driver& d = GetDriver();
  if (d.ok && d.error_name(CUresult(error), &name) == CUDA_SUCCESS && name) return name;
  return "unknown CUDA driver error";
}

SharedErrorKind ClassifySharedError(int error) {
  switch (error) {
    case kNoDriver:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_NOT_SUPPORTED:
    case kRuntimeBase + cudaErrorNoDevice:
    case kRuntimeBase + cudaErrorInsufficientDriver:
    case kRuntimeBase + cudaErrorInvalidDevice:
      return SharedErrorKind::kNoDevice;
    case CUDA_ERROR_OUT_OF_MEMORY:
    case kRuntimeBase + cudaErrorMemoryAllocation:
      return SharedErrorKind::kOutOfMemory;
    default:
      return SharedErrorKind::kOther;
  }
}

}  // namespace polykv::kernels::cuda
