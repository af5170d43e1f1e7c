// Matrix-vector products straight from the GGUF's quantized weights, for the
// decode step (one token): decoding is bound by reading the weights, and
// Q4_1 blocks are ~6x fewer bytes than their f32 expansion. The arithmetic is
// exact dequantization (x = q * d + m, as Dequantize) with f32 accumulation,
// so results equal the f32 path up to summation order. Prefill (many tokens)
// stays on OpenBLAS sgemm over the f32 weights.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "client/worker/gguf.h"

namespace polykv::worker {

// A [rows, cols] weight matrix in its GGUF block format, repacked for speed:
// per-block scales (and minimums) as f32, quants contiguous.
class QMatrix {
 public:
  // Supported: q4_0, q4_1, q8_0. REQUIRES: cols % 32 == 0.
  // `row_order` (optional, size rows): output row r takes source row row_order[r].
  static absl::StatusOr<QMatrix> FromGguf(const GgufTensorInfo& t,
                                          const std::vector<int>* row_order = nullptr);
  static bool Supports(uint32_t type);

  int rows() const { return rows_; }
  int cols() const { return cols_; }

  // y[r] = dot(row r, x) + (accumulate ? y[r] : 0) for r in [0, rows).
  // x: [cols]; y: [rows].
  void MatVec(const float* x, float* y, bool accumulate) const;

 private:
  uint32_t type_ = 0;
  int rows_ = 0, cols_ = 0;
  std::vector<float> scales_;   // [rows * cols / 32]
  std::vector<float> mins_;     // q4_1: [rows * cols / 32]; q4_0: the constant -8 * scale.
  std::vector<uint8_t> quants_; // q4: [rows * cols / 2] nibbles; q8_0: [rows * cols] int8.
};

}  // namespace polykv::worker
