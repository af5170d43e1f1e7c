// The weight kernels: every ISA's integer dot product against the scalar
// reference, the reference against the dequantized f32 dot, activation
// quantization bounds, and WeightMatrix's matvec/matmul against dequantized
// rows — on random blocks of every type and on real tensors of both
// Qwen2.5-Coder files (skipped, naming the command, when they are absent).
#include "client/worker/weights/qdot.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "client/worker/conversation.h"
#include "client/worker/gguf.h"
#include "client/worker/weights/ggml_types.h"
#include "client/worker/weights/weight_matrix.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/model_files.h"

namespace polykv::worker {
namespace {

constexpr uint32_t kDotTypes[] = {2, 3, 6, 7, 8, 12, 13, 14, 15};  // q4_0 ... q8_k

uint16_t RandomHalf(std::mt19937& rng, int min_exp, int max_exp) {
  std::uniform_int_distribution<int> e(min_exp + 15, max_exp + 15), m(0, 1023);
  return static_cast<uint16_t>((e(rng) << 10) | m(rng));
}

// `blocks` random blocks of `type` with finite, moderate scales.
std::vector<uint8_t> RandomRow(uint32_t type, int blocks, std::mt19937& rng) {
  int be = 0, bb = 0;
  EXPECT_TRUE(GgmlBlockInfo(type, &be, &bb));
  std::vector<uint8_t> row(static_cast<size_t>(blocks) * bb);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : row) b = static_cast<uint8_t>(byte(rng));
  auto put_half = [&](uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); };
  for (int i = 0; i < blocks; ++i) {
    uint8_t* b = row.data() + static_cast<size_t>(i) * bb;
    switch (static_cast<GgmlType>(type)) {
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        put_half(b, RandomHalf(rng, -10, -4));
        put_half(b + 2, RandomHalf(rng, -10, -4));
        break;
      case GgmlType::kQ6_K:
        put_half(b + kquant::kQ6KD, RandomHalf(rng, -10, -4));
        break;
      case GgmlType::kQ8_K: {
        const float d = 0.01f;
        std::memcpy(b, &d, 4);
        break;
      }
      default:
        put_half(b, RandomHalf(rng, -10, -4));
    }
  }
  return row;
}

std::vector<float> RandomVector(int n, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng);
  x[n / 3] = 9.0f;  // An outlier, as real activations have.
  return x;
}

// Sum of |w_i * xq_i| over the row: the scale of float rounding differences.
double AbsScale(const std::vector<float>& w, const std::vector<Q8Block>& xq) {
  double s = 0;
  for (size_t i = 0; i < w.size(); ++i) s += std::fabs(w[i] * xq[i / 32].d * xq[i / 32].q[i % 32]);
  return s;
}

double DequantizedDot(const std::vector<float>& w, const std::vector<Q8Block>& xq) {
  double s = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    s += static_cast<double>(w[i]) * xq[i / 32].d * xq[i / 32].q[i % 32];
  }
  return s;
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out = {Isa::kScalar};
  if (BestIsa() >= Isa::kAvx2) out.push_back(Isa::kAvx2);
  if (BestIsa() >= Isa::kAvx512) out.push_back(Isa::kAvx512);
  return out;
}

TEST(QdotTest, QuantizeQ8IsWithinHalfAStep) {
  const unsigned seed = 20261201;
  std::mt19937 rng(seed);
  const std::vector<float> x = RandomVector(256, rng);
  std::vector<Q8Block> q(8);
  QuantizeQ8(x.data(), 256, q.data());
  for (int i = 0; i < 256; ++i) {
    const Q8Block& b = q[i / 32];
    EXPECT_LE(std::fabs(x[i] - b.d * b.q[i % 32]), b.d * 0.5f * 1.0001f) << "seed " << seed;
  }
  for (const Q8Block& b : q) {
    int s0 = 0, s1 = 0;
    for (int j = 0; j < 16; ++j) s0 += b.q[j], s1 += b.q[j + 16];
    EXPECT_EQ(b.sum[0], s0);
    EXPECT_EQ(b.sum[1], s1);
  }
  std::vector<float> zeros(32, 0.0f);
  QuantizeQ8(zeros.data(), 32, q.data());
  EXPECT_EQ(q[0].d, 0.0f);
  EXPECT_EQ(q[0].sum[0], 0);
}

TEST(QdotTest, EveryKernelMatchesTheDequantizedDot) {
  const unsigned seed = 7;
  std::mt19937 rng(seed);
  std::printf("best ISA here: %s\n", IsaName(BestIsa()));
  for (uint32_t type : kDotTypes) {
    int be = 0, bb = 0;
    ASSERT_TRUE(GgmlBlockInfo(type, &be, &bb));
    for (int blocks : {1, 2, 3, 7}) {
      const int ncols = blocks * be;
      SCOPED_TRACE(GgmlTypeName(type) + " x" + std::to_string(blocks) + " seed " +
                   std::to_string(seed));
      const auto row = RandomRow(type, blocks, rng);
      std::vector<float> w(ncols);
      ASSERT_TRUE(Dequantize(type, row.data(), ncols, w.data()).ok());
      const auto x = RandomVector(ncols, rng);
      std::vector<Q8Block> xq(ncols / 32);
      QuantizeQ8(x.data(), ncols, xq.data());
      const double want = DequantizedDot(w, xq);
      const double tol = 2e-6 * AbsScale(w, xq) + 1e-6;
      const float ref = qdot_internal::RefKernel(type)(row.data(), xq.data(), ncols);
      EXPECT_NEAR(ref, want, tol);
      for (Isa isa : SupportedIsas()) {
        EXPECT_NEAR(RowDot(type, isa)(row.data(), xq.data(), ncols), ref, tol) << IsaName(isa);
      }
    }
  }
}

TEST(QdotTest, TypesWithoutIntegerKernelsSayNull) {
  EXPECT_EQ(RowDot(static_cast<uint32_t>(GgmlType::kF32), BestIsa()), nullptr);
  EXPECT_EQ(RowDot(static_cast<uint32_t>(GgmlType::kF16), BestIsa()), nullptr);
  EXPECT_EQ(RowDot(99, BestIsa()), nullptr);
}

// Real tensors: each weight type of both Qwen files, a few rows per tensor.
void CheckRealTensors(const std::string& name) {
  POLYKV_REQUIRE_MODEL_FILE(file, name);
  std::mt19937 rng(11);
  std::map<uint32_t, int> seen;
  for (const auto& [tname, t] : file->tensors()) {
    if (t.dims.size() != 2 || RowDot(t.type, Isa::kScalar) == nullptr) continue;
    if (seen[t.type]++ >= 3) continue;  // Three tensors per type.
    SCOPED_TRACE(tname + " " + GgmlTypeName(t.type));
    auto m = WeightMatrix::FromGguf(t);
    ASSERT_TRUE(m.ok()) << m.status();
    const int cols = m->cols();
    const auto x = RandomVector(cols, rng);
    std::vector<Q8Block> xq(cols / 32);
    QuantizeQ8(x.data(), cols, xq.data());
    const size_t row_bytes = m->bytes() / m->rows();
    std::vector<float> w(cols);
    for (int r : {0, 1, m->rows() / 2, m->rows() - 1}) {
      m->DequantizeRows(r, 1, w.data());
      const uint8_t* row = t.data + row_bytes * r;
      const double tol = 2e-6 * AbsScale(w, xq) + 1e-6;
      const float ref = qdot_internal::RefKernel(t.type)(row, xq.data(), cols);
      EXPECT_NEAR(ref, DequantizedDot(w, xq), tol) << "row " << r;
      for (Isa isa : SupportedIsas()) {
        EXPECT_NEAR(RowDot(t.type, isa)(row, xq.data(), cols), ref, tol)
            << "row " << r << " " << IsaName(isa);
      }
    }
  }
  EXPECT_FALSE(seen.empty());
}

TEST(QdotTest, RealTensorsQwen05B) { CheckRealTensors("qwen2.5-coder-0.5b"); }
TEST(QdotTest, RealTensorsQwen15B) { CheckRealTensors("qwen2.5-coder-1.5b"); }

// MatVec (both modes) and MatMul against a dense product of dequantized rows.
TEST(WeightMatrixTest, ProductsMatchDenseDequantizedWeights) {
  POLYKV_REQUIRE_MODEL_FILE(file, "qwen2.5-coder-0.5b");
  std::mt19937 rng(3);
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight",
                           "blk.3.ffn_down.weight"}) {
    SCOPED_TRACE(name);
    auto t = file->Tensor(name);
    ASSERT_TRUE(t.ok()) << t.status();
    auto m = WeightMatrix::FromGguf(**t);
    ASSERT_TRUE(m.ok());
    const int rows = m->rows(), cols = m->cols(), n = 5;
    std::vector<float> dense(static_cast<size_t>(rows) * cols);
    m->DequantizeRows(0, rows, dense.data());
    std::vector<float> x(static_cast<size_t>(n) * cols);
    for (int i = 0; i < n; ++i) {
      const auto v = RandomVector(cols, rng);
      std::copy(v.begin(), v.end(), x.begin() + static_cast<size_t>(i) * cols);
    }
    std::vector<double> want(static_cast<size_t>(n) * rows), scale(want.size());
    for (int i = 0; i < n; ++i) {
      for (int r = 0; r < rows; ++r) {
        double s = 0, a = 0;
        for (int c = 0; c < cols; ++c) {
          const double p = static_cast<double>(dense[static_cast<size_t>(r) * cols + c]) *
                           x[static_cast<size_t>(i) * cols + c];
          s += p;
          a += std::fabs(p);
        }
        want[static_cast<size_t>(i) * rows + r] = s;
        scale[static_cast<size_t>(i) * rows + r] = a;
      }
    }
    std::vector<float> y(static_cast<size_t>(n) * rows, 1.0f);
    m->MatMul(x.data(), n, y.data(), 1.0f);  // beta = 1: adds to the ones.
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i] + 1.0, 1e-5 * scale[i] + 1e-5) << i;
    std::vector<float> y1(rows);
    m->MatVec(x.data(), y1.data(), false, Activations::kF32);
    for (int r = 0; r < rows; ++r) ASSERT_NEAR(y1[r], want[r], 1e-5 * scale[r] + 1e-5) << r;
    // int8 activations: each element moves by at most d/2 (d = amax/127 per
    // block), so the error is bounded by sum |w| * d/2 over the row.
    m->MatVec(x.data(), y1.data(), false, Activations::kInt8);
    std::vector<Q8Block> xq(cols / 32);
    QuantizeQ8(x.data(), cols, xq.data());
    double worst = 0;
    for (int r = 0; r < rows; ++r) {
      double bound = 0;
      for (int c = 0; c < cols; ++c) {
        bound += std::fabs(dense[static_cast<size_t>(r) * cols + c]) * xq[c / 32].d * 0.5;
      }
      ASSERT_LE(std::fabs(y1[r] - want[r]), bound * 1.001 + 1e-4) << r;
      worst = std::max(worst, std::fabs(y1[r] - want[r]) / (scale[r] + 1e-9));
    }
    std::printf("%s: int8-activation matvec worst relative error %.2e\n", name, worst);
  }
}

}  // namespace
}  // namespace polykv::worker
