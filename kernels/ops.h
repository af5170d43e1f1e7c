// Kernels over KV pages: quantize / dequantize, paged attention (decode and
// chunked prefill) over pages of mixed formats, compaction (gather + merge) and
// scoring. One interface, three implementations chosen by Exec::backend:
//
//   kReference  scalar, double-precision accumulation, obviously right; slow.
//   kCpu        vectorized (AVX2/F16C when the CPU has them, chosen at run
//               time) and multithreaded; what the CPU backend uses.
//   kCuda       CUDA kernels; every pointer argument (including block tables
//               and plans) is a DEVICE pointer and the work is enqueued on
//               Exec::cuda_stream (asynchronous: the Status reports argument
//               and launch errors). Returns FAILED_PRECONDITION when the
//               library was built without CUDA or no device is present.
//               Every op has a CUDA kernel except WritePageRows (host only)
//               and CompactMetadata (host bookkeeping). Block tables and
//               plans in device memory are NOT validated (formats, slot
//               ranges, weights): check plans with CompactMetadata on the
//               host first; bad entries give undefined results.
//
// Layout of pages and block tables: kernels/page_layout.h, docs/formats.md.
// All functions are thread-safe (no shared mutable state besides the CPU
// thread pool, which is internally synchronized).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "kernels/kernel_types.h"
#include "kernels/page_format.h"
#include "kernels/page_layout.h"

namespace polykv::kernels {

enum class Backend : uint8_t { kReference = 0, kCpu = 1, kCuda = 2 };
std::string_view BackendName(Backend b);

struct Exec {
  Backend backend = Backend::kCpu;
  // kCpu: threads to use at most; 0 = all hardware threads.
  int num_threads = 0;
  // kCuda: the cudaStream_t to enqueue on; null = the default stream.
  void* cuda_stream = nullptr;
};

// ---------------------------------------------------------------------------
// Quantize / dequantize.

// Encodes the first `num_tokens` rows of `src` into one page of `format`.
// Scaled formats compute their params over exactly those rows (keys: per
// channel over the rows; values: per row and group), rows beyond are zero.
// Partial pages normally stay in a float format (the recent-token residual);
// this is the helper that quantizes a page once it is full.
//   src:  [num_tokens][num_kv_heads][head_dim] of `src_type`
//   page: PageBytes(format, kind, shape) bytes, kPageAlignment-aligned
// REQUIRES: 0 < num_tokens <= shape.block_tokens; PageBytes(...) != 0.
absl::Status QuantizePage(const Exec& exec, const PageShape& shape, KvKind kind,
                          PageFormat format, const void* src, SourceType src_type,
                          int num_tokens, void* page);

// Appends to a page in a FLOAT format (f32 / f16 / bf16; the residual page of
// recent tokens): writes rows [row, row + num_rows) from f32 `src`
// ([num_rows][num_kv_heads][head_dim]) and leaves every other row untouched.
// Host memory only (the worker's CPU path); scaled formats are refused because
// their params depend on the whole page: quantize full pages with QuantizePage.
absl::Status WritePageRows(const PageShape& shape, PageFormat format, const float* src, int row,
                           int num_rows, void* page);

// Encodes `num_pages` full pages from contiguous rows.
//   src:   [num_pages * block_tokens][num_kv_heads][head_dim] of `src_type`
//   pages: num_pages pages back to back, PageBytes(format, kind, shape) apart.
absl::Status QuantizePages(const Exec& exec, const PageShape& shape, KvKind kind,
                           PageFormat format, const void* src, SourceType src_type,
                           int num_pages, void* pages);

// Decodes the first `num_tokens` rows of one page.
//   dst: [num_tokens][num_kv_heads][head_dim] f32
absl::Status DequantizePage(const Exec& exec, const PageShape& shape, KvKind kind,
                            PageFormat format, const void* page, int num_tokens, float* dst);

// Decodes `num_pages` full pages laid out back to back (as QuantizePages).
//   dst: [num_pages * block_tokens][num_kv_heads][head_dim] f32
absl::Status DequantizePages(const Exec& exec, const PageShape& shape, KvKind kind,
                             PageFormat format, const void* pages, int num_pages, float* dst);

// ---------------------------------------------------------------------------
// Attention over pages. K and V are read in their page formats (no dense copy
// of the cache is made); every block may have its own K and V formats.
//
// GQA: query head qh uses KV head qh / (num_q_heads / num_kv_heads).
// Scores are sm_scale * q.k + bias_s; softmax in f32 with running max (flash
// style). bias_s is params.slot_bias[s] (0 when slot_bias is null), e.g.
// log(count) for a slot that stands for `count` merged tokens, so that it
// weighs exactly like `count` copies of itself. lse and slot_mass below are those
// of the biased softmax. On host backends a non-finite bias is
// INVALID_ARGUMENT (one pass over kv.num_tokens floats, small next to the
// attention itself); on CUDA the array is in device memory and NOT checked.

// One decode step: every query head attends to all kv.num_tokens slots.
//   q:         [num_q_heads][head_dim]
//   out:       [num_q_heads][head_dim]
//   lse:       [num_q_heads] or null; natural-log log-sum-exp of the scaled
//              (and biased) scores (out = sum_s exp(score_s - lse) * v_s)
//   slot_mass: [num_kv_heads][kv.num_tokens] or null. For KV head g and slot
//              s: sum over the query heads qh of group g of
//              softmax_qh(s) = exp(score_qh,s - lse_qh). Each query head's
//              softmax sums to 1 over the slots, so row g sums to the group
//              size (num_q_heads / num_kv_heads). Eviction policies use it as
//              the slot's attention activity in this step. With
//              params.mass_reduce == kMax it is the largest softmax_qh(s)
//              over the group's query heads instead (each value in [0, 1]).
// REQUIRES: kv.num_tokens >= 1.
absl::Status PagedDecodeAttention(const Exec& exec, const PagedKvView& kv,
                                  const AttentionParams& params, const float* q, float* out,
                                  float* lse, float* slot_mass);

// Chunked prefill: the last `num_new` slots of `kv` are a chunk of new tokens
// whose K/V have already been written to the pages; new token i (0-based in
// the chunk, absolute slot kv.num_tokens - num_new + i) attends to slots
// [0, kv.num_tokens - num_new + i] (all earlier pages + causal in the chunk).
//   q:   [num_new][num_q_heads][head_dim]
//   out: [num_new][num_q_heads][head_dim]
//   lse: [num_new][num_q_heads] or null
//   slot_mass: [num_kv_heads][kv.num_tokens] or null: as in decode, summed over
//        the chunk's queries too (each query's softmax over its causal
//        prefix), so row g sums to group size x num_new. It is what H2O-style
//        scores need from a prefill, which is most of an agent's context.
//        With kMax, the largest over the group's heads and the chunk's
//        queries (KVzip's score when the chunk is a reconstruction probe).
//        CPU and reference backends; CUDA answers UNIMPLEMENTED when asked.
// REQUIRES: 1 <= num_new <= kv.num_tokens.
absl::Status PagedPrefillAttention(const Exec& exec, const PagedKvView& kv,
                                   const AttentionParams& params, int num_new, const float* q,
                                   float* out, float* lse, float* slot_mass = nullptr);

// ---------------------------------------------------------------------------
// Compaction: gather and merge slots into NEW pages (the daemon never rewrites
// pages a worker may be reading). Output slot j is the weighted average of the
// K rows (and, separately, of the V rows) of its group of source slots, with
// weights normalized to sum 1 within the group. A group of one slot with any
// weight is a plain copy (gather), exact when the formats agree and are
// float formats. The destination pages are encoded in their own formats (each
// destination block's k_format/v_format); a scaled destination page gets
// params computed over its valid rows.
// REQUIRES: src.shape == dst.shape; dst pages do not overlap src pages.
absl::Status CompactSlots(const Exec& exec, const PagedKvView& src, const CompactPlan& plan,
                          const PagedKvMut& dst);

// Host-only bookkeeping that mirrors CompactSlots for per-slot metadata:
// dst_positions[j] = max position in group j (a merged slot is as recent as
// its latest member); dst_counts[j] = sum of member counts (src_counts null
// counts each member as 1). Any output pointer may be null. Plan arrays are
// HOST pointers here. Returns INVALID_ARGUMENT on a malformed plan.
absl::Status CompactMetadata(const CompactPlan& plan, int num_src, const int32_t* src_positions,
                             const int32_t* src_counts, int32_t* dst_positions,
                             int32_t* dst_counts);

// ---------------------------------------------------------------------------
// Scoring helpers for eviction / merging policies.

// L2 norm of each slot's key per KV head.
//   norms: [num_kv_heads][kv.num_tokens]
absl::Status KeyNorms(const Exec& exec, const PagedKvView& kv, float* norms);

// Relevance of given query vectors (e.g. an intent embedding projected per KV
// head, or recent queries averaged per group) to every cached key:
// scores[i][g][s] = scale * queries[i][g] . k_g,s
//   queries: [num_queries][num_kv_heads][head_dim]
//   scores:  [num_queries][num_kv_heads][kv.num_tokens]
absl::Status QkScores(const Exec& exec, const PagedKvView& kv, const float* queries,
                      int num_queries, float scale, float* scores);

}  // namespace polykv::kernels
