// A weight matrix used in place in its GGUF encoding (no f32 copy of the
// model): decode multiplies straight from the quantized blocks (qdot.h),
// prefill dequantizes one tile of rows at a time into a per-thread buffer and
// multiplies it with OpenBLAS sgemm, so prefill logits are those of the f32
// weights exactly (up to summation order).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "client/worker/gguf.h"
#include "client/worker/weights/dequant.h"
#include "client/worker/weights/qdot.h"

namespace polykv::worker {

// How a matrix-vector product treats the activation vector.
enum class Activations {
  kInt8,  // Quantized to int8 blocks of 32 (llama.cpp's way; the fast path).
  kF32,   // Exact: each weight row dequantized and dotted in f32.
};

// A view: the GGUF file (its mapping) must outlive it. Copyable, immutable;
// every method is thread-safe.
class WeightMatrix {
 public:
  WeightMatrix() = default;
  // `t` must be 2-D with dims {cols, rows}; InvalidArgument otherwise or for
  // a type this build cannot dequantize.
  static absl::StatusOr<WeightMatrix> FromGguf(const GgufTensorInfo& t);

  int rows() const { return rows_; }
  int cols() const { return cols_; }
  uint32_t type() const { return type_; }
  size_t bytes() const { return row_bytes_ * static_cast<size_t>(rows_); }
  const char* name() const { return name_; }

  // y[r] = W[r] . x (+ y[r] when `accumulate`) for r in [0, rows).
  // x: [cols]; y: [rows]. Runs on up to `threads` threads of the shared pool
  // (0 = all).
  void MatVec(const float* x, float* y, bool accumulate, Activations mode, int threads = 0) const;

  // MatVec of n vectors at once, each weight row read once for all of them:
  // several sequences' decode steps. Row b of y is MatVec of row b of x, bit
  // for bit. x: [n, cols]; y: [n, rows].
  void MatVecBatch(const float* x, int n, float* y, bool accumulate, Activations mode,
                   int threads = 0) const;

  // Y = X . W^T + beta * Y. X: [n, cols]; Y: [n, rows] (row stride rows).
  void MatMul(const float* x, int n, float* y, float beta, int threads = 0) const;

  // out: [count, cols] = rows [first, first + count) in f32, Dequantize's bits
  // (with the widest ISA's kernel, dequant.h).
  void DequantizeRows(int first, int count, float* out) const;

 private:
  const uint8_t* data_ = nullptr;
  const char* name_ = "";
  uint32_t type_ = 0;
  int rows_ = 0, cols_ = 0;
  size_t row_bytes_ = 0;
  int64_t blocks_per_row_ = 0;
  DequantFn dequant_ = nullptr;  // nullptr: the scalar Dequantize.
  RowDotFn dot_ = nullptr;  // nullptr: no integer kernel (f32/f16/bf16).
};

}  // namespace polykv::worker
