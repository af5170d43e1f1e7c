// Reference quantize / dequantize / compaction / scoring, element by element.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/page_codec.h"
#include "kernels/ref/ref.h"

namespace polykv::kernels::ref {
namespace {

template <typename Src>
void QuantizeOne(const Src& src, int rows, const PageGeom& g, PageFormat f, KvKind kind,
                 uint8_t* page) {
  const size_t units = NumQuantUnits(g, f, kind);
  for (size_t u = 0; u < units; ++u) QuantizeUnit(src, rows, g, f, kind, page, u);
}

}  // namespace

void QuantizePages(const PageShape& shape, KvKind kind, PageFormat format, const void* src,
                   SourceType src_type, int num_pages, int rows_per_page, void* pages) {
  const PageGeom g = GeomOf(shape);
  const size_t page_bytes = g.PageBytes(format, kind);
  const size_t page_elems = g.Elems();
  for (int p = 0; p < num_pages; ++p) {
    uint8_t* page = static_cast<uint8_t*>(pages) + p * page_bytes;
    if (src_type == SourceType::kF32) {
      const F32Rows rows{static_cast<const float*>(src) + p * page_elems, g.num_kv_heads,
                         g.head_dim};
      QuantizeOne(rows, rows_per_page, g, format, kind, page);
    } else {
      const F16Rows rows{static_cast<const uint16_t*>(src) + p * page_elems, g.num_kv_heads,
                         g.head_dim};
      QuantizeOne(rows, rows_per_page, g, format, kind, page);
    }
  }
}

void DequantizePages(const PageShape& shape, KvKind kind, PageFormat format, const void* pages,
                     int num_pages, int rows_per_page, float* dst) {
  const PageGeom g = GeomOf(shape);
  const size_t page_bytes = g.PageBytes(format, kind);
  for (int p = 0; p < num_pages; ++p) {
    const uint8_t* page = static_cast<const uint8_t*>(pages) + p * page_bytes;
    for (int t = 0; t < rows_per_page; ++t) {
      for (int h = 0; h < g.num_kv_heads; ++h) {
        for (int d = 0; d < g.head_dim; ++d) {
          dst[p * g.Elems() + g.DenseIndex(t, h, d)] = DecodeElem(page, g, format, kind, t, h, d);
        }
      }
    }
  }
}

void Compact(const PagedKvView& src, const CompactPlan& plan, const PagedKvMut& dst) {
  const PageGeom g = GeomOf(src.shape);
  const int bt = g.block_tokens;
  std::vector<float> rows(g.Elems());
  std::vector<double> acc(g.head_dim);
  for (int b = 0; b < dst.num_blocks; ++b) {
    const int n = std::min(bt, plan.num_out - b * bt);
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      std::fill(rows.begin(), rows.end(), 0.0f);
      for (int r = 0; r < n; ++r) {
        const int j = b * bt + r;
        const int begin = plan.group_offsets ? plan.group_offsets[j] : j;
        const int end = plan.group_offsets ? plan.group_offsets[j + 1] : j + 1;
        double wsum = 0;
        for (int m = begin; m < end; ++m) wsum += plan.weights ? plan.weights[m] : 1.0;
        for (int h = 0; h < g.num_kv_heads; ++h) {
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int m = begin; m < end; ++m) {
            const double w = (plan.weights ? plan.weights[m] : 1.0) / wsum;
            const int s = plan.members[m];
            const BlockEntry& e = src.blocks[s / bt];
            const bool key = kind == KvKind::kKey;
            const uint8_t* page = PagePtr(src.base, key ? e.k_offset : e.v_offset);
            const PageFormat f = key ? e.k_format : e.v_format;
            for (int d = 0; d < g.head_dim; ++d) {
              acc[d] += w * DecodeElem(page, g, f, kind, s % bt, h, d);
            }
          }
          for (int d = 0; d < g.head_dim; ++d) rows[g.DenseIndex(r, h, d)] = float(acc[d]);
        }
      }
      const BlockEntry& e = dst.blocks[b];
      const bool key = kind == KvKind::kKey;
      uint8_t* page = PagePtr(dst.base, key ? e.k_offset : e.v_offset);
      QuantizeOne(F32Rows{rows.data(), g.num_kv_heads, g.head_dim}, n, g,
                  key ? e.k_format : e.v_format, kind, page);
    }
  }
}

void KeyNorms(const PagedKvView& kv, float* norms) {
  const PageGeom g = GeomOf(kv.shape);
  for (int s = 0; s < kv.num_tokens; ++s) {
    const BlockEntry& e = kv.blocks[s / g.block_tokens];
    const uint8_t* page = PagePtr(kv.base, e.k_offset);
    for (int h = 0; h < g.num_kv_heads; ++h) {
      double sum = 0;
      for (int d = 0; d < g.head_dim; ++d) {
        const double x = DecodeElem(page, g, e.k_format, KvKind::kKey, s % g.block_tokens, h, d);
        sum += x * x;
      }
      norms[size_t(h) * kv.num_tokens + s] = float(std::sqrt(sum));
    }
  }
}

void QkScores(const PagedKvView& kv, const float* queries, int num_queries, float scale,
              float* scores) {
  const PageGeom g = GeomOf(kv.shape);
  for (int i = 0; i < num_queries; ++i) {
    for (int h = 0; h < g.num_kv_heads; ++h) {
      const float* qv = queries + (size_t(i) * g.num_kv_heads + h) * g.head_dim;
      for (int s = 0; s < kv.num_tokens; ++s) {
        const BlockEntry& e = kv.blocks[s / g.block_tokens];
        const uint8_t* page = PagePtr(kv.base, e.k_offset);
        double dot = 0;
        for (int d = 0; d < g.head_dim; ++d) {
          dot += double(qv[d]) *
                 DecodeElem(page, g, e.k_format, KvKind::kKey, s % g.block_tokens, h, d);
        }
        scores[(size_t(i) * g.num_kv_heads + h) * kv.num_tokens + s] = float(scale * dot);
      }
    }
  }
}

}  // namespace polykv::kernels::ref
