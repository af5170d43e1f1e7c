// Fast CPU kernels (Backend::kCpu): one page-head at a time, never a dense
// copy of the cache (attention reads most formats' rows in place, the others
// through a small f32 tile: cpu_attention.inc), AVX2/FMA/
// F16C inner loops when the CPU has them, AVX-512 ones where written (chosen
// once at run time, capped by the environment's POLYKV_CPU_SIMD: baseline,
// avx2 or avx512), work split over a shared thread pool. Arguments are
// validated by kernels/ops.cc.
#pragma once

#include "kernels/ops.h"

namespace polykv::kernels::cpu {

// Which instruction set the fast path uses on this machine: "avx512", "avx2"
// or "baseline".
const char* SimdLevel();
// Makes every later call use the portable baseline copy (tests only).
void ForceBaselineForTesting(bool force);

void QuantizePages(int num_threads, const PageShape& shape, KvKind kind, PageFormat format,
                   const void* src, SourceType src_type, int num_pages, int rows_per_page,
                   void* pages);
void DequantizePages(int num_threads, const PageShape& shape, KvKind kind, PageFormat format,
                     const void* pages, int num_pages, int rows_per_page, float* dst);
void Attention(int num_threads, const PagedKvView& kv, int num_q_heads, float sm_scale,
               const float* slot_bias, int num_queries, const float* q, float* out, float* lse,
               float* slot_mass, MassReduce mass_reduce);
void Compact(int num_threads, const PagedKvView& src, const CompactPlan& plan,
             const PagedKvMut& dst);
void KeyNorms(int num_threads, const PagedKvView& kv, float* norms);
void QkScores(int num_threads, const PagedKvView& kv, const float* queries, int num_queries,
              float scale, float* scores);

}  // namespace polykv::kernels::cpu
