// Helpers shared by the CUDA sources (kernels/cuda/*.cu only).
#pragma once

#include <cuda_runtime.h>

#define POLYKV_CUDA_RETURN_IF_ERROR(expr) \
  do {                                    \
    const cudaError_t polykv_err = (expr); \
    if (polykv_err != cudaSuccess) return int(polykv_err); \
  } while (0)

namespace polykv::kernels::cuda {

inline cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

inline unsigned GridFor(size_t work, unsigned threads) {
  size_t blocks = (work + threads - 1) / threads;
  if (blocks > 65535u * 16u) blocks = 65535u * 16u;  // grid-stride loops cover the rest
  return unsigned(blocks == 0 ? 1 : blocks);
}

}  // namespace polykv::kernels::cuda
