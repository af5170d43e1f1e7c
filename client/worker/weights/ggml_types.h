// GGML tensor element types as GGUF files store them: block layouts, sizes
// and the scalar reference dequantization. Every kernel over quantized weights
// (weights/qdot*.cc, weight_matrix.cc) is tested against Dequantize, and
// Dequantize against gguf-py's (tests/fixtures/worker/qwen_dequant_cases.jsonl).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"

namespace polykv::worker {

// Wire values are GGML's (ggml.h `enum ggml_type`).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};

// Elements per K-quant super-block.
inline constexpr int kQkK = 256;

// Name for messages ("q4_k"); "type#N" for types this reader does not know.
std::string GgmlTypeName(uint32_t type);

// Elements per quantization block and bytes per block; false for unsupported
// types.
bool GgmlBlockInfo(uint32_t type, int* block_elems, int* block_bytes);

// Dequantizes `n` elements (n a multiple of the type's block size) from `src`
// to f32, with GGML's formulas in GGML's order of float operations (so the
// result equals ggml's and gguf-py's bit for bit).
// REQUIRES: `src` holds n / block_elems * block_bytes bytes.
absl::Status Dequantize(uint32_t type, const void* src, int64_t n, float* dst);

// IEEE half / bfloat16 to float, exact.
float HalfToFloat(uint16_t h);
inline float BF16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline float LoadHalf(const uint8_t* p) { return HalfToFloat(LoadU16(p)); }

// K-quant (Q4_K, Q5_K) 6-bit scale and min of sub-block j in [0, 8) from the
// 12 packed bytes `q` (ggml's get_scale_min_k4).
inline void KQuantScaleMin(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Byte offsets inside the K-quant super-blocks (ggml's block_q*_K structs).
namespace kquant {
// Q4_K: f16 d, f16 dmin, u8 scales[12], u8 qs[128].
inline constexpr int kQ4KScales = 4, kQ4KQs = 16, kQ4KBytes = 144;
// Q5_K: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128].
inline constexpr int kQ5KScales = 4, kQ5KQh = 16, kQ5KQs = 48, kQ5KBytes = 176;
// Q6_K: u8 ql[128], u8 qh[64], i8 scales[16], f16 d.
inline constexpr int kQ6KQh = 128, kQ6KScales = 192, kQ6KD = 208, kQ6KBytes = 210;
// Q8_K: f32 d, i8 qs[256], i16 bsums[16].
inline constexpr int kQ8KQs = 4, kQ8KBytes = 292;
}  // namespace kquant

}  // namespace polykv::worker
