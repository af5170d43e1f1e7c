// Reference paged attention: per query head, decode every key and value of the
// visible slots element by element, add the slot's bias (if any) to its
// scaled score, softmax in double, accumulate in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/page_codec.h"
#include "kernels/ref/ref.h"

namespace polykv::kernels::ref {
namespace {

struct SlotRef {
  const uint8_t* k;
  const uint8_t* v;
  PageFormat kf;
  PageFormat vf;
  int row;
};

SlotRef Slot(const PagedKvView& kv, int s) {
  const BlockEntry& b = kv.blocks[s / kv.shape.block_tokens];
  return SlotRef{PagePtr(kv.base, b.k_offset), PagePtr(kv.base, b.v_offset), b.k_format,
                 b.v_format, s % kv.shape.block_tokens};
}

}  // namespace

void Attention(const PagedKvView& kv, int num_q_heads, float sm_scale, const float* slot_bias,
               int num_queries, const float* q, float* out, float* lse, float* slot_mass,
               MassReduce mass_reduce) {
  const PageGeom g = GeomOf(kv.shape);
  const int D = g.head_dim;
  const int group = num_q_heads / g.num_kv_heads;
  if (slot_mass) std::fill(slot_mass, slot_mass + size_t(g.num_kv_heads) * kv.num_tokens, 0.0f);
  std::vector<double> scores(kv.num_tokens);
  std::vector<double> acc(D);
  for (int i = 0; i < num_queries; ++i) {
    const int visible = kv.num_tokens - num_queries + i + 1;
    for (int qh = 0; qh < num_q_heads; ++qh) {
      const int h = qh / group;
      const float* qv = q + (size_t(i) * num_q_heads + qh) * D;
      double m = -std::numeric_limits<double>::infinity();
      for (int s = 0; s < visible; ++s) {
        const SlotRef r = Slot(kv, s);
        double dot = 0;
        for (int d = 0; d < D; ++d) {
          dot += double(qv[d]) * DecodeElem(r.k, g, r.kf, KvKind::kKey, r.row, h, d);
        }
        scores[s] = double(sm_scale) * dot + (slot_bias ? double(slot_bias[s]) : 0.0);
        m = std::max(m, scores[s]);
      }
      double l = 0;
      for (int s = 0; s < visible; ++s) l += std::exp(scores[s] - m);
      const double log_sum = m + std::log(l);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int s = 0; s < visible; ++s) {
        const double p = std::exp(scores[s] - log_sum);
        const SlotRef r = Slot(kv, s);
        for (int d = 0; d < D; ++d) {
          acc[d] += p * DecodeElem(r.v, g, r.vf, KvKind::kValue, r.row, h, d);
        }
        if (slot_mass) {
          float& m = slot_mass[size_t(h) * kv.num_tokens + s];
          m = mass_reduce == MassReduce::kMax ? std::max(m, float(p)) : m + float(p);
        }
      }
      float* o = out + (size_t(i) * num_q_heads + qh) * D;
      for (int d = 0; d < D; ++d) o[d] = float(acc[d]);
      if (lse) lse[size_t(i) * num_q_heads + qh] = float(log_sum);
    }
  }
}

}  // namespace polykv::kernels::ref
