#include "client/worker/qmatvec.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace polykv::worker {
namespace {

// Compiled for AVX2+FMA and for the x86-64 baseline; the loader picks one at
// run time (the project builds for plain x86-64).
#if defined(__x86_64__) && defined(__GNUC__)
#define POLYKV_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define POLYKV_CLONES
#endif

// One row of 4-bit blocks: sum_b scale_b * sum_j q_bj x_bj + min_b * xsum_b.
// Lane-wise accumulators (no reduction inside the loop) so the compiler
// vectorizes without reassociating float sums.
POLYKV_CLONES float DotQ4(const uint8_t* q, const float* scales, const float* mins,
                          const float* x, const float* xsum, int nblocks) {
  float acc[16] = {};
  float min_acc = 0.0f;
  for (int b = 0; b < nblocks; ++b, q += 16, x += 32) {
    const float d = scales[b];
    for (int j = 0; j < 16; ++j) {
      acc[j] += d * (static_cast<float>(q[j] & 0x0F) * x[j] +
                     static_cast<float>(q[j] >> 4) * x[j + 16]);
    }
    min_acc += mins[b] * xsum[b];
  }
  float s = min_acc;
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

POLYKV_CLONES float DotQ8(const int8_t* q, const float* scales, const float* x, int nblocks) {
  float acc[32] = {};
  for (int b = 0; b < nblocks; ++b, q += 32, x += 32) {
    const float d = scales[b];
    for (int j = 0; j < 32; ++j) acc[j] += d * (static_cast<float>(q[j]) * x[j]);
  }
  float s = 0.0f;
  for (int j = 0; j < 32; ++j) s += acc[j];
  return s;
}

float Half(const uint8_t* p) {
  float f;
  uint16_t h;
  std::memcpy(&h, p, 2);
  // Reuse the exact conversion of Dequantize on a one-element f16 tensor.
  (void)Dequantize(static_cast<uint32_t>(GgmlType::kF16), &h, 1, &f);
  return f;
}

}  // namespace

bool QMatrix::Supports(uint32_t type) {
  return type == static_cast<uint32_t>(GgmlType::kQ4_0) ||
         type == static_cast<uint32_t>(GgmlType::kQ4_1) ||
         type == static_cast<uint32_t>(GgmlType::kQ8_0);
}

absl::StatusOr<QMatrix> QMatrix::FromGguf(const GgufTensorInfo& t,
                                          const std::vector<int>* row_order) {
  if (!Supports(t.type) || t.dims.size() != 2 || t.dims[0] % 32 != 0 || t.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, " (", GgmlTypeName(t.type), ") cannot be used for quantized matvec"));
  }
  QMatrix m;
  m.type_ = t.type;
  m.cols_ = static_cast<int>(t.dims[0]);
  m.rows_ = static_cast<int>(t.dims[1]);
  if (row_order != nullptr && static_cast<int>(row_order->size()) != m.rows_) {
    return absl::InvalidArgumentError("row order size mismatch");
  }
  int be = 0, bb = 0;
  GgmlBlockInfo(t.type, &be, &bb);
  const int nb = m.cols_ / 32;
  const size_t row_bytes = static_cast<size_t>(nb) * bb;
  const bool q8 = t.type == static_cast<uint32_t>(GgmlType::kQ8_0);
  const bool q4_1 = t.type == static_cast<uint32_t>(GgmlType::kQ4_1);
  m.scales_.resize(static_cast<size_t>(m.rows_) * nb);
  if (!q8) m.mins_.resize(m.scales_.size());
  m.quants_.resize(static_cast<size_t>(m.rows_) * nb * (q8 ? 32 : 16));
  for (int r = 0; r < m.rows_; ++r) {
    const int src_row = row_order != nullptr ? (*row_order)[r] : r;
    const uint8_t* src = t.data + static_cast<size_t>(src_row) * row_bytes;
    for (int b = 0; b < nb; ++b, src += bb) {
      const size_t i = static_cast<size_t>(r) * nb + b;
      m.scales_[i] = Half(src);
      if (q8) {
        std::memcpy(&m.quants_[i * 32], src + 2, 32);
      } else if (q4_1) {
        m.mins_[i] = Half(src + 2);
        std::memcpy(&m.quants_[i * 16], src + 4, 16);
      } else {  // q4_0: x = (q - 8) * d = q * d + (-8 d)
        m.mins_[i] = -8.0f * m.scales_[i];
        std::memcpy(&m.quants_[i * 16], src + 2, 16);
      }
    }
  }
  return m;
}

void QMatrix::MatVec(const float* x, float* y, bool accumulate) const {
  const int nb = cols_ / 32;
  if (type_ == static_cast<uint32_t>(GgmlType::kQ8_0)) {
    const int8_t* q = reinterpret_cast<const int8_t*>(quants_.data());
    for (int r = 0; r < rows_; ++r) {
      const float d = DotQ8(q + static_cast<size_t>(r) * nb * 32, &scales_[static_cast<size_t>(r) * nb], x, nb);
      y[r] = accumulate ? y[r] + d : d;
    }
    return;
  }
  std::vector<float> xsum(nb);
  for (int b = 0; b < nb; ++b) {
    float s = 0.0f;
    for (int j = 0; j < 32; ++j) s += x[b * 32 + j];
    xsum[b] = s;
  }
  for (int r = 0; r < rows_; ++r) {
    const size_t i = static_cast<size_t>(r) * nb;
    const float d = DotQ4(&quants_[i * 16], &scales_[i], &mins_[i], x, xsum.data(), nb);
    y[r] = accumulate ? y[r] + d : d;
  }
}

}  // namespace polykv::worker
