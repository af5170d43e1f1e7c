// Scalar reference of the weight-row dot products (qdot.h): integer sums per
// activation block, then one float multiply-add per block. The wide kernels
// are tested against these.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "client/worker/weights/ggml_types.h"
#include "client/worker/weights/qdot.h"

namespace polykv::worker {

void QuantizeQ8(const float* x, int n, Q8Block* out) {
  for (int b = 0; b < n / 32; ++b, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    Q8Block& o = out[b];
    o.d = d;
    int s0 = 0, s1 = 0;
    for (int j = 0; j < 32; ++j) {
      o.q[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
      (j < 16 ? s0 : s1) += o.q[j];
    }
    o.sum[0] = static_cast<int16_t>(s0);
    o.sum[1] = static_cast<int16_t>(s1);
  }
}

namespace {

int Sum(const Q8Block& x) { return x.sum[0] + x.sum[1]; }

float DotQ4_0(const uint8_t* row, const Q8Block* x, int ncols) {
  float acc = 0.0f;
  for (int b = 0; b < ncols / 32; ++b, row += 18) {
    const uint8_t* qs = row + 2;
    int s = 0;
    for (int j = 0; j < 16; ++j) s += (qs[j] & 0xF) * x[b].q[j] + (qs[j] >> 4) * x[b].q[j + 16];
    acc += LoadHalf(row) * x[b].d * static_cast<float>(s - 8 * Sum(x[b]));
  }
  return acc;
}

float DotQ4_1(const uint8_t* row, const Q8Block* x, int ncols) {
  float acc = 0.0f;
  for (int b = 0; b < ncols / 32; ++b, row += 20) {
    const uint8_t* qs = row + 4;
    int s = 0;
    for (int j = 0; j < 16; ++j) s += (qs[j] & 0xF) * x[b].q[j] + (qs[j] >> 4) * x[b].q[j + 16];
    acc += LoadHalf(row) * x[b].d * static_cast<float>(s) +
           LoadHalf(row + 2) * x[b].d * static_cast<float>(Sum(x[b]));
  }
  return acc;
}

template <bool kWithMin>
float DotQ5(const uint8_t* row, const Q8Block* x, int ncols) {
  constexpr int kBytes = kWithMin ? 24 : 22;
  float acc = 0.0f;
  for (int b = 0; b < ncols / 32; ++b, row += kBytes) {
    const uint8_t* p = row + (kWithMin ? 4 : 2);
    uint32_t qh;
    std::memcpy(&qh, p, 4);
    const uint8_t* qs = p + 4;
    int s = 0;
    for (int j = 0; j < 16; ++j) {
      const int w0 = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int w1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      s += w0 * x[b].q[j] + w1 * x[b].q[j + 16];
    }
    if (kWithMin) {
      acc += LoadHalf(row) * x[b].d * static_cast<float>(s) +
             LoadHalf(row + 2) * x[b].d * static_cast<float>(Sum(x[b]));
    } else {
      acc += LoadHalf(row) * x[b].d * static_cast<float>(s - 16 * Sum(x[b]));
    }
  }
  return acc;
}

float DotQ8_0(const uint8_t* row, const Q8Block* x, int ncols) {
  float acc = 0.0f;
  for (int b = 0; b < ncols / 32; ++b, row += 34) {
    const int8_t* qs = reinterpret_cast<const int8_t*>(row + 2);
    int s = 0;
    for (int j = 0; j < 32; ++j) s += qs[j] * x[b].q[j];
    acc += LoadHalf(row) * x[b].d * static_cast<float>(s);
  }
  return acc;
}

template <bool kFive>
float DotQ45K(const uint8_t* row, const Q8Block* x, int ncols) {
  using namespace kquant;
  constexpr int kBytes = kFive ? kQ5KBytes : kQ4KBytes;
  float acc = 0.0f;
  for (int sb = 0; sb < ncols / kQkK; ++sb, row += kBytes, x += 8) {
    const float d = LoadHalf(row), dmin = LoadHalf(row + 2);
    const uint8_t* scales = row + (kFive ? kQ5KScales : kQ4KScales);
    const uint8_t* q = row + (kFive ? kQ5KQs : kQ4KQs);
    const uint8_t* qh = row + kQ5KQh;
    for (int j = 0; j < 4; ++j, q += 32) {
      for (int half = 0; half < 2; ++half) {
        const int sub = 2 * j + half;
        uint8_t sc, m;
        KQuantScaleMin(sub, scales, &sc, &m);
        int s = 0;
        for (int l = 0; l < 32; ++l) {
          int w = half == 0 ? (q[l] & 0xF) : (q[l] >> 4);
          if (kFive) w |= ((qh[l] >> sub) & 1) << 4;
          s += w * x[sub].q[l];
        }
        acc += d * sc * x[sub].d * static_cast<float>(s) -
               dmin * m * x[sub].d * static_cast<float>(Sum(x[sub]));
      }
    }
  }
  return acc;
}

float DotQ6K(const uint8_t* row, const Q8Block* x, int ncols) {
  using namespace kquant;
  float acc = 0.0f;
  for (int sb = 0; sb < ncols / kQkK; ++sb, row += kQ6KBytes) {
    const float d = LoadHalf(row + kQ6KD);
    const int8_t* sc = reinterpret_cast<const int8_t*>(row + kQ6KScales);
    for (int n = 0; n < 2; ++n) {
      const uint8_t* ql = row + 64 * n;
      const uint8_t* qh = row + kQ6KQh + 32 * n;
      for (int k = 0; k < 4; ++k) {
        const Q8Block& xb = x[sb * 8 + n * 4 + k];
        int s[2] = {0, 0};
        for (int l = 0; l < 32; ++l) {
          const uint8_t lo = k & 1 ? ql[l + 32] : ql[l];
          const int w = ((k < 2 ? lo & 0xF : lo >> 4) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
          s[l / 16] += w * xb.q[l];
        }
        const int total = sc[8 * n + 2 * k] * s[0] + sc[8 * n + 2 * k + 1] * s[1];
        acc += d * xb.d * static_cast<float>(total);
      }
    }
  }
  return acc;
}

float DotQ8K(const uint8_t* row, const Q8Block* x, int ncols) {
  float acc = 0.0f;
  for (int sb = 0; sb < ncols / kQkK; ++sb, row += kquant::kQ8KBytes) {
    float d;
    std::memcpy(&d, row, 4);
    const int8_t* qs = reinterpret_cast<const int8_t*>(row + kquant::kQ8KQs);
    for (int b = 0; b < 8; ++b) {
      int s = 0;
      for (int j = 0; j < 32; ++j) s += qs[32 * b + j] * x[sb * 8 + b].q[j];
      acc += d * x[sb * 8 + b].d * static_cast<float>(s);
    }
  }
  return acc;
}

}  // namespace

namespace qdot_internal {
RowDotFn RefKernel(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ4_0: return DotQ4_0;
    case GgmlType::kQ4_1: return DotQ4_1;
    case GgmlType::kQ5_0: return DotQ5<false>;
    case GgmlType::kQ5_1: return DotQ5<true>;
    case GgmlType::kQ8_0: return DotQ8_0;
    case GgmlType::kQ4_K: return DotQ45K<false>;
    case GgmlType::kQ5_K: return DotQ45K<true>;
    case GgmlType::kQ6_K: return DotQ6K;
    case GgmlType::kQ8_K: return DotQ8K;
    default: return nullptr;
  }
}
}  // namespace qdot_internal

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

Isa BestIsa() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const Isa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
      return Isa::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
      return Isa::kAvx2;
    }
    return Isa::kScalar;
  }();
  return best;
#else
  return Isa::kScalar;
#endif
}

RowDotFn RowDot(uint32_t type, Isa isa) {
  RowDotFn f = nullptr;
  if (isa >= Isa::kAvx512) f = qdot_internal::Avx512Kernel(type);
  if (f == nullptr && isa >= Isa::kAvx2) f = qdot_internal::Avx2Kernel(type);
  if (f == nullptr) f = qdot_internal::RefKernel(type);
  return f;
}

}  // namespace polykv::worker
