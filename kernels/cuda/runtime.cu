// Thin wrappers over the CUDA runtime for kernels/device.h (host code that
// includes no CUDA header calls these).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace polykv::kernels::cuda {

int DeviceCount(int* count) {
  *count = 0;
  const cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) {
    *count = 0;
    cudaGetLastError();  // clear the sticky "no driver/device" error
  }
  return int(err);
}

const char* ErrorString(int error) { return cudaGetErrorString(cudaError_t(error)); }

int Malloc(void** ptr, size_t bytes) { return int(cudaMalloc(ptr, bytes)); }
int Free(void* ptr) { return int(cudaFree(ptr)); }
int Memcpy(void* dst, const void* src, size_t bytes, int kind) {
  return int(cudaMemcpy(dst, src, bytes, cudaMemcpyKind(kind)));
}
int Synchronize() { return int(cudaDeviceSynchronize()); }
int SetDevice(int device) { return int(cudaSetDevice(device)); }

}  // namespace polykv::kernels::cuda
