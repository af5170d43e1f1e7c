// polykv-bench kernels: compressed-page kernel throughput and fidelity.
//
// One run prints (with --json, one JSON object on stdout; progress on stderr):
//   quantize    per format: quantize / dequantize throughput of full pages as
//               a ratio to a memcpy of the same f32 bytes with the same threads
//   decode      paged decode attention time for f16/int8/int4/int2 pages
//               (block table in shuffled order) vs f32 dense contiguous K/V,
//               at 1K, 4K and 16K tokens (ratios measured side by side)
//   prefill     the same for a chunk of kPrefillChunk queries at the end of
//               4K and 16K tokens (PagedPrefillAttention)
//   fidelity    relative L2 error of the attention output vs f32 for each
//               (K format, V format) pair, on Gaussian keys and on keys with
//               outlier channels — the K/V asymmetry study
//   fidelity_real  the same table on real K/V/Q (--real-kv DIR, written by
//               kernels/tools/dump_real_kv.py), plus per-channel vs per-token
//               keys; null without --real-kv
//   compaction_drift  attention error after N compactions against quantized
//               once, synthetic keys; compaction_drift_real the same on the
//               --real-kv dump (null without it)
//   intdecode   an experiment (bench/int_decode_proto.h): decode over int8
//               and int4 pages repacked for VNNI integer dot products, timed
//               beside the product's f16/int8/int4 decode on 64-token pages,
//               one thread, and its output compared with theirs; skipped
//               without AVX-512 VNNI. intdecode_real: its error on the
//               --real-kv dump (null without it)
//   cuda        the CUDA backend: decode attention per format against dense
//               f16, and dequantization against a device memcpy; null
//               without a CUDA device (CudaSection)
// Backend: the fast CPU kernels (Backend::kCpu) unless stated.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_json.h"
#include "bench/bench_registry.h"
#include "bench/int_decode_proto.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "kernels/page_codec.h"
#include "kernels/page_format.h"

namespace polykv::bench {
namespace {

using kernels::AttentionParams;
using kernels::Backend;
using kernels::BlockEntry;
using kernels::Exec;
using kernels::KvKind;
using kernels::PageFormat;
using kernels::PageShape;
using kernels::PagedKvView;
using kernels::SourceType;

struct Options {
  bool json = false;
  bool quick = false;
  int threads = 0;
  std::string real_kv;  // directory written by kernels/tools/dump_real_kv.py
  std::string only;     // one section (--only), or all
  bool Runs(const char* section) const { return only.empty() || only == section; }
};

using Clock = std::chrono::steady_clock;

// Queries of the prefill section's chunk.
constexpr int kPrefillChunk = 64;

// Median seconds of each fn, measured round-robin (fn0, fn1, ..., fn0, ...) so
// that ratios between them are side by side even on a noisy machine.
std::vector<double> TimeInterleaved(const std::vector<std::function<void()>>& fns,
                                    int min_reps = 7, double budget_s = 0.5) {
  for (const auto& f : fns) f();  // warm-up
  std::vector<std::vector<double>> t(fns.size());
  const auto start = Clock::now();
  for (int rep = 0;; ++rep) {
    if (rep >= min_reps &&
        (std::chrono::duration<double>(Clock::now() - start).count() >= budget_s || rep >= 200)) {
      break;
    }
    for (size_t i = 0; i < fns.size(); ++i) {
      const auto a = Clock::now();
      fns[i]();
      t[i].push_back(std::chrono::duration<double>(Clock::now() - a).count());
    }
  }
  std::vector<double> med;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t[], AlignedFree>;
Buffer Alloc(size_t bytes) {
  bytes = (bytes + 255) / 256 * 256;
  return Buffer(static_cast<uint8_t*>(std::aligned_alloc(256, std::max<size_t>(bytes, 256))));
}

std::vector<float> Normal(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A few channels per head with large magnitude and offset, as in real models.
void AddOutlierChannels(std::vector<float>& k, int T, int H, int D, std::mt19937& rng) {
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
}

void Check(const absl::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "kernels bench: %s: %s\n", what, std::string(st.message()).c_str());
    std::exit(1);
  }
}

std::string Name(PageFormat f) { return std::string(kernels::FormatShortName(f)); }

// Precision in the JSON: times, throughputs and their ratios to 4 significant
// digits (timer noise is larger than that); fidelity errors, seeded and
// reproducible, to 6 (what the stream-built output carried).
double RoundTiming(double x) { return RoundSignificant(x, 4); }
double RoundError(double x) { return RoundSignificant(x, 6); }

// {"block_tokens", "num_kv_heads", "head_dim"} of `s`, the "shape" of a section.
Json ShapeJson(const PageShape& s) {
  return {
      {"block_tokens", s.block_tokens}, {"num_kv_heads", s.num_kv_heads}, {"head_dim", s.head_dim}};
}

// K and V pages of T tokens: full pages in (kf, vf), a partial last page in
// f16 (the residual rule); one arena per kind. Blocks are listed in a shuffled
// physical order unless `contiguous` (then, in f32 with T a multiple of the
// page size, K and V are each one dense [T][H][D] tensor).
struct Paged {
  Buffer k_arena, v_arena;
  std::vector<BlockEntry> blocks;
  PagedKvView view;
};

Paged BuildPaged(const PageShape& s, const std::vector<float>& k, const std::vector<float>& v,
                 int T, PageFormat kf, PageFormat vf, bool contiguous, int threads,
                 std::mt19937& rng) {
  Paged p;
  const int bt = s.block_tokens;
  const int full = T / bt, nb = (T + bt - 1) / bt;
  const size_t kb = std::max(kernels::PageBytes(kf, KvKind::kKey, s),
                             kernels::PageBytes(PageFormat::kF16, KvKind::kKey, s));
  const size_t vb = std::max(kernels::PageBytes(vf, KvKind::kValue, s),
                             kernels::PageBytes(PageFormat::kF16, KvKind::kValue, s));
  // Full pages are packed at their own size; the slot stride is the larger size
  // only where a partial page follows (keeps dense f32 contiguous).
  const size_t kfull = kernels::PageBytes(kf, KvKind::kKey, s);
  const size_t vfull = kernels::PageBytes(vf, KvKind::kValue, s);
  p.k_arena = Alloc(kfull * full + kb);
  p.v_arena = Alloc(vfull * full + vb);
  const Exec exec{Backend::kCpu, threads};
  const size_t row = size_t(s.num_kv_heads) * s.head_dim;
  Check(kernels::QuantizePages(exec, s, KvKind::kKey, kf, k.data(), SourceType::kF32, full,
                               p.k_arena.get()),
        "quantize K");
  Check(kernels::QuantizePages(exec, s, KvKind::kValue, vf, v.data(), SourceType::kF32, full,
                               p.v_arena.get()),
        "quantize V");
  if (nb > full) {
    Check(kernels::QuantizePage(exec, s, KvKind::kKey, PageFormat::kF16, k.data() + full * bt * row,
                                SourceType::kF32, T - full * bt, p.k_arena.get() + full * kfull),
          "quantize partial K");
    Check(kernels::QuantizePage(exec, s, KvKind::kValue, PageFormat::kF16,
                                v.data() + full * bt * row, SourceType::kF32, T - full * bt,
                                p.v_arena.get() + full * vfull),
          "quantize partial V");
  }
  std::vector<int> order(full);
  std::iota(order.begin(), order.end(), 0);
  if (!contiguous) {
    // Logical block b lives at physical slot perm[b]: move pages accordingly.
    std::vector<int> perm = order;
    std::shuffle(perm.begin(), perm.end(), rng);
    Buffer k2 = Alloc(kfull * full + kb), v2 = Alloc(vfull * full + vb);
    for (int b = 0; b < full; ++b) {
      std::memcpy(k2.get() + perm[b] * kfull, p.k_arena.get() + b * kfull, kfull);
      std::memcpy(v2.get() + perm[b] * vfull, p.v_arena.get() + b * vfull, vfull);
    }
    std::memcpy(k2.get() + full * kfull, p.k_arena.get() + full * kfull, kb);
    std::memcpy(v2.get() + full * vfull, p.v_arena.get() + full * vfull, vb);
    p.k_arena = std::move(k2);
    p.v_arena = std::move(v2);
    order = perm;
  }
  for (int b = 0; b < nb; ++b) {
    BlockEntry e;
    const bool partial = b == full;
    e.k_offset = uint64_t(uintptr_t(p.k_arena.get() + (partial ? full : order[b]) * kfull));
    e.v_offset = uint64_t(uintptr_t(p.v_arena.get() + (partial ? full : order[b]) * vfull));
    e.k_format = partial ? PageFormat::kF16 : kf;
    e.v_format = partial ? PageFormat::kF16 : vf;
    p.blocks.push_back(e);
  }
  p.view = PagedKvView{s, nullptr, p.blocks.data(), nb, T};
  return p;
}

double RelL2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

// Keys quantized PER TOKEN (the value layout: groups of 32 channels per
// token) and decoded back: what a per-token key format would feed attention.
// Full pages only; the rows of a partial last page are left as they are.
std::vector<float> PerTokenFakeQuant(const std::vector<float>& k, const PageShape& s, int T,
                                     PageFormat f, int threads) {
  const int full = T / s.block_tokens;
  std::vector<float> out = k;
  Buffer pages = Alloc(kernels::PageBytes(f, KvKind::kValue, s) * std::max(full, 1));
  const Exec exec{Backend::kCpu, threads};
  Check(kernels::QuantizePages(exec, s, KvKind::kValue, f, k.data(), SourceType::kF32, full,
                               pages.get()),
        "fake-quantize");
  Check(kernels::DequantizePages(exec, s, KvKind::kValue, f, pages.get(), full, out.data()),
        "fake-dequantize");
  return out;
}

// Per-token keys over standardized channels: each channel's mean subtracted
// and the result divided by its largest |k - mean|, both fixed per (head,
// channel) for the whole sequence (taken over the first kNormTokens tokens,
// as a worker would know them after its first prefill chunk, in f16), then
// quantized per token and mapped back. Params that travel with the token plus
// one pair per channel and session: a key format compaction could move
// without re-quantizing (docs/results/2026-12-07-key-drift).
constexpr int kNormTokens = 128;
std::vector<float> StandardizedPerTokenFakeQuant(const std::vector<float>& k, const PageShape& s,
                                               int T, PageFormat f, int threads) {
  const int H = s.num_kv_heads, D = s.head_dim;
  const size_t row = size_t(H) * D;
  const int nt = std::min(T, kNormTokens);
  std::vector<float> mean(row, 0.0f), norm(row, 0.0f);
  for (int t = 0; t < nt; ++t) {
    for (size_t c = 0; c < row; ++c) mean[c] += k[t * row + c] / nt;
  }
  for (float& m : mean) m = kernels::F16ToF32(kernels::F32ToF16(m));
  for (int t = 0; t < nt; ++t) {
    for (size_t c = 0; c < row; ++c) {
      norm[c] = std::max(norm[c], std::fabs(k[t * row + c] - mean[c]));
    }
  }
  for (float& n : norm) n = n > 0.0f ? kernels::F16ToF32(kernels::F32ToF16(n)) : 1.0f;
  std::vector<float> scaled(k.size());
  for (size_t i = 0; i < k.size(); ++i) scaled[i] = (k[i] - mean[i % row]) / norm[i % row];
  std::vector<float> out = PerTokenFakeQuant(scaled, s, T, f, threads);
  const int full = T / s.block_tokens * s.block_tokens;
  for (size_t i = 0; i < size_t(full) * row; ++i) out[i] = out[i] * norm[i % row] + mean[i % row];
  for (size_t i = size_t(full) * row; i < k.size(); ++i) out[i] = k[i];
  return out;
}

// Product-quantized keys (PolyKV's design; [fidelity-2] scope 2): each head's
// D channels cut into D/m subspaces of m channels, and per (head, subspace) a
// codebook of 256 centroids in f16, trained by k-means on the first `train`
// tokens and then fixed for the session: a key is one byte per m channels, 8/m
// bits an element, and compaction could move it without re-encoding. Returns
// every token's key as the codebook gives it back. The codebooks cost
// 256 x 16 bits per channel and session: 4096 / T bits an element over T
// tokens, on top of the codes.
constexpr int kPqCentroids = 256;
constexpr int kPqIterations = 12;
std::vector<float> PqFakeQuant(const std::vector<float>& k, const PageShape& s, int T, int m,
                               int train) {
  const int H = s.num_kv_heads, D = s.head_dim;
  const int n = std::min(T, train), kc = std::min(kPqCentroids, n);
  std::vector<float> out(k.size());
  std::vector<float> c(size_t(kc) * m), sum(size_t(kc) * m);
  std::vector<int> count(kc), assign(n);
  for (int h = 0; h < H; ++h) {
    for (int sub = 0; sub < D / m; ++sub) {
      const auto at = [&](int t) { return &k[(size_t(t) * H + h) * D + size_t(sub) * m]; };
      const auto nearest = [&](const float* x) {
        int best = 0;
        float best_d = std::numeric_limits<float>::infinity();
        for (int i = 0; i < kc; ++i) {
          float d = 0;
          for (int j = 0; j < m; ++j) d += (x[j] - c[i * m + j]) * (x[j] - c[i * m + j]);
          if (d < best_d) best_d = d, best = i;
        }
        return best;
      };
      for (int i = 0; i < kc; ++i) std::copy_n(at(int(int64_t(i) * n / kc)), m, &c[i * m]);
      for (int it = 0; it < kPqIterations; ++it) {
        for (int t = 0; t < n; ++t) assign[t] = nearest(at(t));
        std::fill(sum.begin(), sum.end(), 0.0f);
        std::fill(count.begin(), count.end(), 0);
        for (int t = 0; t < n; ++t) {
          ++count[assign[t]];
          for (int j = 0; j < m; ++j) sum[assign[t] * m + j] += at(t)[j];
        }
        for (int i = 0; i < kc; ++i) {  // an empty cluster keeps its centroid
          for (int j = 0; j < m && count[i] > 0; ++j) c[i * m + j] = sum[i * m + j] / count[i];
        }
      }
      for (float& x : c) x = kernels::F16ToF32(kernels::F32ToF16(x));
      for (int t = 0; t < T; ++t) {
        const int i = nearest(at(t));
        std::copy_n(&c[i * m], m, &out[(size_t(t) * H + h) * D + size_t(sub) * m]);
      }
    }
  }
  return out;
}

// Keys before RoPE (when the dump has them) on the int formats' grids, then
// rotated as the model does (k = kpre * cos + rotate_half(kpre) * sin):
// per-channel params per 16-token page as the page formats keep them, or per
// channel fixed for the session from the first kSessionGridTokens tokens
// (clamped beyond) — a grid a key could keep wherever compaction moves it,
// which after RoPE fails because slow channel pairs keep turning.
constexpr int kSessionGridTokens = 512;
struct Rope {
  std::vector<float> cos, sin;  // [T][D]
};
std::vector<float> Rotate(const std::vector<float>& x, const PageShape& s, int T, const Rope& r) {
  const int H = s.num_kv_heads, D = s.head_dim, half = D / 2;
  std::vector<float> out(x.size());
  for (int t = 0; t < T; ++t) {
    const float* c = &r.cos[size_t(t) * D];
    const float* sn = &r.sin[size_t(t) * D];
    for (int h = 0; h < H; ++h) {
      const float* a = &x[(size_t(t) * H + h) * D];
      float* o = &out[(size_t(t) * H + h) * D];
      for (int d = 0; d < D; ++d) {
        o[d] = a[d] * c[d] + (d < half ? -a[d + half] : a[d - half]) * sn[d];
      }
    }
  }
  return out;
}

// Each (head, channel) on one grid for the session: f's codes and params as a
// page's (the page codec's), over the range of the first `grid_tokens`
// tokens; later values beyond it clamp.
std::vector<float> SessionGridFakeQuant(const std::vector<float>& k, const PageShape& s, int T,
                                        PageFormat f, int grid_tokens) {
  const size_t row = size_t(s.num_kv_heads) * s.head_dim;
  const int n = std::min(T, grid_tokens);
  std::vector<float> lo(row, kernels::kPosInf), hi(row, -kernels::kPosInf);
  for (int t = 0; t < n; ++t) {
    for (size_t c = 0; c < row; ++c) {
      lo[c] = kernels::MinSkipNan(lo[c], k[t * row + c]);
      hi[c] = kernels::MaxSkipNan(hi[c], k[t * row + c]);
    }
  }
  std::vector<float> out(k.size());
  for (size_t c = 0; c < row; ++c) {
    uint16_t scale16, zero16;
    kernels::IntParams(lo[c], hi[c], kernels::QMax(f), &scale16, &zero16);
    const float scale = kernels::F16ToF32(scale16), zero = kernels::F16ToF32(zero16);
    for (int t = 0; t < T; ++t) {
      const uint32_t code = kernels::EncodeScaled(f, k[t * row + c], scale, zero);
      out[t * row + c] = kernels::DecodeScaled(f, code, scale, zero);
    }
  }
  return out;
}

// One layer's keys in the real-K/V ablation's extra layouts, per int format:
// product-quantized at its code bits (m = 8 / bits channels a byte) with
// codebooks from the first kPqTrainTokens tokens (what a daemon could fit
// after a prompt) and from all tokens (an upper bound no online codebook
// reaches: it has seen the keys it encodes); post-RoPE keys on a session
// grid; and, when the dump has the keys before RoPE, those on page and
// session grids, rotated back.
constexpr int kPqTrainTokens = 512;
using KeyVariants = std::map<int, std::map<std::string, std::vector<float>>>;
KeyVariants KeyVariantsOf(const std::vector<float>& k, const std::vector<float>* kpre,
                          const Rope* rope, const PageShape& s, int T, int threads) {
  KeyVariants out;
  for (PageFormat f : {PageFormat::kInt8, PageFormat::kInt4, PageFormat::kInt2}) {
    auto& v = out[int(f)];
    const int m = 8 / kernels::BitsOf(f);
    v["pq_codebook_first_tokens"] = PqFakeQuant(k, s, T, m, kPqTrainTokens);
    v["pq_codebook_all_tokens"] = PqFakeQuant(k, s, T, m, T);
    v["session_grid"] = SessionGridFakeQuant(k, s, T, f, kSessionGridTokens);
    if (kpre && rope) {
      // Page grids through the page codec: keys of full pages, the rest kept.
      std::vector<float> paged = *kpre;
      const int full = T / s.block_tokens;
      Buffer pages = Alloc(kernels::PageBytes(f, KvKind::kKey, s) * std::max(full, 1));
      const Exec exec{Backend::kCpu, threads};
      Check(kernels::QuantizePages(exec, s, KvKind::kKey, f, kpre->data(), SourceType::kF32, full,
                                   pages.get()),
            "pre-RoPE quantize");
      Check(kernels::DequantizePages(exec, s, KvKind::kKey, f, pages.get(), full, paged.data()),
            "pre-RoPE dequantize");
      v["pre_rope_page_grid"] = Rotate(paged, s, T, *rope);
      v["pre_rope_session_grid"] =
          Rotate(SessionGridFakeQuant(*kpre, s, T, f, kSessionGridTokens), s, T, *rope);
    }
  }
  return out;
}

// Relative L2 error with V in f16 and K either in `f` (per channel, the page
// format), per-token fake-quantized with `f` (the KIVI question), per token
// over standardized channels, or in the named extra layouts (when given).
struct KeyAblation {
  double per_channel = 0, per_token = 0, per_token_standardized = 0;
  std::map<std::string, double> extra;
};

void AddKeyAblation(const PageShape& s, const std::vector<float>& k, const std::vector<float>& v,
                    int T, int Hq, const float* q, const std::vector<float>& want, int threads,
                    std::mt19937& rng, std::map<int, KeyAblation>* acc, double weight,
                    const KeyVariants* variants = nullptr) {
  const Exec exec{Backend::kCpu, threads};
  std::vector<float> got(want.size());
  // The error of decode attention over keys `keys` stored in `kf`, V in f16.
  const auto error = [&](const std::vector<float>& keys, PageFormat kf) {
    const Paged p = BuildPaged(s, keys, v, T, kf, PageFormat::kF16, true, threads, rng);
    Check(kernels::PagedDecodeAttention(exec, p.view, AttentionParams{Hq}, q, got.data(), nullptr,
                                        nullptr),
          "decode");
    return weight * RelL2(got, want);
  };
  for (PageFormat f : {PageFormat::kInt8, PageFormat::kInt4, PageFormat::kInt2}) {
    KeyAblation& a = (*acc)[int(f)];
    a.per_channel += error(k, f);
    a.per_token += error(PerTokenFakeQuant(k, s, T, f, threads), PageFormat::kF32);
    a.per_token_standardized +=
        error(StandardizedPerTokenFakeQuant(k, s, T, f, threads), PageFormat::kF32);
    if (variants) {
      for (const auto& [name, keys] : variants->at(int(f))) {
        a.extra[name] += error(keys, PageFormat::kF32);
      }
    }
  }
}

Json AblationJson(const std::map<int, KeyAblation>& acc, const char* label) {
  Json j = Json::object();
  for (const auto& [f, a] : acc) {
    Json& row = j[Name(PageFormat(f))];
    row = {{"per_channel", RoundError(a.per_channel)},
           {"per_token", RoundError(a.per_token)},
           {"per_token_standardized", RoundError(a.per_token_standardized)}};
    std::fprintf(stderr,
                 "key layout (%s, V f16) K %-5s per-channel %.5f  per-token %.5f  "
                 "per-token standardized %.5f\n",
                 label, Name(PageFormat(f)).c_str(), a.per_channel, a.per_token,
                 a.per_token_standardized);
    for (const auto& [name, e] : a.extra) {
      row[name] = RoundError(e);
      std::fprintf(stderr, "    %-26s %.5f\n", name.c_str(), e);
    }
  }
  return j;
}

constexpr PageFormat kQuantFormats[] = {PageFormat::kF32,  PageFormat::kF16,  PageFormat::kBF16,
                                        PageFormat::kFP8E4M3, PageFormat::kInt8, PageFormat::kInt4,
                                        PageFormat::kInt2};

Json QuantizeSection(const Options& o) {
  const PageShape s{16, 8, 128};
  const int pages = o.quick ? 128 : 1024;  // 1024 pages = 64 MiB of f32 rows
  const size_t elems = size_t(16) * 8 * 128 * pages;
  std::mt19937 rng(1);
  std::vector<float> src = Normal(elems, rng);
  std::vector<float> out(elems), copy(elems);
  kernels::cpu::ThreadPool& pool = kernels::cpu::ThreadPool::Shared();
  const int chunks = 64;
  // The same bytes, copied with the same threads.
  const auto memcpy_fn = [&] {
    pool.ParallelFor(chunks, o.threads, [&](int c) {
      const size_t n = elems / chunks;
      std::memcpy(copy.data() + c * n, src.data() + c * n, n * sizeof(float));
    });
  };
  double memcpy_sum = 0;
  int memcpy_n = 0;
  const double bytes = double(elems) * sizeof(float);
  Json js = {{"shape", ShapeJson(s)},
             {"pages", pages},
             {"f32_bytes", size_t(bytes)},
             {"ratio",
              "memcpy seconds / kernel seconds for the same f32 bytes, same threads, interleaved"},
             {"formats", Json::object()}};
  for (PageFormat f : kQuantFormats) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      const size_t pb = kernels::PageBytes(f, kind, s);
      Buffer pg = Alloc(pb * pages);
      const Exec exec{Backend::kCpu, o.threads};
      const std::vector<double> t = TimeInterleaved(
          {memcpy_fn,
           [&] {
             Check(kernels::QuantizePages(exec, s, kind, f, src.data(), SourceType::kF32, pages,
                                          pg.get()),
                   "quantize");
           },
           [&] {
             Check(kernels::DequantizePages(exec, s, kind, f, pg.get(), pages, out.data()),
                   "dequantize");
           }});
      const double t_memcpy = t[0], tq = t[1], td = t[2];
      memcpy_sum += t_memcpy;
      ++memcpy_n;
      const std::string key = Name(f) + (kind == KvKind::kKey ? "_k" : "_v");
      std::fprintf(stderr, "quantize %-7s q %.2f GB/s (%.2fx memcpy)  dq %.2f GB/s (%.2fx)\n",
                   key.c_str(), bytes / tq / 1e9, t_memcpy / tq, bytes / td / 1e9, t_memcpy / td);
      js["formats"][key] = {{"bits_per_elem", double(pb) * 8 / (16.0 * 8 * 128)},
                            {"quantize_gbps", RoundTiming(bytes / tq / 1e9)},
                            {"quantize_vs_memcpy", RoundTiming(t_memcpy / tq)},
                            {"dequantize_gbps", RoundTiming(bytes / td / 1e9)},
                            {"dequantize_vs_memcpy", RoundTiming(t_memcpy / td)}};
    }
  }
  js["memcpy_gbps"] = RoundTiming(bytes / (memcpy_sum / memcpy_n) / 1e9);
  return js;
}

// Paged attention time per page format vs f32 dense K/V through the same
// kernel: decode (one query, num_new == 1) or a prefill chunk of num_new
// queries at the end of the context (PagedPrefillAttention).
Json AttentionSection(const Options& o, int num_new) {
  const bool decode = num_new == 1;
  const char* what = decode ? "decode" : "prefill";
  const PageShape s{16, 8, 128};
  const int Hq = 32;
  std::vector<int> lengths = {1024, 4096, 16384};
  if (!decode) lengths = {4096, 16384};
  if (o.quick) lengths = {1024, 4096};
  const PageFormat formats[] = {PageFormat::kF16, PageFormat::kInt8, PageFormat::kInt4,
                                PageFormat::kInt2};
  Json shape = ShapeJson(s);
  shape["num_q_heads"] = Hq;
  Json js = {{"shape", shape},
             {"baseline", "f32 dense contiguous K/V, same kernel"},
             {"by_tokens", Json::object()}};
  if (!decode) js["chunk_queries"] = num_new;
  std::mt19937 rng(2);
  for (size_t li = 0; li < lengths.size(); ++li) {
    const int T = lengths[li];
    const size_t n = size_t(T) * 8 * 128;
    std::vector<float> k = Normal(n, rng), v = Normal(n, rng);
    std::vector<float> q = Normal(size_t(num_new) * Hq * 128, rng, 2.0f);
    std::vector<float> out(size_t(num_new) * Hq * 128), lse(size_t(num_new) * Hq),
        mass(size_t(8) * T);
    const Exec exec{Backend::kCpu, o.threads};
    auto run = [&](const Paged& p, bool with_mass) -> std::function<void()> {
      return [&, with_mass] {
        float* m = with_mass ? mass.data() : nullptr;
        Check(decode ? kernels::PagedDecodeAttention(exec, p.view, AttentionParams{Hq}, q.data(),
                                                     out.data(), lse.data(), m)
                     : kernels::PagedPrefillAttention(exec, p.view, AttentionParams{Hq}, num_new,
                                                      q.data(), out.data(), lse.data(), m),
              what);
      };
    };
    std::vector<Paged> paged;
    paged.push_back(BuildPaged(s, k, v, T, PageFormat::kF32, PageFormat::kF32, true, o.threads, rng));
    for (PageFormat f : formats) paged.push_back(BuildPaged(s, k, v, T, f, f, false, o.threads, rng));
    std::vector<std::function<void()>> fns;
    for (const Paged& p : paged) fns.push_back(run(p, false));
    fns.push_back(run(paged[3], true));  // int4 with the attention-mass output
    const std::vector<double> t =
        decode ? TimeInterleaved(fns, 5, o.quick ? 0.5 : 2.0) : TimeInterleaved(fns, 3, 0.5);
    const double t_dense = t[0];
    Json& at = js["by_tokens"][std::to_string(T)];
    at["f32_dense_ms"] = RoundTiming(t_dense * 1e3);
    std::fprintf(stderr, "%s T=%-6d f32 dense %.3f ms\n", what, T, t_dense * 1e3);
    for (size_t i = 0; i < std::size(formats); ++i) {
      const PageFormat f = formats[i];
      std::fprintf(stderr,
                   "%s T=%-6d %-5s paged %.3f ms (%.2fx dense f32, %.2fx faster than f16)\n", what,
                   T, Name(f).c_str(), t[i + 1] * 1e3, t[i + 1] / t_dense, t[1] / t[i + 1]);
      at[Name(f) + "_ms"] = RoundTiming(t[i + 1] * 1e3);
      at[Name(f) + "_vs_f32_dense"] = RoundTiming(t[i + 1] / t_dense);
      at["f16_over_" + Name(f)] = RoundTiming(t[1] / t[i + 1]);
    }
    at["int4_with_mass_ms"] = RoundTiming(t.back() * 1e3);
    at["int4_mass_over_without"] = RoundTiming(t.back() / t[3]);
  }
  return js;
}

// The experiment's repacking of `p`'s pages (format f, full pages of `s`
// holding `tokens`).
IntDecodePages Repack(const Paged& p, PageFormat f, const PageShape& s, int tokens) {
  return RepackPages(f, p.k_arena.get(), kernels::PageBytes(f, KvKind::kKey, s), p.v_arena.get(),
                     kernels::PageBytes(f, KvKind::kValue, s), tokens / s.block_tokens,
                     s.num_kv_heads, s.head_dim);
}

// The VNNI-layout experiment against the product's decode on the same int8
// and int4 pages (and on f16 and f32 pages of the same K/V), one thread.
Json IntDecodeSection(const Options& o) {
  if (!IntDecodeSupported()) return {{"skipped", "this CPU has no AVX-512 VNNI"}};
  const PageShape s{IntDecodePages::kTokens, 8, 128};
  const int Hq = 32;
  const std::vector<int> lengths = o.quick ? std::vector<int>{1024} : std::vector<int>{4096, 16384};
  const PageFormat formats[] = {PageFormat::kInt8, PageFormat::kInt4};
  const IntDecodeMode modes[] = {{7, ProbBits::k7},
                                 {7, ProbBits::k14},
                                 {14, ProbBits::k14},
                                 {14, ProbBits::kFloat}};
  const char* const mode_names[] = {"q7_p7", "q7_p14", "q14_p14", "q14_pf32"};
  Json js = {{"shape", ShapeJson(s)},
             {"num_q_heads", Hq},
             {"threads", 1},
             {"error", "relative L2 of the output against the product's decode over f32 pages"},
             {"by_tokens", Json::object()}};
  std::mt19937 rng(3);
  for (const int T : lengths) {
    const size_t n = size_t(T) * s.num_kv_heads * s.head_dim;
    const std::vector<float> k = Normal(n, rng), v = Normal(n, rng);
    const std::vector<float> q = Normal(size_t(Hq) * s.head_dim, rng, 2.0f);
    const Exec exec{Backend::kCpu, 1};
    const size_t out_size = size_t(Hq) * s.head_dim;
    std::vector<float> lse(Hq);
    // Product decode over `p` into `o`.
    auto product = [&](const Paged& p, std::vector<float>& o) -> std::function<void()> {
      return [&] {
        Check(kernels::PagedDecodeAttention(exec, p.view, AttentionParams{Hq}, q.data(), o.data(),
                                            lse.data(), nullptr),
              "decode");
      };
    };
    std::vector<Paged> paged;  // f32, f16, then each of formats
    std::vector<IntDecodePages> vnni;
    paged.push_back(BuildPaged(s, k, v, T, PageFormat::kF32, PageFormat::kF32, true, 1, rng));
    paged.push_back(BuildPaged(s, k, v, T, PageFormat::kF16, PageFormat::kF16, true, 1, rng));
    for (PageFormat f : formats) {
      paged.push_back(BuildPaged(s, k, v, T, f, f, true, 1, rng));
      vnni.push_back(Repack(paged.back(), f, s, T));
    }
    // outs: one per product run (paged order), then per (format, mode).
    std::vector<std::vector<float>> outs(paged.size() + vnni.size() * std::size(modes),
                                         std::vector<float>(out_size));
    std::vector<std::function<void()>> fns;
    for (size_t i = 1; i < paged.size(); ++i) fns.push_back(product(paged[i], outs[i]));
    for (size_t f = 0; f < vnni.size(); ++f) {
      for (size_t m = 0; m < std::size(modes); ++m) {
        std::vector<float>& o = outs[paged.size() + f * std::size(modes) + m];
        fns.push_back([&, f, m] { IntDecode(vnni[f], modes[m], Hq, q.data(), o.data()); });
      }
    }
    const std::vector<double> t = TimeInterleaved(fns, 5, 2.0);  // t[i]: fns[i]
    product(paged[0], outs[0])();
    const std::vector<float>& want = outs[0];
    Json& at = js["by_tokens"][std::to_string(T)];
    at["f16_ms"] = RoundTiming(t[0] * 1e3);
    std::fprintf(stderr, "intdecode T=%-6d f16 %.3f ms\n", T, t[0] * 1e3);
    for (size_t f = 0; f < std::size(formats); ++f) {
      const std::string fname = Name(formats[f]);
      const double tp = t[1 + f];
      const std::vector<float>& got = outs[2 + f];
      at[fname + "_ms"] = RoundTiming(tp * 1e3);
      at["f16_over_" + fname] = RoundTiming(t[0] / tp);
      at[fname + "_error"] = RoundError(RelL2(got, want));
      std::fprintf(stderr, "  %-19s %.3f ms (%.2fx f16), error %.5f\n", fname.c_str(), tp * 1e3,
                   t[0] / tp, RelL2(got, want));
      for (size_t m = 0; m < std::size(modes); ++m) {
        const std::string name = fname + "_vnni_" + mode_names[m];
        const size_t i = paged.size() + f * std::size(modes) + m;
        const double tv = t[i - 1];
        at[name + "_ms"] = RoundTiming(tv * 1e3);
        at["f16_over_" + name] = RoundTiming(t[0] / tv);
        at[name + "_error"] = RoundError(RelL2(outs[i], want));
        at[name + "_vs_" + fname] = RoundError(RelL2(outs[i], got));
        std::fprintf(stderr, "  %-19s %.3f ms (%.2fx f16), error %.5f, vs %s %.5f\n",
                     name.c_str(), tv * 1e3, t[0] / tv, RelL2(outs[i], want), fname.c_str(),
                     RelL2(outs[i], got));
      }
    }
  }
  return js;
}

// The K formats (rows) and V formats (columns) of the fidelity tables.
constexpr PageFormat kFidelityFormats[] = {PageFormat::kF16, PageFormat::kFP8E4M3,
                                           PageFormat::kInt8, PageFormat::kInt4, PageFormat::kInt2};

// One fidelity table, {K format: {V format: err(K, V)}}; each row is also
// printed to stderr under a header the caller printed.
Json ErrorTable(const std::function<double(PageFormat, PageFormat)>& err) {
  Json table = Json::object();
  for (PageFormat kf : kFidelityFormats) {
    Json& row = table[Name(kf)];
    row = Json::object();
    std::fprintf(stderr, "  K %-5s", Name(kf).c_str());
    for (PageFormat vf : kFidelityFormats) {
      const double e = err(kf, vf);
      row[Name(vf)] = RoundError(e);
      std::fprintf(stderr, " %8.5f", e);
    }
    std::fprintf(stderr, "\n");
  }
  return table;
}

Json FidelitySection(const Options& o) {
  const PageShape s{16, 4, 128};
  const int Hq = 16, T = o.quick ? 1024 : 2048, trials = o.quick ? 2 : 4;
  Json shape = ShapeJson(s);
  shape["num_q_heads"] = Hq;
  Json js = {{"shape", shape},
             {"tokens", T},
             {"trials", trials},
             {"metric", "relative L2 error of decode attention output vs f32, mean over trials"},
             {"rows", "K format"},
             {"cols", "V format"}};
  std::map<int, KeyAblation> ablation[2];
  for (bool outliers : {false, true}) {
    std::map<std::pair<int, int>, double> err;
    for (int trial = 0; trial < trials; ++trial) {
      std::mt19937 rng(100 + trial);
      const size_t n = size_t(T) * 4 * 128;
      std::vector<float> k = Normal(n, rng), v = Normal(n, rng), q = Normal(Hq * 128, rng, 2.0f);
      if (outliers) AddOutlierChannels(k, T, 4, 128, rng);
      const Exec exec{Backend::kCpu, o.threads};
      std::vector<float> want(Hq * 128), got(Hq * 128);
      const Paged ref = BuildPaged(s, k, v, T, PageFormat::kF32, PageFormat::kF32, true, o.threads, rng);
      Check(kernels::PagedDecodeAttention(exec, ref.view, AttentionParams{Hq}, q.data(),
                                          want.data(), nullptr, nullptr),
            "decode f32");
      AddKeyAblation(s, k, v, T, Hq, q.data(), want, o.threads, rng, &ablation[outliers],
                     1.0 / trials);
      for (PageFormat kf : kFidelityFormats) {
        for (PageFormat vf : kFidelityFormats) {
          const Paged p = BuildPaged(s, k, v, T, kf, vf, true, o.threads, rng);
          Check(kernels::PagedDecodeAttention(exec, p.view, AttentionParams{Hq}, q.data(),
                                              got.data(), nullptr, nullptr),
                "decode");
          err[{int(kf), int(vf)}] += RelL2(got, want) / trials;
        }
      }
    }
    const std::string name = outliers ? "outlier_keys" : "gaussian";
    std::fprintf(stderr, "fidelity (%s keys): rows K, cols V\n", outliers ? "outlier" : "gaussian");
    js[name] = ErrorTable([&](PageFormat kf, PageFormat vf) { return err[{int(kf), int(vf)}]; });
    js[name + "_key_layout"] =
        AblationJson(ablation[outliers], outliers ? "outlier keys" : "gaussian");
  }
  return js;
}

// Keys drift through compactions: each one gathers the kept slots into new
// pages and re-encodes them from their dequantized values, and key params are
// per channel over a page, so a slot that changes page-mates is rounded onto
// a new grid every time. Outlier keys on 64-token pages of 2 KV heads x 64
// (Qwen2.5-0.5B's shape): each round drops one page's worth of random slots
// and compacts the rest (as an eviction at a fixed budget does); the decode
// attention error of a random query vs f32 over the surviving slots is
// compared with the same slots quantized once.
// K, V ([T][H][D]) and one decode query ([Hq][D]) a drift trial starts from.
struct DriftData {
  std::vector<float> k, v, q;
};

// Compacts `rounds` times (each drops one page's worth of random slots and
// re-encodes the rest into new pages), and at each checkpoint measures decode
// attention over the first `kept` survivors against the same slots quantized
// once, both against f32.
Json DriftRun(const Options& o, const PageShape& s, int Hq, int kept,
              const std::vector<int>& checkpoints, int trials,
              const std::function<DriftData(int trial, std::mt19937& rng)>& data) {
  const int rounds = checkpoints.back();
  const size_t row = size_t(s.num_kv_heads) * s.head_dim;
  // K int8 / V int4 is the shipped default; the f16 rows tell keys' drift from values'.
  const std::pair<PageFormat, PageFormat> formats[] = {{PageFormat::kInt4, PageFormat::kInt4},
                                                       {PageFormat::kInt8, PageFormat::kInt4},
                                                       {PageFormat::kInt8, PageFormat::kF16},
                                                       {PageFormat::kInt4, PageFormat::kF16},
                                                       {PageFormat::kF16, PageFormat::kInt4}};
  Json js = {{"shape", ShapeJson(s)},
             {"num_q_heads", Hq},
             {"tokens_after", kept},
             {"dropped_per_round", s.block_tokens},
             {"trials", trials},
             {"rounds", checkpoints},
             {"metric",
              "relative L2 error of decode attention output vs f32 over the surviving slots, "
              "after N compactions and quantized once, mean over trials"}};
  const Exec exec{Backend::kCpu, o.threads};
  for (const auto& [kf, vf] : formats) {
    std::vector<double> after(checkpoints.size()), once(checkpoints.size());
    for (int trial = 0; trial < trials; ++trial) {
      std::mt19937 rng(200 + trial);
      const DriftData d = data(trial, rng);
      const std::vector<float>& k = d.k;
      const std::vector<float>& v = d.v;
      const std::vector<float>& q = d.q;
      const int T0 = int(k.size() / row);
      Paged cur = BuildPaged(s, k, v, T0, kf, vf, true, o.threads, rng);
      std::vector<int> alive(T0);  // original row of each current slot
      std::iota(alive.begin(), alive.end(), 0);
      size_t next = 0;
      for (int round = 0; round <= rounds; ++round) {
        if (next < checkpoints.size() && checkpoints[next] == round) {
          // The first `kept` survivors: as many slots at every checkpoint,
          // against the same slots quantized once.
          const int n = kept;
          PagedKvView view = cur.view;
          view.num_tokens = n;
          view.num_blocks = n / s.block_tokens;
          std::vector<float> ks(size_t(n) * row), vs(size_t(n) * row);
          for (int j = 0; j < n; ++j) {
            std::copy_n(k.begin() + size_t(alive[j]) * row, row, ks.begin() + size_t(j) * row);
            std::copy_n(v.begin() + size_t(alive[j]) * row, row, vs.begin() + size_t(j) * row);
          }
          std::vector<float> want(size_t(Hq) * s.head_dim), got(want.size()), got1(want.size());
          const Paged ref = BuildPaged(s, ks, vs, n, PageFormat::kF32, PageFormat::kF32, true,
                                       o.threads, rng);
          const Paged one = BuildPaged(s, ks, vs, n, kf, vf, true, o.threads, rng);
          Check(kernels::PagedDecodeAttention(exec, ref.view, AttentionParams{Hq}, q.data(),
                                              want.data(), nullptr, nullptr),
                "drift f32");
          Check(kernels::PagedDecodeAttention(exec, view, AttentionParams{Hq}, q.data(),
                                              got.data(), nullptr, nullptr),
                "drift compacted");
          Check(kernels::PagedDecodeAttention(exec, one.view, AttentionParams{Hq}, q.data(),
                                              got1.data(), nullptr, nullptr),
                "drift once");
          after[next] += RelL2(got, want) / trials;
          once[next] += RelL2(got1, want) / trials;
          ++next;
        }
        if (round == rounds) break;
        // Drop one page's worth of random slots, compact the rest into new pages.
        std::vector<int> idx(alive.size());
        std::iota(idx.begin(), idx.end(), 0);
        std::shuffle(idx.begin(), idx.end(), rng);
        idx.resize(idx.size() - s.block_tokens);
        std::sort(idx.begin(), idx.end());
        std::vector<int32_t> members(idx.begin(), idx.end());
        const int n = int(members.size()), nb = n / s.block_tokens;
        Paged dst;
        const size_t kb = kernels::PageBytes(kf, KvKind::kKey, s);
        const size_t vb = kernels::PageBytes(vf, KvKind::kValue, s);
        dst.k_arena = Alloc(kb * nb);
        dst.v_arena = Alloc(vb * nb);
        for (int b = 0; b < nb; ++b) {
          BlockEntry e;
          e.k_offset = uint64_t(uintptr_t(dst.k_arena.get() + b * kb));
          e.v_offset = uint64_t(uintptr_t(dst.v_arena.get() + b * vb));
          e.k_format = kf;
          e.v_format = vf;
          dst.blocks.push_back(e);
        }
        dst.view = PagedKvView{s, nullptr, dst.blocks.data(), nb, n};
        kernels::CompactPlan plan;
        plan.num_out = n;
        plan.members = members.data();
        Check(kernels::CompactSlots(exec, cur.view, plan,
                                    kernels::PagedKvMut{s, nullptr, dst.blocks.data(), nb, n}),
              "drift compact");
        std::vector<int> survivors(n);
        for (int j = 0; j < n; ++j) survivors[j] = alive[members[j]];
        alive = std::move(survivors);
        cur = std::move(dst);
      }
    }
    const std::string name = "K" + Name(kf) + "_V" + Name(vf);
    std::fprintf(stderr, "compaction drift %s:", name.c_str());
    Json a = Json::array(), b = Json::array(), r = Json::array();
    for (size_t i = 0; i < checkpoints.size(); ++i) {
      a.push_back(RoundError(after[i]));
      b.push_back(RoundError(once[i]));
      r.push_back(RoundError(after[i] / once[i]));
      std::fprintf(stderr, " %d rounds %.5f (once %.5f)", checkpoints[i], after[i], once[i]);
    }
    std::fprintf(stderr, "\n");
    js[name] = {{"after", a}, {"once", b}, {"ratio", r}};
  }
  return js;
}

// The drift on synthetic keys with outlier channels (Qwen2.5-0.5B's page shape).
Json DriftSection(const Options& o) {
  const PageShape s{64, 2, 64};
  const int Hq = 14, kept = o.quick ? 1024 : 2048, trials = o.quick ? 2 : 4;
  const std::vector<int> checkpoints = {0, 1, 4, 16, 64};
  const int T0 = kept + checkpoints.back() * s.block_tokens;
  const size_t row = size_t(s.num_kv_heads) * s.head_dim;
  return DriftRun(o, s, Hq, kept, checkpoints, trials, [&](int, std::mt19937& rng) {
    DriftData d{Normal(size_t(T0) * row, rng), Normal(size_t(T0) * row, rng),
                Normal(size_t(Hq) * s.head_dim, rng, 2.0f)};
    AddOutlierChannels(d.k, T0, s.num_kv_heads, s.head_dim, rng);
    return d;
  });
}

// A device buffer, or the bench stops with the error.
kernels::DeviceBuffer OnDevice(absl::StatusOr<kernels::DeviceBuffer> b) {
  Check(b.status(), "device buffer");
  return *std::move(b);
}

// Seconds per call of `fn`, from `reps` back-to-back launches after one
// warm-up, the device synchronized around them.
double DeviceSeconds(int reps, const std::function<void()>& fn) {
  fn();
  Check(kernels::DeviceSynchronize(), "sync");
  const auto a = Clock::now();
  for (int r = 0; r < reps; ++r) fn();
  Check(kernels::DeviceSynchronize(), "sync");
  return std::chrono::duration<double>(Clock::now() - a).count() / reps;
}

// The CUDA backend, when a device is present (null otherwise):
//   by_tokens  decode attention time per page format, pages in shuffled block
//              order, against f16 pages in order — the dense f16 baseline, the
//              same K/V bytes contiguous — at 1K to 32K tokens;
//              f16_dense_over_<fmt> is the speedup (goal: int4 >= 2 at 32K)
//   dequantize per format, the device's dequantization of 32K tokens of key
//              pages to f32, bytes moved per second against a device-to-device
//              memcpy of the same f32 bytes (goal: >= 0.7 of it)
Json CudaSection(const Options& o) {
  if (kernels::CudaDeviceCount() == 0) return nullptr;
  const PageShape s{16, 8, 128};
  const int Hq = 32, reps = 50;
  const PageFormat formats[] = {PageFormat::kF32, PageFormat::kF16, PageFormat::kInt8,
                                PageFormat::kInt4, PageFormat::kInt2};
  Json js = {{"device_count", kernels::CudaDeviceCount()},
             {"by_tokens", Json::object()},
             {"dequantize", Json::object()}};
  std::mt19937 rng(4);
  const Exec cpu{Backend::kCpu, o.threads}, gpu{Backend::kCuda};
  for (int T : {1024, 4096, 16384, 32768}) {
    const int nb = T / 16;
    const size_t n = size_t(T) * 8 * 128;
    const std::vector<float> k = Normal(n, rng), v = Normal(n, rng), q = Normal(Hq * 128, rng, 2.0f);
    const auto d_q = OnDevice(kernels::DeviceBuffer::CopyOf(q.data(), q.size() * sizeof(float)));
    const auto d_out = OnDevice(kernels::DeviceBuffer::Allocate(q.size() * sizeof(float)));
    Json& at = js["by_tokens"][std::to_string(T)];
    at = Json::object();
    // The in-order f16 run first: the baseline every other row divides.
    double t_dense = 0;
    for (int row = -1; row < int(std::size(formats)); ++row) {
      const PageFormat f = row < 0 ? PageFormat::kF16 : formats[row];
      const size_t kb = kernels::PageBytes(f, KvKind::kKey, s);
      const size_t vb = kernels::PageBytes(f, KvKind::kValue, s);
      std::vector<uint8_t> arena((kb + vb) * nb);
      Check(kernels::QuantizePages(cpu, s, KvKind::kKey, f, k.data(), SourceType::kF32, nb,
                                   arena.data()),
            "quantize K");
      Check(kernels::QuantizePages(cpu, s, KvKind::kValue, f, v.data(), SourceType::kF32, nb,
                                   arena.data() + kb * nb),
            "quantize V");
      std::vector<int> perm(nb);
      std::iota(perm.begin(), perm.end(), 0);
      if (row >= 0) std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<BlockEntry> blocks(nb);
      for (int b = 0; b < nb; ++b) {
        // Logical block b reads physical page perm[b] (its contents are then
        // those of block perm[b]: timing only, not correctness).
        blocks[b].k_offset = uint64_t(perm[b]) * kb;
        blocks[b].v_offset = kb * nb + uint64_t(perm[b]) * vb;
        blocks[b].k_format = f;
        blocks[b].v_format = f;
      }
      const auto d_arena = OnDevice(kernels::DeviceBuffer::CopyOf(arena.data(), arena.size()));
      const auto d_blocks = OnDevice(
          kernels::DeviceBuffer::CopyOf(blocks.data(), blocks.size() * sizeof(BlockEntry)));
      const PagedKvView view{s, d_arena.as<const uint8_t>(), d_blocks.as<const BlockEntry>(), nb,
                             T};
      const double t = DeviceSeconds(reps, [&] {
        Check(kernels::PagedDecodeAttention(gpu, view, AttentionParams{Hq},
                                            d_q.as<const float>(), d_out.as<float>(), nullptr,
                                            nullptr),
              "cuda decode");
      });
      const std::string name = row < 0 ? "f16_dense" : Name(f);
      if (row < 0) t_dense = t;
      std::fprintf(stderr, "cuda decode T=%-6d %-9s %.4f ms (f16 dense / this %.2fx)\n", T,
                   name.c_str(), t * 1e3, t_dense / t);
      at[name + "_ms"] = RoundTiming(t * 1e3);
      if (row >= 0) at["f16_dense_over_" + name] = RoundTiming(t_dense / t);
    }
  }
  // Dequantization of 32K tokens of key pages against a device memcpy of
  // the f32 they decode to (read + write of those bytes).
  const int nb = 32768 / 16;
  const size_t n = size_t(nb) * 16 * 8 * 128;
  const std::vector<float> k = Normal(n, rng);
  const auto d_src = OnDevice(kernels::DeviceBuffer::CopyOf(k.data(), n * sizeof(float)));
  const auto d_dst = OnDevice(kernels::DeviceBuffer::Allocate(n * sizeof(float)));
  const double t_copy = DeviceSeconds(reps, [&] {
    Check(kernels::CopyOnDevice(d_dst.get(), d_src.get(), n * sizeof(float)),
          "device memcpy");
  });
  js["dequantize"]["memcpy_gbps"] = RoundTiming(2.0 * n * sizeof(float) / t_copy / 1e9);
  for (PageFormat f : formats) {
    const size_t kb = kernels::PageBytes(f, KvKind::kKey, s);
    std::vector<uint8_t> pages(kb * nb);
    Check(kernels::QuantizePages(cpu, s, KvKind::kKey, f, k.data(), SourceType::kF32, nb,
                                 pages.data()),
          "quantize K");
    const auto d_pages = OnDevice(kernels::DeviceBuffer::CopyOf(pages.data(), pages.size()));
    const double t = DeviceSeconds(reps, [&] {
      Check(kernels::DequantizePages(gpu, s, KvKind::kKey, f, d_pages.as<const uint8_t>(), nb,
                                     d_dst.as<float>()),
            "cuda dequantize");
    });
    const double bytes = double(pages.size()) + double(n) * sizeof(float);
    std::fprintf(stderr, "cuda dequantize %-5s %.1f GB/s (%.2f of memcpy)\n", Name(f).c_str(),
                 bytes / t / 1e9, t_copy / t * bytes / (2.0 * n * sizeof(float)));
    js["dequantize"][Name(f)] = {
        {"gbps", RoundTiming(bytes / t / 1e9)},
        {"vs_memcpy", RoundTiming(t_copy / t * bytes / (2.0 * n * sizeof(float)))}};
  }
  return js;
}

std::vector<float> ReadF32(const std::string& path, size_t n) {
  std::vector<float> v(n);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f || std::fread(v.data(), sizeof(float), n, f) != n) {
    std::fprintf(stderr, "kernels bench: cannot read %zu floats from %s\n", n, path.c_str());
    std::exit(1);
  }
  std::fclose(f);
  return v;
}

// The dump's pre-RoPE keys, rotated, must be its keys: else the pre-RoPE
// columns would measure a wrong rotation.
void CheckRotation(const std::vector<float>& k, const std::vector<float>& kpre, const PageShape& s,
                   int T, const Rope& rope, const std::string& base) {
  const std::vector<float> r = Rotate(kpre, s, T, rope);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < k.size(); ++i) {
    diff = std::max(diff, double(std::fabs(r[i] - k[i])));
    scale = std::max(scale, double(std::fabs(k[i])));
  }
  if (diff > 1e-4 * scale) {
    std::fprintf(stderr, "kernels bench: %s_kpre.f32 rotated differs from %s_k.f32 by %g\n",
                 base.c_str(), base.c_str(), diff);
    std::exit(1);
  }
}

// The fidelity table on real keys/values/queries dumped by
// kernels/tools/dump_real_kv.py: for each dumped layer and each of the last NQ
// positions p, decode attention of p's query over slots [0, p] (full pages in
// the tested formats, the partial last page f16), relative L2 error vs f32.
// What dump_real_kv.py wrote: its meta.txt.
struct RealDump {
  int T = 0, H = 0, Hq = 0, D = 0, nq = 0;
  std::vector<int> layers;
};
RealDump ReadRealDump(const Options& o) {
  RealDump r;
  FILE* m = std::fopen((o.real_kv + "/meta.txt").c_str(), "r");
  if (!m || std::fscanf(m, "%d %d %d %d %d", &r.T, &r.H, &r.Hq, &r.D, &r.nq) != 5) {
    std::fprintf(stderr, "kernels bench: bad %s/meta.txt\n", o.real_kv.c_str());
    std::exit(1);
  }
  for (int l; std::fscanf(m, "%d", &l) == 1;) r.layers.push_back(l);
  std::fclose(m);
  return r;
}

// One dumped layer: keys and values [T][H][D], the last nq queries
// [nq][Hq][D]; base names its files.
struct RealLayer {
  std::string base;
  std::vector<float> k, v, q;
};
RealLayer ReadRealLayer(const Options& o, const RealDump& r, int layer) {
  RealLayer l;
  l.base = o.real_kv + "/layer" + std::to_string(layer);
  const size_t n = size_t(r.T) * r.H * r.D;
  l.k = ReadF32(l.base + "_k.f32", n);
  l.v = ReadF32(l.base + "_v.f32", n);
  l.q = ReadF32(l.base + "_q.f32", size_t(r.nq) * r.Hq * r.D);
  return l;
}

// The drift on the dump's real keys and values: one trial per dumped layer
// and query (its own random drops), half the tokens kept after 16
// compactions of 64-token pages (the shipped default's page size).
Json RealDriftSection(const Options& o) {
  const RealDump r = ReadRealDump(o);
  const PageShape s{64, r.H, r.D};
  const std::vector<int> checkpoints = {0, 1, 4, 16};
  const int kept = r.T - checkpoints.back() * s.block_tokens;
  if (kept < s.block_tokens) {
    std::fprintf(stderr, "kernels bench: real drift needs more than %d tokens\n",
                 checkpoints.back() * s.block_tokens + s.block_tokens);
    std::exit(1);
  }
  std::vector<RealLayer> layers;  // read once: every format runs every trial
  for (int layer : r.layers) layers.push_back(ReadRealLayer(o, r, layer));
  Json js = DriftRun(o, s, r.Hq, kept / s.block_tokens * s.block_tokens, checkpoints,
                     int(r.layers.size()) * r.nq, [&](int trial, std::mt19937&) {
    const RealLayer& l = layers[trial / r.nq];
    const auto qi = l.q.begin() + size_t(trial % r.nq) * r.Hq * r.D;
    return DriftData{l.k, l.v, std::vector<float>(qi, qi + size_t(r.Hq) * r.D)};
  });
  js["source"] = o.real_kv;
  js["layers"] = r.layers;
  return js;
}

// The VNNI experiment's error on the dump's real K/V and queries (outlier
// key channels widen a page's query range): per layer and query, the first
// whole 64-token pages of the context, against the product's decode over f32
// pages and over the very pages the experiment repacked. No timing.
Json RealIntDecodeSection(const Options& o) {
  const RealDump dump = ReadRealDump(o);
  if (!IntDecodeSupported()) return {{"skipped", "this CPU has no AVX-512 VNNI"}};
  const PageShape s{IntDecodePages::kTokens, dump.H, dump.D};
  const int len = dump.T / s.block_tokens * s.block_tokens;
  const PageFormat formats[] = {PageFormat::kInt8, PageFormat::kInt4};
  const IntDecodeMode modes[] = {{7, ProbBits::k14}, {14, ProbBits::k14}};
  const char* const mode_names[] = {"q7_p14", "q14_p14"};
  std::map<std::string, double> err;
  const double weight = 1.0 / (double(dump.layers.size()) * dump.nq);
  std::mt19937 rng(3);
  const Exec exec{Backend::kCpu, o.threads};
  const size_t out_size = size_t(dump.Hq) * dump.D;
  for (int layer : dump.layers) {
    const RealLayer l = ReadRealLayer(o, dump, layer);
    const Paged f32 = BuildPaged(s, l.k, l.v, len, PageFormat::kF32, PageFormat::kF32, true,
                                 o.threads, rng);
    // Each format's pages and their repacking, built once for the layer's queries.
    std::vector<Paged> paged;
    std::vector<IntDecodePages> packed;
    for (PageFormat f : formats) {
      paged.push_back(BuildPaged(s, l.k, l.v, len, f, f, true, o.threads, rng));
      packed.push_back(Repack(paged.back(), f, s, len));
    }
    for (int i = 0; i < dump.nq; ++i) {
      const float* qi = l.q.data() + size_t(i) * out_size;
      std::vector<float> want(out_size), got(out_size), vnni(out_size);
      Check(kernels::PagedDecodeAttention(exec, f32.view, AttentionParams{dump.Hq}, qi,
                                          want.data(), nullptr, nullptr),
            "decode f32");
      for (size_t fi = 0; fi < std::size(formats); ++fi) {
        const PageFormat f = formats[fi];
        Check(kernels::PagedDecodeAttention(exec, paged[fi].view, AttentionParams{dump.Hq}, qi,
                                            got.data(), nullptr, nullptr),
              "decode");
        err[Name(f) + "_error"] += weight * RelL2(got, want);
        for (size_t m = 0; m < std::size(modes); ++m) {
          IntDecode(packed[fi], modes[m], dump.Hq, qi, vnni.data());
          const std::string name = Name(f) + "_vnni_" + mode_names[m];
          err[name + "_error"] += weight * RelL2(vnni, want);
          err[name + "_vs_" + Name(f)] += weight * RelL2(vnni, got);
        }
      }
    }
  }
  Json js = {{"source", o.real_kv}, {"layers", dump.layers}, {"tokens", len},
             {"queries_per_layer", dump.nq}};
  std::fprintf(stderr, "intdecode on %s (%d tokens, mean over %zu layers x %d queries):\n",
               o.real_kv.c_str(), len, dump.layers.size(), dump.nq);
  for (const auto& [name, e] : err) {
    js[name] = RoundError(e);
    std::fprintf(stderr, "  %-28s %.5f\n", name.c_str(), e);
  }
  return js;
}

Json RealFidelitySection(const Options& o) {
  const RealDump dump = ReadRealDump(o);
  const int T = dump.T, H = dump.H, Hq = dump.Hq, D = dump.D, nq = dump.nq;
  const std::vector<int>& layers = dump.layers;
  const PageShape s{16, H, D};
  // The rotation, when the dump has the keys before RoPE too.
  std::unique_ptr<Rope> rope;
  if (FILE* f = std::fopen((o.real_kv + "/rope_cos.f32").c_str(), "rb")) {
    std::fclose(f);
    rope = std::make_unique<Rope>(Rope{ReadF32(o.real_kv + "/rope_cos.f32", size_t(T) * D),
                                       ReadF32(o.real_kv + "/rope_sin.f32", size_t(T) * D)});
  }
  std::map<std::pair<int, int>, double> err;
  std::map<std::pair<int, int>, double> worst;
  std::map<int, KeyAblation> ablation;
  int samples = 0;
  std::mt19937 rng(3);
  const Exec exec{Backend::kCpu, o.threads};
  for (int layer : layers) {
    const RealLayer l = ReadRealLayer(o, dump, layer);
    const std::string& base = l.base;
    const std::vector<float>& k = l.k;
    const std::vector<float>& v = l.v;
    const std::vector<float>& q = l.q;
    std::unique_ptr<std::vector<float>> kpre;
    if (rope) kpre = std::make_unique<std::vector<float>>(ReadF32(base + "_kpre.f32", k.size()));
    if (kpre) CheckRotation(k, *kpre, s, T, *rope, base);
    // Per token, so every prefix's keys are these keys' first rows.
    const KeyVariants variants = KeyVariantsOf(k, kpre.get(), rope.get(), s, T, o.threads);
    for (int i = 0; i < nq; ++i) {
      const int len = T - nq + i + 1;
      const float* qi = q.data() + size_t(i) * Hq * D;
      std::vector<float> want(Hq * D), got(Hq * D);
      const Paged ref = BuildPaged(s, k, v, len, PageFormat::kF32, PageFormat::kF32, true, o.threads, rng);
      Check(kernels::PagedDecodeAttention(exec, ref.view, AttentionParams{Hq}, qi, want.data(),
                                          nullptr, nullptr),
            "decode f32");
      AddKeyAblation(s, k, v, len, Hq, qi, want, o.threads, rng, &ablation,
                     1.0 / (double(layers.size()) * nq), &variants);
      for (PageFormat kf : kFidelityFormats) {
        for (PageFormat vf : kFidelityFormats) {
          const Paged p = BuildPaged(s, k, v, len, kf, vf, true, o.threads, rng);
          Check(kernels::PagedDecodeAttention(exec, p.view, AttentionParams{Hq}, qi, got.data(),
                                              nullptr, nullptr),
                "decode");
          const double e = RelL2(got, want);
          err[{int(kf), int(vf)}] += e;
          worst[{int(kf), int(vf)}] = std::max(worst[{int(kf), int(vf)}], e);
        }
      }
      ++samples;
    }
  }
  Json js = {{"source", o.real_kv},
             {"tokens", T},
             {"num_kv_heads", H},
             {"num_q_heads", Hq},
             {"head_dim", D},
             {"layers", layers},
             {"queries_per_layer", nq},
             {"metric",
              "relative L2 error of decode attention output vs f32; mean and max over layers x "
              "queries"},
             {"rows", "K format"},
             {"cols", "V format"}};
  js["key_layout_mean"] = AblationJson(ablation, "real");
  for (int which = 0; which < 2; ++which) {
    std::fprintf(stderr, "fidelity (real K/V, %s over %d samples): rows K, cols V\n",
                 which ? "max" : "mean", samples);
    js[which ? "max" : "mean"] = ErrorTable([&](PageFormat kf, PageFormat vf) {
      const auto key = std::make_pair(int(kf), int(vf));
      return which ? worst[key] : err[key] / samples;
    });
  }
  return js;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      o.json = true;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--real-kv" && i + 1 < argc) {
      o.real_kv = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      o.threads = std::atoi(argv[++i]);
    } else if (a == "--only" && i + 1 < argc) {
      o.only = argv[++i];
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "polykv-bench kernels [--json] [--quick] [--threads N]\n"
          "  quantize/dequantize vs memcpy, paged decode and prefill attention vs\n"
          "  f32 dense, and the (K format, V format) fidelity table; fast CPU backend.\n"
          "  --quick    smaller sizes (CI smoke run)\n"
          "  --threads  CPU threads (0 = all)\n"
          "  --real-kv DIR  also the fidelity table on real K/V/Q dumped by\n"
          "                 kernels/tools/dump_real_kv.py\n"
          "  --only SECTION one section: quantize, decode, prefill, fidelity, drift, intdecode "
          "or cuda\n");
      return 0;
    } else {
      std::fprintf(stderr, "kernels bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (!o.only.empty() && o.only != "quantize" && o.only != "decode" && o.only != "prefill" &&
      o.only != "fidelity" && o.only != "drift" && o.only != "intdecode" && o.only != "cuda") {
    std::fprintf(stderr, "kernels bench: unknown section %s (see --help)\n", o.only.c_str());
    return 2;
  }
  const int threads = o.threads > 0 ? o.threads : kernels::cpu::ThreadPool::Shared().max_threads();
  std::fprintf(stderr, "kernels bench: backend cpu (%s), %d threads\n", kernels::cpu::SimdLevel(),
               threads);
  // Sections in this order: their stderr progress lines come in it.
  Json js = {{"bench", "kernels"},
             {"backend", "cpu"},
             {"simd", kernels::cpu::SimdLevel()},
             {"threads", threads},
             {"quick", o.quick}};
  if (o.Runs("quantize")) js["quantize"] = QuantizeSection(o);
  if (o.Runs("decode")) js["decode"] = AttentionSection(o, 1);
  if (o.Runs("prefill")) js["prefill"] = AttentionSection(o, kPrefillChunk);
  if (o.Runs("fidelity")) {
    js["fidelity"] = FidelitySection(o);
    js["fidelity_real"] = o.real_kv.empty() ? Json(nullptr) : RealFidelitySection(o);
  }
  if (o.Runs("drift")) {
    js["compaction_drift"] = DriftSection(o);
    js["compaction_drift_real"] = o.real_kv.empty() ? Json(nullptr) : RealDriftSection(o);
  }
  if (o.Runs("intdecode")) {
    js["intdecode"] = IntDecodeSection(o);
    js["intdecode_real"] = o.real_kv.empty() ? Json(nullptr) : RealIntDecodeSection(o);
  }
  if (o.Runs("cuda")) js["cuda"] = CudaSection(o);
  if (o.json) {
    PrintJson(js);
  } else {
    std::fprintf(stderr, "(pass --json for the machine-readable result)\n");
  }
  return 0;
}

}  // namespace

POLYKV_BENCH(kernels, "compressed KV page kernels: throughput, decode attention, fidelity",
             [](int argc, char** argv) -> int { return Main(argc, argv); });

}  // namespace polykv::bench
