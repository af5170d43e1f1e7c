// The scalar reference dequantization. Compiled with -ffp-contract=off (see
// CMakeLists.txt): a fused multiply-add would round `d1 * q - m1` once instead
// of twice and break bit-equality with ggml and gguf-py.
#include "client/worker/weights/ggml_types.h"

#include "absl/strings/str_cat.h"

namespace polykv::worker {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // Subnormal: normalize.
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

std::string GgmlTypeName(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32: return "f32";
    case GgmlType::kF16: return "f16";
    case GgmlType::kBF16: return "bf16";
    case GgmlType::kQ4_0: return "q4_0";
    case GgmlType::kQ4_1: return "q4_1";
    case GgmlType::kQ5_0: return "q5_0";
    case GgmlType::kQ5_1: return "q5_1";
    case GgmlType::kQ8_0: return "q8_0";
    case GgmlType::kQ4_K: return "q4_k";
    case GgmlType::kQ5_K: return "q5_k";
    case GgmlType::kQ6_K: return "q6_k";
    case GgmlType::kQ8_K: return "q8_k";
  }
  return absl::StrCat("type#", type);
}

bool GgmlBlockInfo(uint32_t type, int* block_elems, int* block_bytes) {
  int e = 0, b = 0;
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32: e = 1; b = 4; break;
    case GgmlType::kF16: e = 1; b = 2; break;
    case GgmlType::kBF16: e = 1; b = 2; break;
    case GgmlType::kQ4_0: e = 32; b = 2 + 16; break;
    case GgmlType::kQ4_1: e = 32; b = 2 + 2 + 16; break;
    case GgmlType::kQ5_0: e = 32; b = 2 + 4 + 16; break;
    case GgmlType::kQ5_1: e = 32; b = 2 + 2 + 4 + 16; break;
    case GgmlType::kQ8_0: e = 32; b = 2 + 32; break;
    case GgmlType::kQ4_K: e = kQkK; b = kquant::kQ4KBytes; break;
    case GgmlType::kQ5_K: e = kQkK; b = kquant::kQ5KBytes; break;
    case GgmlType::kQ6_K: e = kQkK; b = kquant::kQ6KBytes; break;
    case GgmlType::kQ8_K: e = kQkK; b = kquant::kQ8KBytes; break;
    default: return false;
  }
  *block_elems = e;
  *block_bytes = b;
  return true;
}

namespace {

// Inlined into each clone of Dequantize (a call would run the baseline copy).
#define POLYKV_BLOCK_FN inline __attribute__((always_inline))

// Each function dequantizes one block at `x` to `y` (ggml's dequantize_row_*).
POLYKV_BLOCK_FN void BlockQ4_0(const uint8_t* x, float* y) {
  // f16 d, 16 bytes of nibbles: low nibbles are elements 0..15, high 16..31.
  const float d = LoadHalf(x);
  const uint8_t* qs = x + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = (static_cast<int>(qs[j] & 0xf) - 8) * d;
    y[j + 16] = (static_cast<int>(qs[j] >> 4) - 8) * d;
  }
}

POLYKV_BLOCK_FN void BlockQ4_1(const uint8_t* x, float* y) {
  const float d = LoadHalf(x), m = LoadHalf(x + 2);
  const uint8_t* qs = x + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = (qs[j] & 0xf) * d + m;
    y[j + 16] = (qs[j] >> 4) * d + m;
  }
}

// Q5_0 / Q5_1: the fifth bit of element j is bit j of the 32-bit qh.
// Integers first, then one float pass: the shape the vectorizer takes.
template <bool kWithMin>
POLYKV_BLOCK_FN void BlockQ5(const uint8_t* x, float* y) {
  const float d = LoadHalf(x);
  const float m = kWithMin ? LoadHalf(x + 2) : 0.0f;
  const uint8_t* p = x + (kWithMin ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, p, sizeof(qh));
  const uint8_t* qs = p + 4;
  int32_t q[32];
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
    q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
  }
  for (int j = 0; j < 32; ++j) {
    if constexpr (kWithMin) {
      y[j] = q[j] * d + m;
    } else {
      y[j] = (q[j] - 16) * d;
    }
  }
}

POLYKV_BLOCK_FN void BlockQ8_0(const uint8_t* x, float* y) {
  const float d = LoadHalf(x);
  const int8_t* qs = reinterpret_cast<const int8_t*>(x + 2);
  for (int j = 0; j < 32; ++j) y[j] = qs[j] * d;
}

// Q4_K / Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and min.
POLYKV_BLOCK_FN void BlockQ45K(const uint8_t* x, float* y, bool five) {
  using namespace kquant;
  const float d = LoadHalf(x), dmin = LoadHalf(x + 2);
  const uint8_t* scales = x + (five ? kQ5KScales : kQ4KScales);
  const uint8_t* q = x + (five ? kQ5KQs : kQ4KQs);
  const uint8_t* qh = x + kQ5KQh;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < kQkK; j += 64, is += 2, q += 32) {
    uint8_t sc, m;
    KQuantScaleMin(is, scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    KQuantScaleMin(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) {
      const int h = five && (qh[l] & u1) ? 16 : 0;
      *y++ = d1 * ((q[l] & 0xF) + h) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int h = five && (qh[l] & u2) ? 16 : 0;
      *y++ = d2 * ((q[l] >> 4) + h) - m2;
    }
    u1 <<= 2;
    u2 <<= 2;
  }
}

POLYKV_BLOCK_FN void BlockQ6K(const uint8_t* x, float* y) {
  using namespace kquant;
  const float d = LoadHalf(x + kQ6KD);
  const uint8_t* ql = x;
  const uint8_t* qh = x + kQ6KQh;
  const int8_t* sc = reinterpret_cast<const int8_t*>(x + kQ6KScales);
  for (int n = 0; n < kQkK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
    int32_t q[128];
    for (int l = 0; l < 32; ++l) {
      q[l] = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      q[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      q[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      q[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
    }
    // y = (d * scale) * q, scale per 16 elements: ggml's order of operations.
    for (int g = 0; g < 8; ++g) {
      const float ds = d * sc[g];
      for (int l = 0; l < 16; ++l) y[16 * g + l] = ds * q[16 * g + l];
    }
  }
}

POLYKV_BLOCK_FN void BlockQ8K(const uint8_t* x, float* y) {
  float d;
  std::memcpy(&d, x, sizeof(d));
  const int8_t* qs = reinterpret_cast<const int8_t*>(x + kquant::kQ8KQs);
  for (int j = 0; j < kQkK; ++j) y[j] = d * qs[j];
}

}  // namespace

// Cloned for AVX-512 and AVX2 (chosen at load by the CPU): the same IEEE
// operations, unfused (-ffp-contract=off), so every clone gives the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
absl::Status Dequantize(uint32_t type, const void* src_v, int64_t n, float* dst) {
  const uint8_t* src = static_cast<const uint8_t*>(src_v);
  int be, bb;
  if (!GgmlBlockInfo(type, &be, &bb)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot dequantize tensor type ", GgmlTypeName(type)));
  }
  if (n % be != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        n, " elements is not a multiple of the ", GgmlTypeName(type), " block (", be, ")"));
  }
  const int64_t num_blocks = n / be;
  const auto t = static_cast<GgmlType>(type);
  if (t == GgmlType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return absl::OkStatus();
  }
  for (int64_t b = 0; b < num_blocks; ++b, src += bb, dst += be) {
    switch (t) {
      case GgmlType::kF16: *dst = LoadHalf(src); break;
      case GgmlType::kBF16: *dst = BF16ToFloat(LoadU16(src)); break;
      case GgmlType::kQ4_0: BlockQ4_0(src, dst); break;
      case GgmlType::kQ4_1: BlockQ4_1(src, dst); break;
      case GgmlType::kQ5_0: BlockQ5<false>(src, dst); break;
      case GgmlType::kQ5_1: BlockQ5<true>(src, dst); break;
      case GgmlType::kQ8_0: BlockQ8_0(src, dst); break;
      case GgmlType::kQ4_K: BlockQ45K(src, dst, false); break;
      case GgmlType::kQ5_K: BlockQ45K(src, dst, true); break;
      case GgmlType::kQ6_K: BlockQ6K(src, dst); break;
      case GgmlType::kQ8_K: BlockQ8K(src, dst); break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("cannot dequantize tensor type ", GgmlTypeName(type)));
    }
  }
  return absl::OkStatus();
}

}  // namespace polykv::worker
