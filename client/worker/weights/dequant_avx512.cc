// AVX-512 (F, BW, VL, DQ) dequantization kernels (dequant.h). This file alone
// is compiled with those flags and -ffp-contract=off, and only called after
// BestIsa() saw them. One 512-bit register holds 16 floats: exactly one Q6_K
// scale group and half a 32-element block. Fifth bits (Q5_*) become byte
// masks instead of shuffled bytes. The float operations are Dequantize's,
// in its order, unfused (see dequant_avx2.cc).
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

inline __m128i Load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline __m256i Load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// 16 int8 -> 16 floats, exact.
inline __m512 Widen16(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }
inline __m128i Lo(__m256i v) { return _mm256_castsi256_si128(v); }
inline __m128i Hi(__m256i v) { return _mm256_extracti128_si256(v, 1); }

// y[0, 16) = q * d.
inline void Scale16(__m128i q, __m512 d, float* y) {
  _mm512_storeu_ps(y, _mm512_mul_ps(Widen16(q), d));
}
// y[0, 16) = q * d + m.
inline void ScaleAdd16(__m128i q, __m512 d, __m512 m, float* y) {
  _mm512_storeu_ps(y, _mm512_add_ps(_mm512_mul_ps(Widen16(q), d), m));
}
// y[0, 16) = d1 * q - m1.
inline void ScaleSub16(__m128i q, __m512 d1, __m512 m1, float* y) {
  _mm512_storeu_ps(y, _mm512_sub_ps(_mm512_mul_ps(d1, Widen16(q)), m1));
}

// Nibbles of the block with 16 added where the block's 32-bit qh (element i:
// bit i) is set.
inline __m256i Q5Quants(const uint8_t* qh, const uint8_t* qs) {
  const __m256i nib = Nibbles16(qs);
  return _mm256_mask_add_epi8(nib, static_cast<__mmask32>(LoadU32(qh)), nib,
                              _mm256_set1_epi8(16));
}

void Q4_0(const uint8_t* x, int64_t nb, float* y) {
  const __m256i off = _mm256_set1_epi8(8);
  for (; nb > 0; --nb, x += 18, y += 32) {
    const __m512 d = _mm512_set1_ps(Half(x));
    const __m256i q = _mm256_sub_epi8(Nibbles16(x + 2), off);
    Scale16(Lo(q), d, y);
    Scale16(Hi(q), d, y + 16);
  }
}

void Q4_1(const uint8_t* x, int64_t nb, float* y) {
  for (; nb > 0; --nb, x += 20, y += 32) {
    const __m512 d = _mm512_set1_ps(Half(x)), m = _mm512_set1_ps(Half(x + 2));
    const __m256i q = Nibbles16(x + 4);
    ScaleAdd16(Lo(q), d, m, y);
    ScaleAdd16(Hi(q), d, m, y + 16);
  }
}

void Q5_0(const uint8_t* x, int64_t nb, float* y) {
  const __m256i off = _mm256_set1_epi8(16);
  for (; nb > 0; --nb, x += 22, y += 32) {
    const __m512 d = _mm512_set1_ps(Half(x));
    const __m256i q = _mm256_sub_epi8(Q5Quants(x + 2, x + 6), off);
    Scale16(Lo(q), d, y);
    Scale16(Hi(q), d, y + 16);
  }
}

void Q5_1(const uint8_t* x, int64_t nb, float* y) {
  for (; nb > 0; --nb, x += 24, y += 32) {
    const __m512 d = _mm512_set1_ps(Half(x)), m = _mm512_set1_ps(Half(x + 2));
    const __m256i q = Q5Quants(x + 4, x + 8);
    ScaleAdd16(Lo(q), d, m, y);
    ScaleAdd16(Hi(q), d, m, y + 16);
  }
}

void Q8_0(const uint8_t* x, int64_t nb, float* y) {
  for (; nb > 0; --nb, x += 34, y += 32) {
    const __m512 d = _mm512_set1_ps(Half(x));
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
      const __m512 d1 = _mm512_set1_ps(d * sc), m1 = _mm512_set1_ps(dmin * m);
      KQuantScaleMin(2 * p + 1, scales, &sc, &m);
      const __m512 d2 = _mm512_set1_ps(d * sc), m2 = _mm512_set1_ps(dmin * m);
      const __m256i bytes = Load32(q);
      __m256i lo = _mm256_and_si256(bytes, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
      if constexpr (kFive) {  // Bits 2p and 2p + 1 of qh[l]: +16.
        const __mmask32 k1 = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(1 << (2 * p))));
        const __mmask32 k2 = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(2 << (2 * p))));
        lo = _mm256_mask_add_epi8(lo, k1, lo, sixteen);
        hi = _mm256_mask_add_epi8(hi, k2, hi, sixteen);
      }
      ScaleSub16(Lo(lo), d1, m1, y);
      ScaleSub16(Hi(lo), d1, m1, y + 16);
      ScaleSub16(Lo(hi), d2, m2, y + 32);
      ScaleSub16(Hi(hi), d2, m2, y + 48);
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
      auto high = [&](int shift) {  // Two high bits of each quant, at bits 4..5.
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
        Scale16(Lo(v), _mm512_set1_ps(d * sc[2 * i]), y + 32 * i);
        Scale16(Hi(v), _mm512_set1_ps(d * sc[2 * i + 1]), y + 32 * i + 16);
      }
    }
  }
}

}  // namespace

namespace dequant_internal {
DequantFn Avx512Kernel(uint32_t type) {
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
DequantFn Avx512Kernel(uint32_t) { return nullptr; }
}  // namespace polykv::worker::dequant_internal
#endif
