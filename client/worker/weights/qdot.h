// Integer dot products of GGUF-encoded weight rows with quantized
// activations, the inner loop of the decode step (one token): decoding is
// bound by reading the weights, so they are used in their file encoding and
// the activation vector is quantized once per matvec to int8 blocks of 32
// (llama.cpp's Q8_0 activations). Per block the products are exact integers;
// the error is the activation rounding, |dx| <= d/2 per element.
//
// Each kernel exists as a scalar reference (qdot_ref.cc) and in wider ISAs
// (qdot_avx2.cc, qdot_avx512.cc) chosen at run time; the wide ones equal the
// reference up to float summation order (tests/unit/worker/qdot_test.cc).
#pragma once

#include <cstdint>

namespace polykv::worker {

// 32 consecutive activations: x[i] ~= d * q[i].
struct Q8Block {
  float d;
  int16_t sum[2];  // sum of q over [0, 16) and [16, 32): the offset terms.
  int8_t q[32];
};

// x: [n] -> out: [n / 32]. REQUIRES: n % 32 == 0.
void QuantizeQ8(const float* x, int n, Q8Block* out);

// row: one weight row of `ncols` elements in its GGML encoding; x: [ncols / 32].
using RowDotFn = float (*)(const uint8_t* row, const Q8Block* x, int ncols);

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* IsaName(Isa isa);
// The widest ISA this CPU runs (and this build has kernels for).
Isa BestIsa();

// The kernel for GGML `type` at `isa` or the widest narrower ISA that has
// one; nullptr when the type has no integer dot product (f32, f16, bf16).
// REQUIRES: the CPU supports `isa`.
RowDotFn RowDot(uint32_t type, Isa isa);

namespace qdot_internal {
// Per-ISA tables (nullptr entries fall back), indexed by GGML type id < 32.
RowDotFn RefKernel(uint32_t type);
RowDotFn Avx2Kernel(uint32_t type);
RowDotFn Avx512Kernel(uint32_t type);
}  // namespace qdot_internal

}  // namespace polykv::worker
