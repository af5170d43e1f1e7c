// Paged attention over mixed-format pages (decode and chunked prefill).
//
// Flash-decoding in three kernels:
//   1. SplitKernel, grid (splits, kv heads, queries): one thread block walks a
//      range of pages for one KV head and ONE query token, decoding each K/V
//      tile into shared memory once for all query heads of the GQA group,
//      with an online softmax (scores biased by slot_bias when given);
//      writes (max, sum, acc[D]) per query head.
//   2. CombineKernel merges the splits into out and lse.
//   3. MassKernel (decode, when slot_mass is requested) turns the raw scores
//      kept by kernel 1 into per-slot attention mass summed (or maxed) over
//      the group.
#include <math.h>

#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/page_codec.h"

namespace polykv::kernels::cuda {
namespace {

constexpr unsigned kThreads = 128;  // a multiple of the warp size

struct AttnArgs {
  PagedKvView kv;
  PageGeom g;
  int num_q_heads;
  int group;
  float sm_scale;
  const float* slot_bias;  // null or [num_tokens], device memory: added to the scaled scores
  int num_queries;
  int splits;
  int blocks_per_split;
  const float* q;
  float* partial;  // [num_queries][H][splits][group][2 + D]
  float* scores;   // null or [num_q_heads][num_tokens] (decode)
};

__global__ void SplitKernel(AttnArgs a) {
  extern __shared__ float smem[];
  const int D = a.g.head_dim, bt = a.g.block_tokens, G = a.group;
  const int sp = blockIdx.x, h = blockIdx.y, i = blockIdx.z;
  float* q_s = smem;                  // [G][D]
  float* k_s = q_s + G * D;           // [bt][D]
  float* v_s = k_s + bt * D;          // [bt][D]
  float* p_s = v_s + bt * D;          // [G][bt]
  float* acc = p_s + G * bt;          // [G][D]
  float* m_s = acc + G * D;           // [G]
  float* l_s = m_s + G;               // [G]
  float* alpha_s = l_s + G;           // [G]
  const int tid = threadIdx.x;
  for (int e = tid; e < G * D; e += blockDim.x) {
    q_s[e] = a.q[(size_t(i) * a.num_q_heads + h * G) * D + e];
    acc[e] = 0.0f;
  }
  for (int hh = tid; hh < G; hh += blockDim.x) {
    m_s[hh] = -INFINITY;
    l_s[hh] = 0.0f;
  }
  const int visible = a.kv.num_tokens - a.num_queries + i + 1;
  const int s_begin = sp * a.blocks_per_split * bt;
  const int s_end = min((sp + 1) * a.blocks_per_split * bt, visible);
  __syncthreads();
  for (int b = s_begin / bt; b * bt < s_end; ++b) {
    const BlockEntry e = a.kv.blocks[b];
    const int r0 = max(s_begin - b * bt, 0);
    const int n = min(s_end - b * bt, bt) - r0;
    const uint8_t* kp = PagePtr(a.kv.base, e.k_offset);
    const uint8_t* vp = PagePtr(a.kv.base, e.v_offset);
    for (int x = tid; x < n * D; x += blockDim.x) {
      const int r = x / D, d = x % D;
      k_s[x] = DecodeElem(kp, a.g, e.k_format, KvKind::kKey, r0 + r, h, d);
      v_s[x] = DecodeElem(vp, a.g, e.v_format, KvKind::kValue, r0 + r, h, d);
    }
    __syncthreads();
    // One warp per (query head, row): lanes stride the channels (no shared
    // memory bank conflicts), then a butterfly reduction. The loop bound is
    // warp-uniform, so every lane reaches the shuffles.
    const int warp = tid / 32, lane = tid % 32, num_warps = blockDim.x / 32;
    for (int x = warp; x < G * n; x += num_warps) {
      const int hh = x / n, r = x % n;
      float dot = 0.0f;
      for (int d = lane; d < D; d += 32) dot += q_s[hh * D + d] * k_s[r * D + d];
      for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      if (lane == 0) {
        const int slot = b * bt + r0 + r;
        const float s = a.sm_scale * dot + (a.slot_bias ? a.slot_bias[slot] : 0.0f);
        p_s[hh * bt + r] = s;
        if (a.scores) a.scores[size_t(h * G + hh) * a.kv.num_tokens + slot] = s;
      }
    }
    __syncthreads();
    for (int hh = tid; hh < G; hh += blockDim.x) {
      float mt = -INFINITY;
      for (int r = 0; r < n; ++r) mt = fmaxf(mt, p_s[hh * bt + r]);
      const float m_new = fmaxf(m_s[hh], mt);
      const float alpha = m_s[hh] == -INFINITY ? 0.0f : expf(m_s[hh] - m_new);
      float l = l_s[hh] * alpha;
      for (int r = 0; r < n; ++r) {
        const float p = expf(p_s[hh * bt + r] - m_new);
        p_s[hh * bt + r] = p;
        l += p;
      }
      m_s[hh] = m_new;
      l_s[hh] = l;
      alpha_s[hh] = alpha;
    }
    __syncthreads();
    for (int x = tid; x < G * D; x += blockDim.x) {
      const int hh = x / D, d = x % D;
      float v = acc[x] * alpha_s[hh];
      for (int r = 0; r < n; ++r) v += p_s[hh * bt + r] * v_s[r * D + d];
      acc[x] = v;
    }
    __syncthreads();
  }
  float* out = a.partial + ((size_t(i) * a.g.num_kv_heads + h) * a.splits + sp) * G * (2 + D);
  for (int x = tid; x < G * D; x += blockDim.x) out[(x / D) * (2 + D) + 2 + x % D] = acc[x];
  for (int hh = tid; hh < G; hh += blockDim.x) {
    out[hh * (2 + D)] = m_s[hh];
    out[hh * (2 + D) + 1] = l_s[hh];
  }
}

// grid (num_q_heads, num_queries), block D threads (looped).
__global__ void CombineKernel(AttnArgs a, float* out, float* lse) {
  const int qh = blockIdx.x, i = blockIdx.y, D = a.g.head_dim;
  const int h = qh / a.group, hh = qh % a.group;
  const float* base =
      a.partial + (size_t(i) * a.g.num_kv_heads + h) * a.splits * a.group * (2 + D);
  auto row = [&](int sp) { return base + (size_t(sp) * a.group + hh) * (2 + D); };
  float m = -INFINITY;
  for (int sp = 0; sp < a.splits; ++sp) m = fmaxf(m, row(sp)[0]);
  float l = 0.0f;
  for (int sp = 0; sp < a.splits; ++sp) {
    if (row(sp)[0] != -INFINITY) l += expf(row(sp)[0] - m) * row(sp)[1];
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int sp = 0; sp < a.splits; ++sp) {
      if (row(sp)[0] != -INFINITY) o += expf(row(sp)[0] - m) * row(sp)[2 + d];
    }
    out[(size_t(i) * a.num_q_heads + qh) * D + d] = o / l;
  }
  if (threadIdx.x == 0 && lse) lse[size_t(i) * a.num_q_heads + qh] = m + logf(l);
}

__global__ void MassKernel(AttnArgs a, const float* lse, bool most, float* mass) {
  const int T = a.kv.num_tokens;
  const size_t total = size_t(a.g.num_kv_heads) * T;
  for (size_t x = blockIdx.x * size_t(blockDim.x) + threadIdx.x; x < total;
       x += size_t(gridDim.x) * blockDim.x) {
    const int h = int(x / T), s = int(x % T);
    float m = 0.0f;
    for (int hh = 0; hh < a.group; ++hh) {
      const int qh = h * a.group + hh;
      const float p = expf(a.scores[size_t(qh) * T + s] - lse[qh]);
      m = most ? fmaxf(m, p) : m + p;
    }
    mass[x] = m;
  }
}

}  // namespace

int Attention(void* stream_ptr, const PagedKvView& kv, int num_q_heads, float sm_scale,
              const float* slot_bias, int num_queries, const float* q, float* out, float* lse,
              float* slot_mass, MassReduce mass_reduce) {
  const cudaStream_t stream = AsStream(stream_ptr);
  AttnArgs a{};
  a.kv = kv;
  a.g = GeomOf(kv.shape);
  a.num_q_heads = num_q_heads;
  a.group = num_q_heads / a.g.num_kv_heads;
  a.sm_scale = sm_scale;
  a.slot_bias = slot_bias;
  a.num_queries = num_queries;
  a.q = q;
  const int D = a.g.head_dim, bt = a.g.block_tokens, G = a.group;
  if (num_queries > 65535 || num_q_heads > 65535) return int(cudaErrorInvalidValue);  // grid limits
  // Enough thread blocks to fill the device, but at least 8 pages per split.
  const int pairs = a.g.num_kv_heads * num_queries;
  int splits = (264 + pairs - 1) / pairs;
  splits = std::max(1, std::min(splits, (kv.num_blocks + 7) / 8));
  a.blocks_per_split = (kv.num_blocks + splits - 1) / splits;
  a.splits = (kv.num_blocks + a.blocks_per_split - 1) / a.blocks_per_split;
  const size_t smem = sizeof(float) * (size_t(G) * D * 2 + 2 * size_t(bt) * D + size_t(G) * bt +
                                       3 * size_t(G));
  if (smem > 200 * 1024) return int(cudaErrorInvalidValue);
  if (smem > 48 * 1024) {
    POLYKV_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(SplitKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  const size_t partial_floats = size_t(num_queries) * a.g.num_kv_heads * a.splits * G * (2 + D);
  const size_t score_floats = slot_mass ? size_t(num_q_heads) * kv.num_tokens : 0;
  const size_t lse_floats = slot_mass && !lse ? size_t(num_q_heads) : 0;
  float* scratch = nullptr;
  POLYKV_CUDA_RETURN_IF_ERROR(cudaMallocAsync(
      reinterpret_cast<void**>(&scratch),
      sizeof(float) * (partial_floats + score_floats + lse_floats), stream));
  a.partial = scratch;
  a.scores = slot_mass ? scratch + partial_floats : nullptr;
  float* lse_out = lse ? lse : (lse_floats ? scratch + partial_floats + score_floats : nullptr);
  SplitKernel<<<dim3(a.splits, a.g.num_kv_heads, num_queries), kThreads, smem, stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) {
    CombineKernel<<<dim3(num_q_heads, num_queries), kThreads, 0, stream>>>(a, out, lse_out);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess && slot_mass) {
    MassKernel<<<GridFor(size_t(a.g.num_kv_heads) * kv.num_tokens, 256), 256, 0, stream>>>(
        a, lse_out, mass_reduce == MassReduce::kMax, slot_mass);
    err = cudaGetLastError();
  }
  const cudaError_t free_err = cudaFreeAsync(scratch, stream);
  return int(err != cudaSuccess ? err : free_err);
}

}  // namespace polykv::kernels::cuda
