// AVX2 (+FMA, F16C) weight-row dot products; this file alone is compiled with
// -mavx2 -mfma -mf16c and is only called after BestIsa() saw those flags.
// Weight quants are unsigned bytes (the offsets -8/-16/-32 are folded into the
// activation block sums), so one vpmaddubsw multiplies 32 of them with the
// int8 activations; Q8_0's signed weights use the sign trick.
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

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 int32 partial sums of w[i] * x[i] over 32 bytes (w unsigned <= 127 or
// <= 64 with signs, x signed).
inline __m256i DotBytes(__m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

inline __m256i LoadX(const Q8Block& x) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q));
}

int Sum(const Q8Block& x) { return x.sum[0] + x.sum[1]; }

template <int kKind>  // 0: q4_0, 1: q4_1, 2: q5_0, 3: q5_1
float DotLegacy(const uint8_t* row, const Q8Block* x, int ncols) {
  constexpr bool kMin = kKind == 1 || kKind == 3;
  constexpr bool kFive = kKind >= 2;
  constexpr int kBytes = 2 + (kMin ? 2 : 0) + (kFive ? 4 : 0) + 16;
  constexpr int kOffset = kMin ? 0 : (kFive ? 16 : 8);
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  for (int b = 0; b < ncols / 32; ++b, row += kBytes) {
    const uint8_t* p = row + (kMin ? 4 : 2);
    __m256i w;
    if constexpr (kFive) {
      w = _mm256_or_si256(Nibbles16(p + 4), FifthBits(p));
    } else {
      w = Nibbles16(p);
    }
    const float dd = Half(row) * x[b].d;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DotBytes(w, LoadX(x[b]))), _mm256_set1_ps(dd), acc);
    if constexpr (kMin) {
      bias += Half(row + 2) * x[b].d * static_cast<float>(Sum(x[b]));
    } else {
      bias -= dd * static_cast<float>(kOffset * Sum(x[b]));
    }
  }
  return HorizontalSum(acc) + bias;
}

float DotQ8_0(const uint8_t* row, const Q8Block* x, int ncols) {
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < ncols / 32; ++b, row += 34) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2));
    const __m256i xq = LoadX(x[b]);
    const __m256i p = DotBytes(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(Half(row) * x[b].d), acc);
  }
  return HorizontalSum(acc);
}

template <bool kFive>
float DotQ45K(const uint8_t* row, const Q8Block* x, int ncols) {
  using namespace kquant;
  constexpr int kBytes = kFive ? kQ5KBytes : kQ4KBytes;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  for (int sb = 0; sb < ncols / kQkK; ++sb, row += kBytes, x += 8) {
    const float d = Half(row), dmin = Half(row + 2);
    const uint8_t* scales = row + (kFive ? kQ5KScales : kQ4KScales);
    const uint8_t* q = row + (kFive ? kQ5KQs : kQ4KQs);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + kQ5KQh));
    for (int j = 0; j < 4; ++j, q += 32) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      __m256i w[2] = {_mm256_and_si256(bytes, m4),
                      _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4)};
      for (int half = 0; half < 2; ++half) {
        const int sub = 2 * j + half;
        if constexpr (kFive) {
          const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(sub)), one);
          w[half] = _mm256_or_si256(w[half], _mm256_slli_epi16(bit, 4));
        }
        uint8_t sc, m;
        KQuantScaleMin(sub, scales, &sc, &m);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(w[half], LoadX(x[sub])),
                                            _mm256_set1_epi16(sc));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * x[sub].d), acc);
        bias -= dmin * m * x[sub].d * static_cast<float>(Sum(x[sub]));
      }
    }
  }
  return HorizontalSum(acc) + bias;
}

float DotQ6K(const uint8_t* row, const Q8Block* x, int ncols) {
  using namespace kquant;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m2 = _mm256_set1_epi8(0x03);
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.0f;
  for (int sb = 0; sb < ncols / kQkK; ++sb, row += kQ6KBytes, x += 8) {
    const float d = Half(row + kQ6KD);
    const int8_t* sc = reinterpret_cast<const int8_t*>(row + kQ6KScales);
    for (int n = 0; n < 2; ++n) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 64 * n));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 64 * n + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + kQ6KQh + 32 * n));
      const __m256i lows[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
      for (int k = 0; k < 4; ++k) {
        const Q8Block& xb = x[n * 4 + k];
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), m2), 4);
        const __m256i w = _mm256_or_si256(lows[k], high);
        const int sa = sc[8 * n + 2 * k], sbb = sc[8 * n + 2 * k + 1];
        const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(sbb)),
                                               _mm_set1_epi16(static_cast<int16_t>(sa)));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, LoadX(xb)), scale);
        const float dd = d * xb.d;
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dd), acc);
        bias -= dd * static_cast<float>(32 * (sa * xb.sum[0] + sbb * xb.sum[1]));
      }
    }
  }
  return HorizontalSum(acc) + bias;
}

}  // namespace

namespace qdot_internal {
RowDotFn Avx2Kernel(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ4_0: return DotLegacy<0>;
    case GgmlType::kQ4_1: return DotLegacy<1>;
    case GgmlType::kQ5_0: return DotLegacy<2>;
    case GgmlType::kQ5_1: return DotLegacy<3>;
    case GgmlType::kQ8_0: return DotQ8_0;
    case GgmlType::kQ4_K: return DotQ45K<false>;
    case GgmlType::kQ5_K: return DotQ45K<true>;
    case GgmlType::kQ6_K: return DotQ6K;
    default: return nullptr;  // q8_k: the reference.
  }
}
}  // namespace qdot_internal

}  // namespace polykv::worker

#else  // Not x86-64: no kernels of this ISA.
namespace polykv::worker::qdot_internal {
RowDotFn Avx2Kernel(uint32_t) { return nullptr; }
}  // namespace polykv::worker::qdot_internal
#endif
