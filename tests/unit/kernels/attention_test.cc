// Paged decode / prefill attention over compressed pages: every (K format,
// V format) pair against a dense f32 reference, fast CPU against the scalar
// reference, attention mass, LSE, GQA shapes, partial and mixed-format pages,
// and the per-slot log-count bias of merged slots.
#include <cmath>
#include <cstdio>
#include <map>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace polykv::kernels {
namespace {

using testing::kAllFormats;

// Relative L2 error of the attention output vs dense f32 allowed per format
// when that format holds K or V (errors of K and V add): ~2x the errors these
// tests measure (docs/formats.md has the study). A sanity bound only; the
// exact check is against dense attention over the DEQUANTIZED pages. f32
// includes the f16 partial last page.
double FormatTolerance(PageFormat f) {
  switch (f) {
    case PageFormat::kF32: return 1e-4;
    case PageFormat::kF16: return 2e-3;
    case PageFormat::kBF16: return 1.5e-2;
    case PageFormat::kFP8E4M3: return 8e-2;
    case PageFormat::kInt8: return 1.5e-2;
    case PageFormat::kInt4: return 0.25;
    case PageFormat::kInt2: return 1.0;
  }
  return 0;
}

struct Data {
  PageShape shape;
  int num_q_heads;
  int T;
  std::vector<float> k, v, q;
};

Data MakeData(const PageShape& s, int num_q_heads, int T, int num_queries, bool outliers,
              std::mt19937& rng) {
  Data d{s, num_q_heads, T, {}, {}, {}};
  const size_t n = size_t(T) * s.num_kv_heads * s.head_dim;
  d.k = outliers ? testing::OutlierKeys(T, s.num_kv_heads, s.head_dim, rng)
                 : testing::RandomNormal(n, rng);
  d.v = testing::RandomNormal(n, rng);
  // Scaled queries give peaked (model-like) attention rather than near-uniform.
  d.q = testing::RandomNormal(size_t(num_queries) * num_q_heads * s.head_dim, rng, 2.0f);
  return d;
}

struct Result {
  std::vector<float> out, lse, mass;
};

Result Decode(const Exec& exec, const PagedKvView& kv, const Data& d) {
  Result r;
  r.out.resize(size_t(d.num_q_heads) * d.shape.head_dim);
  r.lse.resize(d.num_q_heads);
  r.mass.resize(size_t(d.shape.num_kv_heads) * kv.num_tokens);
  const absl::Status st = PagedDecodeAttention(exec, kv, AttentionParams{d.num_q_heads},
                                               d.q.data(), r.out.data(), r.lse.data(),
                                               r.mass.data());
  EXPECT_TRUE(st.ok()) << st;
  return r;
}

void ExpectMassSumsToGroupSize(const Result& r, const Data& d, int T) {
  const int group = d.num_q_heads / d.shape.num_kv_heads;
  for (int h = 0; h < d.shape.num_kv_heads; ++h) {
    double sum = 0;
    for (int s = 0; s < T; ++s) {
      const float m = r.mass[size_t(h) * T + s];
      EXPECT_GE(m, 0.0f);
      sum += m;
    }
    EXPECT_NEAR(sum, group, 1e-4 * group) << "kv head " << h;
  }
}

// Decodes every page of kv into dense [T][H][D] K and V.
void DequantizeAll(const testing::PagedKv& kv, float* k, float* v) {
  const size_t row = size_t(kv.shape.num_kv_heads) * kv.shape.head_dim;
  for (size_t b = 0; b < kv.blocks.size(); ++b) {
    const BlockEntry& e = kv.blocks[b];
    const int t0 = int(b) * kv.shape.block_tokens;
    const int n = std::min(kv.shape.block_tokens, kv.num_tokens - t0);
    const PagedKvView view = kv.View();
    ASSERT_TRUE(DequantizePage(Exec{Backend::kReference}, kv.shape, KvKind::kKey, e.k_format,
                               PagePtr(view.base, e.k_offset), n, k + t0 * row)
                    .ok());
    ASSERT_TRUE(DequantizePage(Exec{Backend::kReference}, kv.shape, KvKind::kValue, e.v_format,
                               PagePtr(view.base, e.v_offset), n, v + t0 * row)
                    .ok());
  }
}

// The residual rule: full pages in (kf, vf), a partial last page in f16.
testing::FormatFn FullPagesIn(PageFormat kf, PageFormat vf, int T, int bt) {
  const int full = T / bt;
  return [=](int b) {
    return b < full ? std::make_pair(kf, vf) : std::make_pair(PageFormat::kF16, PageFormat::kF16);
  };
}

TEST(PagedDecodeAttentionTest, EveryFormatPairMatchesDenseReference) {
  std::mt19937 rng(testing::TestSeed(20251130));
  const PageShape shape{16, 3, 64};  // SmolLM2-like: 9 query heads over 3 KV heads
  const int T = 16 * 7 + 5;           // 8 pages, the last one partial
  std::map<std::pair<int, int>, double> worst;
  for (bool outliers : {false, true}) {
    const Data d = MakeData(shape, 9, T, 1, outliers, rng);
    std::vector<float> want, want_lse;
    testing::DenseAttention(d.k, d.v, T, 3, 64, 9, 1, d.q, &want, &want_lse);
    for (PageFormat kf : kAllFormats) {
      for (PageFormat vf : kAllFormats) {
        SCOPED_TRACE(::testing::Message() << "K=" << FormatShortName(kf) << " V="
                                        << FormatShortName(vf) << " outliers=" << outliers);
        const testing::PagedKv kv = testing::BuildPaged(shape, d.k, d.v, T, FullPagesIn(kf, vf, T, 16));
        const Result ref = Decode(Exec{Backend::kReference}, kv.View(), d);
        const Result fast = Decode(Exec{Backend::kCpu, 3}, kv.View(), d);
        // Exact semantics: attention over the pages == dense attention over
        // what the pages decode to.
        std::vector<float> kd(d.k.size()), vd(d.v.size()), dq_out, dq_lse;
        DequantizeAll(kv, kd.data(), vd.data());
        testing::DenseAttention(kd, vd, T, 3, 64, 9, 1, d.q, &dq_out, &dq_lse);
        EXPECT_LE(testing::RelL2(ref.out, dq_out), 1e-5);
        EXPECT_LE(testing::MaxAbsDiff(ref.lse, dq_lse), 1e-4);
        const double err = testing::RelL2(ref.out, want);
        worst[{int(kf), int(vf)}] = std::max(worst[{int(kf), int(vf)}], err);
        EXPECT_LE(err, FormatTolerance(kf) + FormatTolerance(vf));
        EXPECT_LE(testing::RelL2(fast.out, ref.out), 2e-5);
        EXPECT_LE(testing::MaxAbsDiff(fast.lse, ref.lse), 1e-4);
        EXPECT_LE(testing::MaxAbsDiff(fast.mass, ref.mass), 1e-5);
        if (kf == PageFormat::kF32) {
          EXPECT_LE(testing::MaxAbsDiff(ref.lse, want_lse), 1e-4);
        }
        ExpectMassSumsToGroupSize(ref, d, T);
        ExpectMassSumsToGroupSize(fast, d, T);
      }
    }
  }
  for (const auto& [key, err] : worst) {
    std::printf("K=%-4s V=%-4s rel_l2=%.5f\n",
                std::string(FormatShortName(PageFormat(key.first))).c_str(),
                std::string(FormatShortName(PageFormat(key.second))).c_str(), err);
  }
}

TEST(PagedDecodeAttentionTest, MassIsPerHeadSoftmaxWithoutGqa) {
  std::mt19937 rng(testing::TestSeed(5));
  const PageShape shape{16, 4, 64};
  const int T = 16 * 3;
  const Data d = MakeData(shape, 4, T, 1, false, rng);
  const testing::PagedKv kv = testing::BuildPaged(
      shape, d.k, d.v, T, [](int) { return std::make_pair(PageFormat::kF32, PageFormat::kF32); });
  for (Backend b : {Backend::kReference, Backend::kCpu}) {
    const Result r = Decode(Exec{b}, kv.View(), d);
    ExpectMassSumsToGroupSize(r, d, T);  // group size 1: every head sums to 1
    // mass[h][s] == exp(q.k_s * scale - lse_h), recomputed densely.
    for (int h = 0; h < 4; ++h) {
      for (int s = 0; s < T; s += 7) {
        double dot = 0;
        for (int x = 0; x < 64; ++x) dot += d.q[h * 64 + x] * d.k[(size_t(s) * 4 + h) * 64 + x];
        EXPECT_NEAR(r.mass[size_t(h) * T + s], std::exp(dot / 8.0 - r.lse[h]), 1e-5);
      }
    }
  }
}

TEST(PagedDecodeAttentionTest, HeadDim128MixedFormatsPerBlockAndAbsoluteAddresses) {
  std::mt19937 rng(testing::TestSeed(77));
  const PageShape shape{16, 2, 128};
  const int T = 16 * 4 + 9;
  const Data d = MakeData(shape, 8, T, 1, true, rng);
  // Every block a different pair, the partial last page quantized too.
  const testing::FormatFn mixed = [](int b) {
    const PageFormat k[] = {PageFormat::kInt2, PageFormat::kInt4, PageFormat::kFP8E4M3,
                            PageFormat::kBF16, PageFormat::kInt8};
    const PageFormat v[] = {PageFormat::kInt4, PageFormat::kF16, PageFormat::kInt8,
                            PageFormat::kInt2, PageFormat::kF32};
    return std::make_pair(k[b % 5], v[b % 5]);
  };
  const testing::PagedKv rel = testing::BuildPaged(shape, d.k, d.v, T, mixed, Backend::kCpu);
  const testing::PagedKv abs =
      testing::BuildPaged(shape, d.k, d.v, T, mixed, Backend::kCpu, /*absolute=*/true);
  const Result ref = Decode(Exec{Backend::kReference}, rel.View(), d);
  for (int threads : {1, 4}) {
    for (bool baseline : {false, true}) {
      cpu::ForceBaselineForTesting(baseline);
      const Result a = Decode(Exec{Backend::kCpu, threads}, rel.View(), d);
      const Result b = Decode(Exec{Backend::kCpu, threads}, abs.View(), d);
      EXPECT_LE(testing::RelL2(a.out, ref.out), 2e-5);
      EXPECT_EQ(a.out, b.out);
      EXPECT_LE(testing::MaxAbsDiff(a.mass, ref.mass), 1e-5);
    }
  }
  cpu::ForceBaselineForTesting(false);
  std::vector<float> want, want_lse;
  testing::DenseAttention(d.k, d.v, T, 2, 128, 8, 1, d.q, &want, &want_lse);
  EXPECT_LE(testing::RelL2(ref.out, want), 0.9 + 0.25);  // int2 K with int4 V dominates
}

TEST(PagedDecodeAttentionTest, LongContextSplitsMatchReference) {
  std::mt19937 rng(testing::TestSeed(31));
  const PageShape shape{16, 3, 64};
  const int T = 16 * 40 + 7;
  const Data d = MakeData(shape, 9, T, 1, true, rng);
  const testing::PagedKv kv = testing::BuildPaged(
      shape, d.k, d.v, T, FullPagesIn(PageFormat::kInt4, PageFormat::kInt8, T, 16), Backend::kCpu);
  const Result ref = Decode(Exec{Backend::kReference}, kv.View(), d);
  for (int threads : {1, 2, 8}) {
    const Result fast = Decode(Exec{Backend::kCpu, threads}, kv.View(), d);
    EXPECT_LE(testing::RelL2(fast.out, ref.out), 2e-5) << threads;
    EXPECT_LE(testing::MaxAbsDiff(fast.lse, ref.lse), 1e-4);
    ExpectMassSumsToGroupSize(fast, d, T);
  }
}

TEST(PagedDecodeAttentionTest, ConcurrentCallersGetTheSameResults) {
  // Several threads share the CPU thread pool: one job holds it, the others
  // must run inline and still be right.
  std::mt19937 rng(testing::TestSeed(8));
  const PageShape shape{16, 3, 64};
  const int T = 16 * 20 + 3;
  const Data d = MakeData(shape, 9, T, 1, false, rng);
  const testing::PagedKv kv = testing::BuildPaged(
      shape, d.k, d.v, T, FullPagesIn(PageFormat::kInt4, PageFormat::kInt8, T, 16), Backend::kCpu);
  const Result want = Decode(Exec{Backend::kCpu, 1}, kv.View(), d);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        const Result got = Decode(Exec{Backend::kCpu}, kv.View(), d);
        if (testing::RelL2(got.out, want.out) > 2e-5) ++mismatches[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(PagedPrefillAttentionTest, ChunkIsCausalAndMatchesDecodeAndDense) {
  std::mt19937 rng(testing::TestSeed(2024));
  const PageShape shape{16, 3, 64};
  const int T = 16 * 5 + 3, num_new = 21;
  const Data d = MakeData(shape, 9, T, num_new, false, rng);
  // Earlier pages quantized, the chunk's pages f16 (as the worker writes them).
  const testing::FormatFn formats = [](int b) {
    return b < 3 ? std::make_pair(PageFormat::kInt8, PageFormat::kInt8)
                 : std::make_pair(PageFormat::kF16, PageFormat::kF16);
  };
  const testing::PagedKv kv = testing::BuildPaged(shape, d.k, d.v, T, formats);
  const size_t n = size_t(num_new) * 9 * 64;
  std::vector<float> ref(n), fast(n), ref_lse(num_new * 9), fast_lse(num_new * 9);
  ASSERT_TRUE(PagedPrefillAttention(Exec{Backend::kReference}, kv.View(), AttentionParams{9},
                                    num_new, d.q.data(), ref.data(), ref_lse.data())
                  .ok());
  ASSERT_TRUE(PagedPrefillAttention(Exec{Backend::kCpu, 3}, kv.View(), AttentionParams{9},
                                    num_new, d.q.data(), fast.data(), fast_lse.data())
                  .ok());
  EXPECT_LE(testing::RelL2(fast, ref), 2e-5);
  EXPECT_LE(testing::MaxAbsDiff(fast_lse, ref_lse), 1e-4);
  std::vector<float> want, want_lse;
  testing::DenseAttention(d.k, d.v, T, 3, 64, 9, num_new, d.q, &want, &want_lse);
  EXPECT_LE(testing::RelL2(ref, want), 2 * FormatTolerance(PageFormat::kInt8));
  // Query i equals a decode step over the first T - num_new + i + 1 slots.
  for (int i : {0, 7, num_new - 1}) {
    PagedKvView view = kv.View();
    view.num_tokens = T - num_new + i + 1;
    view.num_blocks = (view.num_tokens + 15) / 16;
    std::vector<float> out(9 * 64), lse(9);
    ASSERT_TRUE(PagedDecodeAttention(Exec{Backend::kCpu}, view, AttentionParams{9},
                                     d.q.data() + size_t(i) * 9 * 64, out.data(), lse.data(),
                                     nullptr)
                    .ok());
    const std::vector<float> row(fast.begin() + size_t(i) * 9 * 64,
                                 fast.begin() + size_t(i + 1) * 9 * 64);
    EXPECT_LE(testing::RelL2(out, row), 2e-5) << "query " << i;
  }
}

// A prefill's slot mass is the sum of the decode masses of its queries, each
// over its causal prefix: what the worker reports for H2O-style scores.
// A chunk's slot mass against one decode per query of the chunk: their sum
// (kSum), or the most of them (kMax, KVzip's score: decode takes the most over
// the group's heads, prefill also over the queries). Reference and CPU agree,
// on one thread (a chunk this long is one split per query tile: each item
// reduces its own rows) and on three (slot ranges split where there are
// fewer tiles than work items). Returns the CPU's mass.
std::vector<float> ExpectPrefillMassFromDecodes(MassReduce reduce, int T, int num_new,
                                                uint32_t seed, int bt = 16) {
  std::mt19937 rng(testing::TestSeed(seed));
  const PageShape shape{bt, 3, 64};
  const int Hq = 9;
  const Data d = MakeData(shape, Hq, T, num_new, true, rng);
  const testing::PagedKv kv = testing::BuildPaged(
      shape, d.k, d.v, T, FullPagesIn(PageFormat::kInt4, PageFormat::kInt8, T, bt));
  AttentionParams p{Hq};
  p.mass_reduce = reduce;
  const bool most = reduce == MassReduce::kMax;
  std::vector<float> out(size_t(num_new) * Hq * 64), ref_mass(3 * T), fast_mass(3 * T, -1.0f);
  EXPECT_TRUE(PagedPrefillAttention(Exec{Backend::kReference}, kv.View(), p, num_new, d.q.data(),
                                    out.data(), nullptr, ref_mass.data())
                  .ok());
  for (int threads : {3, 1}) {
    EXPECT_TRUE(PagedPrefillAttention(Exec{Backend::kCpu, threads}, kv.View(), p, num_new,
                                      d.q.data(), out.data(), nullptr, fast_mass.data())
                    .ok());
    EXPECT_LE(testing::MaxAbsDiff(fast_mass, ref_mass), 1e-4) << threads << " threads";
  }
  std::vector<float> want(3 * T, 0.0f);
  for (int i = 0; i < num_new; ++i) {
    PagedKvView view = kv.View();
    view.num_tokens = T - num_new + i + 1;
    view.num_blocks = (view.num_tokens + bt - 1) / bt;
    std::vector<float> o(Hq * 64), mass(3 * view.num_tokens), sum(3 * view.num_tokens);
    const float* qi = d.q.data() + size_t(i) * Hq * 64;
    EXPECT_TRUE(PagedDecodeAttention(Exec{Backend::kCpu}, view, p, qi, o.data(), nullptr,
                                     mass.data())
                    .ok());
    EXPECT_TRUE(PagedDecodeAttention(Exec{Backend::kCpu}, view, AttentionParams{Hq}, qi, o.data(),
                                     nullptr, sum.data())
                    .ok());
    for (int h = 0; h < 3; ++h) {
      for (int s = 0; s < view.num_tokens; ++s) {
        const size_t x = size_t(h) * view.num_tokens + s;
        float& w = want[size_t(h) * T + s];
        w = most ? std::max(w, mass[x]) : w + mass[x];
        if (most) {
          // The most of a group's three heads: between a third of their sum and the sum.
          EXPECT_LE(mass[x], sum[x] + 1e-6f);
          EXPECT_GE(mass[x], sum[x] / 3 - 1e-6f);
        }
      }
    }
  }
  EXPECT_LE(testing::MaxAbsDiff(fast_mass, want), 1e-4);
  return fast_mass;
}

TEST(PagedPrefillAttentionTest, MassIsTheSumOfEachQuerysDecodeMass) {
  const int T = 16 * 6 + 9, num_new = 37;  // the chunk spans three pages
  const std::vector<float> mass = ExpectPrefillMassFromDecodes(MassReduce::kSum, T, num_new, 77);
  for (int h = 0; h < 3; ++h) {
    double sum = 0;
    for (int s = 0; s < T; ++s) sum += mass[size_t(h) * T + s];
    EXPECT_NEAR(sum, 3.0 * num_new, 1e-3) << "kv head " << h << ": group size x queries";
  }
}

// Pages of 24 tokens: a tile's 16-lane stores of numerators reach past its
// page (into the next, which the same query writes after, or unseen slots).
TEST(PagedPrefillAttentionTest, MassOnPagesOfNoWholeLaneGroups) {
  ExpectPrefillMassFromDecodes(MassReduce::kMax, 24 * 4 + 5, 33, 79, 24);
  ExpectPrefillMassFromDecodes(MassReduce::kSum, 24 * 4 + 5, 33, 80, 24);
}

TEST(PagedPrefillAttentionTest, MaxMassIsTheMostOfEachQuerysDecodeMass) {
  for (float m : ExpectPrefillMassFromDecodes(MassReduce::kMax, 16 * 5 + 7, 29, 78)) {
    EXPECT_GE(m, 0.0f);
    EXPECT_LE(m, 1.0f + 1e-6f);
  }
}

// ---- slot bias (merged slots: log(count) added to the slot's score) ----

// Runs decode (num_queries == 1) or prefill attention with an optional bias.
Result Attend(const Exec& exec, const PagedKvView& kv, const Data& d, int num_queries,
              const float* bias) {
  Result r;
  r.out.resize(size_t(num_queries) * d.num_q_heads * d.shape.head_dim);
  r.lse.resize(size_t(num_queries) * d.num_q_heads);
  r.mass.resize(size_t(d.shape.num_kv_heads) * kv.num_tokens);
  const AttentionParams p{d.num_q_heads, 0.0f, bias};
  const absl::Status st =
      num_queries == 1
          ? PagedDecodeAttention(exec, kv, p, d.q.data(), r.out.data(), r.lse.data(), r.mass.data())
          : PagedPrefillAttention(exec, kv, p, num_queries, d.q.data(), r.out.data(), r.lse.data(),
                                  r.mass.data());
  EXPECT_TRUE(st.ok()) << st;
  return r;
}

// The fused pass reads f32/f16/bf16/int rows in place when head_dim is a
// multiple of 16 and decodes a tile first otherwise (fp8 always): every such
// case, with page sizes that leave score lanes unused (7) or need two vector
// rows (24), and groups that split into passes of 4 query heads and a rest
// (1, 2, 5, 7), for decode and a prefill chunk, in every CPU copy.
TEST(PagedAttentionFusedPassTest, EveryShapeAndFormatMatchesReference) {
  std::mt19937 rng(testing::TestSeed(20261206));
  struct Case {
    PageShape shape;
    int num_q_heads;
  };
  const Case cases[] = {{{7, 2, 24}, 10}, {{24, 1, 48}, 7}, {{16, 2, 96}, 4}, {{16, 3, 8}, 3},
                        {{8, 2, 64}, 14}};
  for (const Case& c : cases) {
    const PageShape& shape = c.shape;
    const int T = shape.block_tokens * 5 + 3;
    for (int num_queries : {1, 6}) {
      const Data d = MakeData(shape, c.num_q_heads, T, num_queries, true, rng);
      for (PageFormat kf : kAllFormats) {
        for (PageFormat vf : kAllFormats) {
          if (!GeomOf(shape).Supports(kf, KvKind::kKey) ||
              !GeomOf(shape).Supports(vf, KvKind::kValue)) {
            continue;
          }
          SCOPED_TRACE(::testing::Message()
                       << "bt=" << shape.block_tokens << " D=" << shape.head_dim
                       << " Hq=" << c.num_q_heads << " queries=" << num_queries
                       << " K=" << FormatShortName(kf) << " V=" << FormatShortName(vf));
          const testing::PagedKv kv = testing::BuildPaged(
              shape, d.k, d.v, T, FullPagesIn(kf, vf, T, shape.block_tokens));
          const Result ref = Attend(Exec{Backend::kReference}, kv.View(), d, num_queries, nullptr);
          for (bool baseline : {false, true}) {
            cpu::ForceBaselineForTesting(baseline);
            const Result fast = Attend(Exec{Backend::kCpu, 2}, kv.View(), d, num_queries, nullptr);
            EXPECT_LE(testing::RelL2(fast.out, ref.out), 2e-5) << "baseline=" << baseline;
            EXPECT_LE(testing::MaxAbsDiff(fast.lse, ref.lse), 1e-4) << "baseline=" << baseline;
            EXPECT_LE(testing::MaxAbsDiff(fast.mass, ref.mass), 1e-5 * num_queries)
                << "baseline=" << baseline;
          }
          cpu::ForceBaselineForTesting(false);
        }
      }
    }
  }
}

TEST(PagedAttentionSlotBiasTest, CpuMatchesReference) {
  std::mt19937 rng(testing::TestSeed(4242));
  const PageShape shape{16, 3, 64};
  const int T = 16 * 12 + 5;
  std::vector<float> bias(T);
  std::uniform_int_distribution<int> count(1, 6);
  std::uniform_real_distribution<float> jitter(-2.0f, 2.0f);
  for (int s = 0; s < T; ++s) bias[s] = s % 3 == 0 ? std::log(float(count(rng))) : jitter(rng);
  for (int num_queries : {1, 13}) {
    SCOPED_TRACE(::testing::Message() << "num_queries=" << num_queries);
    const Data d = MakeData(shape, 9, T, num_queries, true, rng);
    const testing::PagedKv kv = testing::BuildPaged(
        shape, d.k, d.v, T, FullPagesIn(PageFormat::kInt4, PageFormat::kInt8, T, 16));
    const Result ref = Attend(Exec{Backend::kReference}, kv.View(), d, num_queries, bias.data());
    const Result plain = Attend(Exec{Backend::kReference}, kv.View(), d, num_queries, nullptr);
    EXPECT_GT(testing::RelL2(plain.out, ref.out), 1e-2) << "the bias must change the output";
    for (int threads : {1, 3}) {
      for (bool baseline : {false, true}) {
        cpu::ForceBaselineForTesting(baseline);
        const Result fast =
            Attend(Exec{Backend::kCpu, threads}, kv.View(), d, num_queries, bias.data());
        EXPECT_LE(testing::RelL2(fast.out, ref.out), 2e-5) << threads << " " << baseline;
        EXPECT_LE(testing::MaxAbsDiff(fast.lse, ref.lse), 1e-4);
        EXPECT_LE(testing::MaxAbsDiff(fast.mass, ref.mass), 1e-4);
      }
    }
    cpu::ForceBaselineForTesting(false);
    // The mass is of the biased softmax: each query's still sums to 1 per head.
    for (int h = 0; h < 3; ++h) {
      double sum = 0;
      for (int s = 0; s < T; ++s) sum += ref.mass[size_t(h) * T + s];
      EXPECT_NEAR(sum, 3.0 * num_queries, 1e-4 * num_queries) << "kv head " << h;
    }
  }
}

// The identity the bias exists for: a slot with bias log(c) is c identical
// copies of that slot without bias (same output, same lse; the slot's mass is
// the copies' total). f32 pages, so the copies decode exactly alike.
TEST(PagedAttentionSlotBiasTest, LogCountEqualsCountCopiesOfTheSlot) {
  std::mt19937 rng(testing::TestSeed(1717));
  const PageShape shape{16, 2, 64};
  const int prefix = 37;  // slots before the queries' own (decode: 1, prefill: 6)
  const std::vector<std::pair<int, int>> merged = {{3, 3}, {20, 2}, {21, 5}};  // slot, count
  const testing::FormatFn f32 = [](int) {
    return std::make_pair(PageFormat::kF32, PageFormat::kF32);
  };
  const size_t row = size_t(shape.num_kv_heads) * shape.head_dim;
  for (int num_queries : {1, 6}) {
    SCOPED_TRACE(::testing::Message() << "num_queries=" << num_queries);
    const int T = prefix + num_queries;
    Data d = MakeData(shape, 8, T, num_queries, false, rng);
    // Make the merged slots matter: their keys lean towards the first query
    // head of their KV head's group (8 query heads over 2 KV heads).
    for (const auto& [s, c] : merged) {
      for (int h = 0; h < 2; ++h) {
        for (int x = 0; x < 64; ++x) d.k[s * row + h * 64 + x] += 0.1f * d.q[(h * 4) * 64 + x];
      }
    }
    std::vector<float> bias(T, 0.0f);
    for (const auto& [s, c] : merged) bias[s] = std::log(float(c));
    // The same cache with count - 1 extra copies of each merged slot inserted
    // after the prefix (before the queries' slots, so every query sees them).
    std::vector<float> k2(d.k.begin(), d.k.begin() + prefix * row);
    std::vector<float> v2(d.v.begin(), d.v.begin() + prefix * row);
    std::vector<std::pair<int, int>> copies_of;  // (slot in the copy, original slot)
    for (const auto& [s, c] : merged) {
      for (int n = 1; n < c; ++n) {
        copies_of.emplace_back(int(k2.size() / row), s);
        k2.insert(k2.end(), d.k.begin() + s * row, d.k.begin() + (s + 1) * row);
        v2.insert(v2.end(), d.v.begin() + s * row, d.v.begin() + (s + 1) * row);
      }
    }
    k2.insert(k2.end(), d.k.begin() + prefix * row, d.k.end());
    v2.insert(v2.end(), d.v.begin() + prefix * row, d.v.end());
    const int T2 = int(k2.size() / row);
    const testing::PagedKv kv = testing::BuildPaged(shape, d.k, d.v, T, f32);
    const testing::PagedKv kv2 = testing::BuildPaged(shape, k2, v2, T2, f32);
    for (Backend b : {Backend::kReference, Backend::kCpu}) {
      SCOPED_TRACE(std::string(BackendName(b)));
      const Result biased = Attend(Exec{b}, kv.View(), d, num_queries, bias.data());
      const Result copies = Attend(Exec{b}, kv2.View(), d, num_queries, nullptr);
      const Result plain = Attend(Exec{b}, kv.View(), d, num_queries, nullptr);
      EXPECT_LE(testing::RelL2(biased.out, copies.out), 1e-5);
      EXPECT_LE(testing::MaxAbsDiff(biased.lse, copies.lse), 1e-5);
      // Without the bias a merged slot weighs as one token: clearly different.
      EXPECT_GT(testing::RelL2(plain.out, copies.out), 1e-2);
      EXPECT_GT(testing::MaxAbsDiff(plain.lse, copies.lse), 1e-2);
      // Mass: a merged slot gets what its copies get together; others equal.
      std::vector<double> want(size_t(shape.num_kv_heads) * T, 0.0);
      for (int h = 0; h < shape.num_kv_heads; ++h) {
        for (int s = 0; s < T2; ++s) {
          int orig = s < prefix ? s : -1;
          for (const auto& [c, o] : copies_of) {
            if (c == s) orig = o;
          }
          if (orig < 0) orig = s - (T2 - T);  // the queries' own slots
          want[size_t(h) * T + orig] += copies.mass[size_t(h) * T2 + s];
        }
        for (int s = 0; s < T; ++s) {
          EXPECT_NEAR(biased.mass[size_t(h) * T + s], want[size_t(h) * T + s], 1e-5)
              << "head " << h << " slot " << s;
        }
      }
    }
  }
}

TEST(PagedAttentionSlotBiasTest, RejectsNonFiniteBiasOnHostBackends) {
  std::mt19937 rng(testing::TestSeed(3));
  const PageShape shape{16, 3, 64};
  const Data d = MakeData(shape, 9, 20, 1, false, rng);
  const testing::PagedKv kv = testing::BuildPaged(
      shape, d.k, d.v, 20, [](int) { return std::make_pair(PageFormat::kF16, PageFormat::kF16); });
  std::vector<float> out(9 * 64);
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> bias(20, 0.0f);
    bias[17] = bad;
    for (Backend b : {Backend::kReference, Backend::kCpu}) {
      const absl::Status st =
          PagedDecodeAttention(Exec{b}, kv.View(), AttentionParams{9, 0.0f, bias.data()},
                               d.q.data(), out.data(), nullptr, nullptr);
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad << " " << st;
      EXPECT_NE(st.message().find("slot_bias[17]"), std::string_view::npos) << st;
    }
  }
}

TEST(PagedAttentionValidationTest, RejectsBadArguments) {
  std::mt19937 rng(testing::TestSeed(1));
  const PageShape shape{16, 3, 64};
  const Data d = MakeData(shape, 9, 20, 1, false, rng);
  testing::PagedKv kv = testing::BuildPaged(
      shape, d.k, d.v, 20, [](int) { return std::make_pair(PageFormat::kF16, PageFormat::kF16); });
  std::vector<float> out(9 * 64);
  const Exec exec{Backend::kCpu};
  EXPECT_EQ(PagedDecodeAttention(exec, kv.View(), AttentionParams{8}, d.q.data(), out.data(),
                                 nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  PagedKvView bad = kv.View();
  bad.num_blocks = 1;
  EXPECT_EQ(PagedDecodeAttention(exec, bad, AttentionParams{9}, d.q.data(), out.data(), nullptr,
                                 nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  kv.blocks[1].v_format = static_cast<PageFormat>(42);
  EXPECT_EQ(PagedDecodeAttention(exec, kv.View(), AttentionParams{9}, d.q.data(), out.data(),
                                 nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  kv.blocks[1].v_format = PageFormat::kF16;
  EXPECT_EQ(PagedPrefillAttention(exec, kv.View(), AttentionParams{9}, 21, d.q.data(), out.data(),
                                  nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  AttentionParams unknown_reduce{9};
  unknown_reduce.mass_reduce = static_cast<MassReduce>(7);
  EXPECT_EQ(PagedDecodeAttention(exec, kv.View(), unknown_reduce, d.q.data(), out.data(), nullptr,
                                 nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  if (CudaDeviceCount() == 0) {
    EXPECT_EQ(PagedDecodeAttention(Exec{Backend::kCuda}, kv.View(), AttentionParams{9},
                                   d.q.data(), out.data(), nullptr, nullptr)
                  .code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace polykv::kernels
