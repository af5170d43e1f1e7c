// AVX2 (+F16C) dequantization kernels (dequant.h). This file alone is
// compiled with -mavx2 -mfma -mf16c -ffp-contract=off and only called after
// BestIsa() saw those flags. Quants are unpacked to int8 in 256-bit integer
// registers, widened 8 at a time to f32 and scaled with the operations of
// Dequantize (ggml_types.cc) in its order: q * d, q * d + m, d1 * q - m1 and
// (d * sc) * q, each one rounding — -ffp-contract=off keeps GCC from fusing
// the mul/add intrinsics (plain vector arithmetic to it) into an FMA.
#include <cstring>

#include "client/worker/weights/dequant.h"
#include "client/worker/weights/ggml_types.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "client/worker/weights/x86_blocks.h"

namespace polykv::worker {
namespace {

using x86::Half;
using x86::Nibbles16;
using x86::FifthBits;

inline __m128i Load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline __m256i Load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// 8 int8 (the low 8 bytes of v) -> 8 floats, exact.
inline __m256 Widen8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

// y[0, 16) = q * d for 16 int8 q.
inline void Scale16(__m128i q, __m256 d, float* y) {
  _mm256_storeu_ps(y, _mm256_mul_ps(Widen8(q), d));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(Widen8(_mm_srli_si128(q, 8)), d));
}
inline void Scale32(__m256i q, __m256 d, float* y) {
  Scale16(_mm256_castsi256_si128(q), d, y);
  Scale16(_mm256_extracti128_si256(q, 1), d, y + 16);
}

// y[0, 32) = q * d + m (Q4_1, Q5_1).
inline void ScaleAdd32(__m256i q, __m256 d, __m256 m, float* y) {
  const __m128i h[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
  for (int i = 0; i < 2; ++i, y += 16) {
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_mul_ps(Widen8(h[i]), d), m));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_mul_ps(Widen8(_mm_srli_si128(h[i], 8)), d), m));
  }
}

// y[0, 32) = d1 * q - m1 for 32 int8 q (Q4_K, Q5_K sub-blocks).
inline void ScaleSub32(__m256i q, __m256 d1, __m256 m1, float* y) {
  const __m128i h[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
  for (int i = 0; i < 2; ++i, y += 16) {
    _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(d1, Widen8(h[i])), m1));
    _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(d1, Widen8(_mm_srli_si128(h[i], 8))), m1));
  }
}

void Q4_0(const uint8_t* x, int64_t nb, float* y) {
  const __m256i off = _mm256_set1_epi8(8);
  for (; nb > 0; --nb, x += 18, y += 32) {
    Scale32(_mm256_sub_epi8(Nibbles16(x + 2), off), _mm256_set1_ps(Half(x)), y);
  }
}

void Q4_1(const uint8_t* x, int64_t nb, float* y) {
  for (; nb > 0; --nb, x += 20, y += 32) {
    ScaleAdd32(Nibbles16(x + 4), _mm256_set1_ps(Half(x)), _mm256_set1_ps(Half(x + 2)), y);
  }
}

void Q5_0(const uint8_t* x, int64_t nb, float* y) {
  const __m256i off = _mm256_set1_epi8(16);
  for (; nb > 0; --nb, x += 22, y += 32) {
    const __m256i q = _mm256_or_si256(Nibbles16(x + 6), FifthBits(x + 2));
    Scale32(_mm256_sub_epi8(q, off), _mm256_set1_ps(Half(x)), y);
  }
}

void Q5_1(const uint8_t* x, int64_t nb, float* y) {
  for (; nb > 0; --nb, x += 24, y += 32) {
    const __m256i q = _mm256_or_si256(Nibbles16(x + 8), FifthBits(x + 4));
    ScaleAdd32(q, _mm256_set1_ps(Half(x)), _mm256_set1_ps(Half(x + 2)), y);
  }
}

void Q8_0(const uint8_t* x, int64_t nb, float* y) {
  for (; nb > 0; --nb, x += 34, y += 32) {
    const __m256 d = _mm256_set1_ps(Half(x));
    Scale16(Load16(x + 2), d, y);
    Scale16(Load16(x + 18), d, y + 16);
  }
}

template <bool kFive>
void Q45K(const uint8_t* x, int64_t nb, float* y) {
  using namespace kquant;
  const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  for (; nb > 0; --nb, x += kFive ? kQ5KBytes : kQ4KBytes) {
    const float d = Half(x), dmin = Half(x + 2);
    const uint8_t* scales = x + (kFive ? kQ5KScales : kQ4KScales);
    const uint8_t* q = x + (kFive ? kQ5KQs : kQ4KQs);
    const __m256i qh = kFive ? Load32(x + kQ5KQh) : _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p, q += 32, y += 64) {
      uint8_t sc, m;
      KQuantScaleMin(2 * p, scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      KQuantScaleMin(2 * p + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      const __m256i bytes = Load32(q);
      __m256i lo = _mm256_and_si256(bytes, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
      if constexpr (kFive) {  // Bits 2p and 2p + 1 of qh[l]: +16.
        const __m256i u1 = _mm256_set1_epi8(static_cast<char>(1 << (2 * p)));
        const __m256i u2 = _mm256_set1_epi8(static_cast<char>(2 << (2 * p)));
        lo = _mm256_add_epi8(lo, _mm256_and_si256(
                                     _mm256_cmpeq_epi8(_mm256_and_si256(qh, u1), u1), sixteen));
        hi = _mm256_add_epi8(hi, _mm256_and_si256(
                                     _mm256_cmpeq_epi8(_mm256_and_si256(qh, u2), u2), sixteen));
      }
      ScaleSub32(lo, _mm256_set1_ps(d1), _mm256_set1_ps(m1), y);
      ScaleSub32(hi, _mm256_set1_ps(d2), _mm256_set1_ps(m2), y + 32);
    }
  }
}

void Q6K(const uint8_t* x, int64_t nb, float* y) {
  using namespace kquant;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  const __m256i off = _mm256_set1_epi8(32);
  for (; nb > 0; --nb, x += kQ6KBytes) {
    const float d = Half(x + kQ6KD);
    const uint8_t* ql = x;
    const uint8_t* qh = x + kQ6KQh;
    const int8_t* sc = reinterpret_cast<const int8_t*>(x + kQ6KScales);
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
      const __m256i l0 = Load32(ql), l1 = Load32(ql + 32), h = Load32(qh);
      // Two high bits of each quant, moved to bits 4..5 of its byte.
      auto high = [&](int shift) {
        return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, shift), m3), 4);
      };
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, m4), high(0)),
          _mm256_or_si256(_mm256_and_si256(l1, m4), high(2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), high(4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), high(6)),
      };
      for (int i = 0; i < 4; ++i) {
        const __m256i v = _mm256_sub_epi8(q[i], off);
        // y = (d * scale) * q, one scale per 16 elements (ggml's order).
        Scale16(_mm256_castsi256_si128(v), _mm256_set1_ps(d * sc[2 * i]), y + 32 * i);
        Scale16(_mm256_extracti128_si256(v, 1), _mm256_set1_ps(d * sc[2 * i + 1]),
                y + 32 * i + 16);
      }
    }
  }
}

}  // namespace

namespace dequant_internal {
DequantFn Avx2Kernel(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ4_0: return Q4_0;
    case GgmlType::kQ4_1: return Q4_1;
    case GgmlType::kQ5_0: return Q5_0;
    case GgmlType::kQ5_1: return Q5_1;
    case GgmlType::kQ8_0: return Q8_0;
    case GgmlType::kQ4_K: return Q45K<false>;
    case GgmlType::kQ5_K: return Q45K<true>;
    case GgmlType::kQ6_K: return Q6K;
    default: return nullptr;
  }
}
}  // namespace dequant_internal

}  // namespace polykv::worker

#else  // Not x86-64: no kernels of this ISA.
namespace polykv::worker::dequant_internal {
DequantFn Avx2Kernel(uint32_t) { return nullptr; }
}  // namespace polykv::worker::dequant_internal
#endif
