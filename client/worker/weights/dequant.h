// Vectorized dequantization of GGUF weight blocks to f32: the prefill path
// (WeightMatrix::DequantizeRows feeds sgemm one tile of rows at a time), where
// for short prompts dequantizing the model is most of the work.
//
// Every kernel gives exactly Dequantize's bits (ggml_types.h): the same IEEE
// operations in the same order, one rounding each, no fused multiply-add
// (dequant_avx2.cc and dequant_avx512.cc are compiled with -ffp-contract=off),
// and f16 scales converted by F16C, which is exact. Tested bit for bit in
// tests/unit/worker/dequant_test.cc.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "client/worker/weights/qdot.h"

namespace polykv::worker {

// src: [num_blocks] blocks of one GGML type -> dst: [num_blocks * block_elems].
using DequantFn = void (*)(const uint8_t* src, int64_t num_blocks, float* dst);

// The vector kernel for GGML `type` at `isa` or the widest narrower ISA that
// has one; nullptr when only the scalar Dequantize handles the type (f32, f16,
// bf16, q8_k) or `isa` is kScalar.
// REQUIRES: the CPU supports `isa`.
DequantFn DequantKernel(uint32_t type, Isa isa);

// Dequantize(type, src, n, dst) with DequantKernel(type, isa), falling back
// to Dequantize; same preconditions, errors and bits.
// REQUIRES: the CPU supports `isa`.
absl::Status DequantizeWith(Isa isa, uint32_t type, const void* src, int64_t n, float* dst);

// DequantizeWith(BestIsa(), ...). Thread-safe.
absl::Status DequantizeFast(uint32_t type, const void* src, int64_t n, float* dst);

namespace dequant_internal {
// Per-ISA tables (nullptr: no kernel of that ISA for the type).
DequantFn Avx2Kernel(uint32_t type);
DequantFn Avx512Kernel(uint32_t type);
}  // namespace dequant_internal

}  // namespace polykv::worker
