// Scoring helpers on the device: key norms and q.k relevance per slot, one
// thread per output value, reading keys in their page formats.
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/page_codec.h"

namespace polykv::kernels::cuda {
namespace {

__global__ void KeyNormsKernel(PagedKvView kv, PageGeom g, float* norms) {
  const size_t total = size_t(g.num_kv_heads) * kv.num_tokens;
  for (size_t x = blockIdx.x * size_t(blockDim.x) + threadIdx.x; x < total;
       x += size_t(gridDim.x) * blockDim.x) {
    const int h = int(x / kv.num_tokens), s = int(x % kv.num_tokens);
    const BlockEntry e = kv.blocks[s / g.block_tokens];
    const uint8_t* page = PagePtr(kv.base, e.k_offset);
    float sum = 0.0f;
    for (int d = 0; d < g.head_dim; ++d) {
      const float k = DecodeElem(page, g, e.k_format, KvKind::kKey, s % g.block_tokens, h, d);
      sum += k * k;
    }
    norms[x] = sqrtf(sum);
  }
}

__global__ void QkScoresKernel(PagedKvView kv, PageGeom g, const float* queries, int num_queries,
                               float scale, float* scores) {
  const size_t per_query = size_t(g.num_kv_heads) * kv.num_tokens;
  const size_t total = per_query * num_queries;
  for (size_t x = blockIdx.x * size_t(blockDim.x) + threadIdx.x; x < total;
       x += size_t(gridDim.x) * blockDim.x) {
    const int i = int(x / per_query);
    const int h = int(x % per_query / kv.num_tokens), s = int(x % kv.num_tokens);
    const BlockEntry e = kv.blocks[s / g.block_tokens];
    const uint8_t* page = PagePtr(kv.base, e.k_offset);
    const float* q = queries + (size_t(i) * g.num_kv_heads + h) * g.head_dim;
    float dot = 0.0f;
    for (int d = 0; d < g.head_dim; ++d) {
      dot += q[d] * DecodeElem(page, g, e.k_format, KvKind::kKey, s % g.block_tokens, h, d);
    }
    scores[x] = scale * dot;
  }
}

}  // namespace

int KeyNorms(void* stream, const PagedKvView& kv, float* norms) {
  const PageGeom g = GeomOf(kv.shape);
  KeyNormsKernel<<<GridFor(size_t(g.num_kv_heads) * kv.num_tokens, 256), 256, 0,
                   AsStream(stream)>>>(kv, g, norms);
  return int(cudaGetLastError());
}

int QkScores(void* stream, const PagedKvView& kv, const float* queries, int num_queries,
             float scale, float* scores) {
  const PageGeom g = GeomOf(kv.shape);
  if (num_queries == 0) return 0;
  QkScoresKernel<<<GridFor(size_t(g.num_kv_heads) * kv.num_tokens * num_queries, 256), 256, 0,
                   AsStream(stream)>>>(kv, g, queries, num_queries, scale, scores);
  return int(cudaGetLastError());
}

}  // namespace polykv::kernels::cuda
