// The vector dequantization kernels (weights/dequant.h) against the scalar
// reference Dequantize, bit for bit, for every ISA this CPU runs: on seeded
// random blocks of every type (finite scales over the whole f16 range,
// subnormals included; odd block counts) and on every tensor of both
// Qwen2.5-Coder files (skipped, naming the command, when they are absent).
#include "client/worker/weights/dequant.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/worker/conversation.h"
#include "client/worker/gguf.h"
#include "client/worker/weights/ggml_types.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/model_files.h"

namespace polykv::worker {
namespace {

// The types with vector kernels: q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k.
constexpr uint32_t kVectorTypes[] = {2, 3, 6, 7, 8, 12, 13, 14};

std::vector<Isa> VectorIsas() {
  std::vector<Isa> out;
  if (BestIsa() >= Isa::kAvx2) out.push_back(Isa::kAvx2);
  if (BestIsa() >= Isa::kAvx512) out.push_back(Isa::kAvx512);
  return out;
}

// Any finite half: exponent field 0..30 (0: zero and subnormals), either sign.
uint16_t RandomFiniteHalf(std::mt19937& rng) {
  std::uniform_int_distribution<int> e(0, 30), m(0, 1023), s(0, 1);
  return static_cast<uint16_t>((s(rng) << 15) | (e(rng) << 10) | m(rng));
}

// `blocks` blocks of random bytes with finite f16 scales (NaN scales would
// test only which NaN payload each path propagates).
std::vector<uint8_t> RandomBlocks(uint32_t type, int blocks, std::mt19937& rng) {
  int be = 0, bb = 0;
  EXPECT_TRUE(GgmlBlockInfo(type, &be, &bb));
  std::vector<uint8_t> data(static_cast<size_t>(blocks) * bb);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : data) b = static_cast<uint8_t>(byte(rng));
  auto put_half = [&](uint8_t* p) {
    const uint16_t h = RandomFiniteHalf(rng);
    std::memcpy(p, &h, 2);
  };
  for (int i = 0; i < blocks; ++i) {
    uint8_t* b = data.data() + static_cast<size_t>(i) * bb;
    switch (static_cast<GgmlType>(type)) {
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        put_half(b);
        put_half(b + 2);
        break;
      case GgmlType::kQ6_K:
        put_half(b + kquant::kQ6KD);
        break;
      default:
        put_half(b);
    }
  }
  return data;
}

// Empty when `got` equals `want` bitwise; else the first difference.
std::string FirstDifference(const std::vector<float>& want, const std::vector<float>& got) {
  if (want.size() == got.size() &&
      std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0) {
    return "";
  }
  for (size_t i = 0; i < want.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &want[i], 4);
    std::memcpy(&b, &got[i], 4);
    if (a != b) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "element %zu: want %.9g (0x%08x), got %.9g (0x%08x)", i,
                    want[i], a, got[i], b);
      return buf;
    }
  }
  return "sizes differ";
}

TEST(DequantTest, EveryTypeHasAKernelAtEveryVectorIsa) {
  std::printf("best ISA here: %s\n", IsaName(BestIsa()));
  if (VectorIsas().empty()) GTEST_SKIP() << "this CPU has no AVX2: only the scalar reference";
  for (uint32_t type : kVectorTypes) {
    for (Isa isa : VectorIsas()) {
      EXPECT_NE(DequantKernel(type, isa), nullptr) << GgmlTypeName(type) << " " << IsaName(isa);
    }
  }
  EXPECT_EQ(DequantKernel(static_cast<uint32_t>(GgmlType::kF32), BestIsa()), nullptr);
  EXPECT_EQ(DequantKernel(2, Isa::kScalar), nullptr);
}

TEST(DequantTest, RandomBlocksMatchTheReferenceBitwise) {
  const unsigned seed = 20261207;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (uint32_t type : kVectorTypes) {
    int be = 0, bb = 0;
    ASSERT_TRUE(GgmlBlockInfo(type, &be, &bb));
    for (int blocks : {1, 2, 3, 7, 33, 255}) {
      for (int rep = 0; rep < 8; ++rep) {
        const auto data = RandomBlocks(type, blocks, rng);
        const int64_t n = static_cast<int64_t>(blocks) * be;
        std::vector<float> want(n), got(n);
        ASSERT_TRUE(Dequantize(type, data.data(), n, want.data()).ok());
        for (Isa isa : VectorIsas()) {
          std::fill(got.begin(), got.end(), -1.0f);
          ASSERT_TRUE(DequantizeWith(isa, type, data.data(), n, got.data()).ok());
          EXPECT_EQ(FirstDifference(want, got), "")
              << GgmlTypeName(type) << " " << IsaName(isa) << ", " << blocks
              << " blocks, seed " << seed;
        }
        std::fill(got.begin(), got.end(), -1.0f);
        ASSERT_TRUE(DequantizeFast(type, data.data(), n, got.data()).ok());
        EXPECT_EQ(FirstDifference(want, got), "") << GgmlTypeName(type) << " fast";
      }
    }
  }
}

TEST(DequantTest, FallsBackAndFailsLikeTheReference) {
  // f32 and f16 have no vector kernel: the reference's bits.
  const uint16_t halves[3] = {0x3c00, 0x8001, 0x7bff};
  std::vector<float> want(3), got(3);
  ASSERT_TRUE(Dequantize(1, halves, 3, want.data()).ok());
  ASSERT_TRUE(DequantizeFast(1, halves, 3, got.data()).ok());
  EXPECT_EQ(FirstDifference(want, got), "");
  EXPECT_EQ(DequantizeFast(99, halves, 32, got.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeFast(2, halves, 31, got.data()).code(), absl::StatusCode::kInvalidArgument);
}

// Every tensor of a vector-kernel type, in slices of at most 1 Mi elements.
void CheckRealTensors(const std::string& name) {
  POLYKV_REQUIRE_MODEL_FILE(file, name);
  if (VectorIsas().empty()) GTEST_SKIP() << "this CPU has no AVX2: nothing to compare";
  int64_t checked = 0;
  for (const auto& [tname, t] : file->tensors()) {
    if (DequantKernel(t.type, BestIsa()) == nullptr) continue;
    int be = 0, bb = 0;
    ASSERT_TRUE(GgmlBlockInfo(t.type, &be, &bb));
    int64_t n = 1;
    for (int64_t dim : t.dims) n *= dim;
    ASSERT_EQ(n % be, 0) << tname;
    const int64_t slice_blocks = (int64_t{1} << 20) / be;
    std::vector<float> want, got;
    for (int64_t b0 = 0; b0 < n / be; b0 += slice_blocks) {
      const int64_t nb = std::min(slice_blocks, n / be - b0);
      const uint8_t* src = t.data + b0 * bb;
      want.resize(nb * be);
      got.resize(nb * be);
      ASSERT_TRUE(Dequantize(t.type, src, nb * be, want.data()).ok());
      for (Isa isa : VectorIsas()) {
        ASSERT_TRUE(DequantizeWith(isa, t.type, src, nb * be, got.data()).ok());
        const std::string diff = FirstDifference(want, got);
        ASSERT_EQ(diff, "") << tname << " " << GgmlTypeName(t.type) << " " << IsaName(isa)
                            << " from block " << b0;
      }
    }
    checked += n;
  }
  std::printf("%s: %" PRId64 " elements bitwise equal\n", name.c_str(), checked);
  EXPECT_GT(checked, 0);
}

TEST(DequantTest, RealTensorsQwen05B) { CheckRealTensors("qwen2.5-coder-0.5b"); }
TEST(DequantTest, RealTensorsQwen15B) { CheckRealTensors("qwen2.5-coder-1.5b"); }

}  // namespace
}  // namespace polykv::worker
