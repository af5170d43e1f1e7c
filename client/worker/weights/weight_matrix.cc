#include "client/worker/weights/weight_matrix.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/thread_pool.h"

namespace polykv::worker {
namespace {

// Rows per parallel work item of a matvec: enough to amortize the hand-out,
// few enough that two threads balance.
constexpr int kMatVecRows = 64;
// Rows of a dequantized prefill tile: tile (kTileRows x cols floats, <= 2.3
// MiB at 8960 columns) stays in a core's L2 while sgemm reads it.
constexpr int kTileRows = 64;

float DotF32(const float* a, const float* b, int n) {
  float acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = 0.0f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (float v : acc) s += v;
  return s;
}

kernels::cpu::ThreadPool& Pool() { return kernels::cpu::ThreadPool::Shared(); }

}  // namespace

absl::StatusOr<WeightMatrix> WeightMatrix::FromGguf(const GgufTensorInfo& t) {
  int be = 0, bb = 0;
  if (t.dims.size() != 2 || t.data == nullptr || !GgmlBlockInfo(t.type, &be, &bb) ||
      t.dims[0] % be != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, " (", GgmlTypeName(t.type), ", ", t.dims.size(),
        "-D) cannot be used as a weight matrix"));
  }
  WeightMatrix m;
  m.data_ = t.data;
  m.name_ = t.name.c_str();
  m.type_ = t.type;
  m.cols_ = static_cast<int>(t.dims[0]);
  m.rows_ = static_cast<int>(t.dims[1]);
  m.row_bytes_ = static_cast<size_t>(m.cols_ / be) * bb;
  m.blocks_per_row_ = m.cols_ / be;
  m.dequant_ = DequantKernel(t.type, BestIsa());
  if (m.cols_ % 32 == 0) m.dot_ = RowDot(t.type, BestIsa());
  return m;
}

void WeightMatrix::DequantizeRows(int first, int count, float* out) const {
  if (dequant_ != nullptr) {
    dequant_(data_ + static_cast<size_t>(first) * row_bytes_, blocks_per_row_ * count, out);
    return;
  }
  // Cannot fail: type and sizes were checked in FromGguf.
  (void)Dequantize(type_, data_ + static_cast<size_t>(first) * row_bytes_,
                   static_cast<int64_t>(count) * cols_, out);
}

void WeightMatrix::MatVec(const float* x, float* y, bool accumulate, Activations mode,
                          int threads) const {
  MatVecBatch(x, 1, y, accumulate, mode, threads);
}

void WeightMatrix::MatVecBatch(const float* x, int n, float* y, bool accumulate,
                               Activations mode, int threads) const {
  const int items = (rows_ + kMatVecRows - 1) / kMatVecRows;
  const auto out = [&](int b, int r, float d) {
    float& dst = y[static_cast<size_t>(b) * rows_ + r];
    dst = accumulate ? dst + d : d;
  };
  if (dot_ != nullptr && mode == Activations::kInt8) {
    // Each vector quantized once, then every row dotted with all of them.
    // Per calling thread, reused: a decode step runs ~170 matvecs. The pool's
    // threads read it through `blocks` (a name of a thread_local inside the
    // lambda would be the executing thread's own) while this call waits.
    thread_local std::vector<Q8Block> xq;
    const size_t per = static_cast<size_t>(cols_ / 32);
    xq.resize(per * n);
    for (int b = 0; b < n; ++b) {
      QuantizeQ8(x + static_cast<size_t>(b) * cols_, cols_, xq.data() + b * per);
    }
    const Q8Block* blocks = xq.data();
    Pool().ParallelFor(items, threads, [&](int item) {
      const int r1 = std::min(rows_, (item + 1) * kMatVecRows);
      for (int r = item * kMatVecRows; r < r1; ++r) {
        const uint8_t* row = data_ + static_cast<size_t>(r) * row_bytes_;
        for (int b = 0; b < n; ++b) out(b, r, dot_(row, blocks + b * per, cols_));
      }
    });
    return;
  }
  Pool().ParallelFor(items, threads, [&](int item) {
    thread_local std::vector<float> w;
    w.resize(cols_);
    const int r1 = std::min(rows_, (item + 1) * kMatVecRows);
    for (int r = item * kMatVecRows; r < r1; ++r) {
      DequantizeRows(r, 1, w.data());
      for (int b = 0; b < n; ++b) {
        out(b, r, DotF32(w.data(), x + static_cast<size_t>(b) * cols_, cols_));
      }
    }
  });
}

void WeightMatrix::MatMul(const float* x, int n, float* y, float beta, int threads) const {
  const int items = (rows_ + kTileRows - 1) / kTileRows;
  Pool().ParallelFor(items, threads, [&](int item) {
    thread_local std::vector<float> tile;
    const int r0 = item * kTileRows;
    const int count = std::min(kTileRows, rows_ - r0);
    tile.resize(static_cast<size_t>(count) * cols_);
    DequantizeRows(r0, count, tile.data());
    // Y[:, r0:r0+count] = X . tile^T + beta * Y[:, r0:r0+count]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, count, cols_, 1.0f, x, cols_,
                tile.data(), cols_, beta, y + r0, rows_);
  });
}

}  // namespace polykv::worker
