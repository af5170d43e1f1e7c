// The VNNI layout, per page and KV head (T = 64 tokens, D = 128 channels):
//
//   keys:   4 tiles of 16 tokens x 16 runs j of 64 bytes; byte 4*tt + k of run
//           j holds channel 8j+k of token tt in its low nibble and channel
//           8j+4+k in its high nibble. One vpdpbusd of a run's low (high)
//           nibbles against 4 query bytes broadcast adds 4 channels' products
//           to each of the tile's 16 tokens: no horizontal sums.
//   values: 8 groups of 8 tokens x 8 runs of 16 channels; byte 4*cc + k of a
//           run holds token k of the group in its low nibble and token 4+k in
//           its high nibble, for channel 16*run + cc. One vpdpbusd against 4
//           probability bytes adds 4 tokens to each of 16 channels.
//
// Keys are quantized per channel (x = code * scale_c + zero_c), so
// q . k = sum_c (q_c scale_c) code_c + sum_c q_c zero_c: the first sum runs on
// int8 q_c scale_c (one scale per page, query head); values per token and 32
// channels, so p . v = sum_t (p_t scale_t) code_t + sum_t p_t zero_t: the
// first on 7-bit p_t scale_t (one scale per page, query head, value group).
#include "bench/int_decode_proto.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/numeric.h"
#include "kernels/page_layout.h"

namespace polykv::bench {
namespace {

using kernels::KvKind;
using kernels::PageFormat;
constexpr int kT = IntDecodePages::kTokens, kD = IntDecodePages::kHeadDim;
constexpr int kGroups = kD / IntDecodePages::kGroup;
constexpr size_t kCodeBytes = size_t(kT) * kD / 2;  // one head of one page

int Nibble(const uint8_t* page, size_t i) { return i % 2 == 0 ? page[i / 2] & 15 : page[i / 2] >> 4; }

void Param(const uint8_t* page, size_t data_bytes, size_t index, float* scale, float* zero) {
  uint16_t s, z;
  std::memcpy(&s, page + data_bytes + 4 * index, 2);
  std::memcpy(&z, page + data_bytes + 4 * index + 2, 2);
  *scale = kernels::F16ToF32(s);
  *zero = kernels::F16ToF32(z);
}

#define POLYKV_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni,fma")))

// e^x for x <= 0 (scores minus their running max), to ~1e-7 relative.
POLYKV_VNNI __m512 Exp(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(y, n);
}

// 16 floats rounded to int8 (they are within +-127) at `dst`.
POLYKV_VNNI void StoreInt8(int8_t* dst, __m512 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(x)));
}

POLYKV_VNNI __m512i Broadcast4(const int8_t* p) {
  int32_t w;
  std::memcpy(&w, p, 4);
  return _mm512_set1_epi32(w);
}

// Online softmax state and output of one query head.
struct Head {
  __m512 o[kD / 16];
  float m = -std::numeric_limits<float>::infinity(), l = 0;
};

template <ProbBits kProbs, bool kFineQuery>
POLYKV_VNNI void DecodeKvHead(const IntDecodePages& p, int h, const float* q, float* out) {
  constexpr int kG = 4;  // query heads per KV head
  const float sm = 1.f / std::sqrt(float(kD));
  const __m512i low = _mm512_set1_epi8(15);
  Head heads[kG];
  for (Head& x : heads) {
    for (__m512& v : x.o) v = _mm512_setzero_ps();
  }
  alignas(64) int8_t qi[kG][kD], qlo[kG][kD];  // 7 bits, or 14's high half and low
  alignas(64) float s[kG][kT];
  alignas(64) int8_t wi[kG][kGroups][kT], wlo[kG][kGroups][kT];  // 7 bits, or 14's high half
  alignas(64) float wf[kG][kGroups][kT];                             // kFloat
  float sq[kG], zq[kG], sw[kG][kGroups], zs[kG][kGroups];
  for (int pg = 0; pg < p.num_pages; ++pg) {
    const size_t base = size_t(pg) * p.num_kv_heads + h;
    const float* ks = p.kscale.data() + base * kD;
    const float* kz = p.kzero.data() + base * kD;
    // The query folded with the page's key scales, as int8.
    for (int g = 0; g < kG; ++g) {
      const float* qq = q + size_t(g) * kD;
      __m512 qs[kD / 16], amax = _mm512_setzero_ps(), zacc = _mm512_setzero_ps();
      for (int c = 0; c < kD / 16; ++c) {
        const __m512 qv = _mm512_loadu_ps(qq + 16 * c);
        qs[c] = _mm512_mul_ps(qv, _mm512_loadu_ps(ks + 16 * c));
        amax = _mm512_max_ps(amax, _mm512_abs_ps(qs[c]));
        zacc = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kz + 16 * c), zacc);
      }
      const float mx = _mm512_reduce_max_ps(amax);
      sq[g] = mx > 0 ? mx / (kFineQuery ? 8191.f : 127.f) : 1.f;
      const __m512 inv = _mm512_set1_ps(1.f / sq[g]);
      for (int c = 0; c < kD / 16; ++c) {
        if constexpr (kFineQuery) {
          // A signed 14-bit code as hi * 128 + lo, hi in [-64, 63], lo in [0, 127].
          const __m512i qv = _mm512_cvtps_epi32(_mm512_mul_ps(qs[c], inv));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(qi[g] + 16 * c),
                           _mm512_cvtsepi32_epi8(_mm512_srai_epi32(qv, 7)));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(qlo[g] + 16 * c),
                           _mm512_cvtsepi32_epi8(_mm512_and_si512(qv, _mm512_set1_epi32(127))));
        } else {
          StoreInt8(qi[g] + 16 * c, _mm512_mul_ps(qs[c], inv));
        }
      }
      zq[g] = _mm512_reduce_add_ps(zacc);
    }
    // Scores, 16 tokens at a time.
    const uint8_t* kc = p.kcode.data() + base * kCodeBytes;
    for (int tile = 0; tile < kT / 16; ++tile) {
      __m512i acc[kG], acc_lo[kG];
      for (int g = 0; g < kG; ++g) acc[g] = acc_lo[g] = _mm512_setzero_si512();
      for (int j = 0; j < kD / 8; ++j) {
        const __m512i v = _mm512_loadu_si512(kc + (tile * (kD / 8) + j) * 64);
        const __m512i lo = _mm512_and_si512(v, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        for (int g = 0; g < kG; ++g) {
          acc[g] = _mm512_dpbusd_epi32(acc[g], lo, Broadcast4(qi[g] + 8 * j));
          acc[g] = _mm512_dpbusd_epi32(acc[g], hi, Broadcast4(qi[g] + 8 * j + 4));
          if constexpr (kFineQuery) {
            acc_lo[g] = _mm512_dpbusd_epi32(acc_lo[g], lo, Broadcast4(qlo[g] + 8 * j));
            acc_lo[g] = _mm512_dpbusd_epi32(acc_lo[g], hi, Broadcast4(qlo[g] + 8 * j + 4));
          }
        }
      }
      for (int g = 0; g < kG; ++g) {
        if constexpr (kFineQuery) acc[g] = _mm512_add_epi32(_mm512_slli_epi32(acc[g], 7), acc_lo[g]);
        _mm512_store_ps(s[g] + 16 * tile,
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[g]), _mm512_set1_ps(sq[g] * sm),
                                        _mm512_set1_ps(zq[g] * sm)));
      }
    }
    // Online softmax; the probabilities folded with the value scales.
    const float* vs = p.vscale.data() + base * kGroups * kT;
    const float* vz = p.vzero.data() + base * kGroups * kT;
    for (int g = 0; g < kG; ++g) {
      Head& x = heads[g];
      __m512 mv = _mm512_load_ps(s[g]);
      for (int t = 1; t < kT / 16; ++t) mv = _mm512_max_ps(mv, _mm512_load_ps(s[g] + 16 * t));
      const float mn = std::max(x.m, _mm512_reduce_max_ps(mv));
      const float alpha = std::exp(x.m - mn);
      x.m = mn;
      for (__m512& v : x.o) v = _mm512_mul_ps(v, _mm512_set1_ps(alpha));
      __m512 pv[kT / 16], lsum = _mm512_setzero_ps();
      for (int t = 0; t < kT / 16; ++t) {
        pv[t] = Exp(_mm512_sub_ps(_mm512_load_ps(s[g] + 16 * t), _mm512_set1_ps(mn)));
        lsum = _mm512_add_ps(lsum, pv[t]);
      }
      x.l = x.l * alpha + _mm512_reduce_add_ps(lsum);
      for (int gr = 0; gr < kGroups; ++gr) {
        __m512 w[kT / 16], amax = _mm512_setzero_ps(), zacc = _mm512_setzero_ps();
        for (int t = 0; t < kT / 16; ++t) {
          w[t] = _mm512_mul_ps(pv[t], _mm512_loadu_ps(vs + gr * kT + 16 * t));
          amax = _mm512_max_ps(amax, _mm512_abs_ps(w[t]));
          zacc = _mm512_fmadd_ps(pv[t], _mm512_loadu_ps(vz + gr * kT + 16 * t), zacc);
        }
        zs[g][gr] = _mm512_reduce_add_ps(zacc);
        if constexpr (kProbs == ProbBits::kFloat) {
          for (int t = 0; t < kT / 16; ++t) _mm512_store_ps(wf[g][gr] + 16 * t, w[t]);
          continue;
        }
        const float mx = _mm512_reduce_max_ps(amax);
        const float levels = kProbs == ProbBits::k7 ? 127.f : 16383.f;
        sw[g][gr] = mx > 0 ? mx / levels : 1.f;
        const __m512 inv = _mm512_set1_ps(1.f / sw[g][gr]);
        for (int t = 0; t < kT / 16; ++t) {
          const __m512i wq = _mm512_cvtps_epi32(_mm512_mul_ps(w[t], inv));
          if constexpr (kProbs == ProbBits::k7) {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(wi[g][gr] + 16 * t),
                             _mm512_cvtsepi32_epi8(wq));
          } else {
            // 14 bits as two 7-bit halves, each its own vpdpbusd.
            _mm_storeu_si128(reinterpret_cast<__m128i*>(wi[g][gr] + 16 * t),
                             _mm512_cvtsepi32_epi8(_mm512_srli_epi32(wq, 7)));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(wlo[g][gr] + 16 * t),
                             _mm512_cvtsepi32_epi8(_mm512_and_si512(wq, _mm512_set1_epi32(127))));
          }
        }
      }
    }
    // Values, 16 channels at a time.
    const uint8_t* vc = p.vcode.data() + base * kCodeBytes;
    for (int run = 0; run < kD / 16; ++run) {
      const int gr = run * 16 / IntDecodePages::kGroup;
      if constexpr (kProbs == ProbBits::kFloat) {
        __m512 acc[kG];
        for (__m512& a : acc) a = _mm512_setzero_ps();
        for (int tg = 0; tg < kT / 8; ++tg) {
          const __m512i v = _mm512_loadu_si512(vc + (tg * (kD / 16) + run) * 64);
          for (int k = 0; k < 8; ++k) {  // token tg*8 + k: byte k % 4, nibble k / 4
            const __m512 code = _mm512_cvtepi32_ps(
                _mm512_and_si512(_mm512_srli_epi32(v, 8 * (k % 4) + 4 * (k / 4)),
                                 _mm512_set1_epi32(15)));
            const int t = tg * 8 + (k % 4) + 4 * (k / 4);
            for (int g = 0; g < kG; ++g) {
              acc[g] = _mm512_fmadd_ps(code, _mm512_set1_ps(wf[g][gr][t]), acc[g]);
            }
          }
        }
        for (int g = 0; g < kG; ++g) {
          heads[g].o[run] = _mm512_add_ps(_mm512_add_ps(heads[g].o[run], acc[g]),
                                          _mm512_set1_ps(zs[g][gr]));
        }
        continue;
      }
      __m512i acc[kG], acc_lo[kG];
      for (int g = 0; g < kG; ++g) acc[g] = acc_lo[g] = _mm512_setzero_si512();
      for (int tg = 0; tg < kT / 8; ++tg) {
        const __m512i v = _mm512_loadu_si512(vc + (tg * (kD / 16) + run) * 64);
        const __m512i lo = _mm512_and_si512(v, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        for (int g = 0; g < kG; ++g) {
          acc[g] = _mm512_dpbusd_epi32(acc[g], lo, Broadcast4(wi[g][gr] + 8 * tg));
          acc[g] = _mm512_dpbusd_epi32(acc[g], hi, Broadcast4(wi[g][gr] + 8 * tg + 4));
          if constexpr (kProbs == ProbBits::k14) {
            acc_lo[g] = _mm512_dpbusd_epi32(acc_lo[g], lo, Broadcast4(wlo[g][gr] + 8 * tg));
            acc_lo[g] = _mm512_dpbusd_epi32(acc_lo[g], hi, Broadcast4(wlo[g][gr] + 8 * tg + 4));
          }
        }
      }
      for (int g = 0; g < kG; ++g) {
        if constexpr (kProbs == ProbBits::k14) {
          acc[g] = _mm512_add_epi32(_mm512_slli_epi32(acc[g], 7), acc_lo[g]);
        }
        heads[g].o[run] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[g]), _mm512_set1_ps(sw[g][gr]),
                            _mm512_add_ps(heads[g].o[run], _mm512_set1_ps(zs[g][gr])));
      }
    }
  }
  for (int g = 0; g < kG; ++g) {
    const __m512 inv = _mm512_set1_ps(1.f / heads[g].l);
    for (int c = 0; c < kD / 16; ++c) {
      _mm512_storeu_ps(out + size_t(g) * kD + 16 * c, _mm512_mul_ps(heads[g].o[c], inv));
    }
  }
}

}  // namespace

IntDecodePages RepackInt4(const uint8_t* k_pages, size_t k_page_bytes, const uint8_t* v_pages,
                          size_t v_page_bytes, int num_pages, int num_kv_heads) {
  const kernels::PageGeom geom{kT, num_kv_heads, kD};
  const size_t data_bytes = geom.DataBytes(PageFormat::kInt4);  // keys' and values'
  IntDecodePages p;
  p.num_pages = num_pages;
  p.num_kv_heads = num_kv_heads;
  const size_t heads = size_t(num_pages) * num_kv_heads;
  p.kcode.resize(heads * kCodeBytes);
  p.vcode.resize(heads * kCodeBytes);
  p.kscale.resize(heads * kD);
  p.kzero.resize(heads * kD);
  p.vscale.resize(heads * kGroups * kT);
  p.vzero.resize(heads * kGroups * kT);
  for (int pg = 0; pg < num_pages; ++pg) {
    const uint8_t* kp = k_pages + pg * k_page_bytes;
    const uint8_t* vp = v_pages + pg * v_page_bytes;
    for (int h = 0; h < num_kv_heads; ++h) {
      const size_t base = size_t(pg) * num_kv_heads + h;
      uint8_t* kc = p.kcode.data() + base * kCodeBytes;
      for (int tile = 0; tile < kT / 16; ++tile) {
        for (int j = 0; j < kD / 8; ++j) {
          for (int tt = 0; tt < 16; ++tt) {
            for (int k = 0; k < 4; ++k) {
              const int t = tile * 16 + tt;
              kc[(tile * (kD / 8) + j) * 64 + tt * 4 + k] =
                  uint8_t(Nibble(kp, geom.ElemIndex(t, h, 8 * j + k)) |
                          Nibble(kp, geom.ElemIndex(t, h, 8 * j + 4 + k)) << 4);
            }
          }
        }
      }
      for (int d = 0; d < kD; ++d) {
        Param(kp, data_bytes, geom.ParamIndex(KvKind::kKey, 0, h, d), &p.kscale[base * kD + d],
              &p.kzero[base * kD + d]);
      }
      uint8_t* vc = p.vcode.data() + base * kCodeBytes;
      for (int tg = 0; tg < kT / 8; ++tg) {
        for (int run = 0; run < kD / 16; ++run) {
          for (int cc = 0; cc < 16; ++cc) {
            for (int k = 0; k < 4; ++k) {
              const int d = run * 16 + cc;
              vc[(tg * (kD / 16) + run) * 64 + cc * 4 + k] =
                  uint8_t(Nibble(vp, geom.ElemIndex(tg * 8 + k, h, d)) |
                          Nibble(vp, geom.ElemIndex(tg * 8 + 4 + k, h, d)) << 4);
            }
          }
        }
      }
      for (int gr = 0; gr < kGroups; ++gr) {
        for (int t = 0; t < kT; ++t) {
          const size_t at = (base * kGroups + gr) * kT + t;
          Param(vp, data_bytes, geom.ParamIndex(KvKind::kValue, t, h, gr * IntDecodePages::kGroup), &p.vscale[at],
                &p.vzero[at]);
        }
      }
    }
  }
  return p;
}

bool IntDecodeSupported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
}

void IntDecode(const IntDecodePages& p, IntDecodeMode mode, int num_q_heads, const float* q,
               float* out) {
  using Fn = void (*)(const IntDecodePages&, int, const float*, float*);
  constexpr Fn kFns[2][3] = {
      {DecodeKvHead<ProbBits::k7, false>, DecodeKvHead<ProbBits::k14, false>,
       DecodeKvHead<ProbBits::kFloat, false>},
      {DecodeKvHead<ProbBits::k7, true>, DecodeKvHead<ProbBits::k14, true>,
       DecodeKvHead<ProbBits::kFloat, true>}};
  const Fn fn = kFns[mode.query_bits == 14][static_cast<int>(mode.probs)];
  for (int h = 0; h < p.num_kv_heads; ++h) {
    const size_t at = size_t(h) * (num_q_heads / p.num_kv_heads) * kD;
    fn(p, h, q + at, out + at);
  }
}

}  // namespace polykv::bench
