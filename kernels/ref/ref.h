// Scalar CPU reference kernels (Backend::kReference). Obviously right rather
// than fast: element-by-element decoding through page_codec.h, double-precision
// accumulation, no threads. Arguments are validated by kernels/ops.cc; these
// functions assume valid input (see ops.h for shapes and semantics).
#pragma once

#include "kernels/ops.h"

namespace polykv::kernels::ref {

void QuantizePages(const PageShape& shape, KvKind kind, PageFormat format, const void* src,
                   SourceType src_type, int num_pages, int rows_per_page, void* pages);
void DequantizePages(const PageShape& shape, KvKind kind, PageFormat format, const void* pages,
                     int num_pages, int rows_per_page, float* dst);
// Attention for `num_queries` query tokens that are the last num_queries slots
// of kv (decode: num_queries == 1). slot_mass sums over the queries and the
// group's heads, or takes the most over them (mass_reduce).
// slot_bias: [kv.num_tokens] added to the scaled scores, or null.
void Attention(const PagedKvView& kv, int num_q_heads, float sm_scale, const float* slot_bias,
               int num_queries, const float* q, float* out, float* lse, float* slot_mass,
               MassReduce mass_reduce);
void Compact(const PagedKvView& src, const CompactPlan& plan, const PagedKvMut& dst);
void KeyNorms(const PagedKvView& kv, float* norms);
void QkScores(const PagedKvView& kv, const float* queries, int num_queries, float scale,
              float* scores);

}  // namespace polykv::kernels::ref
