#include "bench/eval/eval_kv_store.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/ops.h"
#include "policies/lowering.h"

namespace polykv::eval {
namespace {

// Softmax of s[0, visible) in place (with optional per-slot logit bias);
// zeroes the rest of the row. Returns the entropy in nats when asked.
void SoftmaxRow(float* s, int64_t visible, int64_t t, const float* bias, double* entropy) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < visible; ++j) {
    if (bias != nullptr) s[j] += bias[j];
    mx = std::max(mx, s[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < visible; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  double h = 0;
  for (int64_t j = 0; j < visible; ++j) {
    s[j] *= inv;
    if (entropy != nullptr && s[j] > 0) h -= s[j] * std::log(static_cast<double>(s[j]));
  }
  if (entropy != nullptr) *entropy = h;
  std::fill(s + visible, s + t, 0.0f);
}

int64_t Pages(int64_t slots, int block_tokens) { return (slots + block_tokens - 1) / block_tokens; }

// The coarser of two formats (the one policies::FinerFormat does not pick).
kernels::PageFormat Coarser(kernels::PageFormat a, kernels::PageFormat b) {
  return policies::FinerFormat(a, b) == a ? b : a;
}

}  // namespace

EvalKvStore::EvalKvStore(const EvalKvStoreOptions& options)
    : options_(options), row_(int64_t{options.shape.num_kv_heads} * options.shape.head_dim) {
  layers_.resize(options.shape.num_layers);
}

absl::StatusOr<std::unique_ptr<EvalKvStore>> EvalKvStore::Create(
    const EvalKvStoreOptions& options) {
  const KvShape& s = options.shape;
  if (s.num_layers <= 0 || s.num_kv_heads <= 0 || s.head_dim <= 0 || options.obs_window < 0 ||
      options.block_tokens < 1 || options.block_tokens > 256) {
    return absl::InvalidArgumentError(absl::StrCat("EvalKvStore: bad shape (layers ", s.num_layers,
                                                   ", kv heads ", s.num_kv_heads, ", head dim ",
                                                   s.head_dim, ", block ", options.block_tokens,
                                                   ")"));
  }
  const kernels::PageShape ps{options.block_tokens, s.num_kv_heads, s.head_dim};
  if (kernels::PageBytes(options.append_format, kernels::KvKind::kValue, ps) == 0) {
    return absl::InvalidArgumentError("EvalKvStore: shape not supported by the append format");
  }
  return std::unique_ptr<EvalKvStore>(new EvalKvStore(options));
}

void EvalKvStore::RoundTrip(kernels::PageFormat format, kernels::KvKind kind, float* rows,
                            int n) const {
  if (format == kernels::PageFormat::kF32 || n == 0) return;
  const kernels::PageShape ps{options_.block_tokens, options_.shape.num_kv_heads,
                              options_.shape.head_dim};
  const size_t bytes = kernels::PageBytes(format, kind, ps);
  // Page buffers must be kPageAlignment-aligned.
  thread_local std::vector<uint8_t> buf;
  buf.resize(bytes + kernels::kPageAlignment);
  void* page = reinterpret_cast<void*>(
      (reinterpret_cast<uintptr_t>(buf.data()) + kernels::kPageAlignment - 1) &
      ~(uintptr_t{kernels::kPageAlignment} - 1));
  const kernels::Exec exec{kernels::Backend::kCpu, 1, nullptr};
  // Shapes were validated at Create/Compact; a failure here is a bug.
  absl::Status s = kernels::QuantizePage(exec, ps, kind, format, rows, kernels::SourceType::kF32,
                                         n, page);
  if (s.ok()) s = kernels::DequantizePage(exec, ps, kind, format, page, n, rows);
  if (!s.ok()) std::abort();
}

absl::StatusOr<std::unique_ptr<EvalKvStore>> EvalKvStore::Compact(
    const EvalKvStore& src, const std::vector<LayerSelection>& layers,
    kernels::PageFormat k_format, kernels::PageFormat v_format, int f16_tail,
    const EvalKvStoreOptions& options) {
  if (layers.size() != src.layers_.size()) {
    return absl::InvalidArgumentError("Compact: one selection per layer is required");
  }
  const kernels::PageShape ps{options.block_tokens, options.shape.num_kv_heads,
                              options.shape.head_dim};
  if (kernels::PageBytes(k_format, kernels::KvKind::kKey, ps) == 0 ||
      kernels::PageBytes(v_format, kernels::KvKind::kValue, ps) == 0) {
    return absl::InvalidArgumentError("Compact: formats not supported for this shape");
  }
  auto made = Create(options);
  if (!made.ok()) return made.status();
  std::unique_ptr<EvalKvStore> out = std::move(*made);
  out->tokens_ = src.tokens_;
  const int64_t row = out->row_;
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerSelection& sel = layers[l];
    const Layer& from = src.layers_[l];
    Layer& to = out->layers_[l];
    const int64_t n = static_cast<int64_t>(sel.counts.size());
    if (sel.offsets.size() != static_cast<size_t>(n + 1) || sel.members.size() != sel.weights.size()) {
      return absl::InvalidArgumentError(absl::StrCat("Compact: malformed selection, layer ", l));
    }
    to.n = n;
    to.k.assign(static_cast<size_t>(n * row), 0.f);
    to.v.assign(static_cast<size_t>(n * row), 0.f);
    to.token.resize(n);
    bool merged = false;
    for (int64_t o = 0; o < n; ++o) {
      float* kd = to.k.data() + o * row;
      float* vd = to.v.data() + o * row;
      uint32_t rep = sel.members[sel.offsets[o]];
      float best = -1.f;
      for (uint32_t m = sel.offsets[o]; m < sel.offsets[o + 1]; ++m) {
        const uint32_t s = sel.members[m];
        if (s >= from.n) return absl::InvalidArgumentError("Compact: member past the layer");
        const float w = sel.weights[m];
        if (w > best) best = w, rep = s;
        const float* ks = from.k.data() + int64_t{s} * row;
        const float* vs = from.v.data() + int64_t{s} * row;
        for (int64_t i = 0; i < row; ++i) {
          kd[i] += w * ks[i];
          vd[i] += w * vs[i];
        }
      }
      to.token[o] = from.token[rep];
      merged |= sel.counts[o] > 1;
    }
    if (merged) {
      to.bias.resize(n);
      for (int64_t o = 0; o < n; ++o) to.bias[o] = std::log(static_cast<float>(sel.counts[o]));
    }
    // Encode the leading full pages; the tail (partial page + residual) is
    // stored as new rows would be, except a full page the plan requantized:
    // that one is encoded as a page of its (coarser) format.
    const int bt = options.block_tokens;
    const int64_t full = n / bt;
    const int64_t encoded = std::max<int64_t>(0, n - f16_tail) / bt;
    for (const auto* rq : {&sel.requant_k, &sel.requant_v}) {
      if (!rq->empty() && static_cast<int64_t>(rq->size()) != full) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Compact: layer ", l, " requantizes ", rq->size(), " blocks of ", full, " full ones"));
      }
    }
    to.page_k.resize(full);
    to.page_v.resize(full);
    for (int64_t p = 0; p < full; ++p) {
      // Stores page p of one kind in the coarser of its own format and the
      // plan's; a residual page left in append_format keeps its rows as they
      // were appended, one by one.
      const auto store = [&](kernels::KvKind kind, kernels::PageFormat own,
                             const std::vector<kernels::PageFormat>& requant, float* rows,
                             kernels::PageFormat* format) -> absl::Status {
        *format = requant.empty() ? own : Coarser(own, requant[p]);
        if (kernels::PageBytes(*format, kind, ps) == 0) {
          return absl::InvalidArgumentError("Compact: requantized format not supported for this shape");
        }
        const int step = *format == own && p >= encoded ? 1 : bt;
        for (int r = 0; r < bt; r += step) {
          out->RoundTrip(*format, kind, rows + r * row, step);
        }
        return absl::OkStatus();
      };
      const int64_t first = p * bt * row;
      absl::Status st = store(kernels::KvKind::kKey, p < encoded ? k_format : options.append_format,
                              sel.requant_k, to.k.data() + first, &to.page_k[p]);
      if (st.ok()) {
        st = store(kernels::KvKind::kValue, p < encoded ? v_format : options.append_format,
                   sel.requant_v, to.v.data() + first, &to.page_v[p]);
      }
      if (!st.ok()) return st;
    }
    for (int64_t s = full * bt; s < n; ++s) {
      out->RoundTrip(options.append_format, kernels::KvKind::kKey, to.k.data() + s * row, 1);
      out->RoundTrip(options.append_format, kernels::KvKind::kValue, to.v.data() + s * row, 1);
    }
  }
  return out;
}

int64_t EvalKvStore::bytes() const {
  const kernels::PageShape ps{options_.block_tokens, options_.shape.num_kv_heads,
                              options_.shape.head_dim};
  const auto page = [&](kernels::PageFormat f, kernels::KvKind kind) {
    return static_cast<int64_t>(kernels::PageBytes(f, kind, ps));
  };
  const int64_t res = page(options_.append_format, kernels::KvKind::kKey) +
                      page(options_.append_format, kernels::KvKind::kValue);
  int64_t total = 0;
  for (const Layer& l : layers_) {
    for (size_t p = 0; p < l.page_k.size(); ++p) {
      total += page(l.page_k[p], kernels::KvKind::kKey) + page(l.page_v[p], kernels::KvKind::kValue);
    }
    total += Pages(l.n - static_cast<int64_t>(l.page_k.size()) * ps.block_tokens, ps.block_tokens) * res;
  }
  return total;
}

absl::Status EvalKvStore::BeginStep(std::span<const StepToken> tokens) {
  if (!step_.empty()) return absl::FailedPreconditionError("BeginStep inside a step");
  if (tokens.empty()) return absl::InvalidArgumentError("BeginStep without tokens");
  step_.assign(tokens.begin(), tokens.end());
  next_layer_ = 0;
  return absl::OkStatus();
}

absl::Status EvalKvStore::Append(int layer, const float* k, const float* v) {
  if (step_.empty()) return absl::FailedPreconditionError("Append outside a step");
  if (layer != next_layer_) {
    return absl::FailedPreconditionError(absl::StrCat("Append layer ", layer, ", expected ", next_layer_));
  }
  Layer& l = layers_[layer];
  const int64_t n = static_cast<int64_t>(step_.size());
  const size_t need = static_cast<size_t>((l.n + n) * row_);
  if (l.k.size() < need) {
    const size_t cap = std::max(need, l.k.size() * 2);
    l.k.resize(cap);
    l.v.resize(cap);
  }
  float* kd = l.k.data() + l.n * row_;
  float* vd = l.v.data() + l.n * row_;
  std::copy(k, k + n * row_, kd);
  std::copy(v, v + n * row_, vd);
  for (int64_t i = 0; i < n; ++i) {
    RoundTrip(options_.append_format, kernels::KvKind::kKey, kd + i * row_, 1);
    RoundTrip(options_.append_format, kernels::KvKind::kValue, vd + i * row_, 1);
  }
  if (!l.bias.empty()) l.bias.resize(l.n + n, 0.f);
  ++next_layer_;
  return absl::OkStatus();
}

absl::Status EvalKvStore::Attend(int layer, int num_heads, const float* q, float* out) {
  if (step_.empty() || layer + 1 != next_layer_) {
    return absl::FailedPreconditionError("Attend before its layer's Append");
  }
  Layer& l = layers_[layer];
  const int kvh = options_.shape.num_kv_heads;
  const int d = options_.shape.head_dim;
  const int n = static_cast<int>(step_.size());
  const int64_t t = l.n + n;
  if (num_heads % kvh != 0) return absl::InvalidArgumentError("query heads not a multiple of KV heads");
  const int group = num_heads / kvh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const bool capture = options_.capture_scores && !probe_;
  if (capture || probe_) {
    l.mass.resize(t, 0.f);
    l.intent.resize(t, 0.f);
  }
  scores_.resize(static_cast<size_t>(n) * t);
  const float* bias = l.bias.empty() ? nullptr : l.bias.data();
  for (int h = 0; h < num_heads; ++h) {
    const int g = h / group;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, static_cast<int>(t), d, scale,
                q + h * d, num_heads * d, l.k.data() + g * d, static_cast<int>(row_), 0.0f,
                scores_.data(), static_cast<int>(t));
    for (int i = 0; i < n; ++i) {
      float* s = scores_.data() + static_cast<int64_t>(i) * t;
      const int64_t visible = l.n + i + 1;  // Causal inside the step.
      SoftmaxRow(s, visible, t, bias, nullptr);
      if (capture) {
        for (int64_t j = 0; j < visible; ++j) l.mass[j] += s[j];
      } else if (probe_) {
        for (int64_t j = 0; j < l.n; ++j) l.intent[j] += s[j];
      }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, static_cast<int>(t), 1.0f,
                scores_.data(), static_cast<int>(t), l.v.data() + g * d, static_cast<int>(row_),
                0.0f, out + h * d, num_heads * d);
  }
  if (capture && options_.obs_window > 0) {
    const int64_t w = options_.obs_window;
    const int64_t qrow = int64_t{num_heads} * d;
    num_heads_ = num_heads;
    if (l.window_q.empty()) {
      l.window_q.assign(w * qrow, 0.f);
      l.window_slot.assign(w, -1);
    }
    for (int i = std::max(0, n - static_cast<int>(w)); i < n; ++i) {
      const int64_t r = l.window_next++ % w;
      std::copy(q + i * qrow, q + (i + 1) * qrow, l.window_q.data() + r * qrow);
      l.window_slot[r] = l.n + i;
    }
  }
  return absl::OkStatus();
}

absl::Status EvalKvStore::EndStep() {
  if (step_.empty()) return absl::FailedPreconditionError("EndStep outside a step");
  if (next_layer_ != options_.shape.num_layers) {
    return absl::FailedPreconditionError(
        absl::StrCat("EndStep after ", next_layer_, " of ", options_.shape.num_layers, " layers"));
  }
  const int64_t n = static_cast<int64_t>(step_.size());
  if (probe_) {
    // Drop the probe rows: nothing past the committed slots is read again.
    for (Layer& l : layers_) {
      if (!l.bias.empty()) l.bias.resize(l.n);
    }
  } else {
    for (Layer& l : layers_) {
      for (int64_t i = 0; i < n; ++i) l.token.push_back(static_cast<uint32_t>(tokens_.size() + i));
      l.n += n;
    }
    tokens_.insert(tokens_.end(), step_.begin(), step_.end());
  }
  step_.clear();
  return absl::OkStatus();
}

std::vector<LayerScores> EvalKvStore::Scores() const {
  const int kvh = options_.shape.num_kv_heads;
  const int d = options_.shape.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<LayerScores> out(layers_.size());
  std::vector<float> s;
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& l = layers_[li];
    LayerScores& o = out[li];
    o.attn.assign(l.n, 0.f);
    o.intent.assign(l.n, 0.f);
    o.obs.assign(l.n, 0.f);
    for (int64_t j = 0; j < l.n && j < static_cast<int64_t>(l.mass.size()); ++j) o.attn[j] = l.mass[j];
    for (int64_t j = 0; j < l.n && j < static_cast<int64_t>(l.intent.size()); ++j) o.intent[j] = l.intent[j];
    if (l.window_q.empty() || num_heads_ == 0) continue;
    const int group = num_heads_ / kvh;
    const int64_t qrow = int64_t{num_heads_} * d;
    double entropy = 0;
    int64_t rows = 0;
    for (size_t r = 0; r < l.window_slot.size(); ++r) {
      const int64_t slot = l.window_slot[r];
      if (slot < 0 || slot >= l.n) continue;
      const int64_t visible = slot + 1;
      s.resize(visible);
      for (int h = 0; h < num_heads_; ++h) {
        const float* qh = l.window_q.data() + r * qrow + h * d;
        const int g = h / group;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(visible), d, scale,
                    l.k.data() + g * d, static_cast<int>(row_), qh, 1, 0.0f, s.data(), 1);
        double hrow = 0;
        SoftmaxRow(s.data(), visible, visible, l.bias.empty() ? nullptr : l.bias.data(), &hrow);
        for (int64_t j = 0; j < visible; ++j) o.obs[j] += s[j];
        entropy += hrow;
        ++rows;
      }
    }
    if (rows > 0) o.entropy = static_cast<float>(entropy / rows);
  }
  return out;
}

std::vector<float> EvalKvStore::KeySummaries(int layer) const {
  const Layer& l = layers_[layer];
  const int kvh = options_.shape.num_kv_heads;
  const int d = options_.shape.head_dim;
  std::vector<float> out(static_cast<size_t>(l.n) * d, 0.f);
  const float inv = 1.0f / static_cast<float>(kvh);
  for (int64_t s = 0; s < l.n; ++s) {
    for (int g = 0; g < kvh; ++g) {
      const float* k = l.k.data() + s * row_ + g * d;
      for (int i = 0; i < d; ++i) out[s * d + i] += inv * k[i];
    }
  }
  return out;
}

}  // namespace polykv::eval
