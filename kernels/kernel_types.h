// Plain argument types of the kernel API (kernels/ops.h), kept free of absl
// and of CUDA headers so that the CUDA sources (kernels/cuda/) can use them.
#pragma once

#include <cstdint>

#include "kernels/page_format.h"
#include "kernels/page_layout.h"

namespace polykv::kernels {

// Largest head_dim the kernels accept (CPU tiles keep per-channel params on
// the stack).
inline constexpr int kMaxHeadDim = 512;

// Element type of dense token rows handed to QuantizePage(s).
enum class SourceType : uint8_t { kF32 = 0, kF16 = 1 };

// How slot_mass (kernels/ops.h) reduces a slot's softmax probabilities over
// the query heads of its KV head's group and over a chunk's queries: the sum
// is attention activity (H2O); the most any single query paid is KVzip's
// reconstruction score, which a slot many queries glance at does not inflate.
enum class MassReduce : uint8_t { kSum = 0, kMax = 1 };

struct AttentionParams {
  int num_q_heads = 0;   // a positive multiple of shape.num_kv_heads
  float sm_scale = 0.0f;  // 0 means 1 / sqrt(head_dim)
  // [kv.num_tokens] or null (no bias). Natural-log value added to slot s's
  // score (sm_scale * q.k) for every query head before the softmax; a slot
  // merged from `count` tokens gets log(count) and weighs like `count`
  // identical slots. Host memory on the reference and CPU backends, device
  // memory on CUDA. See PagedDecodeAttention in kernels/ops.h.
  const float* slot_bias = nullptr;
  MassReduce mass_reduce = MassReduce::kSum;  // of slot_mass, when requested
};

// Compaction plan; see CompactSlots in kernels/ops.h.
struct CompactPlan {
  int num_out = 0;  // output slots; must equal dst.num_tokens
  // [num_out + 1] CSR offsets into members/weights; null means every group
  // has exactly one member: output j = members[j] (plain gather).
  const int32_t* group_offsets = nullptr;
  // [group_offsets[num_out]] (or [num_out]) source slots, each < src.num_tokens.
  const int32_t* members = nullptr;
  // Same length as members, or null for equal weights. Must be >= 0 with a
  // positive sum in every group.
  const float* weights = nullptr;
};

}  // namespace polykv::kernels
