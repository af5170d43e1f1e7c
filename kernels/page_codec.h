// Element-level encoding and decoding of pages (layout in page_layout.h).
// Every function is __host__ __device__ under nvcc, so the CPU reference, the
// fast CPU path and the CUDA kernels produce bit-identical codes and params.
//
// Quantization work is split into independent "units" that each write whole
// bytes, so a CUDA thread, a CPU loop iteration or a CPU thread can each own one:
//   float formats (f32/f16/bf16): one unit per (t, h) row;
//   scaled keys:   one unit per (h, 8 consecutive channels), over all T rows
//                  (per-channel params, KIVI-style);
//   scaled values: one unit per (t, h, group of kValueGroup channels).
// Rows at or beyond `rows` (a partially filled page) are written as zeros.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/numeric.h"
#include "kernels/page_layout.h"

namespace polykv::kernels {

inline constexpr float kF16Max = 65504.0f;

// min / max / running |max| that skip NaN, written as plain comparisons so the
// vectorizer keeps them inline (fminf/fmaxf become library calls without
// -ffinite-math-only) and every implementation gets the same answer.
POLYKV_HD float MinSkipNan(float acc, float x) { return x < acc ? x : acc; }
POLYKV_HD float MaxSkipNan(float acc, float x) { return x > acc ? x : acc; }
POLYKV_HD float AbsMaxSkipNan(float acc, float x) {
  const float ax = x < 0.0f ? -x : x;
  return ax > acc ? ax : acc;
}
inline constexpr float kPosInf = __builtin_huge_valf();

struct QuantParams {
  float scale;
  float zero;
};

POLYKV_HD const uint16_t* ParamsPtr(const uint8_t* page, const PageGeom& g, PageFormat f) {
  return reinterpret_cast<const uint16_t*>(page + g.DataBytes(f));
}

POLYKV_HD QuantParams LoadParams(const uint8_t* page, const PageGeom& g, PageFormat f,
                                 KvKind kind, int t, int h, int d) {
  const uint16_t* p = ParamsPtr(page, g, f) + 2 * g.ParamIndex(kind, t, h, d);
  return QuantParams{F16ToF32(p[0]), F16ToF32(p[1])};
}

POLYKV_HD float ClampF16Range(float x) {
  return x < -kF16Max ? -kF16Max : (x > kF16Max ? kF16Max : x);
}

// Params of an int format for values in [lo, hi]: zero rounded down and scale
// rounded up to f16, so every value in [lo, hi] encodes within scale/2.
POLYKV_HD void IntParams(float lo, float hi, int qmax, uint16_t* scale16, uint16_t* zero16) {
  if (!(lo <= hi)) lo = hi = 0.0f;  // no comparable values (all NaN)
  lo = ClampF16Range(lo);
  hi = ClampF16Range(hi);
  const uint16_t z = F32ToF16Down(lo);
  const float range = hi - F16ToF32(z);
  uint16_t s = range > 0.0f ? F32ToF16Up(range / float(qmax)) : uint16_t(0);
  if ((s & 0x7fffu) >= 0x7c00u) s = 0x7bffu;
  *scale16 = s;
  *zero16 = z;
}

// Params of fp8 for values with max |x| = amax: scale rounded up so that
// amax / scale <= 448 (no saturation).
POLYKV_HD void Fp8Params(float amax, uint16_t* scale16, uint16_t* zero16) {
  amax = amax > kF16Max ? kF16Max : amax;
  uint16_t s = amax > 0.0f ? F32ToF16Up(amax / kFp8E4M3Max) : uint16_t(0);
  if ((s & 0x7fffu) >= 0x7c00u) s = 0x7bffu;
  *scale16 = s;
  *zero16 = 0;
}

POLYKV_HD uint32_t EncodeInt(float x, float scale, float zero, int qmax) {
  if (!(scale > 0.0f)) return 0;
  float q = rintf((x - zero) / scale);
  q = q > 0.0f ? q : 0.0f;  // NaN -> 0
  q = q < float(qmax) ? q : float(qmax);
  return uint32_t(q);
}

POLYKV_HD uint32_t EncodeScaled(PageFormat f, float x, float scale, float zero) {
  if (f == PageFormat::kFP8E4M3) return scale > 0.0f ? F32ToFp8E4M3(x / scale) : 0u;
  return EncodeInt(x, scale, zero, QMax(f));
}

POLYKV_HD float DecodeScaled(PageFormat f, uint32_t code, float scale, float zero) {
  if (f == PageFormat::kFP8E4M3) return Fp8E4M3ToF32(uint8_t(code)) * scale;
  return float(code) * scale + zero;
}

// Raw code of element i of a scaled format.
POLYKV_HD uint32_t LoadCode(const uint8_t* page, PageFormat f, size_t i) {
  switch (f) {
    case PageFormat::kInt4: return (page[i >> 1] >> (4 * (i & 1))) & 0xfu;
    case PageFormat::kInt2: return (page[i >> 2] >> (2 * (i & 3))) & 0x3u;
    default: return page[i];
  }
}

// Value of element (t, h, d). Returns 0 for an invalid format.
POLYKV_HD float DecodeElem(const uint8_t* page, const PageGeom& g, PageFormat f, KvKind kind,
                           int t, int h, int d) {
  const size_t i = g.ElemIndex(t, h, d);
  switch (f) {
    case PageFormat::kF32: return reinterpret_cast<const float*>(page)[i];
    case PageFormat::kF16: return F16ToF32(reinterpret_cast<const uint16_t*>(page)[i]);
    case PageFormat::kBF16: return BF16ToF32(reinterpret_cast<const uint16_t*>(page)[i]);
    case PageFormat::kFP8E4M3:
    case PageFormat::kInt8:
    case PageFormat::kInt4:
    case PageFormat::kInt2: {
      const QuantParams p = LoadParams(page, g, f, kind, t, h, d);
      return DecodeScaled(f, LoadCode(page, f, i), p.scale, p.zero);
    }
  }
  return 0.0f;
}

// Sources of token rows for quantization: element (t, h, d) of a dense
// [rows][H][D] array.
struct F32Rows {
  const float* p;
  int num_kv_heads;
  int head_dim;
  POLYKV_HD float operator()(int t, int h, int d) const {
    return p[(size_t(t) * num_kv_heads + h) * head_dim + d];
  }
};
struct F16Rows {
  const uint16_t* p;
  int num_kv_heads;
  int head_dim;
  POLYKV_HD float operator()(int t, int h, int d) const {
    return F16ToF32(p[(size_t(t) * num_kv_heads + h) * head_dim + d]);
  }
};

inline constexpr int kKeyUnitChannels = 8;

POLYKV_HD size_t NumQuantUnits(const PageGeom& g, PageFormat f, KvKind kind) {
  if (!IsScaledFormat(f)) return size_t(g.block_tokens) * g.num_kv_heads;
  if (kind == KvKind::kKey) {
    return size_t(g.num_kv_heads) * ((g.head_dim + kKeyUnitChannels - 1) / kKeyUnitChannels);
  }
  return size_t(g.block_tokens) * g.num_kv_heads * (g.head_dim / kValueGroup);
}

// Writes elements [d0, d0 + n) of row (t, h): codes computed by `code(d)`.
// REQUIRES: d0 and n are multiples of the elements per byte of `f`, or
// d0 + n == head_dim with the row starting on a byte boundary.
template <typename CodeFn>
POLYKV_HD void StoreCodes(uint8_t* page, const PageGeom& g, PageFormat f, int t, int h, int d0,
                          int n, const CodeFn& code) {
  const int bits = BitsOf(f);
  const int per_byte = 8 / bits;
  const size_t base = g.ElemIndex(t, h, d0);
  for (int j = 0; j < n; j += per_byte) {
    uint32_t b = 0;
    for (int k = 0; k < per_byte && j + k < n; ++k) b |= code(d0 + j + k) << (bits * k);
    page[(base + j) / per_byte] = uint8_t(b);
  }
}

// Quantizes unit `unit` (see the file comment) of a page from `rows` source
// rows. REQUIRES: g.Supports(f, kind); 0 <= rows <= block_tokens.
template <typename Src>
POLYKV_HD void QuantizeUnit(const Src& src, int rows, const PageGeom& g, PageFormat f,
                            KvKind kind, uint8_t* page, size_t unit) {
  if (unit == 0) {
    // Unit 0 also zeroes the padding, so equal content gives equal page bytes
    // (the daemon content-addresses shared prefix pages).
    const size_t data_end = (g.Elems() * size_t(BitsOf(f)) + 7) / 8;
    for (size_t i = data_end; i < g.DataBytes(f); ++i) page[i] = 0;
    const size_t params_end = g.DataBytes(f) + g.NumParams(f, kind) * 4;
    for (size_t i = params_end; i < g.PageBytes(f, kind); ++i) page[i] = 0;
  }
  if (!IsScaledFormat(f)) {
    const int t = int(unit / g.num_kv_heads);
    const int h = int(unit % g.num_kv_heads);
    const size_t base = g.ElemIndex(t, h, 0);
    const bool valid = t < rows;
    for (int d = 0; d < g.head_dim; ++d) {
      const float x = valid ? src(t, h, d) : 0.0f;
      if (f == PageFormat::kF32) {
        reinterpret_cast<float*>(page)[base + d] = x;
      } else if (f == PageFormat::kF16) {
        reinterpret_cast<uint16_t*>(page)[base + d] = F32ToF16(x);
      } else {
        reinterpret_cast<uint16_t*>(page)[base + d] = F32ToBF16(x);
      }
    }
    return;
  }
  uint16_t* params = reinterpret_cast<uint16_t*>(page + g.DataBytes(f));
  const bool fp8 = f == PageFormat::kFP8E4M3;
  if (kind == KvKind::kKey) {
    const int units_per_head = (g.head_dim + kKeyUnitChannels - 1) / kKeyUnitChannels;
    const int h = int(unit / units_per_head);
    const int d0 = int(unit % units_per_head) * kKeyUnitChannels;
    const int n = g.head_dim - d0 < kKeyUnitChannels ? g.head_dim - d0 : kKeyUnitChannels;
    float scale[kKeyUnitChannels], zero[kKeyUnitChannels];
    for (int c = 0; c < n; ++c) {
      float lo = kPosInf, hi = -kPosInf, amax = 0.0f;
      for (int t = 0; t < rows; ++t) {
        const float x = src(t, h, d0 + c);
        lo = MinSkipNan(lo, x);
        hi = MaxSkipNan(hi, x);
        amax = AbsMaxSkipNan(amax, x);
      }
      uint16_t* p = params + 2 * g.ParamIndex(kind, 0, h, d0 + c);
      if (fp8) {
        Fp8Params(amax, &p[0], &p[1]);
      } else {
        IntParams(lo, hi, QMax(f), &p[0], &p[1]);
      }
      scale[c] = F16ToF32(p[0]);
      zero[c] = F16ToF32(p[1]);
    }
    for (int t = 0; t < g.block_tokens; ++t) {
      const bool valid = t < rows;
      StoreCodes(page, g, f, t, h, d0, n, [&](int d) -> uint32_t {
        return valid ? EncodeScaled(f, src(t, h, d), scale[d - d0], zero[d - d0]) : 0u;
      });
    }
    return;
  }
  const int groups = g.head_dim / kValueGroup;
  const int t = int(unit / (size_t(g.num_kv_heads) * groups));
  const int h = int(unit / groups % g.num_kv_heads);
  const int d0 = int(unit % groups) * kValueGroup;
  uint16_t* p = params + 2 * g.ParamIndex(kind, t, h, d0);
  if (t >= rows) {
    p[0] = p[1] = 0;
    StoreCodes(page, g, f, t, h, d0, kValueGroup, [](int) -> uint32_t { return 0u; });
    return;
  }
  float lo = kPosInf, hi = -kPosInf, amax = 0.0f;
  for (int d = d0; d < d0 + kValueGroup; ++d) {
    const float x = src(t, h, d);
    lo = MinSkipNan(lo, x);
    hi = MaxSkipNan(hi, x);
    amax = AbsMaxSkipNan(amax, x);
  }
  if (fp8) {
    Fp8Params(amax, &p[0], &p[1]);
  } else {
    IntParams(lo, hi, QMax(f), &p[0], &p[1]);
  }
  const float scale = F16ToF32(p[0]), zero = F16ToF32(p[1]);
  StoreCodes(page, g, f, t, h, d0, kValueGroup,
             [&](int d) -> uint32_t { return EncodeScaled(f, src(t, h, d), scale, zero); });
}

}  // namespace polykv::kernels
