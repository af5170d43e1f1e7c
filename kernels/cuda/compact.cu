// Compaction (gather + merge) on the device: kernel 1 writes the merged rows
// of the selection into a dense f32 scratch [num_out][H][D] (only the output
// slots, never the whole cache); kernel 2 encodes them into the destination
// pages in each page's format (quantize.cu).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/quantize.cuh"
#include "kernels/page_codec.h"

namespace polykv::kernels::cuda {
namespace {

__global__ void MergeRowsKernel(PagedKvView src, PageGeom g, KvKind kind, CompactPlan plan,
                                float* rows) {
  const size_t per_slot = size_t(g.num_kv_heads) * g.head_dim;
  const size_t total = per_slot * plan.num_out;
  for (size_t x = blockIdx.x * size_t(blockDim.x) + threadIdx.x; x < total;
       x += size_t(gridDim.x) * blockDim.x) {
    const int j = int(x / per_slot);
    const int h = int(x % per_slot / g.head_dim), d = int(x % g.head_dim);
    const int begin = plan.group_offsets ? plan.group_offsets[j] : j;
    const int end = plan.group_offsets ? plan.group_offsets[j + 1] : j + 1;
    float wsum = 0.0f;
    for (int m = begin; m < end; ++m) wsum += plan.weights ? plan.weights[m] : 1.0f;
    float acc = 0.0f;
    for (int m = begin; m < end; ++m) {
      const float w = (plan.weights ? plan.weights[m] : 1.0f) / wsum;
      const int s = plan.members[m];
      const BlockEntry e = src.blocks[s / g.block_tokens];
      const bool key = kind == KvKind::kKey;
      acc += w * DecodeElem(PagePtr(src.base, key ? e.k_offset : e.v_offset), g,
                            key ? e.k_format : e.v_format, kind, s % g.block_tokens, h, d);
    }
    rows[x] = acc;
  }
}

}  // namespace

int Compact(void* stream_ptr, const PagedKvView& src, const CompactPlan& plan,
            const PagedKvMut& dst) {
  const cudaStream_t stream = AsStream(stream_ptr);
  const PageGeom g = GeomOf(src.shape);
  // Whole destination pages, so the quantizer can read every row it encodes.
  const size_t floats = size_t(dst.num_blocks) * g.Elems();
  float* rows = nullptr;
  POLYKV_CUDA_RETURN_IF_ERROR(
      cudaMallocAsync(reinterpret_cast<void**>(&rows), floats * sizeof(float), stream));
  int err = 0;
  for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
    const size_t work = size_t(plan.num_out) * g.num_kv_heads * g.head_dim;
    MergeRowsKernel<<<GridFor(work, 256), 256, 0, stream>>>(src, g, kind, plan, rows);
    err = int(cudaGetLastError());
    if (err != 0) break;
    err = LaunchQuantizeTable(stream, rows, plan.num_out, g, kind, dst.base, dst.blocks,
                              dst.num_blocks);
    if (err != 0) break;
  }
  const cudaError_t free_err = cudaFreeAsync(rows, stream);
  return err != 0 ? err : int(free_err);
}

}  // namespace polykv::kernels::cuda
