// Fast CPU kernels: one source (cpu_kernels.inc) compiled for the portable
// baseline, for AVX2+FMA+F16C and for AVX-512 (F/BW/VL/DQ, which also has
// 512-bit loops where written); the widest copy the CPU runs is chosen once
// at run time, capped by POLYKV_CPU_SIMD (baseline | avx2 | avx512).
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/page_codec.h"

namespace polykv::kernels::cpu {
namespace {

namespace baseline {
#include "kernels/cpu/cpu_kernels.inc"
}  // namespace baseline

// GCC takes '#pragma GCC target'; clang ignores it and takes the same
// target as an attribute on every function of the region instead.
#if defined(__clang__)
#define POLYKV_TARGET_PUSH(t) \
  _Pragma(POLYKV_STRINGIFY(clang attribute push(__attribute__((target(t))), apply_to = function)))
#define POLYKV_TARGET_POP _Pragma("clang attribute pop")
#else
#define POLYKV_TARGET_PUSH(t) _Pragma("GCC push_options") _Pragma(POLYKV_STRINGIFY(GCC target(t)))
#define POLYKV_TARGET_POP _Pragma("GCC pop_options")
#endif
#define POLYKV_STRINGIFY(x) #x

POLYKV_TARGET_PUSH("avx2,fma,f16c")
namespace avx2 {
#define POLYKV_CPU_AVX2 1
#include "kernels/cpu/cpu_kernels.inc"
#undef POLYKV_CPU_AVX2
}  // namespace avx2
POLYKV_TARGET_POP

POLYKV_TARGET_PUSH("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace avx512 {
// The AVX2 helpers too (same instructions, EVEX-encoded), widened where
// POLYKV_CPU_AVX512 says.
#define POLYKV_CPU_AVX2 1
#define POLYKV_CPU_AVX512 1
#include "kernels/cpu/cpu_kernels.inc"
#undef POLYKV_CPU_AVX512
#undef POLYKV_CPU_AVX2
}  // namespace avx512
POLYKV_TARGET_POP

// Tests flip this to exercise the baseline copy on AVX2 machines; relaxed is
// enough because a kernel call reads it once and either copy is correct.
std::atomic<bool> force_baseline{false};

// F16C from CPUID leaf 1 (ECX bit 29): clang 14 does not accept "f16c" in
// __builtin_cpu_supports, and scripts/check-thread-safety.sh compiles this with it.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

enum class Simd { kBaseline, kAvx2, kAvx512 };

// What the CPU runs, capped by POLYKV_CPU_SIMD (an unknown value caps nothing).
Simd BestSimd() {
  static const Simd best = [] {
    Simd s = Simd::kBaseline;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c()) {
      s = Simd::kAvx2;
      if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        s = Simd::kAvx512;
      }
    }
    if (const char* cap = std::getenv("POLYKV_CPU_SIMD"); cap != nullptr) {
      if (std::strcmp(cap, "baseline") == 0) s = Simd::kBaseline;
      if (std::strcmp(cap, "avx2") == 0) s = std::min(s, Simd::kAvx2);
    }
    return s;
  }();
  return best;
}

Simd ChosenSimd() {
  return force_baseline.load(std::memory_order_relaxed) ? Simd::kBaseline : BestSimd();
}

}  // namespace

void ForceBaselineForTesting(bool force) {
  force_baseline.store(force, std::memory_order_relaxed);
}

const char* SimdLevel() {
  switch (ChosenSimd()) {
    case Simd::kAvx512: return "avx512";
    case Simd::kAvx2: return "avx2";
    case Simd::kBaseline: break;
  }
  return "baseline";
}

#define POLYKV_CPU_DISPATCH(fn, ...)                                          \
  (ChosenSimd() == Simd::kAvx512 ? avx512::fn(__VA_ARGS__)                     \
   : ChosenSimd() == Simd::kAvx2 ? avx2::fn(__VA_ARGS__)                       \
                                 : baseline::fn(__VA_ARGS__))

void QuantizePages(int num_threads, const PageShape& shape, KvKind kind, PageFormat format,
                   const void* src, SourceType src_type, int num_pages, int rows_per_page,
                   void* pages) {
  POLYKV_CPU_DISPATCH(QuantizePages, num_threads, shape, kind, format, src, src_type, num_pages,
                      rows_per_page, pages);
}

void DequantizePages(int num_threads, const PageShape& shape, KvKind kind, PageFormat format,
                     const void* pages, int num_pages, int rows_per_page, float* dst) {
  POLYKV_CPU_DISPATCH(DequantizePages, num_threads, shape, kind, format, pages, num_pages,
                      rows_per_page, dst);
}

void Attention(int num_threads, const PagedKvView& kv, int num_q_heads, float sm_scale,
               const float* slot_bias, int num_queries, const float* q, float* out, float* lse,
               float* slot_mass, MassReduce mass_reduce) {
  POLYKV_CPU_DISPATCH(Attention, num_threads, kv, num_q_heads, sm_scale, slot_bias, num_queries, q,
                      out, lse, slot_mass, mass_reduce);
}

void Compact(int num_threads, const PagedKvView& src, const CompactPlan& plan,
             const PagedKvMut& dst) {
  POLYKV_CPU_DISPATCH(Compact, num_threads, src, plan, dst);
}

void KeyNorms(int num_threads, const PagedKvView& kv, float* norms) {
  POLYKV_CPU_DISPATCH(KeyNorms, num_threads, kv, norms);
}

void QkScores(int num_threads, const PagedKvView& kv, const float* queries, int num_queries,
              float scale, float* scores) {
  POLYKV_CPU_DISPATCH(QkScores, num_threads, kv, queries, num_queries, scale, scores);
}

}  // namespace polykv::kernels::cpu
