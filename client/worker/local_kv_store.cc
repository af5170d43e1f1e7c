#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "client/worker/kv_store.h"
#include "kernels/ops.h"

namespace polykv::worker {
namespace {
// Tokens per f32 "page" when the dense rows are handed to the kernels.
constexpr int kDenseBlockTokens = 16;
}  // namespace

absl::StatusOr<std::unique_ptr<LocalKvStore>> LocalKvStore::Create(
    const LocalKvStoreOptions& options) {
  const KvShape& s = options.shape;
  if (s.num_layers <= 0 || s.num_kv_heads <= 0 || s.head_dim <= 0 || options.max_slots <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LocalKvStore: bad shape (layers ", s.num_layers, ", kv heads ", s.num_kv_heads,
        ", head dim ", s.head_dim, ", max slots ", options.max_slots, ")"));
  }
  std::unique_ptr<LocalKvStore> store(new LocalKvStore(options));
  if (options.attention == LocalAttention::kKernels) {
    store->page_bytes_ = kernels::PageBytes(kernels::PageFormat::kF32, kernels::KvKind::kKey,
                                            {kDenseBlockTokens, s.num_kv_heads, s.head_dim});
    if (store->page_bytes_ == 0) {
      return absl::InvalidArgumentError("LocalKvStore: shape not supported by the kernels");
    }
  }
  store->k_.assign(s.num_layers, nullptr);
  store->v_.assign(s.num_layers, nullptr);
  return store;
}

LocalKvStore::~LocalKvStore() {
  for (uint8_t* p : k_) std::free(p);
  for (uint8_t* p : v_) std::free(p);
}

int64_t LocalKvStore::bytes() const {
  return 2 * int64_t{options_.shape.num_layers} * num_slots_ * row_ * int64_t{sizeof(float)};
}

absl::Status LocalKvStore::Grow(int64_t slots) {
  if (slots <= capacity_) return absl::OkStatus();
  int64_t cap = std::max<int64_t>(capacity_ * 2, 256);
  while (cap < slots) cap *= 2;
  auto bytes_for = [&](int64_t n) {
    if (page_bytes_ == 0) return static_cast<size_t>(n * row_) * sizeof(float);
    const size_t size = (n + kDenseBlockTokens - 1) / kDenseBlockTokens * page_bytes_;
    return (size + kernels::kPageAlignment - 1) / kernels::kPageAlignment * kernels::kPageAlignment;
  };
  const size_t bytes = bytes_for(cap);
  for (auto* buffers : {&k_, &v_}) {
    for (uint8_t*& p : *buffers) {
      auto* q = static_cast<uint8_t*>(std::aligned_alloc(kernels::kPageAlignment, bytes));
      if (q == nullptr) return absl::ResourceExhaustedError("LocalKvStore: out of memory");
      if (p != nullptr) std::memcpy(q, p, bytes_for(capacity_));
      std::free(p);
      p = q;
    }
  }
  capacity_ = cap;
  return absl::OkStatus();
}

absl::Status LocalKvStore::BeginStep(std::span<const StepToken> tokens) {
  if (step_tokens_ != 0) return absl::FailedPreconditionError("BeginStep inside a step");
  if (tokens.empty()) return absl::InvalidArgumentError("BeginStep with no tokens");
  const int64_t need = num_slots_ + static_cast<int64_t>(tokens.size());
  if (need > options_.max_slots) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "local KV cache full: ", num_slots_, " + ", tokens.size(), " tokens > max ",
        options_.max_slots, " (raise --max-context)"));
  }
  if (absl::Status s = Grow(need); !s.ok()) return s;
  step_tokens_ = static_cast<int>(tokens.size());
  next_layer_ = 0;
  meta_.insert(meta_.end(), tokens.begin(), tokens.end());
  if (options_.track_attention_mass) mass_.resize(need, 0.0f);
  return absl::OkStatus();
}

absl::Status LocalKvStore::Append(int layer, const float* k, const float* v) {
  if (step_tokens_ == 0) return absl::FailedPreconditionError("Append outside a step");
  if (layer != next_layer_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Append(layer ", layer, ") out of order; expected ", next_layer_));
  }
  if (page_bytes_ == 0) {
    const size_t bytes = static_cast<size_t>(step_tokens_ * row_) * sizeof(float);
    std::memcpy(k_[layer] + num_slots_ * row_ * sizeof(float), k, bytes);
    std::memcpy(v_[layer] + num_slots_ * row_ * sizeof(float), v, bytes);
  } else {
    // Write the rows into their f32 pages, page by page (the page layout is
    // the kernels' business: WritePageRows knows it).
    const kernels::PageShape shape{kDenseBlockTokens, options_.shape.num_kv_heads,
                                   options_.shape.head_dim};
    for (int64_t i = 0; i < step_tokens_;) {
      const int64_t slot = num_slots_ + i;
      const int64_t block = slot / kDenseBlockTokens;
      const int row = static_cast<int>(slot % kDenseBlockTokens);
      const int rows = static_cast<int>(
          std::min<int64_t>(kDenseBlockTokens - row, step_tokens_ - i));
      for (auto [buf, src] : {std::pair{k_[layer], k}, std::pair{v_[layer], v}}) {
        if (absl::Status s = kernels::WritePageRows(shape, kernels::PageFormat::kF32,
                                                    src + i * row_, row, rows,
                                                    buf + block * page_bytes_);
            !s.ok()) {
          return s;
        }
      }
      i += rows;
    }
  }
  ++next_layer_;
  return absl::OkStatus();
}

absl::Status LocalKvStore::Attend(int layer, int num_heads, const float* q, float* out) {
  if (step_tokens_ == 0 || layer >= next_layer_) {
    return absl::FailedPreconditionError("Attend before Append in this step");
  }
  if (num_heads <= 0 || num_heads % options_.shape.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(num_heads, " query heads is not a multiple of ",
                                                   options_.shape.num_kv_heads, " KV heads"));
  }
  return options_.attention == LocalAttention::kKernels ? AttendKernels(layer, num_heads, q, out)
                                                        : AttendBlas(layer, num_heads, q, out);
}

absl::Status LocalKvStore::AttendKernels(int layer, int num_heads, const float* q, float* out) {
  const int n = step_tokens_;
  const int64_t t = num_slots_ + n;
  const int bt = kDenseBlockTokens;
  const size_t page_bytes = page_bytes_;
  kernels::PageShape shape{bt, options_.shape.num_kv_heads, options_.shape.head_dim};
  const int num_blocks = static_cast<int>((t + bt - 1) / bt);
  // Rows of block b start at b * bt: view the dense rows as f32 pages.
  std::vector<kernels::BlockEntry> table(num_blocks);
  for (int b = 0; b < num_blocks; ++b) {
    table[b].k_offset = reinterpret_cast<uintptr_t>(k_[layer]) + b * page_bytes;
    table[b].v_offset = reinterpret_cast<uintptr_t>(v_[layer]) + b * page_bytes;
    table[b].k_format = kernels::PageFormat::kF32;
    table[b].v_format = kernels::PageFormat::kF32;
  }
  kernels::PagedKvView view{shape, nullptr, table.data(), num_blocks, static_cast<int>(t)};
  kernels::AttentionParams params;
  params.num_q_heads = num_heads;
  kernels::Exec exec;
  exec.num_threads = options_.kernel_threads;
  if (n > 1) return kernels::PagedPrefillAttention(exec, view, params, n, q, out, nullptr);
  float* mass = nullptr;
  if (options_.track_attention_mass) {
    scores_.resize(static_cast<size_t>(options_.shape.num_kv_heads) * t);
    mass = scores_.data();
  }
  if (absl::Status s = kernels::PagedDecodeAttention(exec, view, params, q, out, nullptr, mass);
      !s.ok()) {
    return s;
  }
  if (mass != nullptr) {
    for (int g = 0; g < options_.shape.num_kv_heads; ++g) {
      for (int64_t j = 0; j < t; ++j) mass_[j] += mass[g * t + j];
    }
  }
  return absl::OkStatus();
}

absl::Status LocalKvStore::AttendBlas(int layer, int num_heads, const float* q, float* out) {
  const int kvh = options_.shape.num_kv_heads;
  const int d = options_.shape.head_dim;
  const int n = step_tokens_;
  const int64_t t = num_slots_ + n;
  const int group = num_heads / kvh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  scores_.resize(static_cast<size_t>(n) * t);
  const float* kl = reinterpret_cast<const float*>(k_[layer]);
  const float* vl = reinterpret_cast<const float*>(v_[layer]);
  for (int h = 0; h < num_heads; ++h) {
    const int g = h / group;
    // S[n, t] = scale * Q_h[n, d] . K_g[t, d]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, static_cast<int>(t), d, scale,
                q + h * d, num_heads * d, kl + g * d, static_cast<int>(row_), 0.0f,
                scores_.data(), static_cast<int>(t));
    for (int i = 0; i < n; ++i) {
      float* s = scores_.data() + static_cast<int64_t>(i) * t;
      const int64_t visible = num_slots_ + i + 1;  // Causal inside the step.
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, s[j]);
      double sum = 0;
      for (int64_t j = 0; j < visible; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < visible; ++j) s[j] *= inv;
      std::fill(s + visible, s + t, 0.0f);
      if (options_.track_attention_mass) {
        for (int64_t j = 0; j < visible; ++j) mass_[j] += s[j];
      }
    }
    // O_h[n, d] = P[n, t] . V_g[t, d]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, static_cast<int>(t), 1.0f,
                scores_.data(), static_cast<int>(t), vl + g * d, static_cast<int>(row_), 0.0f,
                out + h * d, num_heads * d);
  }
  return absl::OkStatus();
}

absl::Status LocalKvStore::EndStep() {
  if (step_tokens_ == 0) return absl::FailedPreconditionError("EndStep outside a step");
  if (next_layer_ != options_.shape.num_layers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "EndStep after ", next_layer_, " of ", options_.shape.num_layers, " layers"));
  }
  num_slots_ += step_tokens_;
  step_tokens_ = 0;
  return absl::OkStatus();
}

}  // namespace polykv::worker
