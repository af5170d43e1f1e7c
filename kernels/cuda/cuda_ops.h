// CUDA kernels (Backend::kCuda), callable from plain C++: this header pulls in
// neither CUDA nor absl, so polykv_kernels can be compiled by the host compiler
// alone and nvcc never sees absl. Every function returns 0 on success or a
// cudaError_t value (ErrorString names it). All pointers are device pointers
// unless stated; work is enqueued on `stream` (a cudaStream_t, null = default).
// Arguments are validated by kernels/ops.cc before these are called.
#pragma once

#include <cstddef>

#include "kernels/kernel_types.h"
#include "kernels/page_layout.h"

namespace polykv::kernels::cuda {

int DeviceCount(int* count);
const char* ErrorString(int error);
int Malloc(void** ptr, size_t bytes);
int Free(void* ptr);
// kind: 1 host->device, 2 device->host, 3 device->device (cudaMemcpyKind).
int Memcpy(void* dst, const void* src, size_t bytes, int kind);
int Synchronize();
int SetDevice(int device);

int QuantizePages(void* stream, const PageShape& shape, KvKind kind, PageFormat format,
                  const void* src, SourceType src_type, int num_pages, int rows_per_page,
                  void* pages);
int DequantizePages(void* stream, const PageShape& shape, KvKind kind, PageFormat format,
                    const void* pages, int num_pages, int rows_per_page, float* dst);
// Same contract as ref::Attention (ref/ref.h); `kv.blocks` is a device array.
int Attention(void* stream, const PagedKvView& kv, int num_q_heads, float sm_scale,
              const float* slot_bias, int num_queries, const float* q, float* out, float* lse,
              float* slot_mass, MassReduce mass_reduce);
int Compact(void* stream, const PagedKvView& src, const CompactPlan& plan, const PagedKvMut& dst);
int KeyNorms(void* stream, const PagedKvView& kv, float* norms);
int QkScores(void* stream, const PagedKvView& kv, const float* queries, int num_queries,
             float scale, float* scores);

}  // namespace polykv::kernels::cuda
