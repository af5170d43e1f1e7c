// AVX-512 (F, BW, VL, VNNI) weight-row dot products; compiled with those
// flags alone and called only after BestIsa() saw them. Two activation blocks
// fill one 512-bit register; vpdpbusd accumulates u8 x s8 products straight
// into int32 lanes (lanes 0..7: the first block, 8..15: the second).
#include <cstring>

#include "client/worker/weights/ggml_types.h"
#include "client/worker/weights/qdot.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "client/worker/weights/x86_blocks.h"

namespace polykv::worker {
namespace {

using x86::Half;
using x86::Nibbles16;
using x86::FifthBits;

inline __m512i LoadX2(const Q8Block& a, const Q8Block& b) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.q)), 1);
}

inline __m512 Scales2(float a, float b) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(a)), _mm256_set1_ps(b), 1);
}

int Sum(const Q8Block& x) { return x.sum[0] + x.sum[1]; }

template <int kKind>  // 0: q4_0, 1: q4_1, 2: q5_0, 3: q5_1
inline __m256i LegacyWeights(const uint8_t* row) {
  constexpr bool kMin = kKind == 1 || kKind == 3;
  const uint8_t* p = row + (kMin ? 4 : 2);
  if constexpr (kKind >= 2) {
    return _mm256_or_si256(Nibbles16(p + 4), FifthBits(p));
  } else {
    return Nibbles16(p);
  }
}

template <int kKind>
float DotLegacy(const uint8_t* row, const Q8Block* x, int ncols) {
  constexpr bool kMin = kKind == 1 || kKind == 3;
  constexpr int kBytes = 2 + (kMin ? 2 : 0) + (kKind >= 2 ? 4 : 0) + 16;
  constexpr int kOffset = kMin ? 0 : (kKind >= 2 ? 16 : 8);
  const int nb = ncols / 32;
  __m512 acc = _mm512_setzero_ps();
  float bias = 0.0f;
  int b = 0;
  for (; b + 1 < nb; b += 2, row += 2 * kBytes) {
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(LegacyWeights<kKind>(row)),
                                         LegacyWeights<kKind>(row + kBytes), 1);
    const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, LoadX2(x[b], x[b + 1]));
    const float d0 = Half(row) * x[b].d, d1 = Half(row + kBytes) * x[b + 1].d;
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), Scales2(d0, d1), acc);
    if constexpr (kMin) {
      bias += Half(row + 2) * x[b].d * static_cast<float>(Sum(x[b])) +
              Half(row + kBytes + 2) * x[b + 1].d * static_cast<float>(Sum(x[b + 1]));
    } else {
      bias -= d0 * static_cast<float>(kOffset * Sum(x[b])) +
              d1 * static_cast<float>(kOffset * Sum(x[b + 1]));
    }
  }
  float tail = 0.0f;
  if (b < nb) tail = qdot_internal::Avx2Kernel(static_cast<uint32_t>(
                         kKind == 0 ? GgmlType::kQ4_0 : kKind == 1 ? GgmlType::kQ4_1
                         : kKind == 2 ? GgmlType::kQ5_0 : GgmlType::kQ5_1))(row, x + b, 32);
  return _mm512_reduce_add_ps(acc) + bias + tail;
}

float DotQ8_0(const uint8_t* row, const Q8Block* x, int ncols) {
  const int nb = ncols / 32;
  __m512 acc = _mm512_setzero_ps();
  int b = 0;
  for (; b + 1 < nb; b += 2, row += 68) {
    const __m512i w = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 36)), 1);
    const __m512i xq = LoadX2(x[b], x[b + 1]);
    // |w| as unsigned, the sign moved onto x (vpdpbusd is u8 x s8).
    const __mmask64 neg = _mm512_movepi8_mask(w);
    const __m512i aw = _mm512_abs_epi8(w);
    const __m512i sx = _mm512_mask_sub_epi8(xq, neg, _mm512_setzero_si512(), xq);
    const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), aw, sx);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                          Scales2(Half(row) * x[b].d, Half(row + 34) * x[b + 1].d), acc);
  }
  float tail = 0.0f;
  if (b < nb) tail = qdot_internal::Avx2Kernel(static_cast<uint32_t>(GgmlType::kQ8_0))(row, x + b, 32);
  return _mm512_reduce_add_ps(acc) + tail;
}

template <bool kFive>
float DotQ45K(const uint8_t* row, const Q8Block* x, int ncols) {
  using namespace kquant;
  constexpr int kBytes = kFive ? kQ5KBytes : kQ4KBytes;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc = _mm512_setzero_ps();
  float bias = 0.0f;
  for (int sb = 0; sb < ncols / kQkK; ++sb, row += kBytes, x += 8) {
    const float d = Half(row), dmin = Half(row + 2);
    const uint8_t* scales = row + (kFive ? kQ5KScales : kQ4KScales);
    const uint8_t* q = row + (kFive ? kQ5KQs : kQ4KQs);
    uint32_t qh[8];
    if constexpr (kFive) std::memcpy(qh, row + kQ5KQh, 32);
    uint8_t sc[8], m[8];
    for (int s = 0; s < 8; ++s) KQuantScaleMin(s, scales, &sc[s], &m[s]);
    for (int j = 0; j < 4; ++j, q += 32) {
      // Sub-blocks 2j (low nibbles) and 2j+1 (high nibbles) in one register.
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      __m512i w = _mm512_and_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(bytes), _mm256_srli_epi16(bytes, 4), 1), m4);
      if constexpr (kFive) {
        // Bit (2j) of qh byte l goes to element l, bit (2j+1) to element 32+l.
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
        const __m256i lo = _mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j));
        const __m256i hi = _mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j + 1));
        const __m512i bits = _mm512_and_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8(1));
        w = _mm512_or_si512(w, _mm512_slli_epi16(bits, 4));
      }
      const int s0 = 2 * j, s1 = 2 * j + 1;
      const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, LoadX2(x[s0], x[s1]));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                            Scales2(d * sc[s0] * x[s0].d, d * sc[s1] * x[s1].d), acc);
      bias -= dmin * m[s0] * x[s0].d * static_cast<float>(Sum(x[s0])) +
              dmin * m[s1] * x[s1].d * static_cast<float>(Sum(x[s1]));
    }
  }
  return _mm512_reduce_add_ps(acc) + bias;
}

float DotQ6K(const uint8_t* row, const Q8Block* x, int ncols) {
  using namespace kquant;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m2 = _mm512_set1_epi8(0x03);
  __m512 acc = _mm512_setzero_ps();
  float bias = 0.0f;
  for (int sb = 0; sb < ncols / kQkK; ++sb, row += kQ6KBytes, x += 8) {
    const float d = Half(row + kQ6KD);
    const int8_t* sc = reinterpret_cast<const int8_t*>(row + kQ6KScales);
    for (int n = 0; n < 2; ++n) {
      // Quarters k = 0 and 1 (low nibbles of ql[0..32) and ql[32..64)), then 2 and 3.
      const __m512i ql = _mm512_loadu_si512(row + 64 * n);
      const __m256i qh256 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + kQ6KQh + 32 * n));
      const __m512i qh = _mm512_inserti64x4(_mm512_castsi256_si512(qh256),
                                            _mm256_srli_epi16(qh256, 2), 1);
      for (int pair = 0; pair < 2; ++pair) {
        const __m512i low = pair == 0 ? _mm512_and_si512(ql, m4)
                                      : _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
        const __m512i high = _mm512_slli_epi16(
            _mm512_and_si512(_mm512_srl_epi16(qh, _mm_cvtsi32_si128(4 * pair)), m2), 4);
        const __m512i w = _mm512_or_si512(low, high);
        const int k0 = 2 * pair, k1 = 2 * pair + 1;
        const Q8Block& x0 = x[n * 4 + k0];
        const Q8Block& x1 = x[n * 4 + k1];
        // Per 16 elements a scale: multiply in int32 lanes (4 lanes = 16 bytes).
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, LoadX2(x0, x1));
        const __m512i lane_scale = _mm512_set_epi32(
            sc[8 * n + 2 * k1 + 1], sc[8 * n + 2 * k1 + 1], sc[8 * n + 2 * k1 + 1], sc[8 * n + 2 * k1 + 1],
            sc[8 * n + 2 * k1], sc[8 * n + 2 * k1], sc[8 * n + 2 * k1], sc[8 * n + 2 * k1],
            sc[8 * n + 2 * k0 + 1], sc[8 * n + 2 * k0 + 1], sc[8 * n + 2 * k0 + 1], sc[8 * n + 2 * k0 + 1],
            sc[8 * n + 2 * k0], sc[8 * n + 2 * k0], sc[8 * n + 2 * k0], sc[8 * n + 2 * k0]);
        const __m512i ps = _mm512_mullo_epi32(p, lane_scale);
        const float d0 = d * x0.d, d1 = d * x1.d;
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ps), Scales2(d0, d1), acc);
        bias -= d0 * static_cast<float>(32 * (sc[8 * n + 2 * k0] * x0.sum[0] + sc[8 * n + 2 * k0 + 1] * x0.sum[1])) +
                d1 * static_cast<float>(32 * (sc[8 * n + 2 * k1] * x1.sum[0] + sc[8 * n + 2 * k1 + 1] * x1.sum[1]));
      }
    }
  }
  return _mm512_reduce_add_ps(acc) + bias;
}

}  // namespace

namespace qdot_internal {
RowDotFn Avx512Kernel(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ4_0: return DotLegacy<0>;
    case GgmlType::kQ4_1: return DotLegacy<1>;
    case GgmlType::kQ5_0: return DotLegacy<2>;
    case GgmlType::kQ5_1: return DotLegacy<3>;
    case GgmlType::kQ8_0: return DotQ8_0;
    case GgmlType::kQ4_K: return DotQ45K<false>;
    case GgmlType::kQ5_K: return DotQ45K<true>;
    case GgmlType::kQ6_K: return DotQ6K;
    default: return nullptr;
  }
}
}  // namespace qdot_internal

}  // namespace polykv::worker

#else  // Not x86-64: no kernels of this ISA.
namespace polykv::worker::qdot_internal {
RowDotFn Avx512Kernel(uint32_t) { return nullptr; }
}  // namespace polykv::worker::qdot_internal
#endif
