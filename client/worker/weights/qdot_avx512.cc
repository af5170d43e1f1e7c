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

inline float HorizontalSum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}


// The activation side of one super-block (8 blocks of 32): d and d * sum of
// each block as 8 floats, gathered once per super-block instead of 8 scalar
// conversions in the inner loop.
static_assert(sizeof(Q8Block) == 40, "the gathers below step 10 floats per block");
inline void GatherBlocks(const Q8Block* x, __m256* d, __m256i* sums) {
  const __m256i vindex = _mm256_setr_epi32(0, 10, 20, 30, 40, 50, 60, 70);
  *d = _mm256_i32gather_ps(&x[0].d, vindex, 4);
  // Each int32 holds the block's two int16 half sums (sum[0] low, sum[1] high).
  *sums = _mm256_i32gather_epi32(reinterpret_cast<const int*>(x[0].sum), vindex, 4);
}

// Lanes 0..7 take factor 2j, lanes 8..15 factor 2j+1 of an 8-float vector.
inline __m512i PickPair(int j) {
  return _mm512_add_epi32(_mm512_set1_epi32(2 * j),
                          _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
}

// The f16 fields at p + i * stride, i in [0, 8), as 8 floats.
inline __m256 GatherHalves(const uint8_t* p, int stride) {
  const __m256i offsets = _mm256_mullo_epi32(_mm256_set1_epi32(stride),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i raw = _mm256_i32gather_epi32(reinterpret_cast<const int*>(p), offsets, 1);
  return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(raw));  // The low 16 bits of each.
}

inline __m256 BlockSums(__m256i raw) {
  return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_srai_epi32(_mm256_slli_epi32(raw, 16), 16),
                                             _mm256_srai_epi32(raw, 16)));
}

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
  __m256 bias = _mm256_setzero_ps();
  int b = 0;
  // Eight blocks at a time: their scales (and mins) and the activation
  // factors as vectors, the products two blocks per vpdpbusd.
  for (; b + 8 <= nb; b += 8, row += 8 * kBytes) {
    __m256 xd;
    __m256i raw;
    GatherBlocks(x + b, &xd, &raw);
    const __m256 dd = _mm256_mul_ps(GatherHalves(row, kBytes), xd);
    if constexpr (kMin) {
      bias = _mm256_fmadd_ps(_mm256_mul_ps(GatherHalves(row + 2, kBytes), xd), BlockSums(raw), bias);
    } else {
      bias = _mm256_fnmadd_ps(dd, _mm256_mul_ps(_mm256_set1_ps(kOffset), BlockSums(raw)), bias);
    }
    const __m512 dd512 = _mm512_castps256_ps512(dd);
    for (int j = 0; j < 4; ++j) {
      const uint8_t* r = row + 2 * j * kBytes;
      const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(LegacyWeights<kKind>(r)),
                                           LegacyWeights<kKind>(r + kBytes), 1);
      const __m512i p =
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, LoadX2(x[b + 2 * j], x[b + 2 * j + 1]));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(PickPair(j), dd512), acc);
    }
  }
  float tail = 0.0f;
  if (b < nb) {
    tail = qdot_internal::Avx2Kernel(static_cast<uint32_t>(
        kKind == 0 ? GgmlType::kQ4_0 : kKind == 1 ? GgmlType::kQ4_1
        : kKind == 2 ? GgmlType::kQ5_0 : GgmlType::kQ5_1))(row, x + b, (nb - b) * 32);
  }
  return _mm512_reduce_add_ps(acc) + HorizontalSum8(bias) + tail;
}

float DotQ8_0(const uint8_t* row, const Q8Block* x, int ncols) {
  const int nb = ncols / 32;
  __m512 acc = _mm512_setzero_ps();
  int b = 0;
  for (; b + 8 <= nb; b += 8, row += 8 * 34) {
    __m256 xd;
    __m256i raw;
    GatherBlocks(x + b, &xd, &raw);
    const __m512 dd512 = _mm512_castps256_ps512(_mm256_mul_ps(GatherHalves(row, 34), xd));
    for (int j = 0; j < 4; ++j) {
      const uint8_t* r = row + 2 * j * 34;
      const __m512i w = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 2))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 36)), 1);
      const __m512i xq = LoadX2(x[b + 2 * j], x[b + 2 * j + 1]);
      // |w| as unsigned, the sign moved onto x (vpdpbusd is u8 x s8).
      const __mmask64 neg = _mm512_movepi8_mask(w);
      const __m512i sx = _mm512_mask_sub_epi8(xq, neg, _mm512_setzero_si512(), xq);
      const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), sx);
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(PickPair(j), dd512), acc);
    }
  }
  float tail = 0.0f;
  if (b < nb) {
    tail = qdot_internal::Avx2Kernel(static_cast<uint32_t>(GgmlType::kQ8_0))(row, x + b,
                                                                           (nb - b) * 32);
  }
  return _mm512_reduce_add_ps(acc) + tail;
}

// The 8 six-bit scales and 8 mins of a Q4_K/Q5_K super-block as bytes
// (out[0..8) scales, out[8..16) mins): KQuantScaleMin for all j at once.
inline void UnpackScalesMins(const uint8_t* packed, uint32_t out[4]) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, packed, 12);
  out[0] = u[0] & kLow6;
  out[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  out[2] = u[1] & kLow6;
  out[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
}

inline __m256 BytesToFloats(const uint32_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

template <bool kFive>
float DotQ45K(const uint8_t* row, const Q8Block* x, int ncols) {
  using namespace kquant;
  constexpr int kBytes = kFive ? kQ5KBytes : kQ4KBytes;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc = _mm512_setzero_ps();
  __m256 bias = _mm256_setzero_ps();
  for (int sb = 0; sb < ncols / kQkK; ++sb, row += kBytes, x += 8) {
    const float d = Half(row), dmin = Half(row + 2);
    const uint8_t* q = row + (kFive ? kQ5KQs : kQ4KQs);
    uint32_t sm[4];
    UnpackScalesMins(row + (kFive ? kQ5KScales : kQ4KScales), sm);
    __m256 xd;
    __m256i raw;
    GatherBlocks(x, &xd, &raw);
    // - dmin * m_j * d_j * sum_j, all j.
    bias = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), BytesToFloats(sm + 2)),
                           _mm256_mul_ps(xd, BlockSums(raw)), bias);
    // d * sc_j * d_j, all j, picked per lane below.
    const __m512 scale = _mm512_castps256_ps512(
        _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d), BytesToFloats(sm)), xd));
    for (int j = 0; j < 4; ++j, q += 32) {
      // Sub-blocks 2j (low nibbles) and 2j+1 (high nibbles) in one register.
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      __m512i w = _mm512_and_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(bytes), _mm256_srli_epi16(bytes, 4), 1), m4);
      if constexpr (kFive) {
        // Bit (2j) of qh byte l goes to element l, bit (2j+1) to element 32+l.
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + kQ5KQh));
        const __m256i lo = _mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j));
        const __m256i hi = _mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j + 1));
        const __m512i bits = _mm512_and_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8(1));
        w = _mm512_or_si512(w, _mm512_slli_epi16(bits, 4));
      }
      const __m512i p =
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, LoadX2(x[2 * j], x[2 * j + 1]));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(PickPair(j), scale), acc);
    }
  }
  return _mm512_reduce_add_ps(acc) - HorizontalSum8(bias);
}

float DotQ6K(const uint8_t* row, const Q8Block* x, int ncols) {
  using namespace kquant;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m2 = _mm512_set1_epi8(0x03);
  // For half n and pair p (quarters 2p, 2p+1): lane l's 16-element scale is
  // scale index 8n + 4p + l/4, its activation block 4n + 2p + l/8.
  static constexpr auto kPicks = [] {
    struct { alignas(64) int32_t scale[2][2][16]; alignas(64) int32_t block[2][2][16]; } t{};
    for (int n = 0; n < 2; ++n) {
      for (int p = 0; p < 2; ++p) {
        for (int l = 0; l < 16; ++l) {
          t.scale[n][p][l] = 8 * n + 4 * p + l / 4;
          t.block[n][p][l] = 4 * n + 2 * p + l / 8;
        }
      }
    }
    return t;
  }();
  // Activation block b's two half sums sit at lanes 2b, 2b+1 after widening;
  // its d is duplicated onto both.
  const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  __m512 acc = _mm512_setzero_ps();
  __m512 bias = _mm512_setzero_ps();
  for (int sb = 0; sb < ncols / kQkK; ++sb, row += kQ6KBytes, x += 8) {
    const float d = Half(row + kQ6KD);
    const __m512i sc = _mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + kQ6KScales)));
    __m256 xd;
    __m256i raw;
    GatherBlocks(x, &xd, &raw);
    const __m512 dd = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(d), xd));
    // The -32 offset: 32 * d * d_b * (sum over both halves of scale * half sum).
    const __m512i half_sums = _mm512_cvtepi16_epi32(raw);
    bias = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(sc, half_sums)),
                           _mm512_mul_ps(_mm512_set1_ps(32.0f), _mm512_permutexvar_ps(dup, dd)), bias);
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
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w,
                                              LoadX2(x[n * 4 + 2 * pair], x[n * 4 + 2 * pair + 1]));
        const __m512i ps = _mm512_mullo_epi32(p, _mm512_permutexvar_epi32(_mm512_load_si512(kPicks.scale[n][pair]), sc));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ps),
                              _mm512_permutexvar_ps(_mm512_load_si512(kPicks.block[n][pair]), dd), acc);
      }
    }
  }
  return _mm512_reduce_add_ps(acc) - _mm512_reduce_add_ps(bias);
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
