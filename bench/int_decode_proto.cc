// The VNNI layout, per page and KV head (T = 64 tokens, D = 128 or 64), in
// runs of 64 bytes; int4 packs two sub-runs in a run (low and high nibbles),
// int8 one, so a run spans S = 8 (int4) or 4 (int8) channels or tokens:
//
//   keys:   4 tiles of 16 tokens x D/S runs j; byte 4*tt + k of run j holds,
//           in sub-run s, channel S*j + 4*s + k of token tt. One vpdpbusd of
//           a sub-run against 4 query bytes broadcast adds 4 channels'
//           products to each of the tile's 16 tokens: no horizontal sums.
//   values: T/S groups of S tokens x 8 runs of 16 channels; byte 4*cc + k of
//           a run holds, in sub-run s, token S*group + 4*s + k of channel
//           16*run + cc. One vpdpbusd against 4 probability bytes adds 4
//           tokens to each of 16 channels.
//
// Keys are quantized per channel (x = code * scale_c + zero_c), so
// q . k = sum_c (q_c scale_c) code_c + sum_c q_c zero_c: the first sum runs on
// q_c scale_c rounded to 7 or 14 bits and a sign (one scale per page and query
// head); values per token and 32 channels, so p . v = sum_t (p_t scale_t)
// code_t + sum_t p_t zero_t: the first on p_t scale_t rounded to 7 or 14 bits
// (one scale per page, query head and value group). 14 bits go as two 7-bit
// halves, one vpdpbusd each, recombined as hi * 128 + lo in the accumulator.
#include "bench/int_decode_proto.h"

#include <immintrin.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "kernels/page_codec.h"
#include "kernels/page_layout.h"

namespace polykv::bench {
namespace {

using kernels::KvKind;
using kernels::PageFormat;
constexpr int kT = IntDecodePages::kTokens;
// Bytes of codes of one head of one page.
constexpr size_t CodeBytes(int bits, int head_dim) { return size_t(kT) * head_dim * bits / 8; }

// The raw f16 (scale, zero) pair `index` of a page (the codec's params, not
// converted: the experiment reads them as the pages hold them).
void Param(const uint8_t* page, const kernels::PageGeom& g, PageFormat f, size_t index,
           uint16_t* scale, uint16_t* zero) {
  const uint16_t* pair = kernels::ParamsPtr(page, g, f) + 2 * index;
  *scale = pair[0];
  *zero = pair[1];
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

// Sub-run s of a 64-byte run: the codes in bits [bits*s, bits*(s+1)) of
// each byte.
template <int kBits>
POLYKV_VNNI __m512i SubRun(__m512i v, int s) {
  if constexpr (kBits == 8) return v;
  const __m512i low = _mm512_set1_epi8(15);
  return s == 0 ? _mm512_and_si512(v, low) : _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
}

POLYKV_VNNI __m512 LoadF16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Asks for `bytes` from `p` on in cache (the next page's run of this head:
// pages interleave heads, so the hardware prefetcher loses the stream).
void Prefetch(const void* p, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64) {
    _mm_prefetch(static_cast<const char*>(p) + i, _MM_HINT_T0);
  }
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
template <int kD>
struct Head {
  __m512 o[kD / 16];
  float m = -std::numeric_limits<float>::infinity(), l = 0;
};

// kD channels a head, kG query heads per KV head.
template <int kD, int kG, int kBits, ProbBits kProbs, bool kFineQuery>
POLYKV_VNNI void DecodeKvHead(const IntDecodePages& p, int h, const float* q, float* out) {
  constexpr int kGroups = kD / IntDecodePages::kGroup;
  constexpr int kPer = 8 / kBits;    // codes per byte: sub-runs per run
  constexpr int kSpan = 4 * kPer;    // channels (keys) or tokens (values) per run
  const float sm = 1.f / std::sqrt(float(kD));
  Head<kD> heads[kG];
  for (Head<kD>& x : heads) {
    for (__m512& v : x.o) v = _mm512_setzero_ps();
  }
  alignas(64) int8_t qi[kG][kD], qlo[kG][kD];  // 7 bits, or 14's high half and low
  alignas(64) float s[kG][kT];
  alignas(64) int8_t wi[kG][kGroups][kT], wlo[kG][kGroups][kT];  // 7 bits, or 14's high half
  alignas(64) float wf[kG][kGroups][kT];                             // kFloat
  float sq[kG], zq[kG], sw[kG][kGroups], zs[kG][kGroups];
  for (int pg = 0; pg < p.num_pages; ++pg) {
    const size_t base = size_t(pg) * p.num_kv_heads + h;
    const uint16_t* ks = p.kscale.data() + base * kD;
    const uint16_t* kz = p.kzero.data() + base * kD;
    const size_t next = base + (pg + 1 < p.num_pages ? p.num_kv_heads : 0);
    Prefetch(p.kscale.data() + next * kD, kD * 2);
    Prefetch(p.kzero.data() + next * kD, kD * 2);
    Prefetch(p.vscale.data() + next * kGroups * kT, kGroups * kT * 2);
    Prefetch(p.vzero.data() + next * kGroups * kT, kGroups * kT * 2);
    // The query folded with the page's key scales, as int8.
    for (int g = 0; g < kG; ++g) {
      const float* qq = q + size_t(g) * kD;
      __m512 qs[kD / 16], amax = _mm512_setzero_ps(), zacc = _mm512_setzero_ps();
      for (int c = 0; c < kD / 16; ++c) {
        const __m512 qv = _mm512_loadu_ps(qq + 16 * c);
        qs[c] = _mm512_mul_ps(qv, LoadF16(ks + 16 * c));
        amax = _mm512_max_ps(amax, _mm512_abs_ps(qs[c]));
        zacc = _mm512_fmadd_ps(qv, LoadF16(kz + 16 * c), zacc);
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
    const uint8_t* kc = p.kcode.data() + base * CodeBytes(kBits, kD);
    Prefetch(p.kcode.data() + next * CodeBytes(kBits, kD), CodeBytes(kBits, kD));
    for (int tile = 0; tile < kT / 16; ++tile) {
      __m512i acc[kG], acc_lo[kG];
      for (int g = 0; g < kG; ++g) acc[g] = acc_lo[g] = _mm512_setzero_si512();
      for (int j = 0; j < kD / kSpan; ++j) {
        const __m512i v = _mm512_loadu_si512(kc + (tile * (kD / kSpan) + j) * 64);
        for (int sub = 0; sub < kPer; ++sub) {
          const __m512i c = SubRun<kBits>(v, sub);
          const int at = kSpan * j + 4 * sub;
          for (int g = 0; g < kG; ++g) {
            acc[g] = _mm512_dpbusd_epi32(acc[g], c, Broadcast4(qi[g] + at));
            if constexpr (kFineQuery) {
              acc_lo[g] = _mm512_dpbusd_epi32(acc_lo[g], c, Broadcast4(qlo[g] + at));
            }
          }
        }
      }
      for (int g = 0; g < kG; ++g) {
        if constexpr (kFineQuery) {
          acc[g] = _mm512_add_epi32(_mm512_slli_epi32(acc[g], 7), acc_lo[g]);
        }
        _mm512_store_ps(s[g] + 16 * tile,
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[g]), _mm512_set1_ps(sq[g] * sm),
                                        _mm512_set1_ps(zq[g] * sm)));
      }
    }
    // Online softmax; the probabilities folded with the value scales.
    const uint16_t* vs = p.vscale.data() + base * kGroups * kT;
    const uint16_t* vz = p.vzero.data() + base * kGroups * kT;
    for (int g = 0; g < kG; ++g) {
      Head<kD>& x = heads[g];
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
          w[t] = _mm512_mul_ps(pv[t], LoadF16(vs + gr * kT + 16 * t));
          amax = _mm512_max_ps(amax, _mm512_abs_ps(w[t]));
          zacc = _mm512_fmadd_ps(pv[t], LoadF16(vz + gr * kT + 16 * t), zacc);
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
    const uint8_t* vc = p.vcode.data() + base * CodeBytes(kBits, kD);
    Prefetch(p.vcode.data() + next * CodeBytes(kBits, kD), CodeBytes(kBits, kD));
    for (int run = 0; run < kD / 16; ++run) {
      const int gr = run * 16 / IntDecodePages::kGroup;
      if constexpr (kProbs == ProbBits::kFloat) {
        __m512 acc[kG];
        for (__m512& a : acc) a = _mm512_setzero_ps();
        for (int tg = 0; tg < kT / kSpan; ++tg) {
          const __m512i v = _mm512_loadu_si512(vc + (tg * (kD / 16) + run) * 64);
          for (int k = 0; k < kSpan; ++k) {  // token kSpan*tg + k: byte k % 4, sub-run k / 4
            const __m512 code = _mm512_cvtepi32_ps(
                _mm512_and_si512(_mm512_srli_epi32(v, 8 * (k % 4) + kBits * (k / 4)),
                                 _mm512_set1_epi32((1 << kBits) - 1)));
            const int t = tg * kSpan + (k % 4) + 4 * (k / 4);
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
      for (int tg = 0; tg < kT / kSpan; ++tg) {
        const __m512i v = _mm512_loadu_si512(vc + (tg * (kD / 16) + run) * 64);
        for (int sub = 0; sub < kPer; ++sub) {
          const __m512i c = SubRun<kBits>(v, sub);
          const int at = kSpan * tg + 4 * sub;
          for (int g = 0; g < kG; ++g) {
            acc[g] = _mm512_dpbusd_epi32(acc[g], c, Broadcast4(wi[g][gr] + at));
            if constexpr (kProbs == ProbBits::k14) {
              acc_lo[g] = _mm512_dpbusd_epi32(acc_lo[g], c, Broadcast4(wlo[g][gr] + at));
            }
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

IntDecodePages RepackPages(PageFormat format, const uint8_t* k_pages, size_t k_page_bytes,
                           const uint8_t* v_pages, size_t v_page_bytes, int num_pages,
                           int num_kv_heads, int head_dim) {
  const int kD = head_dim, kGroups = head_dim / IntDecodePages::kGroup;
  const int bits = kernels::BitsOf(format);
  const int per = 8 / bits, span = 4 * per;
  const kernels::PageGeom geom{kT, num_kv_heads, kD};
  IntDecodePages p;
  p.bits = bits;
  p.num_pages = num_pages;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = head_dim;
  const size_t heads = size_t(num_pages) * num_kv_heads;
  p.kcode.resize(heads * CodeBytes(bits, kD));
  p.vcode.resize(heads * CodeBytes(bits, kD));
  p.kscale.resize(heads * kD);
  p.kzero.resize(heads * kD);
  p.vscale.resize(heads * kGroups * kT);
  p.vzero.resize(heads * kGroups * kT);
  for (int pg = 0; pg < num_pages; ++pg) {
    const uint8_t* kp = k_pages + pg * k_page_bytes;
    const uint8_t* vp = v_pages + pg * v_page_bytes;
    for (int h = 0; h < num_kv_heads; ++h) {
      const size_t base = size_t(pg) * num_kv_heads + h;
      uint8_t* kc = p.kcode.data() + base * CodeBytes(bits, kD);
      for (int tile = 0; tile < kT / 16; ++tile) {
        for (int j = 0; j < kD / span; ++j) {
          for (int tt = 0; tt < 16; ++tt) {
            for (int k = 0; k < 4; ++k) {
              int byte = 0;
              for (int sub = 0; sub < per; ++sub) {
                byte |= kernels::LoadCode(
                            kp, format, geom.ElemIndex(tile * 16 + tt, h, span * j + 4 * sub + k))
                        << (bits * sub);
              }
              kc[(tile * (kD / span) + j) * 64 + tt * 4 + k] = uint8_t(byte);
            }
          }
        }
      }
      for (int d = 0; d < kD; ++d) {
        Param(kp, geom, format, geom.ParamIndex(KvKind::kKey, 0, h, d), &p.kscale[base * kD + d],
              &p.kzero[base * kD + d]);
      }
      uint8_t* vc = p.vcode.data() + base * CodeBytes(bits, kD);
      for (int tg = 0; tg < kT / span; ++tg) {
        for (int run = 0; run < kD / 16; ++run) {
          for (int cc = 0; cc < 16; ++cc) {
            for (int k = 0; k < 4; ++k) {
              int byte = 0;
              for (int sub = 0; sub < per; ++sub) {
                byte |= kernels::LoadCode(
                            vp, format, geom.ElemIndex(span * tg + 4 * sub + k, h, run * 16 + cc))
                        << (bits * sub);
              }
              vc[(tg * (kD / 16) + run) * 64 + cc * 4 + k] = uint8_t(byte);
            }
          }
        }
      }
      for (int gr = 0; gr < kGroups; ++gr) {
        for (int t = 0; t < kT; ++t) {
          const size_t at = (base * kGroups + gr) * kT + t;
          Param(vp, geom, format,
                geom.ParamIndex(KvKind::kValue, t, h, gr * IntDecodePages::kGroup), &p.vscale[at],
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
  // [shape: 128 x 4, 64 x 7][bits 4, 8][query bits 7, 14][ProbBits]
  static constexpr Fn kFns[2][2][2][3] = {
#define POLYKV_MODES(D, G, B)                                                       \
  {{DecodeKvHead<D, G, B, ProbBits::k7, false>, DecodeKvHead<D, G, B, ProbBits::k14, false>, \
    DecodeKvHead<D, G, B, ProbBits::kFloat, false>},                                \
   {DecodeKvHead<D, G, B, ProbBits::k7, true>, DecodeKvHead<D, G, B, ProbBits::k14, true>,   \
    DecodeKvHead<D, G, B, ProbBits::kFloat, true>}}
      {POLYKV_MODES(128, 4, 4), POLYKV_MODES(128, 4, 8)},
      {POLYKV_MODES(64, 7, 4), POLYKV_MODES(64, 7, 8)}};
#undef POLYKV_MODES
  const int group = num_q_heads / p.num_kv_heads;
  const int shape = p.head_dim == 128 && group == 4 ? 0 : p.head_dim == 64 && group == 7 ? 1 : -1;
  if (shape < 0) {
    std::fprintf(stderr, "intdecode: head_dim %d with %d query heads a KV head is not built\n",
                 p.head_dim, group);
    std::abort();
  }
  const Fn fn = kFns[shape][p.bits == 8][mode.query_bits == 14][static_cast<int>(mode.probs)];
  for (int h = 0; h < p.num_kv_heads; ++h) {
    const size_t at = size_t(h) * group * p.head_dim;
    fn(p, h, q + at, out + at);
  }
}

}  // namespace polykv::bench
