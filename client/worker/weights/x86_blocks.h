// Unpacking helpers shared by the per-ISA weight kernels (qdot_avx2.cc,
// qdot_avx512.cc, dequant_avx2.cc, dequant_avx512.cc). Include only from
// files compiled with at least -mavx2 -mf16c: these are inline x86
// intrinsics, not part of any API.
#pragma once

#if !defined(__AVX2__) || !defined(__F16C__)
#error "x86_blocks.h needs -mavx2 -mf16c (include it only from the per-ISA kernel files)"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "client/worker/weights/ggml_types.h"

namespace polykv::worker::x86 {

// An f16 scale field to float, exact.
inline float Half(const uint8_t* p) { return _cvtsh_ss(LoadU16(p)); }

// 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high.
inline __m256i Nibbles16(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

// The 32 bits at p -> 32 bytes, byte i = 0x10 where bit i is set (a Q5
// block's fifth bits).
inline __m256i FifthBits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return _mm256_maskz_mov_epi8(static_cast<__mmask32>(bits), _mm256_set1_epi8(0x10));
#else
  const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                            0x0101010101010101, 0x0000000000000000);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuffle);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  const __m256i set = _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
#endif
}

}  // namespace polykv::worker::x86
