// Helpers for the kernel tests: seeded data, paged K/V built from dense
// arrays, and a dense f32/double attention that is the ground truth.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "kernels/page_format.h"
#include "kernels/page_layout.h"

namespace polykv::kernels::testing {

inline constexpr PageFormat kAllFormats[] = {
    PageFormat::kF32,  PageFormat::kF16,  PageFormat::kBF16, PageFormat::kFP8E4M3,
    PageFormat::kInt8, PageFormat::kInt4, PageFormat::kInt2};

// Seed from POLYKV_TEST_SEED when set, else `fallback`; printed so a failing
// run can be repeated.
inline uint32_t TestSeed(uint32_t fallback) {
  const char* env = std::getenv("POLYKV_TEST_SEED");
  const uint32_t seed = env ? uint32_t(std::strtoul(env, nullptr, 10)) : fallback;
  std::printf("[seed] %u\n", seed);
  return seed;
}

inline std::vector<float> RandomNormal(size_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Keys [T][H][D] like real models: a few channels per head carry large
// magnitudes and offsets (the reason KIVI quantizes keys per channel).
inline std::vector<float> OutlierKeys(int T, int H, int D, std::mt19937& rng) {
  std::vector<float> k = RandomNormal(size_t(T) * H * D, rng);
  std::uniform_int_distribution<int> ch(0, D - 1);
  for (int h = 0; h < H; ++h) {
    for (int c = 0; c < 4; ++c) {
      const int d = ch(rng);
      const float scale = 10.0f + 5.0f * c, offset = (c % 2 ? -1.0f : 1.0f) * 8.0f;
      for (int t = 0; t < T; ++t) {
        float& x = k[(size_t(t) * H + h) * D + d];
        x = x * scale + offset;
      }
    }
  }
  return k;
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

// Paged K/V for one layer built from dense [T][H][D] arrays: full pages in the
// formats chosen per block, every page in one 256-aligned arena addressed by
// offsets (or, with absolute = true, by absolute addresses and base = null).
struct PagedKv {
  PageShape shape;
  int num_tokens = 0;
  std::vector<BlockEntry> blocks;
  std::unique_ptr<uint8_t[], AlignedFree> arena;
  size_t arena_bytes = 0;
  bool absolute = false;

  PagedKvView View() const {
    PagedKvView v;
    v.shape = shape;
    v.base = absolute ? nullptr : arena.get();
    v.blocks = blocks.data();
    v.num_blocks = int(blocks.size());
    v.num_tokens = num_tokens;
    return v;
  }
  PagedKvMut Mut() {
    PagedKvMut v;
    v.shape = shape;
    v.base = absolute ? nullptr : arena.get();
    v.blocks = blocks.data();
    v.num_blocks = int(blocks.size());
    v.num_tokens = num_tokens;
    return v;
  }
};

using FormatFn = std::function<std::pair<PageFormat, PageFormat>(int block)>;

// Allocates (uninitialized) pages for `num_tokens` slots in the given formats.
inline PagedKv AllocPaged(const PageShape& shape, int num_tokens, const FormatFn& formats,
                          bool absolute = false) {
  PagedKv kv;
  kv.shape = shape;
  kv.num_tokens = num_tokens;
  kv.absolute = absolute;
  const int nb = (num_tokens + shape.block_tokens - 1) / shape.block_tokens;
  size_t off = 0;
  for (int b = 0; b < nb; ++b) {
    BlockEntry e;
    std::tie(e.k_format, e.v_format) = formats(b);
    e.k_offset = off;
    off += PageBytes(e.k_format, KvKind::kKey, shape);
    e.v_offset = off;
    off += PageBytes(e.v_format, KvKind::kValue, shape);
    kv.blocks.push_back(e);
  }
  kv.arena_bytes = std::max<size_t>(off, kPageAlignment);
  kv.arena.reset(static_cast<uint8_t*>(std::aligned_alloc(kPageAlignment, kv.arena_bytes)));
  std::memset(kv.arena.get(), 0xA5, kv.arena_bytes);  // garbage: pages must be fully written
  if (absolute) {
    for (auto& e : kv.blocks) {
      e.k_offset += uint64_t(uintptr_t(kv.arena.get()));
      e.v_offset += uint64_t(uintptr_t(kv.arena.get()));
    }
  }
  return kv;
}

// Quantizes dense k, v ([T][H][D]) into pages: every block, including a
// partial last one, is encoded with QuantizePage on `backend`.
inline PagedKv BuildPaged(const PageShape& shape, const std::vector<float>& k,
                          const std::vector<float>& v, int num_tokens, const FormatFn& formats,
                          Backend backend = Backend::kReference, bool absolute = false) {
  PagedKv kv = AllocPaged(shape, num_tokens, formats, absolute);
  const size_t row = size_t(shape.num_kv_heads) * shape.head_dim;
  const Exec exec{backend};
  uint8_t* base = absolute ? nullptr : kv.arena.get();
  for (size_t b = 0; b < kv.blocks.size(); ++b) {
    const int t0 = int(b) * shape.block_tokens;
    const int n = std::min(shape.block_tokens, num_tokens - t0);
    const BlockEntry& e = kv.blocks[b];
    EXPECT_TRUE(QuantizePage(exec, shape, KvKind::kKey, e.k_format, k.data() + t0 * row,
                             SourceType::kF32, n, PagePtr(base, e.k_offset))
                    .ok());
    EXPECT_TRUE(QuantizePage(exec, shape, KvKind::kValue, e.v_format, v.data() + t0 * row,
                             SourceType::kF32, n, PagePtr(base, e.v_offset))
                    .ok());
  }
  return kv;
}

// Dense attention in double over k, v [T][H][D]: query token i of num_queries
// (the last num_queries slots) sees slots [0, T - num_queries + i].
inline void DenseAttention(const std::vector<float>& k, const std::vector<float>& v, int T, int H,
                           int D, int num_q_heads, int num_queries, const std::vector<float>& q,
                           std::vector<float>* out, std::vector<float>* lse) {
  const int group = num_q_heads / H;
  const double scale = 1.0 / std::sqrt(double(D));
  out->assign(size_t(num_queries) * num_q_heads * D, 0.0f);
  lse->assign(size_t(num_queries) * num_q_heads, 0.0f);
  std::vector<double> s(T), acc(D);
  for (int i = 0; i < num_queries; ++i) {
    const int visible = T - num_queries + i + 1;
    for (int qh = 0; qh < num_q_heads; ++qh) {
      const int h = qh / group;
      const float* qv = q.data() + (size_t(i) * num_q_heads + qh) * D;
      double m = -INFINITY;
      for (int t = 0; t < visible; ++t) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += double(qv[d]) * k[(size_t(t) * H + h) * D + d];
        s[t] = dot * scale;
        m = std::max(m, s[t]);
      }
      double l = 0;
      for (int t = 0; t < visible; ++t) l += std::exp(s[t] - m);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int t = 0; t < visible; ++t) {
        const double p = std::exp(s[t] - m) / l;
        for (int d = 0; d < D; ++d) acc[d] += p * v[(size_t(t) * H + h) * D + d];
      }
      for (int d = 0; d < D; ++d) (*out)[(size_t(i) * num_q_heads + qh) * D + d] = float(acc[d]);
      (*lse)[size_t(i) * num_q_heads + qh] = float(m + std::log(l));
    }
  }
}

inline double RelL2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

}  // namespace polykv::kernels::testing
