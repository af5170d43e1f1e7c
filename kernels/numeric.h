// Scalar number formats shared by host and device code: f16, bf16 and
// fp8-e4m3 conversions, written with integer bit manipulation so that the CPU
// reference, the fast CPU path and the CUDA kernels produce the same bits.
//
// All conversions from f32 round to nearest, ties to even. fp8-e4m3 is the OCP
// "e4m3fn" encoding (bias 7, no infinities, max finite 448, NaN = 0x7f/0xff);
// encoding saturates to +-448 instead of producing NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define POLYKV_HD __host__ __device__ __forceinline__
#else
#define POLYKV_HD inline
#endif

namespace polykv::kernels {

POLYKV_HD uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

POLYKV_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// ---- f16 (IEEE binary16) ----

POLYKV_HD uint16_t F32ToF16(float f) {
  const uint32_t x = FloatToBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return uint16_t(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to +-inf
  if (ax < 0x38800000u) {
    // Below 2^-14: f16 subnormal m * 2^-24. Scaling by 2^24 is exact, so the
    // rounding of rintf (ties to even) is the only rounding step.
    const uint32_t m = uint32_t(rintf(BitsToFloat(ax) * 16777216.0f));
    return uint16_t(sign | m);  // m == 1024 encodes the smallest normal
  }
  uint32_t r = ax - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

POLYKV_HD float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float v = float(m) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (e == 31) return BitsToFloat(sign | 0x7f800000u | (m << 13));
  return BitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}

// Smallest f16 >= f (for finite f within the f16 range).
POLYKV_HD uint16_t F32ToF16Up(float f) {
  uint16_t h = F32ToF16(f);
  if (F16ToF32(h) < f) {
    if (h == 0x8000u) return 0x0001u;
    h = (h & 0x8000u) ? uint16_t(h - 1) : uint16_t(h + 1);
  }
  return h;
}

// Largest f16 <= f (for finite f within the f16 range).
POLYKV_HD uint16_t F32ToF16Down(float f) {
  uint16_t h = F32ToF16(f);
  if (F16ToF32(h) > f) {
    if (h == 0x0000u) return 0x8001u;
    h = (h & 0x8000u) ? uint16_t(h + 1) : uint16_t(h - 1);
  }
  return h;
}

// ---- bf16 ----

POLYKV_HD uint16_t F32ToBF16(float f) {
  uint32_t x = FloatToBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

POLYKV_HD float BF16ToF32(uint16_t h) { return BitsToFloat(uint32_t(h) << 16); }

// ---- fp8 e4m3 (OCP e4m3fn) ----

inline constexpr float kFp8E4M3Max = 448.0f;

POLYKV_HD uint8_t F32ToFp8E4M3(float f) {
  const uint32_t x = FloatToBits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7fu;                         // NaN
  if (ax >= 0x43e00000u) return uint8_t(sign | 0x7eu);        // >= 448: saturate
  if (ax < 0x3c800000u) {                                     // < 2^-6: subnormal m * 2^-9
    const uint32_t m = uint32_t(rintf(BitsToFloat(ax) * 512.0f));
    return uint8_t(sign | m);  // m == 8 encodes the smallest normal
  }
  uint32_t r = ax - (120u << 23);  // rebias exponent 127 -> 7
  r += 0x7ffffu + ((r >> 20) & 1u);
  uint32_t v = r >> 20;
  if (v > 0x7eu) v = 0x7eu;
  return uint8_t(sign | v);
}

POLYKV_HD float Fp8E4M3ToF32(uint8_t v) {
  const uint32_t e = (v >> 3) & 0xfu;
  const uint32_t m = v & 7u;
  float r;
  if (e == 0) {
    r = float(m) * (1.0f / 512.0f);
  } else if (e == 15 && m == 7) {
    r = BitsToFloat(0x7fc00000u);
  } else {
    r = BitsToFloat(((e + 120u) << 23) | (m << 20));
  }
  return (v & 0x80u) ? -r : r;
}

}  // namespace polykv::kernels
